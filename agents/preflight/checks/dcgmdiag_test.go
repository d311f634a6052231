package checks

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/preflight/dcgm"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// quarantineModel applies check runs' events, stamped as the runner stamps
// them, as the quarantine role does: an unhealthy event the shipped rule
// sets match sets a fault (its check and entities, quarantine.FaultKey), a
// healthy one lifts the fault of its check and entities.
type quarantineModel struct {
	t      *testing.T
	pol    *quarantine.Policy
	env    *Env
	faults map[string]bool
}

func newQuarantineModel(t *testing.T, env *Env) *quarantineModel {
	t.Helper()
	rs, err := quarantine.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := quarantine.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	return &quarantineModel{t: t, pol: pol, env: env, faults: map[string]bool{}}
}

func (q *quarantineModel) apply(check string, evs []*datamodels.HealthEvent) {
	q.t.Helper()
	for _, ev := range evs {
		q.env.stamp(ev, check)
		key := quarantine.FaultKey(ev.GetCheckName(), events.EntityKey(ev))
		if ev.GetIsHealthy() {
			delete(q.faults, key)
			continue
		}
		d, errs := q.pol.Evaluate(ev, nil)
		if len(errs) > 0 {
			q.t.Fatalf("evaluation: %v", errs)
		}
		if d != nil {
			q.faults[key] = true
		}
	}
}

func (q *quarantineModel) standing() []string { return slices.Sorted(maps.Keys(q.faults)) }

func parseDCGM(t *testing.T, path string) *dcgm.Result {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := dcgm.Parse(f, dcgm.Options{GPUs: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestDCGMNodeFaultLifted: a test that fails without naming a GPU (a
// deployment test: a CUDA environment variable set) cordons the node on
// its node entity; a later run that passes every test lifts it. Before, a
// pass sent healthy events for the GPUs only, and the node's fault stood
// for ever.
//
// The failing input is json-3.x-r2-pass.json (../dcgm/testdata) with its
// Environment Variables result failed as DCGM 3.x writes a deployment
// failure (key "warnings" in the warning, DCGM_FR_BAD_CUDA_ENV = 28 and its
// message from dcgm_errors.h): no published sample has a node-level
// failure.
func TestDCGMNodeFaultLifted(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName = "gpu-node-1"
	env := &Env{Cfg: cfg, Log: slog.New(slog.DiscardHandler), Echo: io.Discard, Now: time.Now}
	uuidOf := map[int]string{0: "GPU-934a71d6-e50c-86a3-f752-3743a8c1bbb2"}
	pass := "../dcgm/testdata/json-3.x-r2-pass.json"
	b, err := os.ReadFile(pass)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, `"name" : "Environment Variables"`)
	j := strings.Index(doc[i:], `"status" : "Pass"`)
	if i < 0 || j < 0 {
		t.Fatal("Environment Variables result not found in the sample")
	}
	j += i
	doc = doc[:j] + `"status" : "Fail", "warnings" : [{"error_id" : 28, "warnings" : "Found CUDA performance-limiting environment variable 'CUDA_LAUNCH_BLOCKING'."}]` +
		doc[j+len(`"status" : "Pass"`):]
	failing := t.TempDir() + "/env-var-fail.json"
	if err := os.WriteFile(failing, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}

	q := newQuarantineModel(t, env)
	out := dcgmOutcome(env, parseDCGM(t, failing), uuidOf, map[string]string{})
	q.apply(DCGMDiag, out.Events)
	nodeFault := quarantine.FaultKey(DCGMDiag, "NODE=gpu-node-1")
	if got := q.standing(); !slices.Equal(got, []string{nodeFault}) {
		t.Fatalf("after the Environment Variables failure, faults %q, want %q (events %v)", got, nodeFault, out.Events)
	}
	out = dcgmOutcome(env, parseDCGM(t, pass), uuidOf, map[string]string{})
	q.apply(DCGMDiag, out.Events)
	if got := q.standing(); len(got) > 0 {
		t.Errorf("after a run that passed every test, faults %q still stand (events %v)", got, out.Events)
	}
}

// TestDCGMInternalErrorKeepsGPUFault: a GPU's memory failure cordons it;
// the rerun's memory test fails by DCGM's own error (a child process's
// output could not be parsed, DCGM#253) while software passes. The rerun
// did not test the memory, so the GPU's fault stands. Before, the GPU's
// software pass sent a healthy event for it (and one for the node), and
// the fault was lifted with the memory test never run.
//
// Both inputs are table-4.4.2-pass.txt (../dcgm/testdata) with its
// memory rows changed: a hardware failure, then the internal error's rows
// copied from table-4.4.1-internal-error.txt; no published 4.x sample has
// a failed GPU.
func TestDCGMInternalErrorKeepsGPUFault(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName = "gpu-node-1"
	env := &Env{Cfg: cfg, Log: slog.New(slog.DiscardHandler), Echo: io.Discard, Now: time.Now}
	const uuid = "GPU-934a71d6-e50c-86a3-f752-3743a8c1bbb2"
	uuidOf := map[int]string{0: uuid}
	b, err := os.ReadFile("../dcgm/testdata/table-4.4.2-pass.txt")
	if err != nil {
		t.Fatal(err)
	}
	row := func(name, info string) string { return fmt.Sprintf("| %-25s | %-46s |\n", name, info) }
	memoryPass := row("memory", "Pass") + row("", "GPU0: Pass")
	if !strings.Contains(string(b), memoryPass) {
		t.Fatal("memory rows not found in the sample")
	}
	withMemory := func(rows ...string) string {
		p := t.TempDir() + "/dcgmi.txt"
		doc := strings.Replace(string(b), memoryPass, strings.Join(rows, ""), 1)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hardware := withMemory(row("memory", "Fail"),
		row("Warning", "Pending page retirements detected on GPU 0."),
		row("", "GPU0: Fail"))
	internal := withMemory(row("memory", "Fail"),
		row("Warning", "There was an internal error during the test:"),
		row("", "'Output of child process (11167) couldn't be"),
		row("", "parsed: '* Line 1, Column 1   Syntax error: v"),
		row("", "alue, object or array expected. '' Check DCGM"),
		row("", " and system logs for errors. Reset GPU. Resta"),
		row("", "rt DCGM. Rerun diagnostics."),
		row("", "GPU0: Fail"))

	q := newQuarantineModel(t, env)
	out := dcgmOutcome(env, parseDCGM(t, hardware), uuidOf, map[string]string{})
	q.apply(DCGMDiag, out.Events)
	gpuFault := quarantine.FaultKey(DCGMDiag, "GPU="+uuid)
	if got := q.standing(); !slices.Equal(got, []string{gpuFault}) {
		t.Fatalf("after the memory failure, faults %q, want %q (events %v)", got, gpuFault, out.Events)
	}
	res := parseDCGM(t, internal)
	if res.HardwareFault || !slices.Equal(res.FailedTests, []string{"memory"}) {
		t.Fatalf("rerun parsed as failed tests %q, hardware fault %v; want memory failed by DCGM's own error", res.FailedTests, res.HardwareFault)
	}
	out = dcgmOutcome(env, res, uuidOf, map[string]string{})
	for _, ev := range out.Events {
		if ev.GetIsHealthy() {
			t.Errorf("healthy event after a run whose memory test did not run: %v", ev)
		}
	}
	q.apply(DCGMDiag, out.Events)
	if got := q.standing(); !slices.Equal(got, []string{gpuFault}) {
		t.Errorf("after the rerun failed by DCGM's own error, faults %q, want %q (events %v)", got, gpuFault, out.Events)
	}
}
