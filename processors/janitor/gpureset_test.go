package janitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// resetScript is a provider whose ResetGPUs answers its errors in turn,
// then succeeds; it reboots and terminates nothing.
type resetScript struct {
	mu      sync.Mutex
	answers []error
	calls   int
}

func (*resetScript) Reboot(context.Context, Target, RebootMode) error { return ErrUnsupported }
func (*resetScript) Terminate(context.Context, Target) error          { return ErrUnsupported }
func (p *resetScript) ResetGPUs(context.Context, Target, []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if len(p.answers) == 0 {
		return nil
	}
	err := p.answers[0]
	p.answers = p.answers[1:]
	return err
}

// TestGPUResetPollErrors: once the agent accepted a reset (in progress),
// a poll that cannot reach it or cannot read its answer is asked again
// at the next poll, and the reset completes when the agent says it ran;
// the agent's own failure still ends it failed, and so does a first
// request that cannot reach it. Before, one failed poll ended a running
// reset AgentUnreachable and the node was escalated.
func TestGPUResetPollErrors(t *testing.T) {
	t.Parallel()
	inProgress := fmt.Errorf("agent 10.0.0.1:9400 of node n-gpu: resetting: %w", ErrInProgress)
	unreachable := perr(ReasonAgentUnreachable, "agent 10.0.0.1:9400 of node n-gpu: dial tcp: connection refused")
	unparsable := errors.New(`agent 10.0.0.1:9400 of node n-gpu: 502 Bad Gateway: "<html>"`)
	for _, tc := range []struct {
		name    string
		answers []error
		want    string // the Complete condition
	}{
		{"unreachable while resetting", []error{inProgress, unreachable, unreachable, inProgress}, "True/" + ReasonGPUResetSucceeded},
		{"unparsable while resetting", []error{inProgress, unparsable}, "True/" + ReasonGPUResetSucceeded},
		{"agent's failure while resetting", []error{inProgress, unreachable, perr("CommandFailed", "nvidia-smi exited 1")}, "True/CommandFailed"},
		{"auth refused while resetting", []error{inProgress, perr(ReasonAgentAuthFailed, "401")}, "True/" + ReasonAgentAuthFailed},
		{"unreachable at first", []error{unreachable}, "True/" + ReasonAgentUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeCluster(t, fakeNode("n-gpu", "r1", "boot-n-gpu"))
			prov := &resetScript{answers: slices.Clone(tc.answers)}
			j, _ := f.janitor(fakeConfig(), false, prov)
			f.run(j)
			f.create(kindGPUReset, "gpu", "n-gpu", nil)
			o := f.waitFor(kindGPUReset, "gpu", 10*time.Second, "finished", finished)
			if got := condOf(o, CondComplete); got != tc.want {
				t.Errorf("Complete %s, want %s: %v", got, tc.want, condition(o, CondComplete)["message"])
			}
		})
	}
}
