package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/schemas/events"
)

// The Runner's contract, each part against kfake (franz-go's in-process
// Kafka): a failed batch is retried with the same records, holding only
// its own partition while the others go on; a record the
// handler cannot process goes to the dead-letter topic with its reason and
// origin; offsets are committed only once the batch's outputs are
// acknowledged, and a commit the coordinator does not answer holds up no
// batch; a handler panic is a failed batch, not a crash; a rebalance lets
// the batch in flight finish and commit before its partitions move, so the
// new owner does not handle it again.

const (
	topicIn  = "runner.in"
	topicOut = "runner.out"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// harness is a kfake cluster with the runner's topics and a client for
// the test's own produce and reads.
type harness struct {
	t    *testing.T
	kc   *kfake.Cluster
	kcfg kafka.Config
	cl   *kgo.Client
	reg  *prometheus.Registry // the last runner's metrics
	log  *slog.Logger         // the runners' logger (quiet when nil)
}

func newHarness(t *testing.T, partitions int32, topics ...string) *harness {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = strings.Join(kc.ListenAddrs(), ",")
	cl, err := kafka.NewClient(kcfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &harness{t: t, kc: kc, kcfg: kcfg, cl: cl}
}

// produceAt writes one record v to topicIn, stamped at.
func (h *harness) produceAt(v string, at time.Time) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.cl.ProduceSync(ctx, &kgo.Record{Topic: topicIn, Value: []byte(v), Timestamp: at}).FirstErr(); err != nil {
		h.t.Fatal(err)
	}
}

// produce writes n records "k<i>"/"v<i>" to topic, keys spread over the
// partitions.
func (h *harness) produce(topic string, from, n int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := from; i < from+n; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v" + strconv.Itoa(i))}
		if err := h.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			h.t.Fatal(err)
		}
	}
}

// read returns every record of topic, waiting until there are at least n.
func (h *harness) read(topic string, n int) []*kgo.Record {
	h.t.Helper()
	cl, err := kafka.NewClient(h.kcfg, quiet, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		h.t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		out = append(out, cl.PollFetches(ctx).Records()...)
		cancel()
	}
	if len(out) < n {
		h.t.Fatalf("%s: %d records, want %d", topic, len(out), n)
	}
	return out
}

// createTopic creates topic, one partition (a topic the outputs failed to
// until now).
func (h *harness) createTopic(topic string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(h.cl).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		h.t.Fatal(err)
	}
}

// committed returns the group's committed offsets of topicIn by partition
// (-1 when none).
func (h *harness) committed(group string, partitions int32) []int64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := make([]int64, partitions)
	offs, err := kadm.NewClient(h.cl).FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		for p := range out {
			out[p] = -1
		}
		return out
	}
	if err != nil {
		h.t.Fatal(err)
	}
	for p := range partitions {
		out[p] = -1
		if o, ok := offs.Lookup(topicIn, p); ok && o.Err == nil {
			out[p] = o.At
		}
	}
	return out
}

// run starts a runner for the handler; stop ends it and returns Run's error.
func (h *harness) run(role string, handler Handler, mod func(*Config)) (stop func() error) {
	h.t.Helper()
	cfg := Config{Role: role, Topics: []string{topicIn}, MaxBackoff: 50 * time.Millisecond, LagInterval: -1, CommitInterval: 100 * time.Millisecond,
		ConsumeOpts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.RebalanceTimeout(10 * time.Second)}}
	if mod != nil {
		mod(&cfg)
	}
	h.reg = prometheus.NewRegistry()
	log := h.log
	if log == nil {
		log = quiet
	}
	r := NewRunner(cfg, h.kcfg, handler, log, NewMetrics(h.reg))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				err = errors.New("runner did not stop")
			}
		})
		return err
	}
	h.t.Cleanup(func() { _ = stop() })
	return stop
}

func eventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// echo copies every record to topicOut.
func echo(recs []*kgo.Record) Result {
	var res Result
	for _, r := range recs {
		res.Out = append(res.Out, &kgo.Record{Topic: topicOut, Key: r.Key, Value: r.Value})
	}
	return res
}

func values(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	slices.Sort(out)
	return out
}

func want(from, n int) []string {
	var out []string
	for i := from; i < from+n; i++ {
		out = append(out, "v"+strconv.Itoa(i))
	}
	slices.Sort(out)
	return out
}

// TestRunnerRetriesFailedBatch: a batch whose Handle fails is handed to
// Handle again, the same records in the same order, until it succeeds;
// nothing is produced or committed for the failed attempts.
func TestRunnerRetriesFailedBatch(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	h.produce(topicIn, 0, 5)
	var (
		mu       sync.Mutex
		attempts [][]string
	)
	stop := h.run("retry", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		mu.Lock()
		defer mu.Unlock()
		var vs []string
		for _, r := range recs {
			vs = append(vs, string(r.Value))
		}
		attempts = append(attempts, vs)
		if len(attempts) < 3 {
			if got := h.committed("faultline-retry", 1)[0]; got != -1 {
				t.Errorf("committed %d before the batch succeeded", got)
			}
			return Result{}, fmt.Errorf("attempt %d fails", len(attempts))
		}
		return echo(recs), nil
	}), nil)
	eventually(t, 10*time.Second, "offset 5 committed", func() bool { return h.committed("faultline-retry", 1)[0] == 5 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 {
		t.Fatalf("%d attempts, want 3", len(attempts))
	}
	for i, a := range attempts {
		if !slices.Equal(a, []string{"v0", "v1", "v2", "v3", "v4"}) {
			t.Fatalf("attempt %d handled %v", i+1, a)
		}
	}
	if got := values(h.read(topicOut, 5)); !slices.Equal(got, want(0, 5)) {
		t.Fatalf("outputs %v", got)
	}
}

// putTo returns a function that writes n records "v<i>" to partition p
// of topicIn.
func (h *harness) putTo() func(p int32, from, n int) {
	h.t.Helper()
	cl, err := kafka.NewClient(h.kcfg, quiet, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(cl.Close)
	return func(p int32, from, n int) {
		h.t.Helper()
		for i := from; i < from+n; i++ {
			r := &kgo.Record{Topic: topicIn, Partition: p, Value: []byte("v" + strconv.Itoa(i))}
			if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				h.t.Fatal(err)
			}
		}
	}
}

// inOrder records the values each replica's successful batches handled,
// by partition, in order.
type inOrder struct {
	mu sync.Mutex
	ok map[int32][]string
}

func (o *inOrder) add(recs []*kgo.Record) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ok == nil {
		o.ok = map[int32][]string{}
	}
	for _, r := range recs {
		o.ok[r.Partition] = append(o.ok[r.Partition], string(r.Value))
	}
}

