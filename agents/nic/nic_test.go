package nic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/nic/nictest"
	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/agents/topology/topologytest"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

type env struct {
	t    testing.TB
	dir  string
	tree *nictest.Tree
	cfg  Config
	now  time.Time // the clock of e.check()'s checks
}

func setup(t testing.TB, p nictest.Platform) *env { return setupTree(t, p, false) }

// setupFull writes every counter file, as a real ConnectX has.
func setupFull(t testing.TB, p nictest.Platform) *env { return setupTree(t, p, true) }

func setupTree(t testing.TB, p nictest.Platform, full bool) *env {
	t.Helper()
	dir := t.TempDir()
	tree, err := nictest.New(filepath.Join(dir, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	tree.FullCounters = full
	if err := p.Build(tree); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, tree: tree, cfg: DefaultConfig(), now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	e.cfg.SysfsRoot = tree.Root
	e.cfg.MetadataPath = filepath.Join(dir, "gpu_metadata.json")
	if p.Metadata != nil {
		if err := topology.WriteFile(e.cfg.MetadataPath, p.Metadata); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg.ProcNetRoute, _ = nictest.WriteRoute(filepath.Join(dir, "route"), p.DefaultRoute)
	e.cfg.BootIDPath = filepath.Join(dir, "boot_id")
	e.setBootID("boot-1")
	e.cfg.StateFile = filepath.Join(dir, "state", "state.json")
	return e
}

func (e *env) setBootID(id string) {
	if err := os.WriteFile(e.cfg.BootIDPath, []byte(id+"\n"), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) check() *Check {
	e.t.Helper()
	c, err := New(e.cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { return e.now }})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// brief renders an event as "F|H|N check: message" for assertions.
func brief(ev *datamodels.HealthEvent) string {
	k := "N"
	switch {
	case ev.GetIsHealthy():
		k = "H"
	case ev.GetIsFatal():
		k = "F"
	}
	return k + " " + ev.GetCheckName() + ": " + ev.GetMessage()
}

func poll(t testing.TB, c *Check) []string {
	t.Helper()
	evs, err := c.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(); err != nil { // as the runner does once they are spooled
		t.Fatal(err)
	}
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		if ev.GetAgent() != Agent || ev.GetComponentClass() != "NIC" || ev.GetGeneratedTimestamp() == nil {
			t.Errorf("event fields: %v", ev)
		}
		if ev.GetIsFatal() != (ev.GetRecommendedAction() == datamodels.RecommendedAction_REPLACE_VM) {
			t.Errorf("fatal events recommend REPLACE_VM, others NONE: %v", ev)
		}
		// The check reports an escalation to DOWN as an event of its own:
		// its non-fatal state events are no link-down for the correlator,
		// which takes them so without the crossings-only mark (NVSentinel's).
		if _, ok := ev.GetMetadata()[events.MetaNICCrossingsOnly]; ok {
			t.Errorf("event marked %s: %v", events.MetaNICCrossingsOnly, ev)
		}
		if _, ok := ev.GetMetadata()["baseline"]; ok {
			continue // device and card baselines (first_poll, first_seen): TestFirstPollBaselines
		}
		out = append(out, brief(ev))
	}
	return out
}

// pollGone polls a check that no longer lists a known device: nothing
// while it is held down (deviceHoldDown), then, that long later, the
// poll's events.
func (e *env) pollGone(t testing.TB, c *Check) []string {
	t.Helper()
	wantEvents(t, "missing, held down", poll(t, c), nil)
	e.now = e.now.Add(deviceHoldDown)
	return poll(t, c)
}

func wantEvents(t testing.TB, step string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", step, got, want)
	}
}

// TestClassifyPlatforms builds each platform of the link-state design's
// field-validation tables (§4.1.3, §4.2.4, §4.3.4, §8.6) and asserts the
// classification it gives.
func TestClassifyPlatforms(t *testing.T) {
	for _, p := range []nictest.Platform{nictest.A100OCI(), nictest.H100OCI(), nictest.L40SOCI(),
		nictest.OnPremL40S(false), nictest.OnPremL40S(true), nictest.GB200(), nictest.System34()} {
		t.Run(p.Name, func(t *testing.T) {
			e := setup(t, p)
			c := e.check()
			nics, evs, err := c.Poll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(nics) != len(p.Want) {
				t.Fatalf("discovered %d devices, want %d", len(nics), len(p.Want))
			}
			counts := map[Role]int{}
			for _, n := range nics {
				counts[n.Role]++
				if string(n.Role) != p.Want[n.Name] {
					t.Errorf("%s: role %s (%s), want %s", n.Name, n.Role, n.Reason, p.Want[n.Name])
				}
				if n.Monitored != n.Role.Monitored() {
					t.Errorf("%s: monitored %v for role %s", n.Name, n.Monitored, n.Role)
				}
			}
			t.Logf("%s: %v", p.Name, counts)
			// First poll of a healthy node: two healthy baselines per
			// monitored port (its state check's and its degradation
			// check's), nothing for VFs or management NICs.
			monitored := 0
			for _, n := range nics {
				if n.Monitored {
					monitored += len(n.Ports)
				}
			}
			evs = slices.DeleteFunc(evs, func(ev *datamodels.HealthEvent) bool { return ev.GetMetadata()["baseline"] == "first_poll" })
			if len(evs) != 2*monitored {
				t.Errorf("%d events, want %d healthy baselines", len(evs), 2*monitored)
			}
			for _, ev := range evs {
				if !ev.GetIsHealthy() {
					t.Errorf("unexpected %s", brief(ev))
				}
				dev := events.Entity(ev, events.EntityNIC)
				if r := p.Want[dev]; r == "vf" || r == "management" {
					t.Errorf("event for %s device %s", r, dev)
				}
			}
		})
	}
}

func TestPlatformCounts(t *testing.T) {
	count := func(p nictest.Platform) map[string]int {
		out := map[string]int{}
		for _, r := range p.Want {
			out[r]++
		}
		return out
	}
	for _, tc := range []struct {
		p    nictest.Platform
		want map[string]int
	}{
		{nictest.A100OCI(), map[string]int{"management": 2, "compute": 16}},
		{nictest.H100OCI(), map[string]int{"compute": 16, "storage": 2}},
		{nictest.L40SOCI(), map[string]int{"storage": 6}},
		{nictest.OnPremL40S(false), map[string]int{"compute": 4, "storage": 1}},
		{nictest.OnPremL40S(true), map[string]int{"compute": 4, "management": 1}},
		{nictest.GB200(), map[string]int{"compute": 4, "management": 2}},
		{nictest.System34(), map[string]int{"compute": 16, "storage": 2, "vf": 16}},
	} {
		if got := count(tc.p); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: the design expects %v, fixture says %v", tc.p.Name, tc.want, got)
		}
	}
}

// small is 4 single-port IB compute cards plus 2 RoCE storage cards.
func small() nictest.Platform {
	md := &topology.Metadata{Version: "1.0", GPUs: []topology.GPU{{GPUID: 0, NUMANode: 0}, {GPUID: 1, NUMANode: 0}}, NICTopology: map[string][]string{}}
	p := nictest.Platform{Name: "small", Metadata: md, Want: map[string]string{}}
	for i := 0; i < 6; i++ {
		name := fmt.Sprintf("mlx5_%d", i)
		d := nictest.Device{Name: name, PCI: fmt.Sprintf("0000:%02x:00.0", 0x10*(i+1)), Ports: []nictest.Port{{LinkLayer: nictest.IB}}}
		md.NICTopology[name] = []string{"PXB", "SYS"}
		p.Want[name] = "compute"
		if i >= 4 {
			d.Ports = []nictest.Port{{LinkLayer: nictest.Eth, NetDev: fmt.Sprintf("eth%d", i)}}
			md.NICTopology[name] = []string{"NODE", "NODE"}
			p.Want[name] = "storage"
		}
		p.Devices = append(p.Devices, d)
	}
	return p
}

// baselines are the first-poll events of small(): per port, the state
// check's and the degradation check's healthy baselines.
func baselines() []string {
	return []string{
		"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_0"),
		"H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_1"),
		"H InfiniBandStateCheck: Port mlx5_2 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_2"),
		"H InfiniBandStateCheck: Port mlx5_3 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_3"),
		"H EthernetStateCheck: RoCE port mlx5_4 port 1: healthy (ACTIVE, LinkUp, operstate up)",
		degrBaseline(EthernetDegradationCheck, "mlx5_4"),
		"H EthernetStateCheck: RoCE port mlx5_5 port 1: healthy (ACTIVE, LinkUp, operstate up)",
		degrBaseline(EthernetDegradationCheck, "mlx5_5"),
	}
}

