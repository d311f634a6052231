// Package topology turns the text of `nvidia-smi topo -m` into the GPU
// metadata file the NIC check depends on (gpu_metadata.json: §12.2 of
// NVSentinel's NIC link-state design, docs/designs/047-link-state-detection.md
// in github.com/NVIDIA/NVSentinel): the GPUs with their NUMA nodes and,
// per NIC, the raw GPU↔NIC topology levels in GPU order.
//
// nvidia-smi has no structured output for the GPU↔NIC matrix, so this is a
// text parser. It accepts the variations seen in the field: tabs or aligned
// spaces, ANSI colour codes, header lines wrapped over several lines, the
// "NIC Legend" (NICn → device name, not always NIC0 → mlx5_0), older outputs
// that name the NICs directly in the header and say SOC for SYS, a
// "GPU NUMA ID" column or only "NUMA Affinity" (or neither), NUMA ranges and
// lists on Grace systems ("0-71", "0,2-17"), N/A (→ -1), a single GPU and
// systems without NICs. Input it cannot read is a *ParseError naming the line.
package topology

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/faultline/faultline/schemas/events"
)

// MetadataVersion is the version written into gpu_metadata.json.
const MetadataVersion = "1.0"

// Metadata is gpu_metadata.json (§12.2 of the link-state design). The NIC check reads GPUs[].NUMANode
// (or NUMANodes) and NICTopology; the other fields are informational.
type Metadata struct {
	Version  string `json:"version"`
	NodeName string `json:"node_name,omitempty"`
	GPUs     []GPU  `json:"gpus"`
	// NICTopology maps a NIC's device name (mlx5_0, ibp3s0) to its topology
	// level towards each GPU, one entry per GPU in GPUs order: "X", "PIX",
	// "PXB", "PHB", "NODE", "SYS" or "NV<n>", verbatim from nvidia-smi
	// (except that the legacy "SOC" is written as "SYS").
	NICTopology map[string][]string `json:"nic_topology"`
}

// GPU is one GPU of the node.
type GPU struct {
	GPUID int `json:"gpu_id"`
	// PCIAddress is the GPU's PCI address ("0000:0f:00.0"); empty when only
	// the topology matrix was parsed.
	PCIAddress string `json:"pci_address,omitempty"`
	// NUMANode is the first NUMA node of the "NUMA Affinity" column, -1 when
	// unknown (N/A, missing column).
	NUMANode int `json:"numa_node"`
	// NUMANodes lists every NUMA node of the affinity when it is a range or
	// list (Grace: "0-1", "0,2-17"); empty for a single node.
	NUMANodes []int `json:"numa_nodes,omitempty"`
	// GPUNUMAID is the "GPU NUMA ID" column (the GPU memory's own NUMA node on
	// Grace systems); nil when absent or N/A. It is not used for the NIC
	// NUMA gate.
	GPUNUMAID    *int   `json:"gpu_numa_id,omitempty"`
	CPUAffinity  string `json:"cpu_affinity,omitempty"`
	UUID         string `json:"uuid,omitempty"`
	SerialNumber string `json:"serial_number,omitempty"`
}

// NUMASet returns the distinct known NUMA nodes of all GPUs (§4.1 of the link-state design:
// gpu_numa_set), ignoring -1.
func (m *Metadata) NUMASet() map[int]bool {
	set := map[int]bool{}
	for _, g := range m.GPUs {
		if len(g.NUMANodes) > 0 {
			for _, n := range g.NUMANodes {
				if n >= 0 {
					set[n] = true
				}
			}
			continue
		}
		if g.NUMANode >= 0 {
			set[g.NUMANode] = true
		}
	}
	return set
}

// ParseError is returned for input that is not a topology matrix. Line is
// 1-based; 0 means the input as a whole.
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return "topology: " + e.Msg
	}
	return fmt.Sprintf("topology: line %d: %s", e.Line, e.Msg)
}

