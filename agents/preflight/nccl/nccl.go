// Package nccl reads what nccl-tests (all_reduce_perf and its siblings) and
// PyTorch's NCCL backend print: the result table (out-of-place and in-place
// bus bandwidth and wrong-element counts, every layout nccl-tests has used
// since v1), the "Avg bus bandwidth" footer, and the NCCL and CUDA failures,
// classified into the error names of ADR-026's table with the action and
// fatality each one carries.
//
// Lines may carry launcher prefixes (mpirun --tag-output "[1,0]<stdout>:",
// srun --label " 0: ", "[0] ") and be interleaved with NCCL INFO/WARN lines
// and other stray output; none of that disturbs the table.
package nccl

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Row is one line of the result table: one message size.
type Row struct {
	// Bytes is the message size in bytes (the "size" or "bytes" column).
	Bytes int64 `json:"bytes"`
	// BusBwOutOfPlace and BusBwInPlace are the bus bandwidths in GB/s.
	BusBwOutOfPlace float64 `json:"busBwOutOfPlace"`
	BusBwInPlace    float64 `json:"busBwInPlace"`
	// WrongOutOfPlace and WrongInPlace are the wrong elements nccl-tests
	// counted ("#wrong", printed with %g so large counts read 2.68435e+08);
	// nil when it printed N/A (validation off, -c 0). Layouts before
	// nccl-tests 2.13 print the largest relative error ("error", "res")
	// instead of a count: there the value is 1 when that error exceeds the
	// tolerance nccl-tests itself applied (what it counted into "Out of
	// bounds values") and 0 when it does not.
	WrongOutOfPlace *int64 `json:"wrongOutOfPlace"`
	WrongInPlace    *int64 `json:"wrongInPlace"`
}

// Result is what one nccl-tests (or PyTorch benchmark) log says. Its JSON
// form is what `faultline-preflight parse nccl FILE` prints.
type Result struct {
	// AvgBusBw is the last "Avg bus bandwidth" footer in GB/s (0 when the
	// log has none).
	AvgBusBw float64 `json:"avgBusBw"`
	// Rows are the table rows in the order printed (every table of the log).
	Rows []Row `json:"rows"`
	// Wrong is true when any row has a non-zero wrong value (or the footer
	// reports out-of-bounds values): the data was corrupted, whatever the
	// bandwidth.
	Wrong bool `json:"wrong"`

	// HasAvg reports whether the log had an "Avg bus bandwidth" footer.
	HasAvg bool `json:"-"`
	// OutOfBounds is the "Out of bounds values" count, -1 when absent.
	OutOfBounds int64 `json:"-"`
	// ErrorColumn is true for the layouts that print the largest error
	// instead of a wrong-element count.
	ErrorColumn bool `json:"-"`
	// Failures are the NCCL, CUDA and timeout failures found, in order.
	Failures []Failure `json:"-"`
	// Interrupted counts table rows cut short (a process killed mid-line,
	// or another process's output spliced into the row); they are skipped.
	Interrupted int `json:"-"`
	// Lines is the number of lines read.
	Lines int `json:"-"`
}

// ParseError is input that is not a readable nccl-tests log; Line is 1-based
// (0 when the problem is the input as a whole).
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return "nccl: " + e.Msg
	}
	return fmt.Sprintf("nccl: line %d: %s", e.Line, e.Msg)
}

// layout is where the columns of a result table are.
type layout struct {
	size              int // index of size/bytes
	busOut, busIn     int // -1 when the table has only one side
	wrongOut, wrongIn int
	errorColumn       bool // "error"/"res": largest relative error
	fields            int  // minimum fields of a full row
	typeIdx           int  // index of the data type column, -1 if none
	preamble          int  // fields before the first time column
}

