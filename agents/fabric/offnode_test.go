package fabric

import (
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestOffNodeFabricProbe: on a GB200/GB300 compute tray the NVLink fabric is
// managed by the rack's switch trays, not by a local FM: a GPU stuck in
// fabric registration is reported without the local FM's recovery
// (RESTART_BM, "restart the FM service").
func TestOffNodeFabricProbe(t *testing.T) {
	for _, tc := range []struct {
		name, product, code string
		action              datamodels.RecommendedAction
		localFM             bool
	}{
		{"GB200 compute tray", "NVIDIA GB200", "FABRIC-PROBE-TIMEOUT", datamodels.RecommendedAction_CONTACT_SUPPORT, false},
		{"GB300 compute tray", "NVIDIA GB300", "FABRIC-PROBE-TIMEOUT", datamodels.RecommendedAction_CONTACT_SUPPORT, false},
		{"GB200 compute tray, registration failed", "NVIDIA GB200", "FABRIC-PROBE-FAILURE", datamodels.RecommendedAction_CONTACT_SUPPORT, false},
		{"HGX H100", "NVIDIA H100 80GB HBM3", "FABRIC-PROBE-TIMEOUT", datamodels.RecommendedAction_RESTART_BM, true},
		{"HGX H100, registration failed", "NVIDIA H100 80GB HBM3", "FABRIC-PROBE-FAILURE", datamodels.RecommendedAction_RESTART_BM, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, nil)
			if tc.localFM {
				n.switches(h100Switches...)
				n.r.out["systemctl show"] = showActive
			} else {
				n.r.out["systemctl show"] = showAbsent
			}
			smi := testdata(t, "smi/h100-560-layout.txt")
			if tc.code == "FABRIC-PROBE-FAILURE" {
				smi = strings.Replace(strings.Replace(smi, "In Progress", "Completed", 1), "Status                            : N/A", "Status                            : Insufficient Resources", 1)
			}
			n.r.out["nvidia-smi -q"] = strings.ReplaceAll(smi, "NVIDIA H100 80GB HBM3", tc.product)
			var probe *datamodels.HealthEvent
			for _, ev := range append(n.poll(0), n.poll(6*time.Minute)...) {
				if ev.CheckName == CheckState {
					probe = ev
				}
			}
			if probe == nil || probe.ErrorCode[0] != tc.code || !probe.IsFatal {
				t.Fatalf("no fatal %s: %v", tc.code, probe)
			}
			rec := probe.Metadata["recovery"]
			if probe.RecommendedAction != tc.action || strings.Contains(strings.ToLower(rec), "restart the fm service") != tc.localFM {
				t.Fatalf("action %s, recovery %q", probe.RecommendedAction, rec)
			}
		})
	}
}
