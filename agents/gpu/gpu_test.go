package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func summary(evs []*datamodels.HealthEvent) string {
	var s []string
	for _, ev := range evs {
		c := ev.CheckName + ":"
		if ev.IsHealthy {
			c += "healthy"
		} else {
			c += ev.ErrorCode[0]
			if ev.IsFatal {
				c += "!"
			}
			c += "/" + ev.RecommendedAction.String()
		}
		if len(ev.EntitiesImpacted) > 0 {
			c += "@" + ev.EntitiesImpacted[0].EntityValue
		}
		s = append(s, c)
	}
	return strings.Join(s, " ")
}

// TestRecordedHGX plays a recorded DCGM session through the check: the
// connection lost while booting is not reported, the first read that
// answers is the healthy baseline, incidents become events
// once with the table's action, changes and recoveries are reported, a
// lost connection after boot is one event and its return a healthy one.
func TestRecordedHGX(t *testing.T) {
	src, err := LoadReplay("testdata/recorded-hgx.json")
	if err != nil {
		t.Fatal(err)
	}
	uptime := 2 * time.Minute
	c, err := New(Config{Source: src, Uptime: func() (time.Duration, error) { return uptime, nil },
		Now: func() time.Time { return time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC) }})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"", // DCGM not up yet, node booting: nothing
		// DCGM up: the healthy baseline of the process's first read.
		"GpuDcgmConnectivityFailure:healthy GpuMemWatch:healthy GpuPcieWatch:healthy GpuNvlinkWatch:healthy " +
			"GpuThermalWatch:healthy GpuPowerWatch:healthy GpuInforomWatch:healthy",
		"GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-7b4f2c1a-8d6e-4c5b-9a1f-2e3d4c5a6b7c " +
			"GpuThermalWatch:DCGM_FR_CLOCKS_EVENT_THERMAL/NONE@GPU-c43f0536-e751-7211-d7a7-78c95249ee7d",
		"GpuNvlinkWatch:DCGM_FR_NVLINK_DOWN!/COMPONENT_RESET@GPU-11111111-2222-3333-4444-555555555555 " +
			"GpuPcieWatch:DCGM_FR_PCI_REPLAY_RATE!/CONTACT_SUPPORT@GPU-11111111-2222-3333-4444-555555555555 " +
			"GpuPowerWatch:DCGM_FR_SOMETHING_NEW/CONTACT_SUPPORT@GPU-22222222-2222-3333-4444-555555555555",
		"GpuNvlinkWatch:healthy@GPU-11111111-2222-3333-4444-555555555555 " +
			"GpuPcieWatch:healthy@GPU-11111111-2222-3333-4444-555555555555 " +
			"GpuPowerWatch:healthy@GPU-22222222-2222-3333-4444-555555555555 " +
			"GpuMemWatch:DCGM_FR_PENDING_ROW_REMAP!/COMPONENT_RESET@GPU-7b4f2c1a-8d6e-4c5b-9a1f-2e3d4c5a6b7c " +
			"GpuThermalWatch:healthy@GPU-c43f0536-e751-7211-d7a7-78c95249ee7d",
		"GpuDcgmConnectivityFailure:DCGM-CONNECTIVITY-FAILURE/CONTACT_SUPPORT@dcgm",
		"", // still lost: not reported again
		"GpuDcgmConnectivityFailure:healthy@dcgm GpuMemWatch:healthy@GPU-7b4f2c1a-8d6e-4c5b-9a1f-2e3d4c5a6b7c",
	}
	var all []*datamodels.HealthEvent
	for i, w := range want {
		if i == 5 {
			uptime = time.Hour // booted long ago now
		}
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := summary(evs); got != w {
			t.Errorf("step %d:\ngot  %s\nwant %s", i, got, w)
		}
		all = append(all, evs...)
	}
	var b strings.Builder
	for _, ev := range all {
		j, _ := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(ev)
		var v any
		json.Unmarshal(j, &v)
		j, _ = json.Marshal(v)
		b.Write(j)
		b.WriteByte('\n')
	}
	const golden = "testdata/recorded-hgx.golden.jsonl"
	if *update {
		os.WriteFile(golden, []byte(b.String()), 0o644)
	}
	if g, _ := os.ReadFile(golden); string(g) != b.String() {
		t.Errorf("events differ from %s (go test -update rewrites it)", golden)
	}
}

