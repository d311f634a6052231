// Package dcgm reads the output of `dcgmi diag` — the table dcgmi prints by
// default and the JSON document of `dcgmi diag -j`, in the layouts of DCGM
// 3.x ("DCGM GPU Diagnostic", "Fail - GPUs: 0, 3", per-GPU "gpu_ids") and
// 4.x ("DCGM Diagnostic", per-entity results, "GPU0: Fail") — into one
// Result: each test's verdict and per-GPU results, the failed GPUs and
// tests, and whether a failure is the hardware's or the diagnostic's own
// (an internal error, a child process whose output could not be parsed),
// which is not a hardware fault. It also reads `dcgmi discovery -l` to map
// DCGM's GPU ids to UUIDs.
package dcgm

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Status values of tests and GPUs, lower case.
const (
	Pass   = "pass"
	Fail   = "fail"
	Warn   = "warn"
	Skip   = "skip"
	NotRun = "notrun"
)

// GPUResult is one GPU's result in one test.
type GPUResult struct {
	GPU    int    `json:"gpu"`
	Result string `json:"result"`
}

// Warning is a message DCGM attached to a test (or to one GPU of it).
type Warning struct {
	// GPU is the GPU it names, -1 when unknown.
	GPU int
	// Text is the message, wrapped table lines joined.
	Text string
	// ErrorID is DCGM's error code (dcgm_errors.h), -1 when the format does
	// not carry it (the table).
	ErrorID int
	// Category is DCGM's error category, -1 when unknown.
	Category int
}

// DCGM's codes for its own failures: DCGM_FR_INTERNAL and the
// DCGM_FR_EC_INTERNAL_OTHER category.
const (
	errorIDInternal       = 44
	errorCategoryInternal = 16
)

// internalMarker starts DCGM_FR_INTERNAL_MSG, "There was an internal error
// during the test: '%s'", which covers a child process that crashed or
// whose output could not be parsed.
const internalMarker = "There was an internal error during the test"

// Internal reports whether the warning is the diagnostic's own error rather
// than a finding about the hardware.
func (w Warning) Internal() bool {
	return w.ErrorID == errorIDInternal || w.Category == errorCategoryInternal ||
		strings.Contains(w.Text, internalMarker)
}

// Test is one DCGM test (plugin).
type Test struct {
	// Name is the test as DCGM prints it ("GPU Memory", "Targeted Power",
	// "pcie").
	Name string `json:"name"`
	// Result is pass, fail, warn, skip or notrun.
	Result string `json:"result"`
	// GPUs are the per-GPU results, by GPU id.
	GPUs []GPUResult `json:"gpus"`

	// Category is DCGM's category (Deployment, Integration, Hardware,
	// Stress...), "" when unknown.
	Category string `json:"-"`
	// Warnings are the messages DCGM attached.
	Warnings []Warning `json:"-"`
}

// DiagnosticError reports whether the test failed only because of the
// diagnostic itself: it has warnings and every one is an internal error.
func (t Test) DiagnosticError() bool {
	if t.Result != Fail || len(t.Warnings) == 0 {
		return false
	}
	for _, w := range t.Warnings {
		if !w.Internal() {
			return false
		}
	}
	return true
}

// Result is what one `dcgmi diag` run said. Its JSON form is what
// `faultline-preflight parse dcgm FILE` prints.
type Result struct {
	// Overall is fail when any test failed, else warn when any warned, else
	// pass.
	Overall string `json:"overall"`
	// FailedGPUs are the GPU ids that failed any test, sorted.
	FailedGPUs []int `json:"failedGpus"`
	// FailedTests are the names of the failed tests, in DCGM's order.
	FailedTests []string `json:"failedTests"`
	// HardwareFault is false when every failure is the diagnostic's own
	// error (or there is none).
	HardwareFault bool `json:"hardwareFault"`
	// Tests are all tests in DCGM's order.
	Tests []Test `json:"tests"`

	// Format is "table" or "json".
	Format string `json:"-"`
	// Version and DriverVersion are DCGM's metadata, when printed.
	Version       string `json:"-"`
	DriverVersion string `json:"-"`
	// DeviceCount is the number of "GPU Device IDs Detected" (0 unknown).
	DeviceCount int `json:"-"`
	// RuntimeError is the error dcgmi reported instead of results
	// ("Error: ..." or the JSON runtime_error): the diagnostic did not run.
	RuntimeError string `json:"-"`
}

// ParseError is output that is not a readable dcgmi diag result; Line is
// 1-based (0: the input as a whole).
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return "dcgm: " + e.Msg
	}
	return fmt.Sprintf("dcgm: line %d: %s", e.Line, e.Msg)
}

// Options adjust parsing.
type Options struct {
	// GPUs are the GPU ids the diagnostic ran on, when the caller knows
	// them; DCGM 3.x tables say "All" instead of listing them. Without
	// them, "All" means the GPUs the output names, or 0..n-1 for the n
	// device ids it detected.
	GPUs []int
}

// Parse reads dcgmi diag output in any of the supported layouts.
func Parse(r io.Reader, opt Options) (*Result, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("dcgm: read: %w", err)
	}
	var res *Result
	if i := jsonStart(b); i >= 0 {
		res, err = parseJSON(b, i)
	} else {
		res, err = parseTable(b)
	}
	if err != nil {
		return nil, err
	}
	res.finish(opt)
	return res, nil
}