// degrBaseline is the degradation check's healthy baseline of a port: at
// its first counter reading, no counter above its threshold.
func degrBaseline(check, dev string) string {
	return "H " + check + ": Port " + dev + " port 1: healthy (no fatal counter above 0)"
}

// without drops the events about one device.
func without(evs []string, dev string) []string {
	return slices.DeleteFunc(slices.Clone(evs), func(s string) bool { return strings.Contains(s, " "+dev+" ") })
}

// TestStateTransitions walks every transition of §3.4 on an IB port.
func TestStateTransitions(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	wantEvents(t, "first poll", poll(t, c), baselines())
	steps := []struct {
		name        string
		state, phys string
		want        []string
	}{
		{"healthy→healthy", nictest.Active, nictest.LinkUp, nil},
		{"healthy→DOWN/Disabled", nictest.Down, nictest.Disabled, []string{"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled"}},
		{"DOWN/Disabled→DOWN/Polling suppressed", nictest.Down, nictest.Polling, nil},
		{"DOWN→INIT de-escalation suppressed", nictest.Init, nictest.LinkUp, nil},
		{"INIT→ACTIVE recovery", nictest.Active, nictest.LinkUp, []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"}},
		{"healthy→INIT non-fatal on IB", nictest.Init, nictest.LinkUp, []string{"N InfiniBandStateCheck: Port mlx5_0 port 1: state INIT, phys_state LinkUp"}},
		{"INIT→ARMED same severity", nictest.Armed, nictest.LinkUp, nil},
		{"ARMED→DOWN escalation", nictest.Down, nictest.Polling, []string{"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Polling"}},
		{"DOWN→ACTIVE", nictest.Active, nictest.LinkUp, []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"}},
		{"ACTIVE/LinkErrorRecovery non-fatal", nictest.Active, nictest.LinkErr, []string{"N InfiniBandStateCheck: Port mlx5_0 port 1: state ACTIVE, phys_state LinkErrorRecovery"}},
		{"→ACTIVE/LinkUp", nictest.Active, nictest.LinkUp, []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"}},
		{"ACTIVE/Polling non-fatal", nictest.Active, nictest.Polling, []string{"N InfiniBandStateCheck: Port mlx5_0 port 1: state ACTIVE, phys_state Polling"}},
		{"→ACTIVE/Disabled fatal (escalation)", nictest.Active, nictest.Disabled, []string{"F InfiniBandStateCheck: Port mlx5_0 port 1: state ACTIVE, phys_state Disabled"}},
		{"→healthy", nictest.Active, nictest.LinkUp, []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"}},
	}
	for _, s := range steps {
		if err := e.tree.SetPort("mlx5_0", 1, s.state, s.phys); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, s.name, poll(t, c), s.want)
	}
}

// TestRoCETransitions: operstate in the message, INIT/ARMED not reported.
func TestRoCETransitions(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	poll(t, c)
	steps := []struct {
		name        string
		state, phys string
		oper        string
		want        []string
	}{
		{"ACTIVE→INIT not reported", nictest.Init, nictest.LinkUp, "up", nil},
		{"INIT→ACTIVE nothing (never reported unhealthy)", nictest.Active, nictest.LinkUp, "up", nil},
		{"→DOWN", nictest.Down, nictest.Disabled, "down", []string{"F EthernetStateCheck: RoCE port mlx5_4 port 1: state DOWN, phys_state Disabled, operstate down"}},
		{"DOWN→ARMED not reported, still unhealthy", nictest.Armed, nictest.LinkUp, "down", nil},
		{"→ACTIVE", nictest.Active, nictest.LinkUp, "up", []string{"H EthernetStateCheck: RoCE port mlx5_4 port 1: healthy (ACTIVE, LinkUp, operstate up)"}},
	}
	for _, s := range steps {
		if err := e.tree.SetPort("mlx5_4", 1, s.state, s.phys); err != nil {
			t.Fatal(err)
		}
		if err := e.tree.SetOperState("eth4", s.oper); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, s.name, poll(t, c), s.want)
	}
}

// TestRestartWithPersistedState: a port DOWN at stop and fixed while the
// agent was down gets its recovery event; unchanged ports stay quiet.
func TestRestartWithPersistedState(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	poll(t, c)
	e.tree.SetPort("mlx5_1", 1, nictest.Down, nictest.Disabled)
	wantEvents(t, "down", poll(t, c), []string{"F InfiniBandStateCheck: Port mlx5_1 port 1: state DOWN, phys_state Disabled"})
	// Stop; port repaired; another goes down; restart on the same boot.
	e.tree.SetPort("mlx5_1", 1, nictest.Active, nictest.LinkUp)
	e.tree.SetPort("mlx5_2", 1, nictest.Down, nictest.Polling)
	c2 := e.check()
	wantEvents(t, "after restart", poll(t, c2), []string{
		"H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)",
		"F InfiniBandStateCheck: Port mlx5_2 port 1: state DOWN, phys_state Polling",
	})
	wantEvents(t, "steady", poll(t, c2), nil)
}

// TestRebootClearsState: a boot id change discards the state and emits
// healthy baselines again; a port DOWN before the reboot and still DOWN on a
// card at peer mode... is on a single-port card below mode: fatal.
func TestRebootClearsState(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	poll(t, c)
	e.tree.SetPort("mlx5_3", 1, nictest.Down, nictest.Disabled)
	poll(t, c)
	e.setBootID("boot-2")
	c2 := e.check()
	want := without(baselines(), "mlx5_3")
	want = slices.Insert(want, 6, "F InfiniBandStateCheck: Port mlx5_3 port 1: state DOWN, phys_state Disabled", degrBaseline(InfiniBandDegradationCheck, "mlx5_3"))
	want = append([]string{"F InfiniBandStateCheck: Card 0000:40:00 (compute) has 0 active ports, expected 1 (peer mode)"}, want...)
	wantEvents(t, "after reboot", poll(t, c2), want)
	var st persisted
	b, _ := os.ReadFile(e.cfg.StateFile)
	if err := json.Unmarshal(b, &st); err != nil || st.BootID != "boot-2" {
		t.Errorf("state file after reboot: boot id %q, err %v", st.BootID, err)
	}
	// The card recovers: per-port healthy and card cleared.
	e.tree.SetPort("mlx5_3", 1, nictest.Active, nictest.LinkUp)
	wantEvents(t, "recovered", poll(t, c2), []string{
		"H InfiniBandStateCheck: Card 0000:40:00 (compute) has 1 active ports, back at peer mode 1",
		"H InfiniBandStateCheck: Port mlx5_3 port 1: healthy (ACTIVE, LinkUp)",
	})
}

// TestCorruptOrMissingStateFile: both mean a fresh start with baselines.
func TestCorruptOrMissingStateFile(t *testing.T) {
	e := setup(t, small())
	poll(t, e.check())
	wantEvents(t, "restart, same boot", poll(t, e.check()), nil)
	if err := os.WriteFile(e.cfg.StateFile, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, "corrupt", poll(t, e.check()), baselines())
	for _, nulls := range []string{`"ports":{"mlx5_0/1":null}`, `"ports":{},"anomalous_cards":{"0000:40:00":null}`} {
		if err := os.WriteFile(e.cfg.StateFile, []byte(`{"version":1,"boot_id":"boot-1",`+nulls+`}`), 0o644); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, "null entries "+nulls, poll(t, e.check()), baselines())
	}
	os.Remove(e.cfg.StateFile)
	wantEvents(t, "missing", poll(t, e.check()), baselines())
}

// TestStateFileNotUsed: a state file that is damaged — corrupt,
// unreadable, or larger than any the check writes (not read into memory
// whole) — is treated as absent, with a warning: a fresh start with
// baselines. A missing file or a reboot is a fresh start too, without one.
func TestStateFileNotUsed(t *testing.T) {
	run := func(name string, alter func(t *testing.T, e *env), warn string) {
		t.Run(name, func(t *testing.T) {
			e := setup(t, small())
			poll(t, e.check())
			alter(t, e)
			var logs strings.Builder
			c, err := New(e.cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			must(t, err)
			// Read at New; what is at the path now only takes the next
			// save, which the unreadable case's directory would refuse.
			must(t, os.RemoveAll(e.cfg.StateFile))
			wantEvents(t, "restart", poll(t, c), baselines())
			warned := strings.Contains(logs.String(), "level=WARN")
			if warned != (warn != "") || !strings.Contains(logs.String(), warn) {
				t.Errorf("log, want a warning naming %q: %s", warn, logs.String())
			}
		})
	}
	for _, tc := range topologytest.StateDamages(maxStateBytes, `{"boot_id": "boot-1", "ports`) {
		run(tc.Name, func(t *testing.T, e *env) { tc.Alter(t, e.cfg.StateFile) }, tc.Warn)
	}
	run("rebooted", func(t *testing.T, e *env) { e.setBootID("boot-2") }, "")
}

// TestDisappearance: at runtime, across a restart, and back again.
func TestDisappearance(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	poll(t, c)
	if err := e.tree.Remove("mlx5_2"); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, "runtime", e.pollGone(t, c), []string{"F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"})
	wantEvents(t, "reported once", poll(t, c), nil)

	// Across a restart: mlx5_4 vanishes while the agent is stopped.
	e.tree.Remove("mlx5_4")
	c2 := e.check()
	wantEvents(t, "across restart", poll(t, c2), []string{"F EthernetStateCheck: NIC mlx5_4 disappeared from /sys/class/infiniband/ - hardware failure"})

	// mlx5_2 comes back healthy.
	p := small()
	if err := e.tree.Add(p.Devices[2]); err != nil {
		t.Fatal(err)
	}
	got := poll(t, c2)
	wantEvents(t, "back", got, []string{"H InfiniBandStateCheck: NIC mlx5_2 present again in /sys/class/infiniband/"})
}

// TestHomogeneity: uncabled ports consistent across cards are suppressed;
// a card below its role's mode is fatal; roles are separate groups.
func TestHomogeneity(t *testing.T) {
	md := &topology.Metadata{Version: "1.0", GPUs: []topology.GPU{{GPUID: 0, NUMANode: 0}}, NICTopology: map[string][]string{}}
	p := nictest.Platform{Name: "dual", Metadata: md}
	// 4 compute cards, 2 functions each: port of function .1 uncabled
	// (DOWN/Polling) on every card, except card 0x40 where .0 is hard down
	// (DOWN/Disabled: a card waiting for the SM or training would be held
	// down, TestFirstPollWaitsForSM).
	// 2 storage cards (single port, RoCE), both up.
	for card := 0; card < 4; card++ {
		for fn := 0; fn < 2; fn++ {
			name := fmt.Sprintf("mlx5_%d", card*2+fn)
			port := nictest.Port{LinkLayer: nictest.IB}
			if fn == 1 {
				port.State, port.PhysState = nictest.Down, nictest.Polling
			} else if card == 3 {
				port.State, port.PhysState = nictest.Down, nictest.Disabled
			}
			p.Devices = append(p.Devices, nictest.Device{Name: name, PCI: fmt.Sprintf("0000:%02x:00.%d", 0x10*(card+1), fn), Ports: []nictest.Port{port}})
			md.NICTopology[name] = []string{"PXB"}
		}
	}
	for i := 8; i < 10; i++ {
		name := fmt.Sprintf("mlx5_%d", i)
		p.Devices = append(p.Devices, nictest.Device{Name: name, PCI: fmt.Sprintf("0000:%02x:00.0", 0x10*(i+1)), Ports: []nictest.Port{{LinkLayer: nictest.Eth, NetDev: "ens" + name}}})
		md.NICTopology[name] = []string{"NODE"}
	}
	e := setup(t, p)
	c := e.check()
	wantEvents(t, "startup", poll(t, c), []string{
		"F InfiniBandStateCheck: Card 0000:40:00 (compute) has 0 active ports, expected 1 (peer mode)",
		"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_0"),
		degrBaseline(InfiniBandDegradationCheck, "mlx5_1"),
		"H InfiniBandStateCheck: Port mlx5_2 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_2"),
		degrBaseline(InfiniBandDegradationCheck, "mlx5_3"),
		"H InfiniBandStateCheck: Port mlx5_4 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_4"),
		degrBaseline(InfiniBandDegradationCheck, "mlx5_5"),
		"F InfiniBandStateCheck: Port mlx5_6 port 1: state DOWN, phys_state Disabled",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_6"),
		"F InfiniBandStateCheck: Port mlx5_7 port 1: state DOWN, phys_state Polling",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_7"),
		"H EthernetStateCheck: RoCE port mlx5_8 port 1: healthy (ACTIVE, LinkUp, operstate up)",
		degrBaseline(EthernetDegradationCheck, "mlx5_8"),
		"H EthernetStateCheck: RoCE port mlx5_9 port 1: healthy (ACTIVE, LinkUp, operstate up)",
		degrBaseline(EthernetDegradationCheck, "mlx5_9"),
	})
	// A later drop is a port transition at once; its card is reported
	// only after cardHoldDown (TestCardBelowPeersAfterFirstPoll), which
	// this check's fixed clock never reaches.
	e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Polling)
	wantEvents(t, "runtime drop", poll(t, c), []string{"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Polling"})
	// Cabling an uncabled port: healthy event (no earlier fatal was sent,
	// a harmless clear).
	e.tree.SetPort("mlx5_1", 1, nictest.Active, nictest.LinkUp)
	wantEvents(t, "cabled", poll(t, c), []string{"H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)"})
}