func TestNotPresent(t *testing.T) {
	c, _ := New(Config{Source: &Replay{Steps: []ReplayStep{{NotPresent: true}}}})
	if evs, err := c.Check(context.Background()); err != nil || evs != nil {
		t.Fatalf("%v %v", evs, err)
	}
	if c.Name() != "gpu" {
		t.Error(c.Name())
	}
}

func TestActionsTable(t *testing.T) {
	a, err := DefaultActions()
	if err != nil {
		t.Fatal(err)
	}
	for code, w := range map[string]struct {
		a     datamodels.RecommendedAction
		fatal bool
	}{
		"DCGM_FR_VOLATILE_DBE_DETECTED": {datamodels.RecommendedAction_COMPONENT_RESET, true},
		"DCGM_FR_ROW_REMAP_FAILURE":     {datamodels.RecommendedAction_CONTACT_SUPPORT, true},
		"DCGM_FR_NVLINK_DOWN":           {datamodels.RecommendedAction_COMPONENT_RESET, true},
		"DCGM_FR_CLOCKS_EVENT_POWER":    {datamodels.RecommendedAction_NONE, false},
	} {
		if ga, gf := a.Resolve(Incident{Code: code, Health: "FAIL"}); ga != w.a || gf != w.fatal {
			t.Errorf("%s: %s %v, want %s %v", code, ga, gf, w.a, w.fatal)
		}
	}
	if ga, gf := a.Resolve(Incident{Code: "DCGM_FR_NEW", Health: "FAIL"}); ga != datamodels.RecommendedAction_CONTACT_SUPPORT || !gf {
		t.Errorf("unknown FAIL: %s %v", ga, gf)
	}
}

// TestNVMLWithoutLibrary: on a machine without the NVIDIA library the real
// source says "not present" (or, built without cgo, errors) and never panics.
func TestNVMLWithoutLibrary(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("an NVIDIA driver is present")
	}
	incs, err := NewNVML().Health(context.Background())
	if len(incs) != 0 || err == nil {
		t.Fatalf("%v %v", incs, err)
	}
}