func (o *inOrder) of(p int32) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.ok[p])
}

// seq returns "v<from>" … "v<from+n-1>" in that order.
func seq(from, n int) []string {
	var out []string
	for i := from; i < from+n; i++ {
		out = append(out, "v"+strconv.Itoa(i))
	}
	return out
}

// TestRunnerFailingPartitionHoldsOnlyItself: a partition whose batch
// keeps failing (its cluster is down) is held, paused, while the
// replica's other partition is fetched and handled, round after round;
// once the batch succeeds, the partition goes on: every record handled
// once, in order, and committed.
func TestRunnerFailingPartitionHoldsOnlyItself(t *testing.T) {
	h := newHarness(t, 2, topicIn, topicOut, events.TopicDeadLetter)
	put := h.putTo()
	put(0, 0, 5)
	put(1, 100, 5)
	var (
		down   atomic.Bool
		tries0 atomic.Int32
		ok     inOrder
	)
	down.Store(true)
	h.run("hold", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		if recs[0].Partition == 0 {
			tries0.Add(1)
			if down.Load() {
				return Result{}, errors.New("partition 0's cluster is down")
			}
		}
		ok.add(recs)
		return echo(recs), nil
	}), nil)
	committed := func(p int32, at int64) func() bool {
		return func() bool { return h.committed("faultline-hold", 2)[p] == at }
	}
	eventually(t, 10*time.Second, "partition 1 committed while 0 fails", committed(1, 5))
	put(1, 105, 5)
	put(0, 5, 5)
	eventually(t, 10*time.Second, "partition 1's next records committed while 0 fails", committed(1, 10))
	if got := h.committed("faultline-hold", 2)[0]; got != -1 || tries0.Load() < 2 || len(ok.of(0)) > 0 {
		t.Fatalf("partition 0 while failing: committed %d, %d tries, handled %v", got, tries0.Load(), ok.of(0))
	}
	down.Store(false)
	eventually(t, 10*time.Second, "partition 0 committed once it succeeds", committed(0, 10))
	if got := ok.of(0); !slices.Equal(got, seq(0, 10)) {
		t.Fatalf("partition 0 handled %v, want v0…v9 once each, in order", got)
	}
	if got := ok.of(1); !slices.Equal(got, seq(100, 10)) {
		t.Fatalf("partition 1 handled %v", got)
	}
}

// TestRunnerHeldPartitionRevoked: every partition of replica a fails and
// is held when replica b joins; the partitions moved to b are handled
// there from their committed offsets, never by a (its held batches
// dropped), and those a keeps are handled by a once they succeed: every
// record once, in order.
func TestRunnerHeldPartitionRevoked(t *testing.T) {
	h := newHarness(t, 4, topicIn, topicOut, events.TopicDeadLetter)
	put := h.putTo()
	for p := range int32(4) {
		put(p, int(p)*100, 5)
	}
	var (
		down  atomic.Bool
		tries atomic.Int32
		ok    inOrder
		byA   sync.Map // values a handled
	)
	down.Store(true)
	a := &observer{assigned: map[int32]bool{}}
	a.HandlerFunc = func(_ context.Context, recs []*kgo.Record) (Result, error) {
		tries.Add(1)
		if down.Load() {
			return Result{}, errors.New("down")
		}
		for _, r := range recs {
			byA.Store(string(r.Value), true)
		}
		ok.add(recs)
		return echo(recs), nil
	}
	h.run("heldmove", a, nil)
	eventually(t, 10*time.Second, "a's batches held", func() bool { return tries.Load() >= 8 })
	b := &observer{assigned: map[int32]bool{}}
	b.HandlerFunc = func(_ context.Context, recs []*kgo.Record) (Result, error) {
		ok.add(recs)
		return echo(recs), nil
	}
	h.run("heldmove", b, nil)
	eventually(t, 20*time.Second, "the partitions split between a and b", func() bool {
		return len(a.owned()) > 0 && len(b.owned()) > 0 && len(a.owned())+len(b.owned()) == 4
	})
	moved, kept := b.owned(), a.owned()
	eventually(t, 10*time.Second, "b handles the moved partitions", func() bool {
		return !slices.ContainsFunc(moved, func(p int32) bool { return len(ok.of(p)) < 5 })
	})
	down.Store(false)
	eventually(t, 10*time.Second, "a handles the partitions it kept", func() bool {
		return !slices.ContainsFunc(kept, func(p int32) bool { return len(ok.of(p)) < 5 })
	})
	for _, p := range moved {
		put(p, int(p)*100+50, 3)
	}
	eventually(t, 10*time.Second, "b handles what comes next", func() bool {
		return !slices.ContainsFunc(moved, func(p int32) bool { return len(ok.of(p)) < 8 })
	})
	time.Sleep(300 * time.Millisecond) // a held batch of a moved partition would be handled by now
	for _, p := range moved {
		if got, want := ok.of(p), append(seq(int(p)*100, 5), seq(int(p)*100+50, 3)...); !slices.Equal(got, want) {
			t.Errorf("moved partition %d handled %v, want %v", p, got, want)
		}
		for _, v := range ok.of(p) {
			if _, by := byA.Load(v); by {
				t.Errorf("a handled %s of partition %d, moved to b", v, p)
			}
		}
	}
	for _, p := range kept {
		if got := ok.of(p); !slices.Equal(got, seq(int(p)*100, 5)) {
			t.Errorf("kept partition %d handled %v", p, got)
		}
	}
}