func TestModeTie(t *testing.T) {
	grp := []*card{{active: 2}, {active: 1}}
	if m := modeActive(grp); m != 2 {
		t.Errorf("tie mode = %d, want 2", m)
	}
	grp = []*card{{active: 1}, {active: 1}, {active: 2}}
	if m := modeActive(grp); m != 1 {
		t.Errorf("mode = %d, want 1", m)
	}
}

// TestCounters: Appendix A fatal counters.
func TestCounters(t *testing.T) {
	e := setup(t, small())
	e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 4)
	e.tree.SetCounter("mlx5_1", 1, CounterExcessiveBufferOverrun, 2)
	c := e.check()
	got := poll(t, c)
	want := baselines()
	want[3] = "F InfiniBandDegradationCheck: Port mlx5_1 port 1: excessive_buffer_overrun_errors is 2 (threshold > 0)"
	// link_downed at startup is a baseline, not an event.
	wantEvents(t, "startup", got, want)
	e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 6)
	e.tree.SetCounter("mlx5_1", 1, CounterExcessiveBufferOverrun, 5)
	e.tree.SetCounter("mlx5_2", 1, CounterLocalLinkIntegrity, 1)
	e.tree.SetCounter("mlx5_4", 1, CounterRnrNakRetryErr, 9)
	wantEvents(t, "runtime", poll(t, c), []string{
		"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 2 (now 6)",
		"F InfiniBandDegradationCheck: Port mlx5_2 port 1: local_link_integrity_errors is 1 (threshold > 0)",
		"F EthernetDegradationCheck: Port mlx5_4 port 1: rnr_nak_retry_err is 9 (threshold > 0)",
	})
	// A link_downed increase is over once a later poll finds the link up
	// with no further increase.
	wantEvents(t, "no further increase", poll(t, c), []string{"H InfiniBandDegradationCheck: Port mlx5_0 port 1: link up again, link_downed steady at 6"})
	wantEvents(t, "steady", poll(t, c), nil)
	// Across a restart the snapshot is kept: an increase while stopped is seen.
	e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 7)
	c2 := e.check()
	wantEvents(t, "restart", poll(t, c2), []string{"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 1 (now 7)"})
	// Counter reset clears the breach.
	e.tree.SetCounter("mlx5_1", 1, CounterExcessiveBufferOverrun, 0)
	wantEvents(t, "reset", poll(t, c2), []string{
		"H InfiniBandDegradationCheck: Port mlx5_0 port 1: link up again, link_downed steady at 7",
		"H InfiniBandDegradationCheck: Port mlx5_1 port 1: excessive_buffer_overrun_errors back at 0"})
	// Three downs while no agent ran (when, not known): one down to the
	// flap rule ("delta" 1), the increase in "delta_total"; then each
	// increase a process sees counts whole again.
	e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 10)
	c3 := e.check()
	evs := pollEvents(t, c3)
	wantEvents(t, "three downs across a restart", briefs(evs), []string{"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 3 (now 10) while the agent was not running: counted as one down (when each happened is not known)"})
	if md := evs[0].GetMetadata(); md["delta"] != "1" || md["delta_total"] != "3" {
		t.Errorf("across a restart: delta %q, delta_total %q; want 1, 3", md["delta"], md["delta_total"])
	}
	e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 12)
	evs = pollEvents(t, c3)
	wantEvents(t, "two downs seen running", briefs(evs), []string{"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 2 (now 12)"})
	if md := evs[0].GetMetadata(); md["delta"] != "2" || md["delta_total"] != "" {
		t.Errorf("running: delta %q, delta_total %q; want 2, none", md["delta"], md["delta_total"])
	}
}