// jsonStart finds a JSON document: a line that starts with '{'.
func jsonStart(b []byte) int {
	off := 0
	for off < len(b) {
		end := bytes.IndexByte(b[off:], '\n')
		line := b[off:]
		if end >= 0 {
			line = b[off : off+end]
		}
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '{' {
			return off + bytes.IndexByte(line, '{')
		}
		if end < 0 {
			break
		}
		off += end + 1
	}
	return -1
}

// finish derives the summary fields from the tests.
func (r *Result) finish(opt Options) {
	all := opt.GPUs
	if len(all) == 0 {
		all = r.namedGPUs()
	}
	for i := range r.Tests {
		t := &r.Tests[i]
		// "All": the table lists no ids.
		for j := range t.GPUs {
			if t.GPUs[j].GPU == allGPUs {
				st := t.GPUs[j].Result
				t.GPUs = slices.Delete(t.GPUs, j, j+1)
				for _, g := range all {
					t.GPUs = append(t.GPUs, GPUResult{GPU: g, Result: st})
				}
				break
			}
		}
		slices.SortStableFunc(t.GPUs, func(a, b GPUResult) int { return a.GPU - b.GPU })
		t.GPUs = slices.CompactFunc(t.GPUs, func(a, b GPUResult) bool { return a.GPU == b.GPU })
		if t.GPUs == nil {
			t.GPUs = []GPUResult{}
		}
		if t.Result == "" {
			t.Result = aggregate(t.GPUs)
		}
		// A failed test without per-GPU results (3.x deployment tests,
		// a section's "Error"): the GPUs its findings name failed it.
		if t.Result == Fail && len(t.GPUs) == 0 {
			for _, w := range t.Warnings {
				if w.GPU >= 0 && !w.Internal() && !slices.ContainsFunc(t.GPUs, func(g GPUResult) bool { return g.GPU == w.GPU }) {
					t.GPUs = append(t.GPUs, GPUResult{GPU: w.GPU, Result: Fail})
				}
			}
			slices.SortFunc(t.GPUs, func(a, b GPUResult) int { return a.GPU - b.GPU })
		}
	}
	r.Overall = Pass
	r.FailedGPUs, r.FailedTests = []int{}, []string{}
	failed := map[int]bool{}
	for _, t := range r.Tests {
		switch t.Result {
		case Fail:
			r.Overall = Fail
			r.FailedTests = append(r.FailedTests, t.Name)
			if !t.DiagnosticError() {
				r.HardwareFault = true
			}
		case Warn:
			if r.Overall == Pass {
				r.Overall = Warn
			}
		}
		for _, g := range t.GPUs {
			if g.Result == Fail {
				failed[g.GPU] = true
			}
		}
	}
	if r.RuntimeError != "" && len(r.Tests) == 0 {
		r.Overall = Fail
	}
	for g := range failed {
		r.FailedGPUs = append(r.FailedGPUs, g)
	}
	slices.Sort(r.FailedGPUs)
	if r.Tests == nil {
		r.Tests = []Test{}
	}
}

// allGPUs marks a 3.x "All" result until the GPU ids are known.
const allGPUs = -1

// namedGPUs are the GPU ids the output names: explicit per-GPU results and
// "GPU n" in warnings; else 0..n-1 for n detected devices.
func (r *Result) namedGPUs() []int {
	seen := map[int]bool{}
	for _, t := range r.Tests {
		for _, g := range t.GPUs {
			if g.GPU >= 0 {
				seen[g.GPU] = true
			}
		}
		for _, w := range t.Warnings {
			if w.GPU >= 0 {
				seen[w.GPU] = true
			}
		}
	}
	var out []int
	for g := range seen {
		out = append(out, g)
	}
	slices.Sort(out)
	if len(out) == 0 || (r.DeviceCount > 0 && len(out) < r.DeviceCount && slices.Max(out) < r.DeviceCount) {
		out = out[:0]
		for i := 0; i < r.DeviceCount; i++ {
			out = append(out, i)
		}
	}
	return out
}

// aggregate is a test's verdict from its GPUs: any fail, else any warn,
// else any pass, else skip (or notrun when nothing ran).
func aggregate(gs []GPUResult) string {
	has := map[string]bool{}
	for _, g := range gs {
		has[g.Result] = true
	}
	switch {
	case has[Fail]:
		return Fail
	case has[Warn]:
		return Warn
	case has[Pass]:
		return Pass
	case has[Skip]:
		return Skip
	}
	return NotRun
}

// normStatus maps DCGM's words (Pass, PASS, Fail, Warn, Skip, Not Run) to
// the lower-case statuses; ok is false for anything else.
func normStatus(s string) (string, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "pass", "passed":
		return Pass, true
	case "fail", "failed", "failure":
		return Fail, true
	case "warn", "warning":
		return Warn, true
	case "skip", "skipped":
		return Skip, true
	case "not run", "notrun", "not_run":
		return NotRun, true
	}
	return "", false
}

// gpuInText finds "GPU <n>" in a message, -1 when absent.
func gpuInText(s string) int {
	i := strings.Index(s, "GPU ")
	for i >= 0 {
		j := i + 4
		n, k := 0, j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			n = n*10 + int(s[k]-'0')
			k++
		}
		if k > j {
			return n
		}
		next := strings.Index(s[i+4:], "GPU ")
		if next < 0 {
			return -1
		}
		i += 4 + next
	}
	return -1
}
