package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/processors/clusters"
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

// TestGPUResetPollErrorsSpaced: a running reset whose agent cannot be
// reached is polled every poll_interval until gpu_reset_timeout; each
// reset's failed polls are logged at its first, then at most once a
// minute. Before, every poll logged a warning: 120 a reset at the
// defaults, for every node whose agent was down.
func TestGPUResetPollErrorsSpaced(t *testing.T) {
	t.Parallel()
	inProgress := fmt.Errorf("agent 10.0.0.1:9400 of node n-gpu: resetting: %w", ErrInProgress)
	unreachable := perr(ReasonAgentUnreachable, "agent 10.0.0.1:9400 of node n-gpu: dial tcp: connection refused")
	answers := []error{inProgress}
	for range 15 {
		answers = append(answers, unreachable)
	}
	f := newFakeCluster(t, fakeNode("n-gpu", "r1", "boot-n-gpu"), fakeNode("n-gpu2", "r1", "boot-n-gpu2"))
	var logs syncbuf.Buffer
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient(cluster, f.kube, false)
	reg.SetDynamic(cluster, f.dyn)
	prov := resetByNode{"n-gpu": &resetScript{answers: slices.Clone(answers)}, "n-gpu2": &resetScript{answers: slices.Clone(answers)}}
	j, err := New(fakeConfig(), clusters.Config{}, reg, Options{Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Providers: map[string]Provider{ProviderRedfish: prov}, Producer: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	f.run(j)
	f.create(kindGPUReset, "gpu", "n-gpu", nil)
	f.create(kindGPUReset, "gpu2", "n-gpu2", nil)
	for _, name := range []string{"gpu", "gpu2"} {
		o := f.waitFor(kindGPUReset, name, 10*time.Second, "finished", finished)
		if got, want := condOf(o, CondComplete), "True/"+ReasonGPUResetSucceeded; got != want {
			t.Errorf("%s: Complete %s, want %s", name, got, want)
		}
	}
	const line = "a running GPU reset could not be polled"
	for _, name := range []string{"gpu", "gpu2"} {
		n := 0
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, line) && strings.Contains(l, "/"+name+" ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("reset %s: %d warnings of its failed polls, want 1 (its first):\n%s", name, n, logs.String())
		}
	}
}

// resetByNode is a resetScript for each node.
type resetByNode map[string]*resetScript

func (resetByNode) Reboot(context.Context, Target, RebootMode) error { return ErrUnsupported }
func (resetByNode) Terminate(context.Context, Target) error          { return ErrUnsupported }
func (p resetByNode) ResetGPUs(ctx context.Context, t Target, uuids []string) error {
	return p[t.Node.Name].ResetGPUs(ctx, t, uuids)
}
