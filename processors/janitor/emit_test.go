package janitor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// downBroker is a producer whose broker is down: like franz-go without a
// record delivery timeout, it answers only when the context ends.
type downBroker struct{ tries atomic.Int32 }

func (d *downBroker) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	d.tries.Add(1)
	<-ctx.Done()
	return kgo.ProduceResults{{Record: rs[0], Err: ctx.Err()}}
}

// TestEmitBoundedWhileKafkaIsDown: an action that cannot be produced
// takes one bounded try, then emit says so (operation.emit keeps it on
// its resource) and the worker goes on (it used to wait for the broker
// for ever, and with it the reboots it follows).
func TestEmitBoundedWhileKafkaIsDown(t *testing.T) {
	t.Parallel()
	prod := &downBroker{}
	j, err := New(DefaultConfig(), clusters.Config{}, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Producer: prod})
	if err != nil {
		t.Fatal(err)
	}
	j.emitTry = 50 * time.Millisecond
	done := make(chan bool)
	go func() {
		done <- j.emit(context.Background(), &faultlinev1.Action{Id: "a1", Cluster: "c1", Node: "n1", Role: Role, Kind: events.KindReboot, Outcome: events.OutcomeApplied})
	}()
	select {
	case produced := <-done:
		if produced {
			t.Fatal("emit says it produced the action")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("emit still waiting for the broker after 10s")
	}
	if n := prod.tries.Load(); n != 1 {
		t.Fatalf("%d tries, want 1", n)
	}
}

// deadlines is a producer that records each try's bound and answers at
// once: refusing (err) or producing.
type deadlines struct {
	err   error
	tries []time.Duration
}

func (d *deadlines) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	dl, _ := ctx.Deadline()
	d.tries = append(d.tries, time.Until(dl).Round(time.Second))
	return kgo.ProduceResults{{Record: rs[0], Err: d.err}}
}

// TestEmitTryWhileRefused: once the broker refused an action, the next
// ones try for a second, not emitTry, until resayAfter has passed or one
// is produced: a Kafka outage costs each worker a second per action.
func TestEmitTryWhileRefused(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name      string
		refused   time.Time // zero: never
		err       error
		want      time.Duration
		refusedTo time.Time // refusedAt after the try
	}{
		{"never refused", time.Time{}, nil, emitTry, time.Time{}},
		{"refused a moment ago, still down", now.Add(-5 * time.Second), context.DeadlineExceeded, emitTryRefused, now.Add(-5 * time.Second)},
		{"refused a moment ago, back", now.Add(-5 * time.Second), nil, emitTryRefused, time.Time{}},
		{"refused longer ago than resayAfter", now.Add(-resayAfter - time.Second), context.DeadlineExceeded, emitTry, now.Add(-resayAfter - time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prod := &deadlines{err: tc.err}
			j, err := New(DefaultConfig(), clusters.Config{}, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Producer: prod})
			if err != nil {
				t.Fatal(err)
			}
			j.now = func() time.Time { return now }
			if !tc.refused.IsZero() {
				j.refusedAt.Store(tc.refused.UnixNano())
			}
			produced := j.emit(context.Background(), &faultlinev1.Action{Id: "a1", Cluster: "c1", Node: "n1", Role: Role, Kind: events.KindReboot, Outcome: events.OutcomeApplied})
			if produced != (tc.err == nil) || len(prod.tries) != 1 || prod.tries[0] != tc.want {
				t.Fatalf("produced %v after tries bounded by %v; want %v, one try of %v", produced, prod.tries, tc.err == nil, tc.want)
			}
			var want int64
			if !tc.refusedTo.IsZero() {
				want = tc.refusedTo.UnixNano()
			}
			if got := j.refusedAt.Load(); got != want {
				t.Fatalf("refusedAt %v, want %v", time.Unix(0, got), tc.refusedTo)
			}
		})
	}
}

// TestActionIDs: an action's id is its resource's, step's, outcome's and
// failure reason's, not the time it was produced: a step a restarted
// janitor does again produces the same id (the store keeps one), while
// another step, outcome or failure reason of the resource keeps its own.
func TestActionIDs(t *testing.T) {
	t.Parallel()
	j, err := New(DefaultConfig(), clusters.Config{}, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	clk := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { clk = clk.Add(time.Minute); return clk }
	u := &unstructured.Unstructured{}
	u.SetName("r1")
	u.SetUID("uid-1")
	op := &operation{j: j, cr: &clusterRun{name: "c1"}, kd: kindReboot, u: u, nodeName: "n1"}
	failed := func(reason string) map[string]string { return map[string]string{"reason": reason} }
	for _, tc := range []struct {
		name            string
		outcome, step   string
		details         map[string]string
		outcome2, step2 string
		details2        map[string]string
		same            bool
	}{
		{"StepDoneAgain", events.OutcomeSucceeded, "complete", nil, events.OutcomeSucceeded, "complete", nil, true},
		{"FailureDoneAgain", events.OutcomeFailed, "failed", failed(ReasonTimeout), events.OutcomeFailed, "failed", failed(ReasonTimeout), true},
		{"OtherStep", events.OutcomeApplied, "signal", nil, events.OutcomeApplied, "force", nil, false},
		{"OtherOutcome", events.OutcomeInProgress, "signal", nil, events.OutcomeApplied, "signal", nil, false},
		{"OtherFailure", events.OutcomeFailed, "failed", failed(ReasonBMCAuthFailed), events.OutcomeFailed, "failed", failed(ReasonTimeout), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := op.action(tc.outcome, "first", tc.step, tc.details), op.action(tc.outcome2, "second", tc.step2, tc.details2)
			if (a.Id == b.Id) != tc.same {
				t.Fatalf("ids %s and %s; want the same: %v", a.Id, b.Id, tc.same)
			}
		})
	}
}
