package processors

import (
	"strings"
	"testing"
)

// TestSelected: --role names roles from the table (or all); an unknown
// role and one named twice (its second Open would register its metrics
// again and panic) are refused naming it.
func TestSelected(t *testing.T) {
	var table []string
	for _, r := range roles {
		table = append(table, r.Name)
	}
	for _, tc := range []struct {
		roles string
		want  []string // names; nil with err
		err   string
	}{
		{"all", table, ""},
		{" store , correlate", []string{"store", "correlate"}, ""},
		{"store,cook", nil, `role: unknown role "cook"`},
		{"store,store", nil, `role: "store" is named twice`},
		{"store,correlate, store", nil, `role: "store" is named twice`},
	} {
		t.Run(tc.roles, func(t *testing.T) {
			got, err := Config{Roles: tc.roles}.Selected()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, r := range got {
				names = append(names, r.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("got %v, want %v", names, tc.want)
			}
		})
	}
}
