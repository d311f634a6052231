package fabric

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// a100Switches are the twelve NVSwitches of the two-baseboard HGX A100 in
// testdata.
var a100Switches = []string{"0000:44:00.0", "0000:45:00.0", "0000:46:00.0", "0000:47:00.0", "0000:48:00.0", "0000:49:00.0",
	"0000:c4:00.0", "0000:c5:00.0", "0000:c6:00.0", "0000:c7:00.0", "0000:c8:00.0", "0000:c9:00.0"}

// TestOneFailedSwitchIsOneFailure: HGX A100 with two baseboards, bare
// metal, NVSWITCH_FAILURE_MODE=1, one NVSwitch fails: FM disables it and
// its peer and runs at 5/6 bandwidth. The switch is missing from the
// driver's count and named by FM's line by its PCI address: one failure,
// not two (several failures would fall back to mode 0 and make the node
// fatal, RESTART_BM, a reboot loop with the switch still broken). A second
// switch failing, or one FM names only by physical id (which cannot be
// told from the missing one), is several: the safe side.
func TestOneFailedSwitchIsOneFailure(t *testing.T) {
	const failed = "0000:c9:00.0"
	run := func(start, more string, unnamed bool) string {
		named := "[Oct 28 2024 " + start + ":02] [ERROR] [tid 841] NVSwitch pci bus id 00000000:c9:00.0 failed to initialize\n"
		if unnamed {
			named = ""
		}
		return "[Oct 28 2024 " + start + ":00] [INFO] [tid 841] Fabric Manager version 535.183.01 is running with the following configuration options\n" +
			named + more +
			"[Oct 28 2024 " + start + ":09] [INFO] [tid 841] Successfully configured all the available GPUs and NVSwitches to route NVLink traffic.\n"
	}
	bound := []string{}
	for _, p := range a100Switches {
		if p != failed {
			bound = append(bound, p)
		}
	}
	for _, tc := range []struct {
		name  string
		pci   []string // the NVSwitches on the PCI bus (nil: not read)
		bound []string
		more  string // a second failure line in FM's run
		fatal bool
		// unnamed: FM's run does not name the failed switch (off the bus)
		unnamed bool
	}{
		{"the switch still on the PCI bus", a100Switches, bound, "", false, false},
		{"the switch off the PCI bus", bound, bound, "", false, false},
		{"the PCI bus not read", nil, bound, "", false, false},
		{"a second switch bound and failing", a100Switches, bound,
			"[Oct 28 2024 10:00:03] [ERROR] [tid 841] NVSwitch pci bus id 00000000:c5:00.0 failed to initialize\n", true, false},
		{"a second switch failing, named by physical id", bound, bound,
			"[Oct 28 2024 10:00:03] [ERROR] [tid 841] NVSwitch physical id 5 failed to initialize\n", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEvaluator(EvalConfig{Platform: PlatformA100})
			if err != nil {
				t.Fatal(err)
			}
			r := &LogReader{Loc: time.UTC, Year: 2024}
			now := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
			snap := func(log string) *Snapshot {
				s := NewSnapshot(now)
				s.Config = ParseFMConfig(testdata(t, "config/a100-bare-metal-degraded.cfg"))
				s.SMI = ParseSMI(testdata(t, "smi/hgx-a100-2bb.txt"))
				s.Service = &ServiceState{LoadState: "loaded", ActiveState: "active", SubState: "running", ActiveSince: now}
				s.NVSwitchPCIs, s.NVSwitchCount, s.PCISwitches = tc.bound, len(tc.bound), tc.pci
				if log != "" {
					s.Log = r.ReadLog(log)
				}
				return s
			}
			ha := func(evs []*datamodels.HealthEvent) []*datamodels.HealthEvent {
				var out []*datamodels.HealthEvent
				for _, ev := range evs {
					if ev.CheckName == CheckHA {
						out = append(out, ev)
					}
				}
				return out
			}
			// poll 1: the driver shows 11 of 12 switches, FM still starting
			evs := ha(e.Evaluate(snap("")))
			if len(evs) != 1 || evs[0].ErrorCode[0] != "FM-HA-NVSWITCH-PAIR-DISABLED" || evs[0].IsFatal {
				t.Fatalf("poll 1: %s", shorts(evs))
			}
			// poll 2: FM's run names the failed switch (and configures the rest)
			now = now.Add(30 * time.Second)
			check := func(poll string, evs []*datamodels.HealthEvent) {
				t.Helper()
				fatal := false
				for _, ev := range evs {
					fatal = fatal || ev.IsFatal
					if !ev.IsHealthy && !tc.fatal && (ev.IsFatal || ev.ErrorCode[0] != "FM-HA-NVSWITCH-PAIR-DISABLED") {
						t.Fatalf("%s: %s, want FM-HA-NVSWITCH-PAIR-DISABLED, not fatal", poll, shorts(evs))
					}
				}
				if tc.fatal && !fatal {
					t.Fatalf("%s: %s, want FM-HA-NVSWITCH-FM-ABORTED", poll, shorts(evs))
				}
			}
			check("poll 2", ha(e.Evaluate(snap(run("10:00", tc.more, tc.unnamed)))))
			// poll 3: FM's second run (restarted by hand) says the same
			now = now.Add(10 * time.Minute)
			if evs := ha(e.Evaluate(snap(run("10:10", tc.more, tc.unnamed)))); len(evs) > 0 && !tc.fatal {
				t.Fatalf("FM's second run: %s (what stands, stands)", shorts(evs))
			}
			for k, ev := range e.bad {
				if ev.CheckName == CheckHA && ev.IsFatal != tc.fatal && k != "swcount|missing" {
					t.Errorf("standing %s: %s", k, ev.ErrorCode[0])
				}
			}
		})
	}
}

