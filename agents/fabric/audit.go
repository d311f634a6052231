package fabric

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// AuditMatrix is nvswitch-audit's GPU Reachability Matrix: the number of
// NVLinks the NVSwitches are programmed to route between two GPUs, by GPU
// physical id (1-8, 9-16 on a second A100 baseboard).
type AuditMatrix struct {
	GPUs  []int
	Links map[[2]int]int
}

// ParseAudit reads `nvswitch-audit` output, the table or its -c CSV form.
func ParseAudit(out string) (*AuditMatrix, error) {
	m := &AuditMatrix{Links: map[[2]int]int{}}
	var cols []int
	for n, raw := range strings.Split(out, "\n") {
		l := strings.TrimSpace(strings.TrimRight(raw, "\r"))
		if l == "" || strings.HasPrefix(strings.ToLower(l), "gpu reachability") {
			continue
		}
		f := strings.Fields(strings.ReplaceAll(l, ",", " "))
		if len(f) == 0 { // a CSV line of commas only
			continue
		}
		if cols == nil {
			if strings.EqualFold(f[0], "GPU") || strings.EqualFold(f[0], "src") {
				f = f[1:]
			}
			for _, c := range f {
				id, err := strconv.Atoi(c)
				if err != nil {
					return nil, fmt.Errorf("nvswitch-audit: line %d: header cell %q is not a GPU id", n+1, c)
				}
				cols = append(cols, id)
			}
			m.GPUs = cols
			continue
		}
		row, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("nvswitch-audit: line %d: row %q is not a GPU id", n+1, f[0])
		}
		if len(f)-1 != len(cols) {
			return nil, fmt.Errorf("nvswitch-audit: line %d: %d cells for %d GPUs", n+1, len(f)-1, len(cols))
		}
		// The self cell is "X". A row whose X sits off the diagonal (the
		// guide's own example prints row 8 as "12 ... X 12") gives the
		// X's column the value printed on the diagonal.
		xCol, diag := -1, ""
		for i, c := range f[1:] {
			if strings.EqualFold(c, "X") && cols[i] != row {
				xCol = cols[i]
			}
			if cols[i] == row && !strings.EqualFold(c, "X") {
				diag = c
			}
		}
		for i, c := range f[1:] {
			if cols[i] == row || strings.EqualFold(c, "X") {
				if cols[i] == xCol && diag != "" {
					c = diag
				} else {
					continue
				}
			}
			v, err := strconv.Atoi(c)
			if err != nil {
				return nil, fmt.Errorf("nvswitch-audit: line %d: cell %q", n+1, c)
			}
			m.Links[[2]int{row, cols[i]}] = v
		}
	}
	if cols == nil {
		return nil, fmt.Errorf("nvswitch-audit: no GPU header")
	}
	return m, nil
}

// PartitionList is `fmpm -l` output: FM's fmFabricPartitionList_t (the
// guide's Fabric Manager SDK data structures) as JSON.
type PartitionList struct {
	Version          int         `json:"version"`
	NumPartitions    int         `json:"numPartitions"`
	MaxNumPartitions int         `json:"maxNumPartitions"`
	Partitions       []Partition `json:"partitionInfo"`
}

// Partition is one supported fabric partition.
type Partition struct {
	ID       int            `json:"partitionId"`
	IsActive int            `json:"isActive"`
	NumGPUs  int            `json:"numGpus"`
	GPUs     []PartitionGPU `json:"gpuInfo"`
}

// PartitionGPU is one GPU of a partition.
type PartitionGPU struct {
	PhysicalID          int    `json:"physicalId"`
	UUID                string `json:"uuid"`
	PCIBusID            string `json:"pciBusId"`
	NumNvLinksAvailable int    `json:"numNvLinksAvailable"`
	MaxNumNvLinks       int    `json:"maxNumNvLinks"`
	NvlinkLineRateMBps  int    `json:"nvlinkLineRateMBps"`
}

// ParsePartitions reads `fmpm -l` JSON.
func ParsePartitions(out string) (*PartitionList, error) {
	var p PartitionList
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("fmpm partition list: %w", err)
	}
	sort.Slice(p.Partitions, func(i, j int) bool { return p.Partitions[i].ID < p.Partitions[j].ID })
	return &p, nil
}

// a100Partitions is Table 14 (default Shared NVSwitch and vGPU partitions
// of DGX/HGX A100): partition id → GPU physical ids.
var a100Partitions = func() map[int][]int {
	r := func(a, b int) []int {
		var s []int
		for i := a; i <= b; i++ {
			s = append(s, i)
		}
		return s
	}
	m := map[int][]int{
		0: r(1, 16), 1: r(1, 8), 2: r(9, 16),
		3: append(r(1, 4), r(9, 12)...), 4: append(r(5, 8), r(13, 16)...),
		5: append(r(1, 4), r(13, 16)...), 6: append(r(5, 8), r(9, 12)...),
		7: r(1, 4), 8: r(5, 8), 9: r(9, 12), 10: r(13, 16),
	}
	for i := 0; i < 8; i++ {
		m[11+i] = []int{2*i + 1, 2*i + 2}
	}
	for i := 1; i <= 16; i++ {
		m[18+i] = []int{i}
	}
	return m
}()

// DefaultA100Partitions returns the Table 14 partitions whose GPUs all sit
// on the given baseboards (physical ids 1-8: bottom tray, 9-16: top tray).
func DefaultA100Partitions(bottom, top bool) map[int][]int {
	out := map[int][]int{}
	for id, gpus := range a100Partitions {
		ok := true
		for _, g := range gpus {
			if (g <= 8 && !bottom) || (g > 8 && !top) {
				ok = false
				break
			}
		}
		if ok {
			out[id] = gpus
		}
	}
	return out
}
