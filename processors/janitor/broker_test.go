package janitor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// timed passes each try to produce on to a producer and records how long
// it was given (its context's deadline), how long it took and its error.
type timed struct {
	pipeline.Producer
	mu    sync.Mutex
	tries []try
}

type try struct {
	action      string // kind/outcome id
	bound, took time.Duration
	err         error
}

func (t try) String() string {
	return fmt.Sprintf("%s given %s, took %s: %v", t.action, t.bound, t.took, t.err)
}

func (t *timed) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	began := time.Now()
	dl, _ := ctx.Deadline()
	res := t.Producer.ProduceSync(ctx, rs...)
	t.mu.Lock()
	var action string
	if a, err := events.UnmarshalAction(rs[0].Value); err == nil {
		action = a.Kind + "/" + a.Outcome + " " + a.Id
	}
	t.tries = append(t.tries, try{action: action, bound: dl.Sub(began), took: time.Since(began), err: res.FirstErr()})
	t.mu.Unlock()
	return res
}

func (t *timed) all() []try {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]try(nil), t.tries...)
}

// TestActionsKeptWhileTheBrokerIsDown: the janitor's own producer
// (actionsProducer, franz-go) to a real broker stopped before a reboot.
// The reboot goes on; its first action waits out emitTry, the next only
// emitTryRefused (franz-go fails a record it put in a produce request
// only with AllowIdempotentProduceCancellation: without it the first try
// waited for the broker); both are kept on the resource. Once the broker
// is back the same client produces them (resay, resayAfter after the
// refusal), each once with its id, and the resource is cleared. The fake
// brokers of the other tests answer at once or never; this one is
// franz-go losing a broker and finding it again.
func TestActionsKeptWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	k := testenv.StartKafka(t)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = k.Addr()
	ctx := context.Background()
	if err := kafka.CreatePipelineTopics(ctx, kcfg, testLog); err != nil {
		t.Fatal(err)
	}
	prod, err := actionsProducer(kcfg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	// The client has found the broker before it goes, as a running
	// janitor's has.
	warm, err := pipeline.ActionRecord(&faultlinev1.Action{Id: "warm", Cluster: cluster, Node: "none", Role: Role, Kind: events.KindReboot, Outcome: events.OutcomeSkipped})
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.ProduceSync(ctx, warm).FirstErr(); err != nil {
		t.Fatal(err)
	}
	k.Stop()

	const node = "broker-down"
	e.node(node, sysID(0), true, nil)
	tp := &timed{Producer: prod}
	j := e.janitorTo(tp, e.config(), false, nil)
	j.emitTry, j.resayAfter = 3*time.Second, 5*time.Second // 30 s each as shipped
	run(t, j)
	e.create(kindReboot, node, node, false)
	o := e.wait(kindReboot, node, 60*time.Second)
	if condOf(o, CondNodeReady) != "True/"+ReasonSucceeded {
		t.Fatalf("reboot not succeeded while the broker was down: %v", o.Object["status"])
	}
	kept := map[string]string{} // id -> kind/outcome
	for _, a := range keptActions(t, o) {
		kept[a.Id] = a.Kind + "/" + a.Outcome
	}
	tries := tp.all()
	t.Logf("kept %v; tries while down: %v", kept, tries)
	if len(kept) != 2 || len(tries) < 2 || !strings.HasPrefix(tries[0].action, "reboot/applied ") {
		t.Fatalf("kept %v after tries %v, want reboot/applied and reboot/succeeded, reboot/applied tried first", kept, tries)
	}
	// The first try is given emitTry; reboot/succeeded's, after that
	// refusal, emitTryRefused. (A reboot slower than resayAfter puts a
	// resay of the kept reboot/applied between them, given emitTry, which
	// marks the refusal again.) franz-go looks at a record's context
	// between its tries to reach the broker: a try ends up to one retry
	// backoff (≤ 1.2 s) and a dial after its bound. Without
	// AllowIdempotentProduceCancellation the first try never ended (the
	// record was in a produce request before the dial failed, and the
	// idempotent producer holds such a record until it knows its fate).
	succeeded := slices.IndexFunc(tries, func(t try) bool { return strings.HasPrefix(t.action, "reboot/succeeded ") })
	if succeeded < 0 {
		t.Fatalf("reboot/succeeded never tried: %v", tries)
	}
	for i, got := range tries {
		want := j.emitTry
		if i == succeeded {
			want = emitTryRefused
		}
		if got.err == nil || (i == 0 || i == succeeded) && got.bound.Round(time.Second) != want || got.took > got.bound+3*time.Second {
			t.Fatalf("try %d %v; want given %s, refused within 3s of its end", i+1, got, want)
		}
	}

	k.Start()
	back := time.Now()
	seen := map[string]int{}
	cl, err := kafka.NewClient(kcfg, testLog, kgo.ConsumeTopics(events.TopicActions), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	poll := func() { // counts the kept actions read from the topic
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if a, err := events.UnmarshalAction(r.Value); err == nil && kept[a.Id] != "" {
				seen[a.Id]++
			}
		})
	}
	for deadline := time.Now().Add(60 * time.Second); len(seen) < len(kept); poll() {
		if time.Now().After(deadline) {
			t.Fatalf("after the broker was back: %v of the kept %v produced", seen, kept)
		}
	}
	t.Logf("kept actions produced %s after the broker was back", time.Since(back).Round(time.Millisecond))
	time.Sleep(2 * time.Second) // a second copy would show by now
	poll()
	for id, n := range seen {
		if n != 1 {
			t.Errorf("kept action %s (%s) produced %d times", id, kept[id], n)
		}
	}
	e.waitUnsaidCleared(kindReboot, node, 10*time.Second)
}