// TestAccessGPURemovedIsRemediatedByRestartingFM: HGX A100 bare metal,
// ACCESS_LINK_FAILURE_MODE=0, an access NVLink fails at FM's
// initialization: FM removes the GPU from NVLink P2P. The condition stands
// until FM's next run configures the fabric without it (Table 17: restart
// FM; if it persists, RMA the GPU), so the action is one that restarts FM
// (RESTART_BM; a GPU reset leaves FM's run and the condition as they are).
// The reboot's new FM run clears it; one that fails the link again keeps
// it, without a second event.
func TestAccessGPURemovedIsRemediatedByRestartingFM(t *testing.T) {
	const gpu = "GPU-a100b000-0000-0000-0000-000000000002"
	run := func(start string, fails bool) string {
		s := "[Oct 28 2024 " + start + ":01] [INFO] [tid 841] Fabric Manager version 535.183.01 is running with the following configuration options\n"
		if fails {
			s += "[Oct 28 2024 " + start + ":04] [ERROR] [tid 841] access NVLink training failed for GPU physical id 3 (pci bus id 00000000:47:00.0) link 6 on NVSwitch pci bus id 00000000:c7:00.0 port 5\n"
		}
		return s + "[Oct 28 2024 " + start + ":09] [INFO] [tid 841] Successfully configured all the available GPUs and NVSwitches to route NVLink traffic.\n"
	}
	for _, tc := range []struct {
		name      string
		failAgain bool
		want      string
	}{
		{"the link trains after the reboot", false, "FabricManagerHAMode::healthy@" + gpu},
		{"the link fails again", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEvaluator(EvalConfig{Platform: PlatformA100})
			if err != nil {
				t.Fatal(err)
			}
			r := &LogReader{Loc: time.UTC, Year: 2024}
			snap := func(now time.Time, log string) *Snapshot {
				s := NewSnapshot(now)
				s.Config = ParseFMConfig(testdata(t, "config/a100-bare-metal-degraded.cfg"))
				s.SMI = ParseSMI(testdata(t, "smi/hgx-a100-2bb.txt"))
				s.Log = r.ReadLog(log)
				return s
			}
			var ha *datamodels.HealthEvent
			for _, ev := range e.Evaluate(snap(time.Date(2024, 10, 28, 10, 1, 0, 0, time.UTC), run("10:00", true))) {
				if ev.CheckName == CheckHA {
					ha = ev
				}
			}
			if ha == nil || ha.ErrorCode[0] != "FM-HA-ACCESS-GPU-REMOVED" || !ha.IsFatal || ha.RecommendedAction != datamodels.RecommendedAction_RESTART_BM {
				t.Fatalf("access link failure: %v, want FM-HA-ACCESS-GPU-REMOVED fatal RESTART_BM", ha)
			}
			// the node reboots: a new agent resumes what stood
			boot := time.Date(2024, 10, 28, 10, 20, 0, 0, time.UTC)
			e2, _ := NewEvaluator(EvalConfig{Platform: PlatformA100})
			e2.Resume(e.Standing(), boot, true)
			got := shortsOf(e2.Evaluate(snap(boot.Add(3*time.Minute), run("10:21", tc.failAgain))), CheckHA)
			if got != tc.want {
				t.Fatalf("after the reboot: %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSXidFatalToTheFabricOnAnAccessPort: SXid 10003 (Host_unhandled_
// interrupt, Table 22: fatal to the fabric/system, reset all GPUs and
// NVSwitches) on an access port is not a reset of the one GPU on that
// port: RESTART_BM. 19084 (AN1 Heartbeat Timeout, Table 19: non-fatal,
// reset all GPUs and all NVSwitches) recommends the same, not fatal.
func TestSXidFatalToTheFabricOnAnAccessPort(t *testing.T) {
	log := filepath.Join(t.TempDir(), "fabricmanager.log")
	if err := os.WriteFile(log, []byte("[Mar 02 2026 10:00:00] [INFO] [tid 2201] Fabric Manager version 550.127.05 is running with the following configuration options\n"+
		"[Mar 02 2026 11:00:00] [ERROR] [tid 2290] detected NVSwitch fatal error 10003 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46\n"+
		"[Mar 02 2026 11:00:01] [ERROR] [tid 2290] detected NVSwitch non-fatal error 19084 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(abs, log) // parse reads its files under testdata
	if err != nil {
		t.Fatal(err)
	}
	_, evs := parse(t, "--nvswitches", "4", "smi/hgx-h100-topology.txt", "nvlink/h100-remote.txt", rel)
	var got []string
	for _, e := range evs {
		got = append(got, e.short())
	}
	want := []string{"FabricManagerNVSwitchError:SXID-10003:fatal:RESTART_BM@0000:07:00.0", "FabricManagerNVSwitchError:SXID-19084:nonfatal:RESTART_BM@0000:07:00.0"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", got, want)
	}
	if evs[0].Meta["port_type"] != PortAccess || evs[0].Meta["table_class"] != "always_fatal" {
		t.Errorf("10003 metadata %v", evs[0].Meta)
	}
}