var (
	ansiRe     = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)
	gpuLabelRe = regexp.MustCompile(`^GPU(\d+)$`)
	nicLabelRe = regexp.MustCompile(`^NIC\d+$`)
	nvRe       = regexp.MustCompile(`^NV\d+$`)
	legendRe   = regexp.MustCompile(`^\s*(NIC\d+)\s*:\s*(\S+)\s*$`)
	phraseRes  = []struct {
		re  *regexp.Regexp
		col string
	}{
		{regexp.MustCompile(`GPU\s+NUMA\s+ID`), colGPUNUMA},
		{regexp.MustCompile(`CPU\s+Affinity`), colCPU},
		{regexp.MustCompile(`NUMA\s+Affinity`), colNUMA},
	}
)

// Trailing (non-device) columns, as single tokens after phrase folding.
const (
	colCPU     = "\x00cpu_affinity"
	colNUMA    = "\x00numa_affinity"
	colGPUNUMA = "\x00gpu_numa_id"
)

// validCell reports whether s is a topology level and returns it normalised.
func validCell(s string) (string, bool) {
	switch s {
	case "X", "SYS", "NODE", "PHB", "PXB", "PIX":
		return s, true
	case "SOC": // nvidia-smi before 375 said SOC for what is now SYS
		return "SYS", true
	}
	if nvRe.MatchString(s) {
		return s, true
	}
	return "", false
}

type row struct {
	line   int
	tokens []string
}