// TestRunnerShutdownMidBatch: a batch the shutdown cuts is not a failure
// (no warning, not counted as a batch error) and is not committed, so the
// next runner of the group handles it.
func TestRunnerShutdownMidBatch(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	h.produce(topicIn, 0, 3)
	var logs syncbuf.Buffer
	h.log = slog.New(slog.NewTextHandler(&logs, nil))
	started := make(chan struct{})
	var once sync.Once
	stop := h.run("cut", HandlerFunc(func(ctx context.Context, _ []*kgo.Record) (Result, error) {
		once.Do(func() { close(started) })
		<-ctx.Done()
		return Result{}, fmt.Errorf("query: %w", ctx.Err())
	}), nil)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was not handed to the handler")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") ||
		!strings.Contains(out, "interrupted by the shutdown") {
		t.Fatalf("log of a shutdown mid-batch:\n%s", out)
	}
	if got := counter(t, h.reg, "faultline_processor_batch_errors_total"); got != 0 {
		t.Fatalf("batch errors %v, want 0", got)
	}
	if got := h.committed("faultline-cut", 1)[0]; got != -1 {
		t.Fatalf("committed %d for a batch the shutdown cut", got)
	}
	h.log = nil
	h.run("cut", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) { return echo(recs), nil }), nil)
	eventually(t, 20*time.Second, "the cut batch handled by the next runner", func() bool { return h.committed("faultline-cut", 1)[0] == 3 })
}

// TestRunnerOverlapShutdownCutsAnEarlierRound: with Overlap, the shutdown
// cuts a round while the next one, handed over behind it, has succeeded:
// nothing is committed past the cut round (its partition's later records
// wait behind it), and the next runner of the group handles it. The cut
// round was dropped and the next one's offset committed: v0…v4 lost.
func TestRunnerOverlapShutdownCutsAnEarlierRound(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	h.produce(topicIn, 0, 10)
	handed := make(chan struct{})
	var once sync.Once
	stop := h.run("overlap-cut", HandlerFunc(func(ctx context.Context, recs []*kgo.Record) (Result, error) {
		if string(recs[0].Value) == "v0" {
			<-ctx.Done()
			return Result{}, fmt.Errorf("insert: %w", ctx.Err())
		}
		once.Do(func() { close(handed) })
		return Result{}, nil
	}), func(c *Config) { c.Overlap, c.MaxPollRecords = true, 5 })
	select {
	case <-handed:
	case <-time.After(10 * time.Second):
		t.Fatal("the next round was not handed over behind the first")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := h.committed("faultline-overlap-cut", 1)[0]; got != -1 {
		t.Fatalf("committed offset %d past a round the shutdown cut (v0…v4 never handled)", got)
	}
	var (
		mu   sync.Mutex
		seen []*kgo.Record
	)
	h.run("overlap-cut", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		mu.Lock()
		seen = append(seen, recs...)
		mu.Unlock()
		return Result{}, nil
	}), nil)
	eventually(t, 20*time.Second, "offset 10 committed by the next runner", func() bool { return h.committed("faultline-overlap-cut", 1)[0] == 10 })
	mu.Lock()
	defer mu.Unlock()
	if got := values(seen); !slices.Contains(got, "v0") {
		t.Fatalf("the next runner handled %v, want the cut round's v0…v4 among them", got)
	}
}

// TestRunnerDeadLetters: a record the handler reports dead goes to the
// dead-letter topic with its key and value, the reason, where it came
// from and which role gave up; the batch's other records carry on and the
// offsets move past it.
func TestRunnerDeadLetters(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	h.produce(topicIn, 0, 4)
	h.run("dl", poisoned("v2", nil), nil)
	eventually(t, 10*time.Second, "offset 4 committed", func() bool { return h.committed("faultline-dl", 1)[0] == 4 })
	dl := h.read(events.TopicDeadLetter, 1)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
	d := dl[0]
	hdr := map[string]string{}
	for _, x := range d.Headers {
		hdr[x.Key] = string(x.Value)
	}
	if string(d.Key) != "k2" || string(d.Value) != "v2" || hdr[events.HeaderError] != "v2 is poison" ||
		hdr[events.HeaderSource] != topicIn || hdr[events.HeaderSourcePart] != "0" || hdr[events.HeaderSourceOff] != "2" ||
		hdr[HeaderRole] != "dl" {
		t.Fatalf("dead letter %s=%s headers %v", d.Key, d.Value, hdr)
	}
	if got := values(h.read(topicOut, 3)); !slices.Equal(got, []string{"v0", "v1", "v3"}) {
		t.Fatalf("outputs %v", got)
	}
	if got, want := produced(t, h.reg), map[string]float64{"dl " + events.TopicDeadLetter: 1, "dl " + topicOut: 3}; !maps.Equal(got, want) {
		t.Fatalf("faultline_processor_produced_total %v, want %v", got, want)
	}
}

