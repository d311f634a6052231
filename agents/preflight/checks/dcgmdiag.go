package checks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/faultline/faultline/agents/preflight/dcgm"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Error codes of dcgm-diag events besides the per-test ones
// (DCGM_DIAG_<TEST>_FAIL, DCGM_DIAG_<TEST>_WARN, and DCGM_FR_<id> for
// DCGM's own error ids when its output carries them).
const (
	CodeDCGMInternal   = "DCGM_DIAG_INTERNAL_ERROR"
	CodeDCGMError      = "DCGM_DIAG_ERROR"
	CodeDCGMUnreadable = "DCGM_DIAG_UNREADABLE"
)

// DCGMAction is ADR-026's "DCGM Diag" table for a failed test: Memory,
// PCIe and NVLink failures call for support (the part is bad), a Stress
// failure for DCGM's extended diagnostics (EUD); tests the table does not
// name (deployment/software checks and the rest) call for support too.
func DCGMAction(t dcgm.Test) datamodels.RecommendedAction {
	n := strings.NewReplacer(" ", "", "_", "", "-", "").Replace(strings.ToLower(t.Name))
	switch n {
	case "memory", "gpumemory", "memtest", "pcie", "nvlink", "nvbandwidth", "nvlinkstatus":
		return datamodels.RecommendedAction_CONTACT_SUPPORT
	case "targetedstress", "targetedpower", "smstress", "diagnostic", "memorybandwidth", "pulsetest", "eud", "eudtest", "cpueud":
		return datamodels.RecommendedAction_RUN_DCGMEUD
	}
	if strings.EqualFold(t.Category, "Stress") {
		return datamodels.RecommendedAction_RUN_DCGMEUD
	}
	return datamodels.RecommendedAction_CONTACT_SUPPORT
}

func actionRank(a datamodels.RecommendedAction) int {
	switch a {
	case datamodels.RecommendedAction_CONTACT_SUPPORT:
		return 3
	case datamodels.RecommendedAction_RUN_DCGMEUD:
		return 2
	}
	return 1
}

// testCode is DCGM_DIAG_<TEST>_<STATUS> ("Targeted Power" →
// DCGM_DIAG_TARGETED_POWER_FAIL).
func testCode(name, status string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(name) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "_") {
			b.WriteByte('_')
		}
	}
	return "DCGM_DIAG_" + strings.TrimSuffix(b.String(), "_") + "_" + strings.ToUpper(status)
}

// runDCGMDiag: GPU UUIDs from nvidia-smi, DCGM's ids for them from
// `dcgmi discovery -l`, then `dcgmi diag -r <level> --host <hostengine>
// -i <uuids>`, parsed in either output format.
func runDCGMDiag(ctx context.Context, env *Env) (Outcome, error) {
	cfg := env.Cfg.DCGM
	uuids, missing, err := env.podGPUs(ctx)
	if err != nil || missing != nil {
		return derefOutcome(missing), err
	}
	// DCGM reports results under its own GPU ids; map them to the UUIDs.
	// A GPU left without one is reported on the node (dcgmOutcome).
	idOf := map[string]int{}
	if out, err := run(ctx, env.Echo, env.Child, cfg.Dcgmi, "discovery", "-l", "--host", cfg.HostengineAddr); errors.Is(err, errNotFound) {
		return Outcome{}, configErr("dcgmi", "dcgm.dcgmi: %v", err)
	} else if err == nil && out.ExitCode == 0 {
		if m, perr := dcgm.ParseDiscovery(strings.NewReader(out.Text)); perr == nil {
			idOf = m
		} else {
			env.Log.Warn("dcgmi discovery output unreadable; GPU results are reported on the node", "err", perr)
		}
	} else if ctx.Err() != nil {
		return Outcome{}, ctx.Err()
	} else {
		env.Log.Warn("dcgmi discovery failed; GPU results are reported on the node", "exit", out.ExitCode, "err", err)
	}
	uuidOf := map[int]string{}
	var ids []int
	for _, u := range uuids {
		if id, ok := idOf[u]; ok {
			uuidOf[id] = u
			ids = append(ids, id)
		}
	}
	if len(idOf) > 0 && len(ids) < len(uuids) {
		env.Log.Warn("dcgmi discovery did not list every GPU of the pod; results of those it did not are reported on the node", "gpus", len(uuids), "listed", len(ids))
	}
	sort.Ints(ids)
	args := []string{"diag", "-r", strconv.Itoa(cfg.DiagLevel), "--host", cfg.HostengineAddr, "-i", strings.Join(uuids, ",")}
	if cfg.Format == "json" {
		args = append(args, "-j")
	}
	out, err := run(ctx, env.Echo, env.Child, cfg.Dcgmi, args...)
	if errors.Is(err, errNotFound) {
		return Outcome{}, configErr("dcgmi", "dcgm.dcgmi: %v", err)
	}
	if err != nil {
		return Outcome{}, err
	}
	res, perr := dcgm.Parse(strings.NewReader(out.Text), dcgm.Options{GPUs: ids})
	meta := map[string]string{"preflight.faultline.io/gpus": strings.Join(uuids, ","),
		"preflight.faultline.io/dcgm-diag-level": strconv.Itoa(cfg.DiagLevel)}
	node := nodeEntity(env.Cfg.NodeName)
	if perr != nil {
		msg := fmt.Sprintf("dcgmi diag output (exit %d) is unreadable: %v", out.ExitCode, perr)
		return Outcome{Failed: true, Codes: []string{CodeDCGMUnreadable}, Summary: msg,
			Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeDCGMUnreadable}, node, meta)}}, nil
	}
	if res.Version != "" {
		meta["preflight.faultline.io/dcgm-version"] = res.Version
	}
	if res.RuntimeError != "" && len(res.Tests) == 0 {
		msg := "DCGM diagnostic did not run: " + res.RuntimeError
		return Outcome{Failed: true, Codes: []string{CodeDCGMError}, Summary: msg,
			Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeDCGMError}, node, meta)}}, nil
	}
	if len(res.Tests) == 0 || out.ExitCode != 0 && res.Overall == dcgm.Pass {
		// Output cut short (dcgmi killed, crashed): no test, or passes
		// with a failing exit — not a pass.
		msg := fmt.Sprintf("dcgmi diag exited %d with %d tests and no failure: its output is incomplete", out.ExitCode, len(res.Tests))
		return Outcome{Failed: true, Codes: []string{CodeDCGMUnreadable}, Summary: msg,
			Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeDCGMUnreadable}, node, meta)}}, nil
	}
	return dcgmOutcome(env, res, uuidOf, meta), nil
}

