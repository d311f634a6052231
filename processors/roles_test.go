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

// TestJanitorTimeoutsBelowCompletionTimeout: where the janitor runs, a
// janitor timeout (reboot_timeout, terminate_timeout, gpu_reset_timeout)
// is refused at or above remediate.completion_timeout, naming both keys
// and their values.
// Both count from the resource's start; before, a reboot still within
// its janitor timeout was failed by the remediate role and the node
// escalated CONTACT_SUPPORT while the janitor went on.
func TestJanitorTimeoutsBelowCompletionTimeout(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		reboot, terminate, gpuReset time.Duration
		completion                  time.Duration
		err                         string
	}{
		{"defaults", 30 * time.Minute, 30 * time.Minute, 10 * time.Minute, time.Hour, ""},
		{"just below", 59 * time.Minute, 59 * time.Minute, 59 * time.Minute, time.Hour, ""},
		{"reboot at it", time.Hour, 30 * time.Minute, 10 * time.Minute, time.Hour,
			"janitor.reboot_timeout: must be below remediate.completion_timeout (1h0m0s): both count from the resource's start, and the remediate role fails and escalates one not finished by then while the janitor goes on; got 1h0m0s"},
		{"reboot above it", 2 * time.Hour, 30 * time.Minute, 10 * time.Minute, time.Hour, "janitor.reboot_timeout: must be below remediate.completion_timeout (1h0m0s)"},
		{"terminate above it", 30 * time.Minute, 90 * time.Minute, 10 * time.Minute, time.Hour, "janitor.terminate_timeout: must be below remediate.completion_timeout (1h0m0s)"},
		{"gpu reset above a lowered completion timeout", 5 * time.Minute, 5 * time.Minute, 10 * time.Minute, 8 * time.Minute,
			"janitor.gpu_reset_timeout: must be below remediate.completion_timeout (8m0s)"},
		// NVSentinel's janitor instead of faultline's: the janitor keys'
		// defaults bound nothing, a lowered completion_timeout is valid.
		{"janitor not run", 30 * time.Minute, 30 * time.Minute, 10 * time.Minute, 20 * time.Minute, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			if tc.name == "janitor not run" {
				c.Roles = "store,correlate,quarantine,drain,remediate"
			}
			c.Janitor.RebootTimeout, c.Janitor.TerminateTimeout, c.Janitor.GPUResetTimeout = tc.reboot, tc.terminate, tc.gpuReset
			c.Remediate.CompletionTimeout = tc.completion
			err := c.Validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
}
