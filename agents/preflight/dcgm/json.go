package dcgm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// parseJSON reads `dcgmi diag -j`: DCGM 3.x puts everything under
// "DCGM GPU Diagnostic" with results per GPU ("gpu_id"/"gpu_ids"); 4.x
// under "DCGM Diagnostic" with results per entity and a test_summary, and
// the metadata at the top level.
func parseJSON(b []byte, start int) (*Result, error) {
	line := 1 + bytes.Count(b[:start], []byte{'\n'})
	dec := json.NewDecoder(bytes.NewReader(b[start:]))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, &ParseError{line, "JSON document does not decode: " + err.Error()}
	}
	res := &Result{Format: "json"}
	root, ok := doc["DCGM Diagnostic"].(map[string]any)
	if !ok {
		root, ok = doc["DCGM GPU Diagnostic"].(map[string]any)
	}
	if !ok {
		return nil, &ParseError{line, `JSON document has no "DCGM Diagnostic" (4.x) or "DCGM GPU Diagnostic" (3.x) object`}
	}
	if meta, ok := doc["metadata"].(map[string]any); ok {
		res.Version, _ = meta["version"].(string)
		res.DriverVersion, _ = meta["Driver Version Detected"].(string)
	}
	if v, ok := root["version"].(string); ok && res.Version == "" {
		res.Version = v
	}
	if groups, ok := doc["entity_groups"].([]any); ok {
		for _, g := range groups {
			gm, _ := g.(map[string]any)
			if gm["entity_group"] == "GPU" {
				if es, ok := gm["entities"].([]any); ok {
					res.DeviceCount = len(es)
				}
			}
		}
	}
	if e, ok := root["runtime_error"].(string); ok {
		res.RuntimeError = e
	}
	cats, _ := root["test_categories"].([]any)
	for ci, c := range cats {
		cm, ok := c.(map[string]any)
		if !ok {
			continue // 3.x may leave null holes
		}
		category, _ := cm["category"].(string)
		tests, _ := cm["tests"].([]any)
		for ti, tv := range tests {
			tm, ok := tv.(map[string]any)
			if !ok {
				continue
			}
			name, _ := tm["name"].(string)
			if name == "" {
				return nil, &ParseError{line, fmt.Sprintf("test_categories[%d].tests[%d] has no name", ci, ti)}
			}
			t := Test{Name: name, Category: category}
			results, _ := tm["results"].([]any)
			for ri, rv := range results {
				rm, ok := rv.(map[string]any)
				if !ok {
					continue
				}
				st, ok := normStatus(str(rm["status"]))
				if !ok {
					return nil, &ParseError{line, fmt.Sprintf("test %s results[%d]: status %q is not Pass, Fail, Warn, Skip or Not Run", name, ri, str(rm["status"]))}
				}
				gpus, node := resultGPUs(rm)
				for _, g := range gpus {
					t.GPUs = append(t.GPUs, GPUResult{GPU: g, Result: st})
				}
				gpu := -1
				if len(gpus) == 1 {
					gpu = gpus[0]
				}
				t.Warnings = append(t.Warnings, warnings(rm, gpu)...)
				if node {
					// A node-level result (deployment tests): the test's own.
					t.Result = worse(t.Result, st)
				}
			}
			if sum, ok := tm["test_summary"].(map[string]any); ok {
				if st, ok := normStatus(str(sum["status"])); ok {
					t.Result = st
				}
				t.Warnings = append(t.Warnings, warnings(sum, -1)...)
			}
			res.Tests = append(res.Tests, t)
		}
	}
	if len(res.Tests) == 0 && res.RuntimeError == "" {
		return nil, &ParseError{line, "JSON document has no tests and no runtime_error"}
	}
	return res, nil
}

// resultGPUs returns the GPU ids of one result entry, and whether the entry
// is node-level (no GPU named).
func resultGPUs(rm map[string]any) ([]int, bool) {
	if eg, ok := rm["entity_group"]; ok {
		if eg != "GPU" {
			return nil, false
		}
		if id, ok := num(rm["entity_id"]); ok {
			return []int{id}, false
		}
		return nil, true
	}
	for _, k := range []string{"gpu_ids", "gpu_id"} {
		v, ok := rm[k]
		if !ok {
			continue
		}
		if n, ok := num(v); ok {
			return []int{n}, false
		}
		var out []int
		for _, p := range strings.Split(str(v), ",") {
			if n, err := strconv.Atoi(strings.TrimSpace(p)); err == nil {
				out = append(out, n)
			}
		}
		if len(out) > 0 {
			return out, false
		}
	}
	return nil, true
}

func warnings(m map[string]any, gpu int) []Warning {
	ws, _ := m["warnings"].([]any)
	var out []Warning
	for _, w := range ws {
		wm, ok := w.(map[string]any)
		if !ok {
			continue
		}
		text := str(wm["warning"])
		if text == "" {
			text = str(wm["warnings"]) // DCGM 3.x deployment tests use this key
		}
		id, ok := num(wm["error_id"])
		if !ok {
			id = -1
		}
		cat, ok := num(wm["error_category"])
		if !ok {
			cat = -1
		}
		g := gpu
		if g < 0 {
			g = gpuInText(text)
		}
		out = append(out, Warning{GPU: g, Text: text, ErrorID: id, Category: cat})
	}
	return out
}

func worse(a, b string) string {
	rank := map[string]int{"": 0, NotRun: 1, Skip: 2, Pass: 3, Warn: 4, Fail: 5}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	}
	return ""
}

func num(v any) (int, bool) {
	switch x := v.(type) {
	case json.Number:
		n, err := x.Int64()
		return int(n), err == nil
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(x))
		return n, err == nil
	}
	return 0, false
}
