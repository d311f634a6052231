package gpu

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/validate"
)

// FuzzReplay: whatever a recording holds, it is refused with a message or
// played without a panic, every event the check emits passes the
// gateway's validation once stamped as the agent stamps it, and the last
// step read again (a replay repeats it) reports nothing new.
func FuzzReplay(f *testing.F) {
	b, err := os.ReadFile("testdata/recorded-hgx.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"steps":[{"incidents":[{"gpu":1,"system":"Mem","health":"FAIL","code":"X"},{"gpu":1,"system":"Mem","health":"WARN","code":"DCGM_FR_CLOCKS_EVENT_THERMAL"}]}]}`))
	f.Add([]byte(`{"steps":[{"incidents":[{"uuid":"\u0007","pci":"","system":"Pcie","health":"fail","code":"Y","message":"\u001b[31m"}]},{"notPresent":true},{"error":""}]}`))
	actions, err := DefaultActions()
	if err != nil {
		f.Fatal(err)
	}
	now := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
	v := validate.Validator{MaxBatch: 1000, MaxFutureSkew: 5 * time.Minute}
	f.Fuzz(func(t *testing.T, recording []byte) {
		r, err := parseReplay(recording)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error with no message")
			}
			return
		}
		c, err := New(Config{Source: r, Actions: actions, Now: func() time.Time { return now },
			Uptime: func() (time.Duration, error) { return time.Hour, nil }})
		if err != nil {
			t.Fatal(err)
		}
		for i := range len(r.Steps) + 1 {
			evs, err := c.Check(context.Background())
			if err != nil {
				t.Fatalf("poll %d: %v", i, err)
			}
			if i == len(r.Steps) && len(evs) > 0 {
				t.Fatalf("the last step read again reported %d new events: %v", len(evs), evs)
			}
			for _, ev := range evs {
				ev.NodeName = "gpu-node-1"
				validate.Clean(ev, now)
				if err := v.Validate(ev, now); err != nil {
					t.Fatalf("poll %d: event the gateway would refuse (%v): %v", i, err, ev)
				}
			}
		}
	})
}
