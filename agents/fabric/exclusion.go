package fabric

import (
	"regexp"
	"sort"
	"strings"
)

// GPUInformation is /proc/driver/nvidia/gpus/<bus id>/information: the
// driver's view of one GPU it found on the bus (open-gpu-kernel-modules
// kernel-open/nvidia/nv-procfs.c), including whether it is excluded.
type GPUInformation struct {
	PCI, UUID, Model string
	Excluded         bool
}

// ParseGPUInformation reads one information file.
func ParseGPUInformation(text string) GPUInformation {
	var g GPUInformation
	for _, l := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "Model":
			g.Model = v
		case "GPU UUID":
			g.UUID = v
		case "Bus Location":
			g.PCI = normPCI(v)
		case "GPU Excluded":
			g.Excluded = strings.EqualFold(v, "Yes")
		}
	}
	return g
}

// ExcludeList is what the node's configuration asks the drivers to
// exclude: NVreg_ExcludedGpus and NvSwitchExcludelist from
// /etc/modprobe.d/*.conf, the kernel command line or an insmod line.
type ExcludeList struct {
	GPUs, NVSwitches []string
	// Deprecated names the deprecated parameters found
	// (NVreg_GpuBlacklist, NvSwitchBlacklist).
	Deprecated []string
	// Sources names where each list came from.
	Sources []string
}

var reExcludeParam = regexp.MustCompile(`(?i)(?:^|[\s.])(NVreg_ExcludedGpus|NVreg_GpuBlacklist|(?:NVreg_)?NvSwitchExcludelist|(?:NVreg_)?NvSwitchBlacklist)=("[^"]*"|[^\s,]+(?:\s*,\s*[^\s,]+)*)`)

// Parse adds the exclusion parameters of a modprobe.d file,
// kernel command line or insmod line to l.
func (l *ExcludeList) Parse(source, text string) {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, m := range reExcludeParam.FindAllStringSubmatch(line, -1) {
			name := m[1]
			var ids []string
			for _, id := range strings.Split(strings.Trim(m[2], `"`), ",") {
				if id = strings.TrimSpace(id); id != "" {
					ids = append(ids, id)
				}
			}
			low := strings.ToLower(name)
			if strings.Contains(low, "blacklist") {
				l.Deprecated = appendUniq(l.Deprecated, name)
			}
			if strings.Contains(low, "nvswitch") {
				l.NVSwitches = appendUniq(l.NVSwitches, ids...)
			} else {
				l.GPUs = appendUniq(l.GPUs, ids...)
			}
			l.Sources = appendUniq(l.Sources, source)
		}
	}
}

// ParseExcludedGPUs reads `nvidia-smi -B` (--list-excluded-gpus): every
// GPU UUID (and bus id) it prints is an excluded GPU.
func ParseExcludedGPUs(out string) []GPUInformation {
	var gs []GPUInformation
	for _, l := range strings.Split(out, "\n") {
		u := reUUID.FindString(l)
		if u == "" {
			continue
		}
		g := GPUInformation{UUID: u, Excluded: true}
		if m := reAnyPCI.FindString(l); m != "" {
			g.PCI = normPCI(m)
		}
		gs = append(gs, g)
	}
	return gs
}

var reAnyPCI = regexp.MustCompile(`[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]`)

func appendUniq(s []string, v ...string) []string {
	for _, x := range v {
		found := false
		for _, y := range s {
			if strings.EqualFold(x, y) {
				found = true
				break
			}
		}
		if !found {
			s = append(s, x)
		}
	}
	sort.Strings(s)
	return s
}