// Parse reads `nvidia-smi topo -m` output.
func Parse(r io.Reader) (*Metadata, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	var lines []string
	for sc.Scan() {
		l := ansiRe.ReplaceAllString(sc.Text(), "")
		lines = append(lines, strings.TrimRight(l, "\r"))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("topology: read: %w", err)
	}

	// Split matrix from legends.
	legend := map[string]string{}
	end := len(lines)
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if t == "Legend:" || strings.HasPrefix(t, "Legend:") {
			end = i
			break
		}
	}
	inNICLegend := false
	for i := end; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if strings.HasPrefix(t, "NIC Legend") {
			inNICLegend = true
			continue
		}
		if !inNICLegend || t == "" {
			continue
		}
		m := legendRe.FindStringSubmatch(lines[i])
		if m == nil {
			return nil, &ParseError{Line: i + 1, Msg: fmt.Sprintf("NIC Legend entry %q is not \"NICn: name\"", t)}
		}
		if _, dup := legend[m[1]]; dup {
			return nil, &ParseError{Line: i + 1, Msg: fmt.Sprintf("%s appears twice in the NIC Legend", m[1])}
		}
		legend[m[1]] = m[2]
	}

	// Header lines come before the first row; a row starts with a label
	// followed by a topology cell.
	var header []string
	headerLine := 0
	var rows []row
	labels := map[string]bool{}
	for i := 0; i < end; i++ {
		toks := strings.Fields(lines[i])
		if len(toks) == 0 {
			continue
		}
		if rows == nil {
			if _, ok := validCell(safeIdx(toks, 1)); ok && (gpuLabelRe.MatchString(toks[0]) || nicLabelRe.MatchString(toks[0])) {
				if len(header) == 0 {
					return nil, &ParseError{Line: i + 1, Msg: "matrix row before any header line"}
				}
				cols, err := headerColumns(header)
				if err != nil {
					return nil, &ParseError{Line: headerLine, Msg: err.Error()}
				}
				for _, c := range cols {
					labels[c] = true
				}
				rows = append(rows, row{line: i + 1, tokens: toks})
				continue
			}
			if headerLine == 0 {
				headerLine = i + 1
			}
			header = append(header, lines[i])
			continue
		}
		if labels[toks[0]] {
			rows = append(rows, row{line: i + 1, tokens: toks})
			continue
		}
		// A wrapped row: continuation of the previous one.
		last := &rows[len(rows)-1]
		last.tokens = append(last.tokens, toks...)
	}
	if len(header) == 0 {
		return nil, &ParseError{Msg: "no topology matrix header found (is this `nvidia-smi topo -m` output?)"}
	}
	if rows == nil {
		return nil, &ParseError{Line: headerLine, Msg: "no matrix row (GPU0 X ...) follows the header; is this `nvidia-smi topo -m` output?"}
	}
	cols, _ := headerColumns(header)
	var devCols, trailCols []string
	for _, c := range cols {
		if strings.HasPrefix(c, "\x00") {
			trailCols = append(trailCols, c)
			continue
		}
		if len(trailCols) > 0 {
			return nil, &ParseError{Line: headerLine, Msg: fmt.Sprintf("device column %q after the affinity columns", c)}
		}
		devCols = append(devCols, c)
	}

	// Resolve columns: GPUs by index, NICs by legend or by name.
	type gpuCol struct{ id, col int }
	var gpuCols []gpuCol
	nicName := map[int]string{}
	named := map[string]string{} // device name → its column
	seen := map[string]bool{}
	for ci, c := range devCols {
		if seen[c] {
			return nil, &ParseError{Line: headerLine, Msg: fmt.Sprintf("column %q appears twice", c)}
		}
		seen[c] = true
		if m := gpuLabelRe.FindStringSubmatch(c); m != nil {
			id, _ := strconv.Atoi(m[1])
			gpuCols = append(gpuCols, gpuCol{id: id, col: ci})
			continue
		}
		name := c
		if nicLabelRe.MatchString(c) {
			n, ok := legend[c]
			if !ok {
				return nil, &ParseError{Line: headerLine, Msg: fmt.Sprintf("column %s has no entry in the NIC Legend", c)}
			}
			name = n
		}
		if prev, dup := named[name]; dup {
			return nil, &ParseError{Line: headerLine, Msg: fmt.Sprintf("columns %s and %s both name device %q", prev, c, name)}
		}
		named[name] = c
		nicName[ci] = name
	}
	if len(gpuCols) == 0 {
		return nil, &ParseError{Line: headerLine, Msg: "header names no GPU columns"}
	}

	// Parse rows.
	gpuRows := map[string][]string{}
	gpuTrail := map[string][]string{}
	for _, r := range rows {
		label := r.tokens[0]
		cells := r.tokens[1:]
		if len(cells) < len(devCols) {
			return nil, &ParseError{Line: r.line, Msg: fmt.Sprintf("row %s has %d cells, the header names %d devices", label, len(cells), len(devCols))}
		}
		norm := make([]string, len(devCols))
		for i := range devCols {
			v, ok := validCell(cells[i])
			if !ok {
				return nil, &ParseError{Line: r.line, Msg: fmt.Sprintf("row %s, column %s: %q is not a topology level (X, PIX, PXB, PHB, NODE, SYS, NV<n>)", label, devCols[i], cells[i])}
			}
			norm[i] = v
		}
		trail := cells[len(devCols):]
		// A GPU row short of a value after the matrix (a blank cell) would
		// read the next column's value as this one's: its NUMA node wrong.
		if len(trail) > len(trailCols) || gpuLabelRe.MatchString(label) && len(trail) != len(trailCols) {
			return nil, &ParseError{Line: r.line, Msg: fmt.Sprintf("row %s has %d values after the matrix, the header names %d columns", label, len(trail), len(trailCols))}
		}
		if gpuLabelRe.MatchString(label) {
			if _, dup := gpuRows[label]; dup {
				return nil, &ParseError{Line: r.line, Msg: fmt.Sprintf("row %s appears twice", label)}
			}
			gpuRows[label] = norm
			gpuTrail[label] = trail
		}
	}

	md := &Metadata{Version: MetadataVersion, NICTopology: map[string][]string{}}
	sort.SliceStable(gpuCols, func(i, j int) bool { return gpuCols[i].id < gpuCols[j].id })
	for _, gc := range gpuCols {
		label := devCols[gc.col]
		cells, ok := gpuRows[label]
		if !ok {
			return nil, &ParseError{Msg: fmt.Sprintf("the header names %s but no row describes it", label)}
		}
		g := GPU{GPUID: gc.id, NUMANode: -1}
		line := rowLine(rows, label)
		for i, v := range gpuTrail[label] {
			switch trailCols[i] {
			case colCPU:
				if v != "N/A" {
					g.CPUAffinity = v
				}
			case colNUMA:
				nodes, err := parseNodeList(v)
				if err != nil {
					return nil, &ParseError{Line: line, Msg: fmt.Sprintf("row %s: NUMA Affinity: %v", label, err)}
				}
				if len(nodes) > 0 {
					g.NUMANode = nodes[0]
				}
				if len(nodes) > 1 {
					g.NUMANodes = nodes
				}
			case colGPUNUMA:
				if v != "N/A" {
					n, err := strconv.Atoi(v)
					if err != nil {
						return nil, &ParseError{Line: line, Msg: fmt.Sprintf("row %s: GPU NUMA ID %q is not a number", label, v)}
					}
					g.GPUNUMAID = &n
				}
			}
		}
		md.GPUs = append(md.GPUs, g)
		for ci, name := range nicName {
			md.NICTopology[name] = append(md.NICTopology[name], cells[ci])
		}
	}
	return md, nil
}

