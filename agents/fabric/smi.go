package fabric

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// GPUFabric is one GPU's part of `nvidia-smi -q`: identity and its Fabric
// section (State, Status, CliqueId, ClusterUUID and the Health block).
type GPUFabric struct {
	// Index is the GPU's position in the output (0-based).
	Index int
	// PCI is the bus id of the GPU header ("0000:18:00.0"), empty in a grep
	// fragment without one.
	PCI, UUID, Product string
	// ModuleID is "GPU Module ID"/"Module ID" (H100 and later: the FM
	// physical id of the GPU), -1 when absent.
	ModuleID int
	// MIG is "MIG Mode / Current" (Enabled, Disabled, N/A).
	MIG string
	// HasFabric: a Fabric section was seen.
	HasFabric             bool
	State, Status         string
	CliqueID, ClusterUUID string
	// Health block (570+ drivers; Summary nested under Health since 580).
	Summary, Bandwidth     string
	RouteRecovery          string
	RouteUnhealthy         string
	AccessTimeoutRecovery  string
	IncorrectConfiguration string
	// Fragment: the GPU came from grep output without a "GPU <bus id>"
	// header; it is known by its position.
	Fragment bool
}

// ID is the GPU's identity for entities: its UUID, else its PCI address,
// else "index:N".
func (g *GPUFabric) ID() string {
	switch {
	case g.UUID != "":
		return g.UUID
	case g.PCI != "":
		return g.PCI
	}
	return "index:" + strconv.Itoa(g.Index)
}

// NoFabric reports a GPU that takes part in no NVLink fabric: no Fabric
// section, or a State of N/A or Not Supported (PCIe boards, a single-GPU
// VM). Status is not looked at: "In Progress" comes with "Status: N/A".
func (g *GPUFabric) NoFabric() bool {
	if !g.HasFabric {
		return true
	}
	s := strings.ToLower(g.State)
	return s == "" || s == "n/a" || s == "not supported" || s == "[not supported]"
}

// SMIReport is a parsed `nvidia-smi -q` output (or grep fragments of one).
type SMIReport struct {
	Timestamp     time.Time
	DriverVersion string
	AttachedGPUs  int
	GPUs          []GPUFabric
}

// gpuHeader is a GPU's header line in nvidia-smi -q: "GPU 00000000:18:00.0".
var gpuHeader = regexp.MustCompile(`^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$`)

// smiTimeLayout is the "Timestamp" line of nvidia-smi -q.
const smiTimeLayout = "Mon Jan 2 15:04:05 2006"

// ParseSMI reads `nvidia-smi -q` output. It accepts the layouts of the
// 535-580 drivers: any key padding, the Fabric section with or without
// CliqueId/ClusterUUID and a Health block (with Summary first or last),
// CRLF line ends, and grep output (`nvidia-smi -q | grep -A N Fabric`):
// blocks separated by "--" lines and without "GPU <bus id>" headers, each
// Fabric block then being the next GPU in order.
func ParseSMI(out string) *SMIReport {
	rep := &SMIReport{}
	var cur *GPUFabric
	var path []string
	var indents []int
	newGPU := func(pci string, fragment bool) {
		rep.GPUs = append(rep.GPUs, GPUFabric{Index: len(rep.GPUs), PCI: pci, ModuleID: -1, Fragment: fragment})
		cur = &rep.GPUs[len(rep.GPUs)-1]
		path, indents = nil, nil
	}
	for _, raw := range strings.Split(out, "\n") {
		raw = strings.TrimRight(raw, "\r")
		line := strings.TrimSpace(raw)
		if line == "" {
			continue
		}
		ind := len(raw) - len(strings.TrimLeft(raw, " \t"))
		if line == "--" {
			cur, path, indents = nil, nil, nil
			continue
		}
		if ind == 0 {
			if m := gpuHeader.FindStringSubmatch(line); m != nil {
				newGPU(normPCI(m[1]), false)
				continue
			}
			if k, v, ok := strings.Cut(line, ":"); ok {
				k, v = strings.TrimSpace(k), strings.TrimSpace(v)
				switch k {
				case "Timestamp":
					if t, err := time.ParseInLocation(smiTimeLayout, strings.Join(strings.Fields(v), " "), time.UTC); err == nil {
						rep.Timestamp = t
					}
				case "Driver Version":
					rep.DriverVersion = v
				case "Attached GPUs":
					rep.AttachedGPUs, _ = strconv.Atoi(v)
				}
			}
			if !strings.HasPrefix(line, "Fabric") {
				cur, path, indents = nil, nil, nil
				continue
			}
		}
		for len(indents) > 0 && indents[len(indents)-1] >= ind {
			indents = indents[:len(indents)-1]
			path = path[:len(path)-1]
		}
		k, v, hasColon := strings.Cut(line, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		section := !hasColon || (v == "" && !strings.Contains(line, " : ") && !strings.HasSuffix(line, " :"))
		if section {
			if line == "Fabric" && len(path) == 0 && (cur == nil || cur.HasFabric) {
				// A Fabric block with no GPU header (grep output), or a
				// second Fabric block under the same header: the next GPU.
				newGPU("", true)
			}
			if cur != nil && line == "Fabric" && len(path) == 0 {
				cur.HasFabric = true
			}
			path = append(path, line)
			indents = append(indents, ind)
			continue
		}
		if cur == nil {
			if k == "GPU UUID" || k == "Bus Id" {
				// A grep fragment that starts with identity lines.
				newGPU("", true)
			} else {
				continue
			}
		}
		sec := strings.Join(path, "/")
		switch {
		case sec == "" && k == "GPU UUID":
			cur.UUID = v
		case sec == "" && k == "Product Name":
			cur.Product = v
		case (sec == "" || sec == "Platform Info") && (k == "Module ID" || k == "GPU Module ID" || k == "Module Id"):
			if n, err := strconv.Atoi(v); err == nil {
				cur.ModuleID = n
			}
		case sec == "MIG Mode" && k == "Current":
			cur.MIG = v
		case sec == "PCI" && k == "Bus Id" && cur.PCI == "":
			cur.PCI = normPCI(v)
		case sec == "Fabric" && k == "State":
			cur.State = v
		case sec == "Fabric" && k == "Status":
			cur.Status = v
		case sec == "Fabric" && (k == "CliqueId" || k == "Clique ID"):
			cur.CliqueID = v
		case sec == "Fabric" && (k == "ClusterUUID" || k == "Cluster UUID"):
			cur.ClusterUUID = v
		case strings.HasPrefix(sec, "Fabric") && k == "Summary":
			cur.Summary = v
		case sec == "Fabric/Health" && k == "Bandwidth":
			cur.Bandwidth = v
		case sec == "Fabric/Health" && strings.HasPrefix(k, "Route Recovery"):
			cur.RouteRecovery = v
		case sec == "Fabric/Health" && k == "Route Unhealthy":
			cur.RouteUnhealthy = v
		case sec == "Fabric/Health" && k == "Access Timeout Recovery":
			cur.AccessTimeoutRecovery = v
		case sec == "Fabric/Health" && k == "Incorrect Configuration":
			cur.IncorrectConfiguration = v
		}
	}
	return rep
}

// isTrue reads a health flag ("True", "Yes").
func isTrue(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	return s == "true" || s == "yes"
}

// isSet reads a value that names a condition when it is neither empty,
// N/A, None nor False (Incorrect Configuration).
func isSet(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "n/a", "none", "false", "not supported", "[not supported]":
		return false
	}
	return true
}
