package correlate

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// refusingProducer records what it was given and refuses the records
// refuse names (call counts from 1).
type refusingProducer struct {
	mu     sync.Mutex
	calls  int
	refuse func(call int, r *kgo.Record) bool
	got    []*kgo.Record
}

func (p *refusingProducer) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	var out kgo.ProduceResults
	for _, r := range rs {
		var err error
		if p.refuse(p.calls, r) {
			err = errors.New("NOT_ENOUGH_REPLICAS")
		} else {
			p.got = append(p.got, r)
		}
		out = append(out, kgo.ProduceResult{Record: r, Err: err})
	}
	return out
}

// TestSweepOutputRetriedPromptly: a sweep's derived events Kafka refused
// are produced again within the backoff, not after correlate.cache_ttl
// (the replica takes what it emitted for standing until then), and those
// Kafka acknowledged are not produced again.
func TestSweepOutputRetriedPromptly(t *testing.T) {
	s := server(t)
	m := time.Minute
	for _, tt := range []struct {
		name   string
		refuse func(call int, r *kgo.Record) bool
	}{
		{"Kafka up", func(int, *kgo.Record) bool { return false }},
		{"Kafka refuses twice", func(call int, _ *kgo.Record) bool { return call <= 2 }},
		{"Kafka refuses one node's twice", func(call int, r *kgo.Record) bool { return call <= 2 && strings.HasSuffix(string(r.Key), "/n1") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster("sweepretry")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			for _, n := range []string{"n1", "n2"} {
				if d := describe(hs.batch(records(t, append(append(flap(c, n, 0), flap(c, n, 1*m)...), flap(c, n, 2*m)...))...)); d != "RepeatedNICLinkFlap:fault" {
					t.Fatalf("%s: derived %q", n, d)
				}
			}
			// At 32m both verdicts recover (window and stabilization passed);
			// the clock stands still, so the cache never expires.
			hs.clock.Set(base.Add(32 * m))
			p := &refusingProducer{refuse: tt.refuse}
			sctx, cancel := context.WithCancel(ctx(t))
			done := make(chan struct{})
			go func() { defer close(done); hs.h.RunSweeps(sctx, 20*time.Millisecond, p) }()
			ours := func() []string {
				p.mu.Lock()
				defer p.mu.Unlock()
				var out []string
				for _, r := range p.got {
					if ev := mustUnmarshal(t, r.Value); ev.GetCluster() == c {
						out = append(out, ev.GetNodeName()+" "+describe(evs(ev)))
					}
				}
				slices.Sort(out)
				return out
			}
			want := []string{"n1 RepeatedNICLinkFlap:recovery", "n2 RepeatedNICLinkFlap:recovery"}
			for deadline := time.Now().Add(3 * time.Second); len(ours()) < len(want) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // and nothing more
			cancel()
			<-done
			if got := ours(); !slices.Equal(got, want) {
				t.Fatalf("produced %q within 3s, want %q", got, want)
			}
		})
	}
}

// TestSweepOutputKeptUntilCacheTTL: a refused derived event is kept for
// another try while the replica remembers it as emitted, and dropped once
// it no longer does (the next sweep derives it again: no duplicate kept).
func TestSweepOutputKeptUntilCacheTTL(t *testing.T) {
	c := &clock{t: base}
	h := New(nil, nil, c.Now, 2*time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	for _, tt := range []struct {
		name string
		age  time.Duration
		kept int
	}{
		{"younger than the cache", 2 * time.Minute, 1},
		{"older than the cache", 2*time.Minute + time.Second, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &refusingProducer{refuse: func(int, *kgo.Record) bool { return true }}
			left := h.produceSwept(context.Background(), p, []sweptRecord{{&kgo.Record{Key: []byte("c/n1")}, base.Add(-tt.age)}})
			if len(left) != tt.kept {
				t.Fatalf("%d kept, want %d", len(left), tt.kept)
			}
		})
	}
}