// poisoned copies each record to topicOut but the one whose value is
// poison, which it reports dead ("<poison> is poison"); calls (nil: not
// counted) counts its calls.
func poisoned(poison string, calls *atomic.Int32) Handler {
	return HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		if calls != nil {
			calls.Add(1)
		}
		var res Result
		for _, r := range recs {
			if string(r.Value) == poison {
				res.Dead = append(res.Dead, Dead{Record: r, Reason: errors.New(poison + " is poison")})
				continue
			}
			res.Out = append(res.Out, &kgo.Record{Topic: topicOut, Key: r.Key, Value: r.Value})
		}
		return res, nil
	})
}

// produced reads faultline_processor_produced_total from reg by "role topic".
// counter returns the sum of the counter name over its labels (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func produced(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "faultline_processor_produced_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["role"]+" "+l["topic"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestRunnerCommitsOnlyAfterOutputsAcknowledged: while the batch's outputs
// cannot be produced (their topic does not exist yet), the offsets stay
// where they were and the batch is handled again; once the outputs are
// acknowledged, Result.Produced is called (once) and the offsets are
// committed.
func TestRunnerCommitsOnlyAfterOutputsAcknowledged(t *testing.T) {
	h := newHarness(t, 1, topicIn, events.TopicDeadLetter) // no topicOut
	h.produce(topicIn, 0, 3)
	var calls, produced atomic.Int32
	h.run("ack", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		calls.Add(1)
		res := echo(recs)
		res.Produced = func() { produced.Add(1) }
		return res, nil
	}), func(c *Config) { c.BatchTimeout = 300 * time.Millisecond })
	eventually(t, 10*time.Second, "the batch handled twice (its outputs failed)", func() bool { return calls.Load() >= 2 })
	if got := h.committed("faultline-ack", 1)[0]; got != -1 || produced.Load() != 0 {
		t.Fatalf("offset %d committed (Produced called %d times) while the outputs were not produced", got, produced.Load())
	}
	h.createTopic(topicOut)
	eventually(t, 15*time.Second, "offset 3 committed once the outputs were produced", func() bool {
		return h.committed("faultline-ack", 1)[0] == 3
	})
	if produced.Load() != 1 {
		t.Fatalf("Produced called %d times, want once", produced.Load())
	}
	if got := values(h.read(topicOut, 3)); !slices.Equal(got, want(0, 3)) {
		t.Fatalf("outputs %v", got)
	}
}

// TestRunnerDeadLettersCountedOnceWritten: a dead letter is counted and
// logged once its batch's outputs are written; before, each try of a
// batch whose produce failed counted it again, and the dead-letter alert
// fired on a broker's trouble rather than on poison records.
func TestRunnerDeadLettersCountedOnceWritten(t *testing.T) {
	h := newHarness(t, 1, topicIn, events.TopicDeadLetter) // no topicOut
	h.produce(topicIn, 0, 3)
	var calls atomic.Int32
	h.run("dlonce", poisoned("v1", &calls), func(c *Config) { c.BatchTimeout = 300 * time.Millisecond })
	eventually(t, 10*time.Second, "the batch handled three times (its outputs failed)", func() bool { return calls.Load() >= 3 })
	if n := counter(t, h.reg, "faultline_processor_dead_letters_total"); n != 0 {
		t.Fatalf("%v dead letters counted while none was written with its batch", n)
	}
	h.createTopic(topicOut)
	eventually(t, 15*time.Second, "offset 3 committed once the outputs were produced", func() bool {
		return h.committed("faultline-dlonce", 1)[0] == 3
	})
	if n := counter(t, h.reg, "faultline_processor_dead_letters_total"); n != 1 {
		t.Fatalf("%v dead letters counted, want 1", n)
	}
}

// TestRunnerWaitsARoundInARebalance: the group waits for a member's round
// (its Handle and its produce, each up to batch_timeout) before it puts the
// member out of a rebalance, and a produce the broker does not answer ends
// with the round's context; before, franz-go's 60 s rebalance timeout was
// shorter than the 2m batches of quarantine, drain and remediate.
func TestRunnerWaitsARoundInARebalance(t *testing.T) {
	for _, tc := range []struct{ batch, want time.Duration }{
		{30 * time.Second, 90 * time.Second},
		{2 * time.Minute, 270 * time.Second},
		{time.Second, time.Minute},
	} {
		cl, err := kgo.NewClient(roundBound(tc.batch)...)
		if err != nil {
			t.Fatal(err)
		}
		got := cl.OptValue(kgo.RebalanceTimeout)
		cancels := cl.OptValue(kgo.AllowIdempotentProduceCancellation)
		cl.Close()
		if got != tc.want || cancels != true {
			t.Errorf("batch_timeout %v: rebalance timeout %v, produce cancellation %v; want %v and true", tc.batch, got, cancels, tc.want)
		}
	}
}

