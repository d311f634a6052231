package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultline/faultline/agents/gpu"
)

// TestGPUCheckExpectsMetadataGPUs: the agent gives the gpu check the
// node's GPUs of the GPU metadata (nic.metadata_path), so a GPU already
// gone when the agent starts (NVML does not list it) is reported lost
// (fatal DCGM_FR_FALLEN_OFF_BUS) at the first poll, not left out.
func TestGPUCheckExpectsMetadataGPUs(t *testing.T) {
	md := filepath.Join(t.TempDir(), "gpu_metadata.json")
	if err := os.WriteFile(md, []byte(`{"version":"1.0","gpus":[
		{"gpu_id":0,"uuid":"GPU-A","pci_address":"0000:1b:00.0","numa_node":0},
		{"gpu_id":1,"uuid":"GPU-B","pci_address":"0000:43:00.0","numa_node":0}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.NIC.MetadataPath = md
	cfg.GPU.Source = &gpu.Replay{Steps: []gpu.ReplayStep{{GPUs: []gpu.GPU{{Index: 0, UUID: "GPU-A", PCI: "00000000:1b:00.0"}}}}}
	chk, err := spec("gpu").New(&cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := chk.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var lost []string
	for _, ev := range evs {
		if !ev.GetIsHealthy() && ev.GetErrorCode()[0] == gpu.CodeGPULost && ev.GetIsFatal() {
			for _, e := range ev.GetEntitiesImpacted() {
				lost = append(lost, e.GetEntityType()+"="+e.GetEntityValue())
			}
		}
	}
	if got, want := strings.Join(lost, ","), "GPU=GPU-B,PCI=00000000:43:00.0"; got != want {
		t.Errorf("lost GPU events name %q, want %q; events %v", got, want, evs)
	}
}