// Parse reads a log. It fails only on input that cannot be a nccl-tests or
// benchmark log at all, or on a full-width table row whose numbers do not
// read, naming the line.
func Parse(r io.Reader) (*Result, error) {
	res := &Result{Rows: []Row{}, OutOfBounds: -1}
	br := bufio.NewReaderSize(r, 1<<16)
	var lay *layout
	inPlaceFirst := false
	ranks := map[int]bool{}
	var pendingRows []rowTol // old layouts: rows whose error needs the rank count
	lineNo := 0
	seen := false // anything recognisably nccl-tests or NCCL
	for {
		raw, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// An over-long line: read the rest and judge the whole.
			long := append([]byte(nil), raw...)
			for err == bufio.ErrBufferFull {
				raw, err = br.ReadSlice('\n')
				long = append(long, raw...)
			}
			raw = long
		}
		if len(raw) == 0 && err != nil {
			if err != io.EOF {
				return nil, fmt.Errorf("nccl: read: %w", err)
			}
			break
		}
		lineNo++
		line := string(bytes.TrimRight(raw, "\r\n"))
		line = stripPrefixes(line)
		t := strings.TrimSpace(line)
		switch {
		case t == "":
		case strings.HasPrefix(t, "#") || strings.HasPrefix(t, "Out of bounds") || strings.HasPrefix(t, "Avg bus"):
			body := strings.TrimSpace(strings.TrimPrefix(t, "#"))
			if l, ok := parseHeader(body); ok {
				lay, seen = l, true
				if inPlaceFirst {
					l.busOut, l.busIn = l.busIn, l.busOut
					l.wrongOut, l.wrongIn = l.wrongIn, l.wrongOut
					inPlaceFirst = false
				}
				continue
			}
			if strings.Contains(body, "out-of-place") && strings.Contains(body, "in-place") {
				inPlaceFirst = strings.Index(body, "in-place") < strings.Index(body, "out-of-place")
				seen = true
				continue
			}
			if v, ok := footerValue(body, "Avg bus bandwidth"); ok {
				f, bad := bandwidth(firstField(v))
				if bad != "" {
					return nil, &ParseError{lineNo, fmt.Sprintf("Avg bus bandwidth %q %s", v, bad)}
				}
				res.AvgBusBw, res.HasAvg, seen = f, true, true
				continue
			}
			if v, ok := footerValue(body, "Out of bounds values"); ok {
				n, perr := strconv.ParseInt(firstField(v), 10, 64)
				if perr != nil {
					return nil, &ParseError{lineNo, fmt.Sprintf("Out of bounds values %q is not a number", v)}
				}
				res.OutOfBounds, seen = n, true
				continue
			}
			if r, ok := rankLine(body); ok {
				ranks[r] = true
				seen = true
				continue
			}
			if strings.HasPrefix(body, "nThread ") || strings.HasPrefix(body, "nccl-tests version") || strings.HasPrefix(body, "Collective test") {
				seen = true
			}
		default:
			// A table row (two integers and a data type) is tried
			// first: it cannot be a failure line, and rows are most of
			// a long log.
			var fields []string
			isRow := false
			if lay != nil && t[0] >= '0' && t[0] <= '9' {
				fields = strings.Fields(t)
				isRow = isRowStart(fields, lay)
			}
			if !isRow {
				if f, ok := Classify(t); ok {
					f.Line = lineNo
					res.Failures = append(res.Failures, f)
					seen = true
				}
				continue
			}
			if len(fields) < lay.fields {
				// The row was cut: killed mid-line, or another
				// process's output spliced into it.
				res.Interrupted++
				continue
			}
			row, tol, perr := parseRow(fields, lay)
			if perr != nil {
				return nil, &ParseError{lineNo, perr.Error()}
			}
			if lay.errorColumn {
				res.ErrorColumn = true
				pendingRows = append(pendingRows, rowTol{idx: len(res.Rows), tol: tol})
			}
			res.Rows = append(res.Rows, row)
			seen = true
		}
		if err == io.EOF {
			break
		}
	}
	res.Lines = lineNo
	if !seen {
		return nil, &ParseError{0, fmt.Sprintf("no nccl-tests table, Avg bus bandwidth footer or NCCL failure in %d lines", lineNo)}
	}
	// Old layouts: judge each error against nccl-tests' own tolerance,
	// DeltaMaxValue(type) * (nranks - 1).
	n := len(ranks)
	for _, p := range pendingRows {
		p.tol.judge(&res.Rows[p.idx], n)
	}
	for _, r := range res.Rows {
		if nonZero(r.WrongOutOfPlace) || nonZero(r.WrongInPlace) {
			res.Wrong = true
		}
	}
	if res.OutOfBounds > 0 {
		res.Wrong = true
	}
	return res, nil
}

