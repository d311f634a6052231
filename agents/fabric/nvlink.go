package fabric

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/faultline/faultline/schemas/events"
)

// NVLinkGPU is one GPU of `nvidia-smi nvlink -s` / `-R` output.
type NVLinkGPU struct {
	Index int
	Name  string
	UUID  string
	// Links by local link number.
	Links map[int]*NVLink
}

// NVLink is one GPU link: its state (nvlink -s) and the device at its
// other end (nvlink -R).
type NVLink struct {
	Link int
	// Status is the nvlink -s text: a speed ("26.562 GB/s") or
	// "<inactive>"; empty when only -R was read.
	Status string
	// RemotePCI and RemoteLink name the port at the other end: an NVSwitch
	// port (access NVLink) or a peer GPU's link.
	RemotePCI  string
	RemoteLink int
}

// Inactive reports a link nvidia-smi shows as inactive.
func (l *NVLink) Inactive() bool { return strings.Contains(strings.ToLower(l.Status), "inactive") }

var (
	reNVLinkGPU    = regexp.MustCompile(`^GPU (\d+): (.*?)(?: \(UUID: (GPU-[0-9a-fA-F-]+)\))?$`)
	reNVLinkStatus = regexp.MustCompile(`^Link (\d+): (.+)$`)
	reNVLinkRemote = regexp.MustCompile(`^Link (\d+): Remote Device ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]): Link (\d+)$`)
)

// ParseNVLink reads `nvidia-smi nvlink -s` (status) and/or `nvidia-smi
// nvlink -R` (remote link info) output into gpus, merging by GPU index; it
// returns the updated list.
func ParseNVLink(out string, gpus []*NVLinkGPU) []*NVLinkGPU {
	byIndex := map[int]*NVLinkGPU{}
	for _, g := range gpus {
		byIndex[g.Index] = g
	}
	var cur *NVLinkGPU
	for _, raw := range strings.Split(out, "\n") {
		l := strings.TrimSpace(strings.TrimRight(raw, "\r"))
		if l == "" {
			continue
		}
		if m := reNVLinkGPU.FindStringSubmatch(l); m != nil {
			i, _ := strconv.Atoi(m[1])
			cur = byIndex[i]
			if cur == nil {
				cur = &NVLinkGPU{Index: i, Links: map[int]*NVLink{}}
				byIndex[i] = cur
				gpus = append(gpus, cur)
			}
			cur.Name = m[2]
			if m[3] != "" {
				cur.UUID = m[3]
			}
			continue
		}
		if cur == nil {
			continue
		}
		if m := reNVLinkRemote.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			rl, _ := strconv.Atoi(m[3])
			lk := cur.link(n)
			lk.RemotePCI, lk.RemoteLink = normPCI(m[2]), rl
			continue
		}
		if m := reNVLinkStatus.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			if strings.HasPrefix(m[2], "Remote Device") {
				continue // "Remote Device: N/A" of an inactive link
			}
			cur.link(n).Status = m[2]
		}
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	return gpus
}

func (g *NVLinkGPU) link(n int) *NVLink {
	if g.Links == nil {
		g.Links = map[int]*NVLink{}
	}
	l := g.Links[n]
	if l == nil {
		l = &NVLink{Link: n, RemoteLink: -1}
		g.Links[n] = l
	}
	return l
}

