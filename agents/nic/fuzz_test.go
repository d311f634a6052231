package nic

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/nic/nictest"
	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzPollEventsValid: whatever sysfs and the state file hold — at
// discovery (read through procfs), on the hot path of later polls, and
// across a restart — a poll neither panics nor fails, and every event it
// emits, stamped as the agent stamps it, passes the gateway's validation.
// A panic here would stop the NIC check on every poll of that node.
func FuzzPollEventsValid(f *testing.F) {
	good := []byte(`{"version":1,"boot_id":"boot-1","ports":{"mlx5_0/1":{"state":"4: ACTIVE","phys_state":"5: LinkUp",` +
		`"link_layer":"InfiniBand","level":"healthy","counters":{"link_downed":0}}},"known_devices":{"mlx5_0":"InfiniBand"}}`)
	f.Add(nictest.Active, nictest.LinkUp, "400 Gb/sec (4X NDR)", "0", "up", good)
	f.Add("1: DOWN", "3: Disabled", "100 Gb/sec (4X EDR)", "7", "down", []byte(`{"version":1,"boot_id":"boot-1","ports":{"mlx5_0/1":null}}`))
	f.Add("4:", ": LinkUp", "Gb/sec", "18446744073709551615", "", []byte(`{"version":1,"boot_id":"boot-1","ports":{},"anomalous_cards":{"0000:10:00":{"expected":-1}}}`))
	f.Add("4: ACTIVE: x", "\x1b[31m5: LinkUp", "", "-1", "up\x00", []byte(`{`))
	e := setup(f, small()) // one tree: building it is most of an input's time
	ports := []string{"mlx5_0", "mlx5_1", "mlx5_4"}
	f.Fuzz(func(t *testing.T, state, phys, rate, counter, operstate string, stateFile []byte) {
		raw := func(path, v string) {
			if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		newCheck := func() *Check {
			c, err := New(e.cfg, Options{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return fuzzNow }})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		polled := func(step string, c *Check) {
			t.Helper()
			evs, err := c.Check(t.Context())
			if err == nil {
				err = c.Commit()
			}
			if err != nil {
				t.Fatalf("%s: poll failed: %v", step, err)
			}
			fuzzseed.Stamped(t, step, evs, fuzzNow)
		}
		// The tree as built: healthy ports, zero counters, no state file.
		for _, dev := range ports {
			must(t, e.tree.SetPort(dev, 1, nictest.Active, nictest.LinkUp))
			for _, c := range fatalCounters {
				raw(filepath.Join(e.tree.PortDir(dev, 1), c.dir, c.name), "0")
			}
		}
		raw(filepath.Join(e.tree.Root, "class/net/eth4/operstate"), "up")
		os.Remove(e.cfg.StateFile)

		// Discovery: procfs parses mlx5_0's port files.
		p0 := e.tree.PortDir("mlx5_0", 1)
		raw(filepath.Join(p0, "state"), state)
		raw(filepath.Join(p0, "phys_state"), phys)
		raw(filepath.Join(p0, "rate"), rate)
		raw(filepath.Join(p0, "counters", CounterLinkDowned), counter)
		c := newCheck()
		polled("first poll", c)
		// Hot path: an IB and a RoCE port change under a running check.
		for _, dev := range ports[1:] {
			pd := e.tree.PortDir(dev, 1)
			raw(filepath.Join(pd, "state"), state)
			raw(filepath.Join(pd, "phys_state"), phys)
			raw(filepath.Join(pd, "counters", CounterLocalLinkIntegrity), counter)
			raw(filepath.Join(pd, "hw_counters", CounterRnrNakRetryErr), counter)
		}
		raw(filepath.Join(e.tree.Root, "class/net/eth4/operstate"), operstate)
		polled("second poll", c)
		// Restart on whatever the state file holds.
		raw(e.cfg.StateFile, string(stateFile))
		polled("after restart", newCheck())
	})
}

var fuzzNow = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