func nonZero(p *int64) bool { return p != nil && *p != 0 }

// stripPrefixes removes launcher prefixes: mpirun --tag-output
// "[1,0]<stdout>:", srun --label "0: ", and "[0] ".
func stripPrefixes(s string) string {
	for {
		t := strings.TrimLeft(s, " \t")
		switch {
		case strings.HasPrefix(t, "[") && strings.Contains(t, "]<std"):
			i := strings.Index(t, ">:")
			if i < 0 {
				return s
			}
			s = t[i+2:]
			continue
		case len(t) > 0 && t[0] >= '0' && t[0] <= '9':
			i := 0
			for i < len(t) && t[i] >= '0' && t[i] <= '9' {
				i++
			}
			if i < len(t) && t[i] == ':' && (i+1 == len(t) || t[i+1] == ' ') {
				s = t[i+1:]
				continue
			}
			return s
		case strings.HasPrefix(t, "[") && len(t) > 2:
			i := 1
			for i < len(t) && t[i] >= '0' && t[i] <= '9' {
				i++
			}
			if i > 1 && i < len(t) && t[i] == ']' && i+1 < len(t) && t[i+1] == ' ' {
				s = t[i+1:]
				continue
			}
			return s
		}
		return s
	}
}

// parseHeader recognises the column-name line of a result table.
func parseHeader(body string) (*layout, bool) {
	f := strings.Fields(body)
	if len(f) < 5 {
		return nil, false
	}
	if f[0] != "size" && f[0] != "bytes" {
		return nil, false
	}
	l := &layout{size: 0, busOut: -1, busIn: -1, wrongOut: -1, wrongIn: -1, typeIdx: -1, preamble: -1}
	bus := 0
	for i, name := range f {
		switch name {
		case "type":
			l.typeIdx = i
		case "time", "cputime":
			if l.preamble < 0 {
				l.preamble = i
			}
		case "busbw":
			if bus == 0 {
				l.busOut = i
			} else if bus == 1 {
				l.busIn = i
			}
			bus++
		case "#wrong", "error", "res":
			if name != "#wrong" {
				l.errorColumn = true
			}
			if l.wrongOut < 0 {
				l.wrongOut = i
			} else if l.wrongIn < 0 {
				l.wrongIn = i
			}
		}
	}
	if l.busOut < 0 || l.preamble < 0 {
		return nil, false
	}
	last := max(l.busOut, l.busIn, l.wrongOut, l.wrongIn, l.typeIdx)
	l.fields = last + 1
	return l, true
}

// isRowStart reports whether fields begin like a table row: the size and
// count as integers, then the data type.
func isRowStart(f []string, l *layout) bool {
	if len(f) < 3 {
		return false
	}
	if !isInt(f[0]) || !isInt(f[1]) {
		return false
	}
	if l.typeIdx >= 0 && l.typeIdx < len(f) {
		if _, ok := typeTolerance[f[l.typeIdx]]; !ok {
			return false
		}
	}
	return true
}