// InactiveLinks lists the GPU's inactive links in order.
func (g *NVLinkGPU) InactiveLinks() []int {
	var out []int
	for n, l := range g.Links {
		if l.Inactive() {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

// TopoMatrix is the GPU×GPU part of `nvidia-smi topo -m`: the number of
// NVLinks between two GPUs ("NV12" → 12), by GPU index.
type TopoMatrix struct {
	GPUs  int
	Links map[[2]int]int
}

// ParseTopoMatrix reads the GPU rows of `nvidia-smi topo -m`.
func ParseTopoMatrix(out string) (*TopoMatrix, error) {
	var header []string
	m := &TopoMatrix{Links: map[[2]int]int{}}
	for _, raw := range strings.Split(out, "\n") {
		l := stripANSI(strings.TrimRight(raw, "\r"))
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if header == nil {
			if strings.HasPrefix(f[0], "GPU") && len(f) > 1 && strings.HasPrefix(f[1], "GPU") {
				header = f
			} else if f[0] == "GPU0" {
				header = f
			}
			continue
		}
		if !strings.HasPrefix(f[0], "GPU") {
			continue
		}
		row, err := strconv.Atoi(strings.TrimPrefix(f[0], "GPU"))
		if err != nil {
			continue
		}
		if row+1 > m.GPUs {
			m.GPUs = row + 1
		}
		for i, cell := range f[1:] {
			if i >= len(header) || !strings.HasPrefix(header[i], "GPU") {
				break
			}
			col, err := strconv.Atoi(strings.TrimPrefix(header[i], "GPU"))
			if err != nil {
				break
			}
			if strings.HasPrefix(cell, "NV") {
				n, err := strconv.Atoi(strings.TrimPrefix(cell, "NV"))
				if err != nil {
					return nil, fmt.Errorf("topo -m: GPU%d/GPU%d: bad cell %q", row, col, cell)
				}
				m.Links[[2]int{row, col}] = n
			}
		}
	}
	if header == nil {
		return nil, fmt.Errorf("topo -m: no GPU header line")
	}
	return m, nil
}

// MaxLinks is the largest NV# of the matrix (the platform's links per GPU
// pair through the NVSwitches).
func (m *TopoMatrix) MaxLinks() int {
	max := 0
	for _, n := range m.Links {
		if n > max {
			max = n
		}
	}
	return max
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*m`)

func stripANSI(s string) string { return ansi.ReplaceAllString(s, "") }

// Topology maps NVSwitch ports to the GPUs wired to them, from the GPUs'
// `nvidia-smi nvlink -R` output: every GPU link whose remote device is not
// a GPU is an access NVLink to that NVSwitch port. A port of a known
// NVSwitch that no GPU link reaches is a trunk NVLink on a platform that
// has them (HGX A100 with two baseboards) and unknown otherwise.
type Topology struct {
	// Access maps "switchPCI/port" to the GPU and its local link.
	Access   map[string]AccessLink
	Switches map[string]bool
}

// AccessLink is the GPU end of an access NVLink.
type AccessLink struct {
	GPUIndex  int
	GPUUUID   string
	GPUPCI    string
	LocalLink int
}

// Port types of an NVSwitch port.
const (
	PortAccess  = "access"
	PortTrunk   = "trunk"
	PortUnknown = "unknown"
)

// BuildTopology builds the port map from nvlink -R data. gpuPCIs (PCI
// addresses of the node's GPUs, from nvidia-smi -q) tells GPU peers from
// NVSwitches; gpuPCIByIndex fills the GPU end's address.
func BuildTopology(gpus []*NVLinkGPU, gpuPCIs map[string]bool, gpuPCIByUUID map[string]string) *Topology {
	t := &Topology{Access: map[string]AccessLink{}, Switches: map[string]bool{}}
	for _, g := range gpus {
		for _, l := range g.Links {
			if l.RemotePCI == "" || gpuPCIs[events.NormalizePCI(l.RemotePCI, false)] {
				continue
			}
			sw := events.NormalizePCI(l.RemotePCI, false)
			t.Switches[sw] = true
			t.Access[sw+"/"+strconv.Itoa(l.RemoteLink)] = AccessLink{GPUIndex: g.Index, GPUUUID: g.UUID,
				GPUPCI: gpuPCIByUUID[g.UUID], LocalLink: l.Link}
		}
	}
	return t
}

// Port returns what is at an NVSwitch port.
func (t *Topology) Port(switchPCI string, port int, hasTrunks bool) (AccessLink, string) {
	if t == nil || port < 0 {
		return AccessLink{}, PortUnknown
	}
	sw := events.NormalizePCI(switchPCI, false)
	if a, ok := t.Access[sw+"/"+strconv.Itoa(port)]; ok {
		return a, PortAccess
	}
	if hasTrunks && t.Switches[sw] {
		return AccessLink{}, PortTrunk
	}
	return AccessLink{}, PortUnknown
}

// SwitchLinks is the map kmsg.StaticTopology.SwitchLinks takes
// ("switchPCI/link" → GPU UUID), so kernel-log SXids name their GPU too.
func (t *Topology) SwitchLinks() map[string]string {
	out := map[string]string{}
	if t == nil {
		return out
	}
	for k, a := range t.Access {
		if a.GPUUUID != "" {
			out[k] = a.GPUUUID
		}
	}
	return out
}

// CollectSwitchLinks runs `nvidia-smi -q` and `nvidia-smi nvlink -R` and
// returns the NVSwitch port map as kmsg.StaticTopology.SwitchLinks takes
// it, so the kernel-log SXids of the kmsg check name their GPU. A host
// without nvidia-smi or NVSwitches gets an empty map.
func CollectSwitchLinks(ctx context.Context, r Runner, nvidiaSMI string) (map[string]string, error) {
	if r == nil {
		r = ExecRunner{}
	}
	q, err := runSMI(ctx, r, nvidiaSMI, "-q")
	if errors.Is(err, exec.ErrNotFound) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s -q: %w", nvidiaSMI, err)
	}
	links, err := runSMI(ctx, r, nvidiaSMI, "nvlink", "-R")
	if err != nil {
		return nil, fmt.Errorf("%s nvlink -R: %w", nvidiaSMI, err)
	}
	pcis, byUUID := map[string]bool{}, map[string]string{}
	for _, g := range ParseSMI(string(q)).GPUs {
		if g.PCI != "" {
			pcis[events.NormalizePCI(g.PCI, false)] = true
			byUUID[g.UUID] = g.PCI
		}
	}
	return BuildTopology(ParseNVLink(string(links), nil), pcis, byUUID).SwitchLinks(), nil
}
