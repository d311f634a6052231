package dcgm

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// infoChunk is how many characters dcgmi puts on one table line before
// wrapping a message onto the next (DATA_INFO_TAG_LEN in dcgmi/Diag.cpp);
// the cell is one wider, so a wrapped chunk's trailing space survives.
const infoChunk = 45

// entry is a value being assembled from wrapped table lines.
type entry struct {
	kind   string // "warning", "info", "meta"
	name   string
	chunks []string
}

func (e *entry) text() string { return strings.TrimSpace(strings.Join(e.chunks, "")) }

func parseTable(b []byte) (*Result, error) {
	res := &Result{Format: "table"}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	category := ""
	var cur *Test
	var open *entry
	lineNo := 0
	sawTable := false
	flush := func() {
		if open == nil {
			return
		}
		txt := open.text()
		switch open.kind {
		case "warning":
			if cur != nil {
				cur.Warnings = append(cur.Warnings, Warning{GPU: gpuInText(txt), Text: txt, ErrorID: -1, Category: -1})
			}
		case "meta":
			switch open.name {
			case "DCGM Version":
				res.Version = txt
			case "Driver Version Detected":
				res.DriverVersion = txt
			case "GPU Device IDs Detected":
				n := 0
				for _, p := range strings.Split(txt, ",") {
					if strings.TrimSpace(p) != "" {
						n++
					}
				}
				res.DeviceCount = n
			}
		}
		open = nil
	}
	for sc.Scan() {
		lineNo++
		line := strings.TrimRight(sc.Text(), "\r \t")
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "Error: ") || strings.HasPrefix(t, "Error:\t") {
			if res.RuntimeError == "" {
				res.RuntimeError = strings.TrimSpace(strings.TrimPrefix(t, "Error:"))
			}
			continue
		}
		if !strings.HasPrefix(t, "|") && !strings.HasPrefix(t, "+") {
			continue
		}
		line = t
		// Borders and category separators.
		if strings.HasPrefix(line, "+") || strings.HasPrefix(line, "|-") {
			flush()
			name := strings.Trim(firstCell(line), "+-=| ")
			if name != "" {
				category = name
				cur = nil
				sawTable = true
			}
			continue
		}
		p := strings.IndexByte(line[1:], '|')
		if p < 0 {
			return nil, &ParseError{lineNo, "table row has no second column: " + strconv.Quote(line)}
		}
		p++
		// A row whose closing border was cut off (a log pasted short)
		// keeps what it has.
		last := strings.LastIndexByte(line, '|')
		if last <= p {
			last = len(line)
		}
		name := strings.TrimSpace(line[1:p])
		field := line[p+1 : last]
		field = strings.TrimPrefix(field, " ")
		chunk := field
		if len(chunk) > infoChunk {
			chunk = chunk[:infoChunk]
		}
		value := strings.TrimSpace(field)
		if name == "Diagnostic" && value == "Result" {
			sawTable = true
			continue
		}
		switch {
		case name == "":
			if cur != nil {
				if g, st, ok := entityLine(value); ok {
					flush()
					if g >= 0 {
						cur.GPUs = append(cur.GPUs, GPUResult{GPU: g, Result: st})
					}
					continue
				}
				if gs, st, ok, err := statusList(value); ok {
					if err != nil {
						return nil, &ParseError{lineNo, fmt.Sprintf("test %s: %v", cur.Name, err)}
					}
					flush()
					for _, g := range gs {
						cur.GPUs = append(cur.GPUs, GPUResult{GPU: g, Result: st})
					}
					cur.Result = ""
					continue
				}
			}
			if open != nil {
				open.chunks = append(open.chunks, chunk)
			}
		case name == "Warning" || name == "Error":
			flush()
			if cur == nil {
				// A message with no test row above it in its section:
				// it stands for the section (an "Error" fails it).
				st := Warn
				if name == "Error" {
					st = Fail
				}
				section := category
				if section == "" {
					section = "Diagnostic"
				}
				res.Tests = append(res.Tests, Test{Name: section, Category: category, Result: st})
				cur = &res.Tests[len(res.Tests)-1]
				sawTable = true
			}
			open = &entry{kind: "warning", chunks: []string{chunk}}
		case name == "Info":
			flush()
			open = &entry{kind: "info", chunks: []string{chunk}}
		case strings.EqualFold(category, "Metadata"):
			flush()
			open = &entry{kind: "meta", name: name, chunks: []string{chunk}}
		default:
			flush()
			test := Test{Name: name, Category: category}
			st, gs, all, err := testStatus(value)
			if err != nil {
				return nil, &ParseError{lineNo, fmt.Sprintf("test %s: %v", name, err)}
			}
			test.Result = st
			switch {
			case all:
				test.GPUs = []GPUResult{{GPU: allGPUs, Result: st}}
			case gs != nil:
				for _, g := range gs {
					test.GPUs = append(test.GPUs, GPUResult{GPU: g, Result: st})
				}
				test.Result = ""
			}
			// A second table (dcgmi run twice into one log) replaces the first.
			replaced := false
			for i := range res.Tests {
				if res.Tests[i].Name == name && res.Tests[i].Category == category {
					res.Tests = append(res.Tests[:i], res.Tests[i+1:]...)
					replaced = true
					break
				}
			}
			_ = replaced
			res.Tests = append(res.Tests, test)
			cur = &res.Tests[len(res.Tests)-1]
			sawTable = true
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, &ParseError{lineNo + 1, err.Error()}
	}
	if !sawTable && res.RuntimeError == "" {
		return nil, &ParseError{0, fmt.Sprintf("no dcgmi diag table, JSON document or dcgmi error in %d lines", lineNo)}
	}
	return res, nil
}