// TestRunnerRecoversPanic: a handler that panics fails the batch (it is
// retried); the runner keeps running — also when the panic is in one of
// ByKey's workers, as the roles that act per node run their work (there
// it ended the process).
func TestRunnerRecoversPanic(t *testing.T) {
	for _, where := range []string{"handler", "worker"} {
		t.Run(where, func(t *testing.T) {
			h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
			h.produce(topicIn, 0, 2)
			var calls atomic.Int32
			boom := func() {
				if calls.Add(1) == 1 {
					var m map[string]int
					m["boom"]++ // a nil map write: a runtime panic
				}
			}
			group := "panic-" + where
			stop := h.run(group, HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
				if where == "worker" {
					ByKey(recs, func(r *kgo.Record) string { return string(r.Value) }, 2, func([]*kgo.Record) int { boom(); return 0 })
				} else {
					boom()
				}
				return echo(recs), nil
			}), nil)
			eventually(t, 10*time.Second, "offset 2 committed after the panic", func() bool { return h.committed("faultline-"+group, 1)[0] == 2 })
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := values(h.read(topicOut, 2)); !slices.Equal(got, want(0, 2)) {
				t.Fatalf("outputs %v", got)
			}
		})
	}
}

// observer is a handler that records its assignments and revocations.
type observer struct {
	HandlerFunc
	mu       sync.Mutex
	assigned map[int32]bool
	revoked  []int32
}

func (o *observer) PartitionsAssigned(topic string, ps []int32, total int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if topic != topicIn || total != 4 {
		panic(fmt.Sprintf("assigned %s with %d partitions", topic, total))
	}
	for _, p := range ps {
		o.assigned[p] = true
	}
}

func (o *observer) PartitionsRevoked(topic string, ps []int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range ps {
		delete(o.assigned, p)
		o.revoked = append(o.revoked, p)
	}
}

func (o *observer) owned() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []int32
	for p := range o.assigned {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestRunnerPartitionRevocation: a second replica joining the group takes
// partitions from the first, which is told of the revocation
// (PartitionObserver); the batch the first had in flight finishes and is
// committed before its partitions move, so the second replica handles
// only what came after, and every record is handled exactly once.
func TestRunnerPartitionRevocation(t *testing.T) {
	h := newHarness(t, 4, topicIn, topicOut, events.TopicDeadLetter)
	var (
		mu      sync.Mutex
		handled = map[string]string{} // value -> replica
		dups    []string
	)
	record := func(replica string, recs []*kgo.Record) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			if by, ok := handled[string(r.Value)]; ok {
				dups = append(dups, string(r.Value)+" by "+by+" and "+replica)
			}
			handled[string(r.Value)] = replica
		}
	}
	release := make(chan struct{})
	var inFlight atomic.Bool
	a := &observer{assigned: map[int32]bool{}}
	a.HandlerFunc = func(ctx context.Context, recs []*kgo.Record) (Result, error) {
		if !inFlight.Swap(true) {
			<-release // hold the first batch while the second replica joins
		}
		record("a", recs)
		return echo(recs), nil
	}
	h.run("rebalance", a, nil)
	eventually(t, 10*time.Second, "replica a owns all 4 partitions", func() bool { return len(a.owned()) == 4 })
	h.produce(topicIn, 0, 20)
	eventually(t, 10*time.Second, "a batch in flight", inFlight.Load)

	b := &observer{assigned: map[int32]bool{}}
	b.HandlerFunc = func(_ context.Context, recs []*kgo.Record) (Result, error) {
		record("b", recs)
		return echo(recs), nil
	}
	h.run("rebalance", b, nil)
	time.Sleep(500 * time.Millisecond) // b's join is waiting on a's batch
	if len(b.owned()) != 0 {
		t.Fatalf("b was assigned %v while a's batch was in flight", b.owned())
	}
	close(release)
	eventually(t, 20*time.Second, "the partitions split between a and b", func() bool {
		return len(a.owned()) > 0 && len(b.owned()) > 0 && len(a.owned())+len(b.owned()) == 4
	})
	a.mu.Lock()
	revoked := len(a.revoked)
	a.mu.Unlock()
	if revoked == 0 {
		t.Fatal("a was not told of its revoked partitions")
	}
	h.produce(topicIn, 20, 20)
	eventually(t, 20*time.Second, "all 40 records handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 40
	})
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(dups) > 0 {
		t.Fatalf("handled twice: %v", dups)
	}
	byB := 0
	for _, r := range handled {
		if r == "b" {
			byB++
		}
	}
	if byB == 0 {
		t.Fatal("b handled nothing after it joined")
	}
}

// TestRunnerCommitDoesNotHoldBatches: while the group coordinator does not
// answer commits (it is failing over to another broker), the runner goes on
// handling new batches; the offsets are committed once it answers again.
// (Committing after each batch before polling the next stalled every
// partition's records for the whole failover.)
func TestRunnerCommitDoesNotHoldBatches(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	answer := make(chan struct{})
	var held atomic.Int32
	h.kc.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		h.kc.KeepControl()
		held.Add(1)
		h.kc.SleepControl(func() { <-answer })
		return nil, nil, false // then the cluster answers it
	})
	h.produce(topicIn, 0, 3)
	var handled atomic.Int32
	h.run("held", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		handled.Add(int32(len(recs)))
		return echo(recs), nil
	}), nil)
	eventually(t, 10*time.Second, "the first batch handled and its commit held", func() bool { return handled.Load() == 3 && held.Load() > 0 })
	h.produce(topicIn, 3, 2)
	eventually(t, 5*time.Second, "the next batch handled while the commit is held", func() bool { return handled.Load() == 5 })
	if got := h.committed("faultline-held", 1)[0]; got != -1 {
		t.Fatalf("offset %d committed while the coordinator answered no commit", got)
	}
	close(answer)
	eventually(t, 10*time.Second, "offset 5 committed once the coordinator answers", func() bool { return h.committed("faultline-held", 1)[0] == 5 })
}