// gpuFindings collects what one GPU showed across tests.
type gpuFindings struct {
	failed, warned, passed []string
	// unjudged are the tests that failed by the diagnostic's own error:
	// whatever DCGM printed for the GPU there, they did not test it, so
	// the GPU gets no healthy event (it would lift an earlier run's
	// fault of a test that never ran).
	unjudged []string
	action   datamodels.RecommendedAction
	codes    []string
	msgs     []string
}

// dcgmOutcome turns a result into events: per GPU, a fatal event for
// hardware failures (action by ADR-026's table, the most severe of its
// tests), a non-fatal one for warnings, a healthy one when every test it
// ran passed and none failed by the diagnostic's own error; a non-fatal
// node event for failures that are the diagnostic's own; a fatal node
// event for a failed test DCGM did not pin on a GPU, and a healthy node
// event when every failed test (if any) was a hardware failure pinned on
// a GPU: that is what lifts an earlier run's node fault (the
// quarantine lifts a fault on a healthy event of the same check and
// entities, and the GPUs' healthy events name the GPUs, not the node).
// GPUs are named by uuidOf; one without a UUID there is reported on the
// node (a failure is a node fault, a pass sends nothing for it).
func dcgmOutcome(env *Env, res *dcgm.Result, uuidOf map[int]string, meta map[string]string) Outcome {
	per := map[int]*gpuFindings{}
	get := func(g int) *gpuFindings {
		if per[g] == nil {
			per[g] = &gpuFindings{}
		}
		return per[g]
	}
	var internal []string
	var nodeFail []dcgm.Test
	// nodeClean: no test failed by the diagnostic's own error (whatever
	// GPUs it names), and none failed without a GPU failing in it.
	nodeClean := true
	for _, t := range res.Tests {
		diagErr := t.DiagnosticError()
		if t.Result == dcgm.Fail && diagErr {
			internal = append(internal, t.Name)
			nodeClean = false
		}
		gpuFailed := false
		for _, g := range t.GPUs {
			f := get(g.GPU)
			if diagErr {
				// A GPU's Pass or Fail in a test DCGM could not run is
				// no verdict (DCGM#253: two child processes of four
				// crashed, every GPU printed Pass).
				f.unjudged = append(f.unjudged, t.Name)
				continue
			}
			switch g.Result {
			case dcgm.Fail:
				gpuFailed = true
				f.failed = append(f.failed, t.Name)
				f.codes = append(f.codes, testCode(t.Name, "fail"))
				if a := DCGMAction(t); actionRank(a) > actionRank(f.action) {
					f.action = a
				}
				for _, w := range t.Warnings {
					if w.GPU == g.GPU || w.GPU < 0 {
						f.msgs = append(f.msgs, w.Text)
						if w.ErrorID >= 0 {
							f.codes = append(f.codes, "DCGM_FR_"+strconv.Itoa(w.ErrorID))
						}
					}
				}
			case dcgm.Warn:
				f.warned = append(f.warned, t.Name)
				f.codes = append(f.codes, testCode(t.Name, "warn"))
			case dcgm.Pass:
				f.passed = append(f.passed, t.Name)
			}
		}
		if t.Result == dcgm.Fail && !gpuFailed {
			nodeClean = false
			if !diagErr {
				nodeFail = append(nodeFail, t)
			}
		}
	}
	var out Outcome
	out.Failed = res.Overall == dcgm.Fail
	gpus := make([]int, 0, len(per))
	for g := range per {
		gpus = append(gpus, g)
	}
	sort.Ints(gpus)
	node := nodeEntity(env.Cfg.NodeName)
	for _, g := range gpus {
		f := per[g]
		m := withMeta(meta, "preflight.faultline.io/dcgm-gpu-id", strconv.Itoa(g))
		u, known := uuidOf[g]
		ent, what := []*datamodels.Entity{gpuEntity(u)}, fmt.Sprintf("GPU %d (%s)", g, u)
		if !known {
			// Without its UUID (dcgmi discovery failed or did not list it)
			// a GPU is reported on the node: DCGM's id counts the host
			// engine's GPUs, not the pod's, and a fault under it is never
			// lifted by a pass that names the GPU by UUID; a pass lifts
			// the node's.
			ent, what = node, fmt.Sprintf("GPU %d (DCGM's id; its UUID is unknown)", g)
		}
		codes := distinct(f.codes)
		switch {
		case len(f.failed) > 0:
			msg := fmt.Sprintf("DCGM diagnostic failed on %s: %s", what, strings.Join(f.failed, ", "))
			if len(f.msgs) > 0 {
				msg += ": " + strings.Join(slices.Compact(f.msgs), "; ")
			}
			out.Events = append(out.Events, env.Unhealthy(true, f.action, msg, codes, ent, m))
			out.Codes = append(out.Codes, codes...)
			if !known {
				nodeClean = false
			}
		case len(f.warned) > 0:
			msg := fmt.Sprintf("DCGM diagnostic warned on %s: %s", what, strings.Join(f.warned, ", "))
			out.Events = append(out.Events, env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, codes, ent, m))
		case len(f.passed) > 0 && known && len(f.unjudged) == 0:
			out.Events = append(out.Events, env.Healthy(fmt.Sprintf("DCGM diagnostic passed on %s: %s", what, strings.Join(f.passed, ", ")), ent, m))
		}
	}
	if nodeClean {
		out.Events = append(out.Events, env.Healthy(fmt.Sprintf("DCGM diagnostic found no failure on the node outside its GPUs (%d tests)", len(res.Tests)), node, meta))
	}
	for _, t := range nodeFail {
		msg := fmt.Sprintf("DCGM diagnostic test %s failed", t.Name)
		var texts []string
		codes := []string{testCode(t.Name, "fail")}
		for _, w := range t.Warnings {
			texts = append(texts, w.Text)
			if w.ErrorID >= 0 {
				codes = append(codes, "DCGM_FR_"+strconv.Itoa(w.ErrorID))
			}
		}
		if len(texts) > 0 {
			msg += ": " + strings.Join(texts, "; ")
		}
		codes = distinct(codes)
		out.Events = append(out.Events, env.Unhealthy(true, DCGMAction(t), msg, codes, node, meta))
		out.Codes = append(out.Codes, codes...)
	}
	if len(internal) > 0 {
		msg := "DCGM diagnostic could not test (its own error, not a hardware fault): " + strings.Join(internal, ", ")
		for _, t := range res.Tests {
			if slices.Contains(internal, t.Name) && len(t.Warnings) > 0 {
				msg += ": " + t.Warnings[0].Text
				break
			}
		}
		out.Events = append(out.Events, env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeDCGMInternal}, node, meta))
		out.Codes = append(out.Codes, CodeDCGMInternal)
	}
	switch res.Overall {
	case dcgm.Fail:
		out.Summary = fmt.Sprintf("DCGM diagnostic failed: tests %s, GPUs %v, hardware fault %v", strings.Join(res.FailedTests, ", "), res.FailedGPUs, res.HardwareFault)
	case dcgm.Warn:
		out.Summary = "DCGM diagnostic passed with warnings"
	default:
		out.Summary = fmt.Sprintf("DCGM diagnostic passed (%d tests)", len(res.Tests))
	}
	return out
}

func withMeta(base map[string]string, k, v string) map[string]string {
	m := make(map[string]string, len(base)+1)
	for a, b := range base {
		m[a] = b
	}
	m[k] = v
	return m
}

// distinct returns codes without repeats, in their order.
func distinct(codes []string) []string {
	var out []string
	for _, c := range codes {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}
