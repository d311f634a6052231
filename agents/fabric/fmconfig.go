package fabric

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// FMConfig is the part of fabricmanager.cfg the check needs: the fabric
// mode and the high-availability failure modes. Integer items the file
// does not set are -1 (the guide's defaults are applied by Mode/Value).
type FMConfig struct {
	// Values holds every KEY=VALUE item.
	Values map[string]string
	// FabricMode is FABRIC_MODE (or SHARED_FABRIC_MODE, the name Table 18
	// uses): 0 bare metal / full passthrough, 1 Shared NVSwitch, 2 vGPU.
	FabricMode             int
	AccessLinkFailureMode  int
	TrunkLinkFailureMode   int
	NVSwitchFailureMode    int
	AbortCUDAJobsOnFMExit  int
	StayResidentOnFailures int
	// LogFile is LOG_FILE_NAME.
	LogFile string
	// LogUseSyslog is LOG_USE_SYSLOG (1: FM logs to syslog, not its file;
	// any value but 0 reads as 1; -1 unset).
	LogUseSyslog int
	// PartitionFile is SHARED_PARTITION_DEFINITION_FILE (custom partitions).
	PartitionFile string
	// Problems are items with values the guide does not define.
	Problems []string
}

// ParseFMConfig reads fabricmanager.cfg: KEY=VALUE lines, '#' comments.
func ParseFMConfig(text string) *FMConfig {
	c := &FMConfig{Values: map[string]string{}}
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(strings.TrimRight(l, "\r"))
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		c.Values[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	num := func(keys []string, allowed ...int) int {
		for _, k := range keys {
			v, ok := c.Values[k]
			if !ok {
				continue
			}
			n, err := strconv.Atoi(v)
			good := err == nil
			if good && len(allowed) > 0 {
				good = false
				for _, a := range allowed {
					if n == a {
						good = true
					}
				}
			}
			if !good {
				c.Problems = append(c.Problems, fmt.Sprintf("%s=%s: not one of %v", k, v, allowed))
				return -1
			}
			return n
		}
		return -1
	}
	c.FabricMode = num([]string{"FABRIC_MODE", "SHARED_FABRIC_MODE"}, 0, 1, 2)
	c.AccessLinkFailureMode = num([]string{"ACCESS_LINK_FAILURE_MODE"}, 0, 1)
	c.TrunkLinkFailureMode = num([]string{"TRUNK_LINK_FAILURE_MODE"}, 0, 1)
	c.NVSwitchFailureMode = num([]string{"NVSWITCH_FAILURE_MODE"}, 0, 1)
	c.AbortCUDAJobsOnFMExit = num([]string{"ABORT_CUDA_JOBS_ON_FM_EXIT"}, 0, 1)
	c.StayResidentOnFailures = num([]string{"FM_STAY_RESIDENT_ON_FAILURES"}, 0, 1)
	// Any value but 0 is read as syslog (how FM reads other values is not
	// documented): reading the journal too costs little, missing FM's
	// errors there costs them all. Not a config problem.
	c.LogUseSyslog = -1
	if v, ok := c.Values["LOG_USE_SYSLOG"]; ok {
		c.LogUseSyslog = 1
		if n, err := strconv.Atoi(v); err == nil && n == 0 {
			c.LogUseSyslog = 0
		}
	}
	c.LogFile = c.Values["LOG_FILE_NAME"]
	c.PartitionFile = c.Values["SHARED_PARTITION_DEFINITION_FILE"]
	sort.Strings(c.Problems)
	return c
}

// LogsToJournal reports an FM that logs to the unit's journal, not to a
// file: LOG_USE_SYSLOG=1, or LOG_FILE_NAME set empty (FM logs to stderr).
func (c *FMConfig) LogsToJournal() bool {
	if c == nil {
		return false
	}
	name, set := c.Values["LOG_FILE_NAME"]
	return c.LogUseSyslog == 1 || (set && name == "")
}

// Mode is the fabric mode name (ModeBareMetal when unset).
func (c *FMConfig) Mode() string {
	if c == nil {
		return ModeBareMetal
	}
	switch c.FabricMode {
	case 1:
		return ModeShared
	case 2:
		return ModeVGPU
	}
	return ModeBareMetal
}

// FailureMode is the configured *_FAILURE_MODE for a failure kind
// (access, trunk, nvswitch), 0 when unset (the shipped default).
func (c *FMConfig) FailureMode(kind string) (value int, set bool) {
	if c == nil {
		return 0, false
	}
	v := -1
	switch kind {
	case "access":
		v = c.AccessLinkFailureMode
	case "trunk":
		v = c.TrunkLinkFailureMode
	case "nvswitch":
		v = c.NVSwitchFailureMode
	}
	if v < 0 {
		return 0, false
	}
	return v, true
}
