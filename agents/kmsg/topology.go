package kmsg

import "strings"

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
		if NormalizePCI(k, false) == NormalizePCI(pci, false) {
			return v
		}
	}
	return ""
}

// GPUAtNVSwitchLink implements Topology.
func (t StaticTopology) GPUAtNVSwitchLink(sw string, link int) string {
	for k, v := range t.SwitchLinks {
		p, l, ok := strings.Cut(k, "/")
		if ok && NormalizePCI(p, false) == NormalizePCI(sw, false) && l == itoa(link) {
			return v
		}
	}
	return ""
}

// NICName implements Topology.
func (t StaticTopology) NICName(pci string) string {
	for k, v := range t.NICs {
		if NormalizePCI(k, true) == NormalizePCI(pci, true) {
			return v
		}
	}
	return ""
}

// NormalizePCI returns a PCI address as "dddd:bb:dd" (or "dddd:bb:dd.f" with
// keepFunc), lower case, with the domain cut or padded to four digits:
// "00000000:3B:00.0", "0000:3b:00" and "3b:00.0" all become "0000:3b:00".
func NormalizePCI(s string, keepFunc bool) string {
	if canonicalPCI(s, keepFunc) {
		return s
	}
	s = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(s, "PCI:")))
	fn := ""
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		fn = s[i:]
		s = s[:i]
	}
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		parts = append([]string{"0000"}, parts...)
	case 3:
	default:
		return s + fn
	}
	d := parts[0]
	if len(d) > 4 {
		d = d[len(d)-4:]
	}
	for len(d) < 4 {
		d = "0" + d
	}
	out := d + ":" + parts[1] + ":" + parts[2]
	if keepFunc {
		if fn == "" {
			fn = ".0"
		}
		out += fn
	}
	return out
}

// canonicalPCI reports whether s is already in NormalizePCI's form.
func canonicalPCI(s string, keepFunc bool) bool {
	n := 10
	if keepFunc {
		n = 12
	}
	if len(s) != n || s[4] != ':' || s[7] != ':' || (keepFunc && s[10] != '.') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 4 || i == 7 || (keepFunc && i == 10) {
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