func safeIdx(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return ""
}

func rowLine(rows []row, label string) int {
	for _, r := range rows {
		if r.tokens[0] == label {
			return r.line
		}
	}
	return 0
}

// headerColumns folds the multi-word column names and splits the header.
func headerColumns(header []string) ([]string, error) {
	h := strings.Join(header, " ")
	for _, p := range phraseRes {
		h = p.re.ReplaceAllString(h, " "+p.col+" ")
	}
	cols := strings.Fields(h)
	if len(cols) == 0 {
		return nil, fmt.Errorf("empty header")
	}
	return cols, nil
}

// parseNodeList parses "0", "0-1", "0,2-17", "N/A".
func parseNodeList(s string) ([]int, error) {
	if s == "" || s == "N/A" || s == "-1" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("%q is not a NUMA node, range or list", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a NUMA node, range or list", s)
			}
		}
		if b-a > 4096 {
			return nil, fmt.Errorf("NUMA range %q too large", part)
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}

// ParseGPUQuery fills PCI addresses, UUIDs and serials from the output of
// `nvidia-smi --query-gpu=index,pci.bus_id,uuid,serial --format=csv,noheader`.
// GPUs the query does not name are left as they are.
func (m *Metadata) ParseGPUQuery(r io.Reader) error {
	sc := bufio.NewScanner(r)
	ln := 0
	for sc.Scan() {
		ln++
		t := strings.TrimSpace(ansiRe.ReplaceAllString(sc.Text(), ""))
		if t == "" {
			continue
		}
		f := strings.Split(t, ",")
		if len(f) < 2 {
			return &ParseError{Line: ln, Msg: fmt.Sprintf("GPU query line %q has fewer than 2 fields", t)}
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil {
			return &ParseError{Line: ln, Msg: fmt.Sprintf("GPU index %q is not a number", f[0])}
		}
		for i := range m.GPUs {
			if m.GPUs[i].GPUID != idx {
				continue
			}
			m.GPUs[i].PCIAddress = events.NormalizePCI(f[1], true) // nvidia-smi's "00000000:0F:00.0": sysfs's "0000:0f:00.0"
			if len(f) > 2 && f[2] != "[N/A]" {
				m.GPUs[i].UUID = f[2]
			}
			if len(f) > 3 && f[3] != "[N/A]" {
				m.GPUs[i].SerialNumber = f[3]
			}
		}
	}
	return sc.Err()
}

// Load reads gpu_metadata.json.
func Load(path string) (*Metadata, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read GPU metadata: %w", err)
	}
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode GPU metadata %s: %w", path, err)
	}
	return &m, nil
}

// WriteFile writes m as indented JSON to path atomically (temporary file in
// the same directory, fsync, rename).
func WriteFile(path string, m *Metadata) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode GPU metadata: %w", err)
	}
	return AtomicWrite(path, append(b, '\n'))
}

// ReadCapped reads the file at path, at most max bytes: a larger file is
// an error (nothing of it is used). A check reads its state file, written
// by AtomicWrite, with it: a file far larger than the check writes is not
// its own (damaged, or the setting pointed at another file) and is not
// read into the agent's memory whole. A missing file's error is
// os.ErrNotExist.
func ReadCapped(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// AtomicWrite replaces path with data: write to a temporary file in the same
// directory, fsync it, rename it over path, fsync the directory.
func AtomicWrite(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("atomic write %s: %w", path, werr)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
