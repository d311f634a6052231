package kmsg

import (
	"strings"

	"github.com/faultline/faultline/schemas/events"
)

// Topology attributes PCI addresses and NVSwitch links to devices. The agent
// passes one built from the topology metadata (gpu_metadata.json); GPU UUIDs
// the driver prints ("NVRM: GPU at PCI:… GPU-…") are learned by the parser
// itself and take precedence.
type Topology interface {
	// GPUUUID returns the UUID of the GPU at a PCI address ("" if unknown).
	GPUUUID(pciBusID string) string
	// GPUAtNVSwitchLink returns the UUID of the GPU wired to an NVSwitch
	// port ("" if unknown).
	GPUAtNVSwitchLink(switchPCI string, link int) string
	// NICName returns the RDMA device name ("mlx5_0") of a PCI function
	// ("" if unknown).
	NICName(pciBusID string) string
}

// StaticTopology is a Topology from fixed maps, keyed by addresses in any
// form NormalizePCI accepts.
type StaticTopology struct {
	// GPUs maps a GPU's PCI address to its UUID.
	GPUs map[string]string
	// SwitchLinks maps "switchPCI/link" to the UUID of the GPU on that port.
	SwitchLinks map[string]string
	// NICs maps a NIC function's PCI address to its device name.
	NICs map[string]string
}

// GPUUUID implements Topology.
func (t StaticTopology) GPUUUID(pci string) string {
	for k, v := range t.GPUs {
		if events.NormalizePCI(k, false) == events.NormalizePCI(pci, false) {
			return v
		}
	}
	return ""
}

// GPUAtNVSwitchLink implements Topology.
func (t StaticTopology) GPUAtNVSwitchLink(sw string, link int) string {
	for k, v := range t.SwitchLinks {
		p, l, ok := strings.Cut(k, "/")
		if ok && events.NormalizePCI(p, false) == events.NormalizePCI(sw, false) && l == itoa(link) {
			return v
		}
	}
	return ""
}

// NICName implements Topology.
func (t StaticTopology) NICName(pci string) string {
	for k, v := range t.NICs {
		if events.NormalizePCI(k, true) == events.NormalizePCI(pci, true) {
			return v
		}
	}
	return ""
}
