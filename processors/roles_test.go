package processors

import (
	"strings"
	"testing"
	"time"
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

// TestValidateAcrossRoles: the janitor's max_queue_age is refused below
// its cooldown (a resource waiting for its node's cooldown would end
// QueueTimeout, never started) and at or above the remediate role's
// queue_timeout (the remediate role would fail and escalate a resource
// the janitor may still start), naming both keys; 0 (no bound) is
// accepted. Before, each section was validated alone.
func TestValidateAcrossRoles(t *testing.T) {
	for _, tc := range []struct {
		name                           string
		maxQueueAge, cooldown, queueTO time.Duration
		err                            string
	}{
		{"defaults", 6 * time.Hour, 30 * time.Minute, 12 * time.Hour, ""},
		{"no bound", 0, 30 * time.Minute, 12 * time.Hour, ""},
		{"no cooldown", time.Minute, 0, 12 * time.Hour, ""},
		{"the cooldown", 30 * time.Minute, 30 * time.Minute, 12 * time.Hour, ""},
		{"below the cooldown", 20 * time.Minute, 30 * time.Minute, 12 * time.Hour, "janitor.max_queue_age: must be 0 (no bound) or at least janitor.cooldown (30m0s)"},
		{"the queue timeout", 12 * time.Hour, 30 * time.Minute, 12 * time.Hour, "janitor.max_queue_age: must be below remediate.queue_timeout (12h0m0s)"},
		{"above the queue timeout", 13 * time.Hour, 30 * time.Minute, 12 * time.Hour, "janitor.max_queue_age: must be below remediate.queue_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Janitor.MaxQueueAge, c.Janitor.Cooldown, c.Remediate.QueueTimeout = tc.maxQueueAge, tc.cooldown, tc.queueTO
			err := c.validateAcross()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
	// Validate asks it.
	c := DefaultConfig()
	c.Janitor.MaxQueueAge = 20 * time.Minute
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "janitor.cooldown") {
		t.Fatalf("Validate: %v, want the max_queue_age below the cooldown refused", err)
	}
}
