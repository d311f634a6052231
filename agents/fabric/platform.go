package fabric

import "strings"

// Platforms the guide distinguishes ("" when unknown).
const (
	PlatformA100 = "a100" // HGX/DGX A100 (and A800): 6 NVSwitches per baseboard, two baseboards joined by trunk NVLinks
	PlatformH100 = "h100" // HGX/DGX H100, H200, H800, H20: 4 NVSwitches, no trunk links
	PlatformB200 = "b200" // HGX/DGX B200, B100: 2 NVSwitches behind a CX7 bridge, NVLSM, no SXids
)

// PlatformInfo is what the check knows of the node's fabric hardware.
type PlatformInfo struct {
	// Name is one of the Platform* constants, "" when unknown.
	Name string
	// NVSwitches is the number of NVSwitches the NVSwitch driver bound
	// (-1 unknown); 0 on HGX B200, whose switches sit behind the CX7 bridge.
	NVSwitches int
	// PCISwitches is the number of NVSwitch functions on the PCI bus,
	// bound or not (-1 unknown): more than NVSwitches when the driver did
	// not bind some (or any) of them.
	PCISwitches int
	// NVLinkBridges are the CX7 NVLink management functions (VPD SMDL
	// SW_MNG) of an HGX B200 baseboard.
	NVLinkBridges int
	// GPUs is the number of GPUs seen (-1 unknown).
	GPUs int
	// OffNodeFabric: the GPUs' NVLink fabric is managed off this node
	// (GB200/GB300 NVL72 compute tray: FM runs on the NVLink switch
	// trays), so the local FM's recovery does not apply.
	OffNodeFabric bool
}

// HasFabric reports a host that has NVSwitches for FM to manage: switches
// on PCI (bound by the NVSwitch driver or not: switches it does not bind
// are a fabric fault, not a host without a fabric), or the NVLink
// management bridge of a fourth-generation baseboard. A host without
// either (a PCIe board, a cloud VM whose fabric the host manages) does not
// need FM.
func (p PlatformInfo) HasFabric() bool {
	return p.NVSwitches > 0 || p.PCISwitches > 0 || p.NVLinkBridges > 0 || p.Name == PlatformB200
}

// Baseboards is 2 for an A100 system with 12 NVSwitches or 16 GPUs.
func (p PlatformInfo) Baseboards() int {
	if p.Name == PlatformA100 && (p.NVSwitches > 6 || p.PCISwitches > 6 || p.GPUs > 8) {
		return 2
	}
	return 1
}

// HasTrunks reports trunk NVLinks (NVSwitch to NVSwitch between two
// baseboards): HGX A100 with two baseboards only.
func (p PlatformInfo) HasTrunks() bool { return p.Name == PlatformA100 && p.Baseboards() == 2 }

// ExpectedNVSwitches is the PCI NVSwitch count of the platform (-1 unknown).
func (p PlatformInfo) ExpectedNVSwitches() int {
	switch p.Name {
	case PlatformA100:
		return 6 * p.Baseboards()
	case PlatformH100:
		return 4
	case PlatformB200:
		return 0
	}
	return -1
}

// ExpectedGPUs is the GPU count of the platform's baseboards (-1 unknown).
func (p PlatformInfo) ExpectedGPUs() int {
	if p.Name == "" {
		return -1
	}
	return 8 * p.Baseboards()
}

// LinksPerGPU is the NVLinks of one GPU (A100 12, H100 and B200 18).
func (p PlatformInfo) LinksPerGPU() int {
	switch p.Name {
	case PlatformA100:
		return 12
	case PlatformH100, PlatformB200:
		return 18
	}
	return 0
}

// platformOfProduct names the platform of an nvidia-smi product name.
func platformOfProduct(product string) string {
	p := strings.ToUpper(product)
	switch {
	case strings.Contains(p, "GB200"), strings.Contains(p, "GB300"):
		return "" // multi-node NVL72: FM runs on the switch trays, not here
	case strings.Contains(p, "PCIE"), strings.Contains(p, "NVL") && !strings.Contains(p, "NVLINK"):
		return "" // PCIe boards and H100 NVL pairs have no NVSwitch
	case strings.Contains(p, "A100"), strings.Contains(p, "A800"):
		return PlatformA100
	case strings.Contains(p, "H100"), strings.Contains(p, "H200"), strings.Contains(p, "H800"), strings.Contains(p, "H20"):
		return PlatformH100
	case strings.Contains(p, "B200"), strings.Contains(p, "B100"), strings.Contains(p, "B300"):
		return PlatformB200
	}
	return ""
}

// DetectPlatform combines what the node shows: the GPU product name, the
// PCI NVSwitch count and the NVLink management bridges. A name given in
// override wins.
func DetectPlatform(override, product string, nvswitches, bridges, gpus int) PlatformInfo {
	p := PlatformInfo{NVSwitches: nvswitches, PCISwitches: -1, NVLinkBridges: bridges, GPUs: gpus}
	if override == "" || override == "auto" {
		up := strings.ToUpper(product)
		p.OffNodeFabric = strings.Contains(up, "GB200") || strings.Contains(up, "GB300")
	}
	switch {
	case override != "" && override != "auto":
		p.Name = override
	case bridges > 0:
		p.Name = PlatformB200
	default:
		p.Name = platformOfProduct(product)
		if p.Name == "" {
			switch nvswitches {
			case 6, 12:
				p.Name = PlatformA100
			case 4:
				p.Name = PlatformH100
			}
		}
	}
	return p
}
