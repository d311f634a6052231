package nic

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/faultline/faultline/agents/topology"
)

// Role is a NIC's role (§4.2.3).
type Role string

// Roles. Compute, Storage and Override are monitored.
const (
	RoleCompute    Role = "compute"
	RoleStorage    Role = "storage"
	RoleManagement Role = "management"
	// RoleOverride: monitored because nic_inclusion_regex_override names it.
	RoleOverride Role = "override"
	// RoleExcluded: dropped by nic_exclusion_regex or not named by the override.
	RoleExcluded Role = "excluded"
	// RoleVF: an SR-IOV virtual function, skipped unconditionally (§8).
	RoleVF Role = "vf"
	// RoleUnsupported: not a Mellanox device (§10).
	RoleUnsupported Role = "unsupported"
)

// Monitored reports whether devices of this role are monitored.
func (r Role) Monitored() bool {
	return r == RoleCompute || r == RoleStorage || r == RoleOverride
}

// BlueFieldHCATypes are the BlueField DPU HCA types excluded as management
// in the all-SYS branch (§4.2.4).
var BlueFieldHCATypes = []string{"MT41682", "MT41686", "MT41692"}

// classifier holds the startup facts of classification.
type classifier struct {
	gpuNUMA      map[int]bool
	topo         map[string][]string
	defaultRoute []string // IB devices carrying the default route
	exclude      []*regexp.Regexp
	include      []*regexp.Regexp
}

func matchAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

// classify applies §4 (and §8, §10, §12.1) to one device and returns its
// role and why.
func (c *classifier) classify(d *Device) (Role, string) {
	if d.IsVF {
		return RoleVF, "SR-IOV virtual function (device/physfn present)"
	}
	if len(c.include) > 0 {
		if matchAny(c.include, d.Name) {
			return RoleOverride, "named by nic_inclusion_regex_override"
		}
		return RoleExcluded, "not named by nic_inclusion_regex_override"
	}
	if matchAny(c.exclude, d.Name) {
		return RoleExcluded, "matches nic_exclusion_regex"
	}
	if d.Vendor != "mellanox" {
		return RoleUnsupported, "not a Mellanox device (name is not mlx5_N and driver is not mlx5_core)"
	}
	if slices.Contains(c.defaultRoute, d.Name) {
		return RoleManagement, "carries the host's default route"
	}
	if d.NUMANode < 0 {
		return RoleManagement, "NUMA node unknown (-1): excluded rather than risk a false REPLACE_VM"
	}
	if !c.gpuNUMA[d.NUMANode] {
		return RoleManagement, fmt.Sprintf("NUMA node %d has no GPU", d.NUMANode)
	}
	levels, known := c.topo[d.Name]
	if slices.Contains(levels, "PIX") || slices.Contains(levels, "PXB") {
		return RoleCompute, "PIX/PXB to a GPU"
	}
	if d.LinkLayer == "InfiniBand" {
		return RoleCompute, "InfiniBand link layer, no PIX/PXB"
	}
	if slices.Contains(levels, "NODE") || slices.Contains(levels, "PHB") {
		return RoleStorage, "Ethernet, NODE/PHB to a GPU"
	}
	if slices.Contains(BlueFieldHCATypes, d.HCAType) {
		return RoleManagement, fmt.Sprintf("BlueField DPU (%s) with no PCIe relationship to a GPU", d.HCAType)
	}
	if !known {
		return RoleStorage, "Ethernet, not in nic_topology: all-SYS fallback"
	}
	return RoleStorage, "Ethernet, all-SYS fallback"
}

// newClassifier builds the classifier; md may be nil only with an
// inclusion override.
func newClassifier(cfg *Config, md *topology.Metadata, defaultRoute []string) (*classifier, error) {
	excl, err := compileList(cfg.ExclusionRegex)
	if err != nil {
		return nil, fmt.Errorf("nic.nic_exclusion_regex: %w", err)
	}
	incl, err := compileList(cfg.InclusionRegexOverride)
	if err != nil {
		return nil, fmt.Errorf("nic.nic_inclusion_regex_override: %w", err)
	}
	c := &classifier{exclude: excl, include: incl, defaultRoute: defaultRoute, gpuNUMA: map[int]bool{}}
	if md != nil {
		c.gpuNUMA = md.NUMASet()
		c.topo = md.NICTopology
	}
	return c, nil
}

// ErrMetadata is returned by New when the GPU metadata is missing or lacks
// what classification needs; the agent must not start (§4, §12.2).
var ErrMetadata = fmt.Errorf("GPU metadata unusable")

// loadMetadata enforces the hard dependency on the metadata collector.
func loadMetadata(path string) (*topology.Metadata, error) {
	md, err := topology.Load(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w (the metadata collector, `faultline-agent topology collect`, must write it before the NIC check starts)", ErrMetadata, err)
	}
	if len(md.NICTopology) == 0 {
		return nil, fmt.Errorf("%w: %s has no nic_topology: cannot classify NIC roles", ErrMetadata, path)
	}
	if len(md.NUMASet()) == 0 {
		return nil, fmt.Errorf("%w: %s has no GPU with a known numa_node: the NUMA gate cannot tell management NICs from compute NICs", ErrMetadata, path)
	}
	return md, nil
}