// TestReplayRefusesBadIncidents: a recording whose incident could not
// become an event the gateway takes is refused at load, naming the field.
func TestReplayRefusesBadIncidents(t *testing.T) {
	for _, tc := range []struct{ incident, want string }{
		{`{"system":"Mem","health":"FAIL","code":"DCGM_FR_X"}`, ""},
		{`{"system":"Mem","health":"warn","code":"DCGM_FR_X"}`, ""},
		{`{"health":"FAIL","code":"DCGM_FR_X"}`, `steps[1].incidents[0].system: want a watch name such as Mem or Nvlink, got ""`},
		{`{"system":"Mem Watch","health":"FAIL","code":"DCGM_FR_X"}`, `steps[1].incidents[0].system: want a watch name such as Mem or Nvlink, got "Mem Watch"`},
		{`{"system":"Mem","health":"FAIL"}`, `steps[1].incidents[0].code: want an error code such as DCGM_FR_VOLATILE_DBE_DETECTED, got ""`},
		{`{"system":"Mem","health":"FAIL","code":"DCGM\u0000"}`, `steps[1].incidents[0].code: want an error code such as DCGM_FR_VOLATILE_DBE_DETECTED, got "DCGM\x00"`},
		{`{"system":"Mem","health":"BAD","code":"DCGM_FR_X"}`, `steps[1].incidents[0].health: want WARN or FAIL, got "BAD"`},
	} {
		path := filepath.Join(t.TempDir(), "replay.json")
		if err := os.WriteFile(path, []byte(`{"steps":[{"incidents":[]},{"incidents":[`+tc.incident+`]}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadReplay(path)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.incident, err)
		case tc.want != "" && (err == nil || err.Error() != path+": "+tc.want):
			t.Errorf("%s:\n got  %v\n want %s", tc.incident, err, tc.want)
		}
	}
}

// TestNotPresentWithExpectedGPUs: NVML finding no driver or library ("not
// a GPU node") on a node whose GPU metadata names GPUs (a driver that did
// not load after a reboot) loses the health source, past BootGrace; a node
// without metadata, or metadata naming none, stays idle.
func TestNotPresentWithExpectedGPUs(t *testing.T) {
	gpus := []GPU{{Index: 0, UUID: "GPU-A", PCI: "0000:1b:00.0"}, {Index: 1, UUID: "GPU-B", PCI: "0000:43:00.0"}}
	for _, tc := range []struct {
		name     string
		expected func() []GPU
		uptime   time.Duration
		want     string
	}{
		{"no metadata", nil, time.Hour, ""},
		{"metadata names no GPU", func() []GPU { return nil }, time.Hour, ""},
		{"metadata names GPUs", func() []GPU { return gpus }, time.Hour, "GpuDcgmConnectivityFailure:DCGM-CONNECTIVITY-FAILURE/CONTACT_SUPPORT@dcgm"},
		{"metadata names GPUs, booting", func() []GPU { return gpus }, time.Minute, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Config{Source: &Replay{Steps: []ReplayStep{{NotPresent: true}}}, Expected: tc.expected,
				Uptime: func() (time.Duration, error) { return tc.uptime, nil }})
			if err != nil {
				t.Fatal(err)
			}
			for poll, want := range []string{tc.want, ""} {
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if got := summary(evs); got != want {
					t.Errorf("poll %d: events %q, want %q", poll, got, want)
				}
			}
		})
	}
}

// stuckSource is a Source whose Health calls wait for answer (a hung GPU:
// NVML's cgo calls do not heed the context), counting the calls.
type stuckSource struct {
	calls  atomic.Int32
	answer chan error
}

func (s *stuckSource) Health(context.Context) ([]Incident, error) {
	s.calls.Add(1)
	if err := <-s.answer; err != nil {
		panic(err)
	}
	return nil, nil
}

// TestStuckSource: a Health call that does not return is given up at the
// poll's deadline: the health source is reported lost (past BootGrace),
// and the next polls start no other call while it runs (nor report it
// again); its answer, when it comes, is the next poll's (the source back),
// and the poll after starts a new call. A call that panics loses the
// source too, without taking the agent down. Check used to wait for ever:
// no event, and the agent's /healthz went stale.
func TestStuckSource(t *testing.T) {
	const baselines = "GpuMemWatch:healthy GpuPcieWatch:healthy GpuNvlinkWatch:healthy GpuThermalWatch:healthy GpuPowerWatch:healthy GpuInforomWatch:healthy"
	for _, tc := range []struct {
		name   string
		uptime time.Duration
		answer error // what the stuck call does when released: nil answers, else panics
		lost   string
		back   string
	}{
		{"hung, then answers", time.Hour, nil, "GpuDcgmConnectivityFailure:DCGM-CONNECTIVITY-FAILURE/CONTACT_SUPPORT@dcgm",
			"GpuDcgmConnectivityFailure:healthy@dcgm " + baselines},
		{"hung while booting", time.Minute, nil, "", "GpuDcgmConnectivityFailure:healthy " + baselines},
		{"hung, then panics", time.Hour, errors.New("boom"), "GpuDcgmConnectivityFailure:DCGM-CONNECTIVITY-FAILURE/CONTACT_SUPPORT@dcgm", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &stuckSource{answer: make(chan error, 1)}
			c, err := New(Config{Source: src, Uptime: func() (time.Duration, error) { return tc.uptime, nil }})
			if err != nil {
				t.Fatal(err)
			}
			poll := func(what string, timeout time.Duration) string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				done := make(chan string, 1)
				go func() {
					evs, err := c.Check(ctx)
					if err != nil {
						t.Errorf("%s: %v", what, err)
					}
					done <- summary(evs)
				}()
				select {
				case s := <-done:
					return s
				case <-time.After(5 * time.Second):
					t.Fatalf("%s: Check did not return after its deadline", what)
					return ""
				}
			}
			if got := poll("stuck", 20*time.Millisecond); got != tc.lost {
				t.Errorf("stuck: events %q, want %q", got, tc.lost)
			}
			if got := poll("still stuck", 20*time.Millisecond); got != "" {
				t.Errorf("still stuck: events %q, want none", got)
			}
			if n := src.calls.Load(); n != 1 {
				t.Errorf("%d Health calls while the first is stuck, want 1", n)
			}
			src.answer <- tc.answer
			if got := poll("answered", 5*time.Second); got != tc.back {
				t.Errorf("answered: events %q, want %q", got, tc.back)
			}
			src.answer <- nil
			poll("next", 5*time.Second)
			if n := src.calls.Load(); n != 2 {
				t.Errorf("%d Health calls after the stuck one answered, want 2", n)
			}
		})
	}
}
