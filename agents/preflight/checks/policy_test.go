package checks

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/preflight/dcgm"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestShippedQuarantinePolicyApplies: the events the checks build, stamped
// as the runner stamps them, meet the shipped quarantine rule sets
// (processors/quarantine/default_rules.toml): hardware failures match
// "preflight-checks" and quarantine the node; the diagnostic's own
// errors, warnings, gang timeouts, and the gang-wide run's failures that a
// peer causes (remote and system errors, low bandwidth) do not.
func TestShippedQuarantinePolicyApplies(t *testing.T) {
	rs, err := quarantine.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := quarantine.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.NodeName = "gpu-node-1"
	env := &Env{Cfg: cfg, Log: slog.New(slog.DiscardHandler), Echo: io.Discard, Now: time.Now}
	rule := func(check string, ev *datamodels.HealthEvent) string {
		env.stamp(ev, check)
		if ev.GetIsHealthy() {
			return "healthy"
		}
		d, errs := pol.Evaluate(ev, nil)
		if len(errs) > 0 {
			t.Fatalf("evaluation: %v", errs)
		}
		if d == nil {
			return ""
		}
		return d.Rule
	}
	dcgmOut := func(file string) Outcome {
		f, err := os.Open("../dcgm/testdata/" + file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		res, err := dcgm.Parse(f, dcgm.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return dcgmOutcome(env, res, nil, map[string]string{})
	}
	for _, ev := range dcgmOut("table-3.3.8-cuda-init-fail.txt").Events {
		if got := rule(DCGMDiag, ev); got != "preflight-checks" && (got != "healthy" || events.Entity(ev, events.EntityNode) == "") {
			t.Errorf("DCGM GPU Memory failure: rule %q for %v", got, ev)
		}
	}
	for _, ev := range dcgmOut("table-4.4.1-internal-error.txt").Events {
		if got := rule(DCGMDiag, ev); got != "healthy" && got != "" {
			t.Errorf("DCGM internal error quarantined by %q: %v", got, ev)
		}
	}
	nccl := func(check, file string, threshold float64, gang bool, exit int) *datamodels.HealthEvent {
		b, err := os.ReadFile("../nccl/testdata/" + file)
		if err != nil {
			t.Fatal(err)
		}
		return env.ncclVerdict(check, output{Text: string(b), ExitCode: exit}, threshold, gang, nil).Events[0]
	}
	for _, tc := range []struct {
		name string
		ev   *datamodels.HealthEvent
		want string
	}{
		{"loopback system error", nccl(NCCLLoopback, "system-error.log", 10, false, 2), "preflight-checks"},
		{"loopback remote error", nccl(NCCLLoopback, "torch-remote-error.log", 10, false, 1), "preflight-checks"},
		{"loopback corruption", nccl(NCCLLoopback, "derived-corruption.log", 10, false, 0), "preflight-checks"},
		{"loopback low bandwidth", nccl(NCCLLoopback, "h100-single-node.log", 500, false, 0), "preflight-checks"},
		{"loopback pass", nccl(NCCLLoopback, "h100-single-node.log", 10, false, 0), "healthy"},
		// The check image's CUDA runtime is newer than the node's driver:
		// not the node's fault.
		{"loopback CUDA driver too old", nccl(NCCLLoopback, "cuda-driver-insufficient.log", 10, false, 1), ""},
		// A peer of the gang exited or its link failed: every other rank
		// reports it, so it cannot be placed on this node.
		{"allreduce remote error (a peer's, not placeable on this node)", nccl(NCCLAllreduce, "torch-remote-error.log", 5, true, 1), ""},
		{"allreduce system error (a connection's, not placeable on this node)", nccl(NCCLAllreduce, "torch-system-error.log", 5, true, 1), ""},
		{"allreduce internal error", nccl(NCCLAllreduce, "torch-internal-error.log", 5, true, 1), "preflight-checks"},
		{"allreduce watchdog timeout", nccl(NCCLAllreduce, "torch-timeout.log", 5, true, 1), ""},
		{"allreduce low bandwidth (not placeable on one node)", nccl(NCCLAllreduce, "h100-single-node.log", 500, true, 0), ""},
		{"gang timeout", env.Unhealthy(false, datamodels.RecommendedAction_NONE, "gang did not form", []string{CodeGangTimeout}, nodeEntity("gpu-node-1"), nil), ""},
	} {
		if got := rule(strings.SplitN(tc.name, " ", 2)[0], tc.ev); got != tc.want {
			t.Errorf("%s: rule %q, want %q (%v)", tc.name, got, tc.want, tc.ev)
		}
	}
}
