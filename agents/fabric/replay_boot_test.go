package fabric

import (
	"fmt"
	"testing"
)

// TestReplayedStandingLinesOfAnEarlierBoot: with no usable saved position
// (no state file, the log rotated or truncated) the agent replays the FM
// log's tail; the lines of an earlier boot that open standing conditions
// (an NVSwitch that failed to initialize, with its HA consequence, an
// exclusion, an access link training failure) are not raised on the
// freshly booted node, like that boot's SXids; this boot's are.
func TestReplayedStandingLinesOfAnEarlierBoot(t *testing.T) {
	const (
		nvswitch = "[%s] [ERROR] [tid 9] NVSwitch pci bus id 00000000:07:00.0 failed to initialize"
		excluded = "[%s] [INFO] [tid 9] NVSwitch pci bus id 00000000:08:00.0 is excluded by the NvSwitchExcludelist"
		training = "[%s] [ERROR] [tid 9] GPU physical id 2 access link training failed"
		nvlsm    = "[%s] [ERROR] [tid 9] failed to connect to NVLSM over fm_sm_ipc"
		gpu2     = "GPU-cc7d93b3-73f8-5028-287a-9e617839550e" // module id 2 of hgx-h100-topology.txt
	)
	for _, tc := range []struct {
		name string
		line string
		want string // of this boot's line
	}{
		{"NVSwitch failure", nvswitch, "FabricManagerInit:FM-INIT-NVSWITCH-FAILURE:nonfatal@0000:07:00.0 FabricManagerHAMode:FM-HA-NVSWITCH-UNAVAILABLE:fatal@0000:07:00.0"},
		{"NVSwitch excluded", excluded, "NVSwitchExclusion:NVSWITCH-EXCLUDED:nonfatal@0000:08:00.0 FabricManagerHAMode:FM-HA-NVSWITCH-UNAVAILABLE:fatal@0000:08:00.0"},
		{"access link training", training, "FabricManagerNVLinkTraining:FM-INIT-ACCESS-LINK-TRAINING-FAILURE:nonfatal@" + gpu2 +
			" FabricManagerHAMode:FM-HA-ACCESS-NVLINK-INACTIVE:nonfatal@" + gpu2 + " GPUExclusion:GPU-EXCLUSION-CANDIDATE:nonfatal@" + gpu2},
		{"NVLSM", nvlsm, "NVLSMService:NVLSM-IPC-FAILURE:fatal@0000:05:00.0"},
	} {
		for _, at := range []struct {
			name, time string
			this       bool
		}{
			{"earlier boot", "Oct 27 2024 09:00:00", false},
			{"this boot", "Oct 28 2024 10:10:00", true},
		} {
			t.Run(tc.name+"/"+at.name, func(t *testing.T) {
				n := h100Node(t, nil)
				n.healthy()
				n.write("proc/stat", "cpu  1 2 3 4\nbtime 1730109600\n") // 2024-10-28 10:00:00 UTC
				n.write("fabricmanager.log", fmt.Sprintf(tc.line, at.time)+"\n")
				c, err := New(n.c.cfg) // reads the boot's start
				if err != nil {
					t.Fatal(err)
				}
				n.c = c
				got := shorts(n.poll(0))
				want := ""
				if at.this {
					want = tc.want
				}
				if got != want {
					t.Fatalf("%q\nwant %q", got, want)
				}
			})
		}
	}
}