// TestRunnerRestsTopic: a batch asking a topic to rest (Result.Rest) is
// committed, and the topic is not fetched again until the time asked,
// but soon after it (a short FetchMaxWait), while the other topic's
// records are handled as they come.
func TestRunnerRestsTopic(t *testing.T) {
	const topicRest = "runner.rest"
	h := newHarness(t, 1, topicIn, topicRest, topicOut, events.TopicDeadLetter)
	// Long enough that a loaded machine's delays (a few hundred ms, at
	// times more) stay well inside both bounds below: the other topic
	// within half the rest, the rested one within 3 s of its end (franz-go's
	// default 5 s fetch wait would miss it).
	const rest = 6 * time.Second
	var (
		mu      sync.Mutex
		handled = map[string]time.Time{}
		until   time.Time
	)
	h.run("rest", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		mu.Lock()
		defer mu.Unlock()
		var res Result
		for _, r := range recs {
			handled[string(r.Value)] = time.Now()
			if r.Topic == topicRest && until.IsZero() {
				until = time.Now().Add(rest)
				res.Rest = map[string]time.Time{topicRest: until}
			}
		}
		return res, nil
	}), func(c *Config) { c.Topics, c.FetchMaxWait = []string{topicIn, topicRest}, 200*time.Millisecond })
	at := func(v string) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		t, ok := handled[v]
		return t, ok
	}
	h.produce(topicRest, 0, 1)
	eventually(t, 10*time.Second, "the first record of the resting topic handled", func() bool { _, ok := at("v0"); return ok })
	h.produce(topicRest, 1, 1)
	sent := time.Now()
	h.produce(topicIn, 2, 1)
	eventually(t, 10*time.Second, "the other topic's record handled", func() bool { _, ok := at("v2"); return ok })
	if got, _ := at("v2"); got.Sub(sent) > rest/2 {
		t.Errorf("the other topic's record handled %v after its send, want well within the rest (%v)", got.Sub(sent), rest)
	}
	eventually(t, 10*time.Second, "the resting topic's next record handled", func() bool { _, ok := at("v1"); return ok })
	mu.Lock()
	defer mu.Unlock()
	switch got := handled["v1"]; {
	case got.Before(until):
		t.Errorf("the resting topic's next record handled %v before its rest ended", until.Sub(got))
	case got.Sub(until) > 3*time.Second:
		t.Errorf("the resting topic's next record handled %v after its rest ended, want within a fetch's wait", got.Sub(until))
	}
}

// pauser records the client's pause state; its Resume can be held so a
// test can rest a topic again while an earlier rest's timer is resuming.
type pauser struct {
	mu       sync.Mutex
	paused   map[string]bool
	resumes  int           // Resume calls finished
	resuming chan struct{} // signalled when a Resume starts (if set)
	release  chan struct{} // a Resume waits for it (if set)
}

func (p *pauser) PauseFetchTopics(topics ...string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range topics {
		p.paused[t] = true
	}
	return nil
}

func (p *pauser) ResumeFetchTopics(topics ...string) {
	if p.resuming != nil {
		p.resuming <- struct{}{}
		<-p.release
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range topics {
		p.paused[t] = false
	}
	p.resumes++
}

func (p *pauser) isPaused(topic string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused[topic]
}

// TestRestingNewRestOutlivesFiredTimer: a topic rested again while its
// earlier rest's timer is already resuming stays paused for the new rest
// (the old code's late Resume undid the new Pause: one extra fetch of a
// record not yet due).
func TestRestingNewRestOutlivesFiredTimer(t *testing.T) {
	p := &pauser{paused: map[string]bool{}, resuming: make(chan struct{}), release: make(chan struct{})}
	var rs resting
	defer rs.stop()
	rs.rest(p, map[string]time.Time{"requeue": time.Now()}) // due at once
	<-p.resuming                                            // its timer is resuming
	p.resuming = nil                                        // (no Resume is expected while the test looks)
	again := make(chan struct{})
	go func() {
		rs.rest(p, map[string]time.Time{"requeue": time.Now().Add(time.Hour)})
		close(again)
	}()
	time.Sleep(100 * time.Millisecond) // the new rest's Pause, had it not waited for the firing timer
	close(p.release)
	<-again
	eventually(t, 5*time.Second, "the earlier rest's Resume finished", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.resumes == 1
	})
	if !p.isPaused("requeue") {
		t.Fatal("the topic was resumed by the earlier rest's timer while its new rest (an hour) lasts")
	}
	rs.rest(p, map[string]time.Time{"requeue": time.Now().Add(50 * time.Millisecond)})
	eventually(t, 5*time.Second, "the topic resumed when its rest ends", func() bool { return !p.isPaused("requeue") })
}

