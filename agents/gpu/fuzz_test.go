package gpu

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzReplay: whatever a recording holds, it is refused with a message or
// played without a panic, every event the check emits passes the
// gateway's validation once stamped as the agent stamps it, and the last
// step read again (a replay repeats it) reports nothing new (the healthy
// baseline is sent once).
func FuzzReplay(f *testing.F) {
	b, err := os.ReadFile("testdata/recorded-hgx.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"steps":[{"incidents":[{"gpu":1,"system":"Mem","health":"FAIL","code":"X"},{"gpu":1,"system":"Mem","health":"WARN","code":"DCGM_FR_CLOCKS_EVENT_THERMAL"}]}]}`))
	f.Add([]byte(`{"steps":[{"incidents":[{"uuid":"\u0007","pci":"","system":"Pcie","health":"fail","code":"Y","message":"\u001b[31m"}]},{"notPresent":true},{"error":""}]}`))
	f.Add([]byte(`{"steps":[{"incidents":[{"gpu":1,"uuid":"A","system":"Mem","health":"FAIL","code":"X"}],"gpus":[{"gpu":0,"uuid":"B","pci":"p","unknown":["Pcie"]},{"gpu":1,"uuid":"A"}]},{"incidents":[],"gpus":[{"gpu":0,"uuid":"B","pci":"p"}]}]}`))
	actions, err := DefaultActions()
	if err != nil {
		f.Fatal(err)
	}
	now := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, recording []byte) {
		r, err := parseReplay(recording)
		if fuzzseed.Parsed(t, r, err); err != nil {
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
			// (An empty recording has no step: its one read is the first,
			// the healthy baseline.)
			if i == len(r.Steps) && i > 0 && len(evs) > 0 {
				t.Fatalf("the last step read again reported %d new events: %v", len(evs), evs)
			}
			fuzzseed.Stamped(t, fmt.Sprintf("poll %d", i), evs, now)
		}
	})
}