func TestMetadataRequired(t *testing.T) {
	p := small()
	for _, tc := range []struct {
		name string
		md   *topology.Metadata
	}{
		{"missing", nil},
		{"no nic_topology", &topology.Metadata{Version: "1.0", GPUs: []topology.GPU{{NUMANode: 0}}}},
		{"no GPU NUMA", &topology.Metadata{Version: "1.0", GPUs: []topology.GPU{{NUMANode: -1}}, NICTopology: map[string][]string{"mlx5_0": {"PIX"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.Metadata = tc.md
			e := setup(t, p)
			_, err := New(e.cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if !errors.Is(err, ErrMetadata) {
				t.Fatalf("New: %v, want ErrMetadata", err)
			}
			t.Log(err)
		})
	}
}

func TestExclusionAndOverride(t *testing.T) {
	e := setup(t, small())
	e.cfg.ExclusionRegex = "^mlx5_[01]$"
	nics, _, err := e.check().Poll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if nics[0].Role != RoleExcluded || nics[1].Role != RoleExcluded || nics[2].Role != RoleCompute {
		t.Errorf("exclusion: %v %v %v", nics[0].Role, nics[1].Role, nics[2].Role)
	}
	e.cfg.InclusionRegexOverride = "^mlx5_1$"
	e.cfg.MetadataPath = filepath.Join(e.dir, "absent.json") // not needed with the override
	os.Remove(e.cfg.StateFile)
	nics, evs, err := e.check().Poll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nics {
		want := RoleExcluded
		if n.Name == "mlx5_1" {
			want = RoleOverride
		}
		if n.Role != want {
			t.Errorf("override: %s is %s", n.Name, n.Role)
		}
	}
	evs = slices.DeleteFunc(evs, func(ev *datamodels.HealthEvent) bool { return ev.GetMetadata()["baseline"] == "first_poll" })
	if len(evs) != 2 {
		t.Errorf("override: %d events, want 2 (mlx5_1's port baselines)", len(evs))
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.SysfsRoot = "" }, "nic.sysfs_root"},
		{func(c *Config) { c.PollInterval = 0 }, "nic.state_polling_interval"},
		{func(c *Config) { c.ExclusionRegex = "([" }, "nic.nic_exclusion_regex"},
		{func(c *Config) { c.MetadataPath = "" }, "nic.metadata_path"},
		{func(c *Config) { c.Checks = []string{"InfinibandStateCheck"} }, `nic.checks: no known sub-check (unknown: "InfinibandStateCheck"`},
		{func(c *Config) { c.Checks = []string{"ib", "eth"} }, `nic.checks: no known sub-check (unknown: "ib", "eth"`},
		{func(c *Config) { c.Checks = nil }, "nic.checks: empty"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want it to name %s", err, tc.want)
		}
	}
	// One known sub-check is enough; a misspelt one beside it is skipped.
	c := DefaultConfig()
	c.Checks = []string{"InfinibandStateCheck", EthernetStateCheck}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate with one known sub-check = %v", err)
	}
}

// TestStateFileContents: the file holds port snapshots, known devices,
// counters and the boot id.
func TestStateFileContents(t *testing.T) {
	e := setup(t, small())
	poll(t, e.check())
	b, err := os.ReadFile(e.cfg.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	var st persisted
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	ps := st.Ports["mlx5_0/1"]
	if st.BootID != "boot-1" || len(st.KnownDevices) != 6 || ps == nil || ps.State != "4: ACTIVE" || ps.Level != levelHealthy {
		t.Errorf("state: %s", b)
	}
	if _, ok := ps.Counters[CounterLinkDowned]; !ok {
		t.Errorf("no counter snapshot: %s", b)
	}
	ents, _ := os.ReadDir(filepath.Dir(e.cfg.StateFile))
	if len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}

// briefs renders events with brief.
func briefs(evs []*datamodels.HealthEvent) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, brief(ev))
	}
	return out
}
