package quarantine

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// The actions kept on a node stay within their bounds: each detail cut,
// the newest kept by count and by bytes, the caller's action untouched.
func TestAddUnsaidBounded(t *testing.T) {
	act := func(i, keys, detail int) *faultlinev1.Action {
		a := &faultlinev1.Action{Id: fmt.Sprint("a", i), Cluster: "c1", Node: "n", Role: Role, Kind: events.KindUnquarantine,
			Outcome: events.OutcomeApplied, Details: map[string]string{events.DetailEntities: strings.Repeat("x", detail)}}
		for k := 1; k < keys; k++ {
			a.Details[fmt.Sprint("k", k)] = strings.Repeat("y", detail)
		}
		return a
	}
	for _, tc := range []struct {
		name          string
		n, keys       int
		detail        int
		wantN, maxN   int
		wantNewest    string
		wantDetailLen int
	}{
		{name: "small", n: 3, keys: 1, detail: 10, wantN: 3, maxN: 3, wantNewest: "a2", wantDetailLen: 10},
		{name: "more than maxUnsaid", n: maxUnsaid + 5, keys: 1, detail: 10, wantN: maxUnsaid, maxN: maxUnsaid, wantNewest: fmt.Sprint("a", maxUnsaid+4), wantDetailLen: 10},
		{name: "large details", n: maxUnsaid, keys: 1, detail: 64 << 10, wantN: maxUnsaid, maxN: maxUnsaid, wantNewest: fmt.Sprint("a", maxUnsaid-1), wantDetailLen: maxUnsaidDetail},
		// 20 details of 256 bytes: about 5.4 KiB each, three fit in 16 KiB.
		{name: "over maxUnsaidBytes", n: 5, keys: 20, detail: 1 << 10, wantN: 3, maxN: 3, wantNewest: "a4", wantDetailLen: maxUnsaidDetail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{}
			for i := range tc.n {
				a := act(i, tc.keys, tc.detail)
				st.addUnsaid(a)
				if len(a.Details[events.DetailEntities]) != tc.detail {
					t.Fatal("the caller's action was cut")
				}
			}
			size := 0
			for _, raw := range st.Unsaid {
				size += len(raw)
			}
			acts, bad := st.unsaid("c1", "n")
			if bad > 0 || len(acts) < tc.wantN || len(acts) > tc.maxN || size > maxUnsaidBytes {
				t.Fatalf("%d kept (%d bad), %d bytes; want %d to %d, at most %d bytes", len(acts), bad, size, tc.wantN, tc.maxN, maxUnsaidBytes)
			}
			newest := acts[len(acts)-1]
			if newest.Id != tc.wantNewest || len(newest.Details[events.DetailEntities]) != tc.wantDetailLen {
				b, _ := protojson.Marshal(newest)
				t.Fatalf("newest kept: %s", b)
			}
		})
	}
}