func isInt(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// typeTolerance is nccl-tests' DeltaMaxValue per data type, the tolerance
// of the old "error" column (1e-200 for the integer types: any error).
var typeTolerance = map[string]float64{
	"half": 1e-2, "float16": 1e-2, "bfloat16": 5e-2, "float": 1e-5, "float32": 1e-5,
	"double": 1e-12, "float64": 1e-12,
	"int8": 1e-200, "uint8": 1e-200, "int32": 1e-200, "int": 1e-200, "uint32": 1e-200,
	"int64": 1e-200, "uint64": 1e-200, "char": 1e-200,
	"f8e4m3": 1e-1, "f8e5m2": 1e-1, "fp8_e4m3": 1e-1, "fp8_e5m2": 1e-1,
}

// rowTol keeps what judging an old-layout row needs.
type rowTol struct {
	idx int
	tol tolerance
}

type tolerance struct {
	delta   float64
	out, in *float64
}

func (t tolerance) judge(r *Row, nranks int) {
	limit := t.delta * float64(max(nranks-1, 1))
	if t.out != nil {
		v := int64(0)
		if *t.out > limit || math.IsNaN(*t.out) {
			v = 1
		}
		r.WrongOutOfPlace = &v
	}
	if t.in != nil {
		v := int64(0)
		if *t.in > limit || math.IsNaN(*t.in) {
			v = 1
		}
		r.WrongInPlace = &v
	}
}

func parseRow(f []string, l *layout) (Row, tolerance, error) {
	var row Row
	var tol tolerance
	size, err := strconv.ParseInt(f[l.size], 10, 64)
	if err != nil {
		return row, tol, fmt.Errorf("size %q is not an integer", f[l.size])
	}
	row.Bytes = size
	num := func(i int, what string) (float64, error) {
		v, bad := bandwidth(f[i])
		if bad != "" {
			return 0, fmt.Errorf("%s (field %d) %q %s", what, i+1, f[i], bad)
		}
		return v, nil
	}
	if row.BusBwOutOfPlace, err = num(l.busOut, "busbw"); err != nil {
		return row, tol, err
	}
	if l.busIn >= 0 {
		if row.BusBwInPlace, err = num(l.busIn, "in-place busbw"); err != nil {
			return row, tol, err
		}
	}
	if l.typeIdx >= 0 {
		tol.delta = typeTolerance[f[l.typeIdx]]
	} else {
		tol.delta = 1e-5
	}
	wrong := func(i int, what string) (*int64, *float64, error) {
		if i < 0 {
			return nil, nil, nil
		}
		s := f[i]
		if s == "N/A" {
			return nil, nil, nil
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 {
			return nil, nil, fmt.Errorf("%s (field %d) %q is not a count or N/A", what, i+1, s)
		}
		if l.errorColumn {
			return nil, &v, nil
		}
		n := int64(math.Round(v))
		return &n, nil, nil
	}
	var errOut, errIn *float64
	if row.WrongOutOfPlace, errOut, err = wrong(l.wrongOut, "#wrong"); err != nil {
		return row, tol, err
	}
	if row.WrongInPlace, errIn, err = wrong(l.wrongIn, "in-place #wrong"); err != nil {
		return row, tol, err
	}
	tol.out, tol.in = errOut, errIn
	return row, tol, nil
}

// bandwidth reads a bus bandwidth in GB/s, a finite number not below 0,
// or says what s is instead ("is not a number", "is not a bandwidth").
// nccl-tests prints "nan" or "inf" when its timing went wrong; such a
// value (or a negative one) measures nothing, and compared with a
// threshold a NaN would pass (every comparison with NaN is false).
func bandwidth(s string) (float64, string) {
	v, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil:
		return 0, "is not a number"
	case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
		return 0, "is not a bandwidth"
	}
	return v, ""
}

// footerValue returns what follows "name :" in a footer line.
func footerValue(body, name string) (string, bool) {
	rest, ok := strings.CutPrefix(body, name)
	if !ok {
		return "", false
	}
	rest = strings.TrimSpace(rest)
	rest, ok = strings.CutPrefix(rest, ":")
	if !ok {
		return "", false
	}
	return strings.TrimSpace(rest), true
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return ""
}

// rankLine reads "Rank  3 Group  0 Pid ..." (or the older "Rank  3 Pid"
// and "Rank  3 on host") from the "Using devices" block.
func rankLine(body string) (int, bool) {
	rest, ok := strings.CutPrefix(body, "Rank ")
	if !ok {
		return 0, false
	}
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0, false
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, false
	}
	return n, true
}