// TestRunnerStartWithin: a group with no committed offset starts at the
// first record stamped within Config.StartWithin, not at the log's start
// (a role that acts on nothing older does not read a week of the topic);
// without it, at the start; and a committed offset wins, however old the
// records after it.
func TestRunnerStartWithin(t *testing.T) {
	old := time.Now().Add(-72 * time.Hour)
	for _, tc := range []struct {
		name        string
		startWithin time.Duration
		committed   bool // the group consumed the first record before
		want        []string
	}{
		{"no committed offset, no bound: the log's start", 0, false, []string{"old0", "old1", "new0"}},
		{"no committed offset, 6h: the records of the last 6h", 6 * time.Hour, false, []string{"new0"}},
		{"a committed offset wins over the bound", 6 * time.Hour, true, []string{"old1", "new0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, topicIn, topicOut)
			produce := h.produceAt
			var c collector
			produce("old0", old)
			if tc.committed {
				stop := h.run("startwithin", &c, nil)
				eventually(t, 20*time.Second, "old0 handled and committed", func() bool { return h.committed(DefaultGroup("startwithin"), 1)[0] == 1 })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				c.reset()
			}
			produce("old1", old.Add(time.Second))
			produce("new0", time.Now().Add(-time.Minute))
			stop := h.run("startwithin", &c, func(c *Config) { c.StartWithin = tc.startWithin })
			eventually(t, 20*time.Second, "new0 handled", func() bool { return slices.Contains(c.values(), "new0") })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := c.values(); !slices.Equal(got, tc.want) {
				t.Errorf("handled %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRunnerStartWithinCommitsItsStart: a group that started a partition
// StartWithin back commits that start before it handles anything there,
// so a record written while it was stopped, older than StartWithin by
// the time it restarts, is read: the quarantine role's retry consumer,
// its batch held all through a long outage and restarted meanwhile, must
// not skip the faults deferred during it. (Without the commit the restart
// started the partition StartWithin back from its own time.)
func TestRunnerStartWithinCommitsItsStart(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut)
	old := time.Now().Add(-72 * time.Hour)
	h.produceAt("old0", old) // offset 0: before the group's first start, outside the bound
	var c collector
	within := func(c *Config) { c.StartWithin = 6 * time.Hour }
	stop := h.run("startcommit", &c, within)
	eventually(t, 20*time.Second, "the group's start (offset 1, nothing handled) committed", func() bool {
		return h.committed(DefaultGroup("startcommit"), 1)[0] == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	h.produceAt("held0", old.Add(time.Hour)) // offset 1: written while it was stopped, as old by its restart
	h.produceAt("new0", time.Now())
	stop = h.run("startcommit", &c, within)
	eventually(t, 20*time.Second, "new0 handled", func() bool { return slices.Contains(c.values(), "new0") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.values(), []string{"held0", "new0"}; !slices.Equal(got, want) {
		t.Errorf("handled %v, want %v", got, want)
	}
}

// collector is a Handler that keeps the values of the records it handles.
type collector struct {
	mu  sync.Mutex
	got []string
}

func (c *collector) Handle(_ context.Context, recs []*kgo.Record) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range recs {
		c.got = append(c.got, string(r.Value))
	}
	return Result{}, nil
}

func (c *collector) values() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

func (c *collector) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = nil
}

// TestStartOffsetsMissNoRecordProducedWhileListing: a role's first start
// while its topic fills. A by-time search that finds nothing answers -1 and
// the end is listed again; a record written between the two (here: the
// search answered as a broker that ran it before the record was written)
// is before that second end. franz-go's AfterMilli, and kadm's listing on
// its own, start past it — one accepted event never handled.
// startOffsets' end, listed before the search, keeps it.
func TestStartOffsetsMissNoRecordProducedWhileListing(t *testing.T) {
	h := newHarness(t, 1, topicIn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	produce := h.produceAt
	produce("old0", time.Now().Add(-72*time.Hour)) // offset 0
	h.kc.ControlKey(int16(kmsg.ListOffsets), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.ListOffsetsRequest)
		if len(req.Topics) == 0 || len(req.Topics[0].Partitions) == 0 || req.Topics[0].Partitions[0].Timestamp < 0 {
			return nil, nil, false // the start or end: as the broker has it
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.Offset, sp.Timestamp, sp.LeaderEpoch = rp.Partition, -1, -1, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	got, err := startOffsets(ctx, kadm.NewClient(h.cl), time.Now().Add(-6*time.Hour), map[string][]int32{topicIn: {0}},
		func() { produce("new0", time.Now()) }) // offset 1
	if err != nil {
		t.Fatal(err)
	}
	if got[topicIn][0] != 1 {
		t.Fatalf("start offset %d, want 1 (new0, written while the offsets were listed)", got[topicIn][0])
	}
}

// TestRunnerBatchBytesEndLinger: a lingering runner hands over what it
// gathered once it holds MaxBatchBytes, well before MinBatch records:
// 100 records of 100 KB, polled 5 at a time, batches of at most 1 MiB
// (one poll past it).
func TestRunnerBatchBytesEndLinger(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	big := bytes.Repeat([]byte("x"), 100<<10)
	for range 100 {
		if err := h.cl.ProduceSync(ctx, &kgo.Record{Topic: topicIn, Value: big}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu    sync.Mutex
		sizes []int
	)
	h.run("bytes", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		mu.Lock()
		sizes = append(sizes, len(recs))
		mu.Unlock()
		return Result{}, nil
	}), func(c *Config) {
		c.Linger, c.MaxPollRecords, c.MinBatch, c.MaxBatchBytes = 2*time.Second, 5, 1000, 1<<20
	})
	eventually(t, 20*time.Second, "all 100 records handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range sizes {
			n += s
		}
		return n == 100
	})
	mu.Lock()
	defer mu.Unlock()
	for _, s := range sizes {
		if s > 15 {
			t.Fatalf("batches of %v records, want none over 15 (1 MiB of 100 KB records and one poll of 5)", sizes)
		}
	}
}

// TestRunnerOverlapHandsOverTheNextRound: with Overlap the next poll's
// batch is handled while the last one still is, and offsets are committed
// in order: never past a batch in flight, however far the next one got.
func TestRunnerOverlapHandsOverTheNextRound(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	h.produce(topicIn, 0, 10)
	var (
		next     = make(chan struct{})
		nextOnce sync.Once
		mu       sync.Mutex
		seen     []*kgo.Record
	)
	h.run("overlap", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		if string(recs[0].Value) == "v0" {
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				t.Error("the next batch was not handed over while the first was being handled")
			}
			time.Sleep(300 * time.Millisecond) // three commit intervals: none may pass this batch
			if c := h.committed("faultline-overlap", 1)[0]; c != -1 {
				t.Errorf("committed offset %d while the first batch was in flight", c)
			}
		} else {
			nextOnce.Do(func() { close(next) })
		}
		mu.Lock()
		seen = append(seen, recs...)
		mu.Unlock()
		return Result{}, nil
	}), func(c *Config) { c.Overlap, c.MaxPollRecords = true, 5 })
	eventually(t, 20*time.Second, "offset 10 committed", func() bool { return h.committed("faultline-overlap", 1)[0] == 10 })
	mu.Lock()
	defer mu.Unlock()
	if got := values(seen); !slices.Equal(got, want(0, 10)) {
		t.Fatalf("handled %v, want each of v0…v9 once", got)
	}
}

// TestRunnerOverlapHoldsWhatFollowsAFailedBatch: with Overlap, a batch
// that fails after the next was handed over is held with the next one's
// records joined to it (they were polled behind it): its retry waits for
// the next one to finish (due 100 ms after the failure, the next takes
// 400 ms) and carries both, in offset order, and nothing is committed
// until it succeeds.
func TestRunnerOverlapHoldsWhatFollowsAFailedBatch(t *testing.T) {
	h := newHarness(t, 1, topicIn, topicOut, events.TopicDeadLetter)
	h.produce(topicIn, 0, 10)
	var (
		mu          sync.Mutex
		first, then []string // the first batch, the first handed over behind it
		retried     [][]string
		next        = make(chan struct{})
	)
	h.run("overlap-fail", HandlerFunc(func(_ context.Context, recs []*kgo.Record) (Result, error) {
		var vs []string
		for _, r := range recs {
			vs = append(vs, string(r.Value))
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case first == nil && vs[0] == "v0":
			first = vs
			mu.Unlock()
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				t.Error("the next batch was not handed over while the first was being handled")
			}
			mu.Lock()
			return Result{}, errors.New("the first batch fails once")
		case then == nil:
			then = vs
			close(next)
			// Still handled when the failed batch is due again: its
			// retry waits for this one to join it.
			mu.Unlock()
			time.Sleep(400 * time.Millisecond)
			mu.Lock()
		default:
			if len(retried) == 0 {
				if c := h.committed("faultline-overlap-fail", 1)[0]; c != -1 {
					t.Errorf("committed offset %d before the failed batch succeeded", c)
				}
			}
			retried = append(retried, vs)
		}
		return Result{}, nil
	}), func(c *Config) { c.Overlap, c.MaxPollRecords = true, 5 })
	eventually(t, 20*time.Second, "offset 10 committed", func() bool { return h.committed("faultline-overlap-fail", 1)[0] == 10 })
	mu.Lock()
	defer mu.Unlock()
	if len(retried) == 0 {
		t.Fatalf("first %v, then %v: the failed batch was not retried", first, then)
	}
	if joined := append(slices.Clone(first), then...); !slices.Equal(retried[0], joined) {
		t.Fatalf("retried %v, want the failed batch and the one polled behind it: %v", retried[0], joined)
	}
	var all []string
	for _, b := range retried {
		all = append(all, b...)
	}
	if !slices.Equal(all, seq(0, 10)) {
		t.Fatalf("from the retry on handled %v, want v0…v9 once, in order", all)
	}
}

// TestRunnerOverlapRebalance: with Overlap, a second replica joins while
// the first has rounds in flight (each takes 300 ms); the rebalance waits
// for the older round only, so the newer may still be in flight when its
// partitions move (their next owner handles them again; what the round
// marks of them is dropped: TestHoldingAbsorbsWhatFollows). Every record
// is handled and the committed offsets end at the partitions' ends, not
// set back.
func TestRunnerOverlapRebalance(t *testing.T) {
	h := newHarness(t, 4, topicIn, topicOut, events.TopicDeadLetter)
	var (
		mu      sync.Mutex
		handled = map[string]bool{}
	)
	record := func(recs []*kgo.Record) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			handled[string(r.Value)] = true
		}
	}
	overlap := func(c *Config) { c.Overlap, c.MaxPollRecords = true, 5 }
	a := &observer{assigned: map[int32]bool{}}
	a.HandlerFunc = func(_ context.Context, recs []*kgo.Record) (Result, error) {
		time.Sleep(300 * time.Millisecond)
		record(recs)
		return Result{}, nil
	}
	h.produce(topicIn, 0, 20)
	h.run("overlap-rebalance", a, overlap)
	eventually(t, 10*time.Second, "replica a handling", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) > 0
	})
	b := &observer{assigned: map[int32]bool{}}
	b.HandlerFunc = func(_ context.Context, recs []*kgo.Record) (Result, error) {
		record(recs)
		return Result{}, nil
	}
	h.run("overlap-rebalance", b, overlap)
	eventually(t, 20*time.Second, "the partitions split between a and b", func() bool {
		return len(a.owned()) > 0 && len(b.owned()) > 0 && len(a.owned())+len(b.owned()) == 4
	})
	h.produce(topicIn, 20, 20)
	sum := func() (n int64) {
		for _, o := range h.committed("faultline-overlap-rebalance", 4) {
			n += max(o, 0)
		}
		return n
	}
	eventually(t, 20*time.Second, "all 40 records handled and committed", func() bool {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		return n == 40 && sum() == 40
	})
	time.Sleep(time.Second) // a's last rounds finish; nothing they mark sets an offset back
	if n := sum(); n != 40 {
		t.Fatalf("committed offsets sum to %d, want 40 (%v)", n, h.committed("faultline-overlap-rebalance", 4))
	}
}