func firstCell(line string) string {
	if i := strings.IndexAny(line[1:], "+|"); i >= 0 {
		return line[:i+1]
	}
	return line
}

// testStatus reads a test line's result: "Pass", "Fail - All",
// "Pass - GPUs: 0, 1, 2", "Fail - GPU: 3".
func testStatus(v string) (st string, gpus []int, all bool, err error) {
	word, rest, found := strings.Cut(v, " - ")
	st, ok := normStatus(word)
	if !ok {
		return "", nil, false, fmt.Errorf("result %q is not Pass, Fail, Warn, Skip or Not Run", v)
	}
	if !found {
		return st, nil, false, nil
	}
	rest = strings.TrimSpace(rest)
	if rest == "All" {
		return st, nil, true, nil
	}
	gs, err := gpuList(rest)
	if err != nil {
		return "", nil, false, err
	}
	return st, gs, false, nil
}

// statusList reads a 3.x continuation "Fail - GPU: 3".
func statusList(v string) ([]int, string, bool, error) {
	word, rest, found := strings.Cut(v, " - ")
	st, ok := normStatus(word)
	if !ok || !found || !strings.HasPrefix(strings.TrimSpace(rest), "GPU") {
		return nil, "", false, nil
	}
	gs, err := gpuList(strings.TrimSpace(rest))
	return gs, st, true, err
}

// gpuList reads "GPU: 3" or "GPUs: 0, 1, 2".
func gpuList(s string) ([]int, error) {
	_, ids, ok := strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(s, "GPU") {
		return nil, fmt.Errorf("GPU list %q is not \"GPU: n\" or \"GPUs: n, m\"", s)
	}
	var out []int
	for _, p := range strings.Split(ids, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("GPU id %q in %q is not a number", p, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// entityLine reads a 4.x per-entity line "GPU0: Pass"; g is -1 for other
// entity kinds (CPU0, ...), which are consumed but not recorded.
func entityLine(v string) (g int, st string, ok bool) {
	name, word, found := strings.Cut(v, ": ")
	if !found || strings.Contains(name, " ") {
		return 0, "", false
	}
	st, ok = normStatus(word)
	if !ok {
		return 0, "", false
	}
	i := 0
	for i < len(name) && (name[i] < '0' || name[i] > '9') {
		i++
	}
	if i == 0 || i == len(name) {
		return 0, "", false
	}
	n, err := strconv.Atoi(name[i:])
	if err != nil {
		return 0, "", false
	}
	if name[:i] != "GPU" {
		return -1, st, true
	}
	return n, st, true
}
