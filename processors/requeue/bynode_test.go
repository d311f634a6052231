package requeue

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestByNode: a requeue record that is not due is handed on at once,
// unchanged (same not-before, same attempt), with its node's later items
// behind it, and the topic asked to rest until it is due, at most Hold;
// other nodes' work runs at once; a due record runs its step and is
// requeued with one more attempt; one waiting for its cluster runs as soon
// as the cluster may be tried; shutdown hands everything on unchanged.
func TestByNode(t *testing.T) {
	const topic = "rq"
	type item struct {
		id, node string
		in       time.Duration // not-before from the start; 0: an original record
		attempt  int
	}
	mk := func(start time.Time, it item, cluster string) *kgo.Record {
		r := &kgo.Record{Topic: "src", Key: []byte(it.node), Value: []byte(it.id)}
		if it.in != 0 {
			r.Headers = []kgo.RecordHeader{
				{Key: HeaderNotBefore, Value: []byte(strconv.FormatInt(start.Add(it.in).UnixMilli(), 10))},
				{Key: HeaderAttempt, Value: []byte(strconv.Itoa(it.attempt))},
			}
		}
		if cluster != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderCluster, Value: []byte(cluster)})
		}
		return r
	}
	type fwd struct {
		id      string
		in      time.Duration // 0: no not-before
		attempt int
	}
	// A loaded 2-core machine's delay, and under Hold: what the old
	// contract waited for a record not due.
	const slack = Hold - 100*time.Millisecond
	for _, tc := range []struct {
		name   string
		items  []item
		waits  map[string]string // item id -> the cluster it waits for (HeaderCluster)
		slow   string            // a node whose cluster is slow: its due items go to the lane
		turns  string            // an item whose step finds its cluster turned slow (Again.Slow); its node's cluster slow from then on
		again  time.Duration     // what every step asks (0: done)
		cancel bool
		ran    []string      // ids whose step ran
		soon   []string      // of those, the ones that must run at once (within slack)
		out    []fwd         // requeue records, in order ("lane: " before the id: on the lane's topic)
		rest   time.Duration // the topic's rest asked, from the start (0: none)
	}{
		{
			name:  "not due beside new work of another node",
			items: []item{{"follow-up", "n1", 15 * time.Second, 3}, {"new", "n2", 0, 0}},
			ran:   []string{"new"}, soon: []string{"new"},
			out:  []fwd{{"follow-up", 15 * time.Second, 3}},
			rest: Hold,
		},
		{
			name:  "beyond the old 20s cap: handed on, never run early",
			items: []item{{"follow-up", "n1", time.Minute, 1}},
			out:   []fwd{{"follow-up", time.Minute, 1}},
			// The topic rests, so a record that is not due goes round at
			// most once per Hold.
			rest: Hold,
		},
		{
			name: "the node's later items stay behind it, in order",
			items: []item{{"follow-up", "n1", 15 * time.Second, 2}, {"new n1", "n1", 0, 0},
				{"due n1", "n1", -time.Second, 4}, {"new n2", "n2", 0, 0}},
			ran: []string{"new n2"}, soon: []string{"new n2"},
			out:  []fwd{{"follow-up", 15 * time.Second, 2}, {"new n1", 0, 0}, {"due n1", -time.Second, 4}},
			rest: Hold,
		},
		{
			name:  "a due record runs its step and is requeued with one more attempt",
			items: []item{{"follow-up", "n1", -time.Second, 1}, {"new", "n2", 0, 0}},
			again: 15 * time.Second,
			ran:   []string{"follow-up", "new"}, soon: []string{"follow-up", "new"},
			out: []fwd{{"follow-up", 15 * time.Second, 2}, {"new", 15 * time.Second, 1}},
		},
		{
			name:  "due within the hold: handed on, the topic rests until it is due",
			items: []item{{"follow-up", "n1", 400 * time.Millisecond, 1}, {"later", "n2", 700 * time.Millisecond, 1}},
			out:   []fwd{{"follow-up", 400 * time.Millisecond, 1}, {"later", 700 * time.Millisecond, 1}},
			rest:  400 * time.Millisecond,
		},
		{
			// The cluster answers long before the backoff the work met
			// ends; another is still down; work waiting for itself waits.
			name: "work waiting for a cluster that may be tried again is due",
			items: []item{{"back", "n1", 20 * time.Second, 1}, {"still down", "n2", 20 * time.Second, 1},
				{"own wait", "n3", 5 * time.Second, 1}},
			waits: map[string]string{"back": "up", "still down": "down"},
			again: 15 * time.Second,
			ran:   []string{"back"}, soon: []string{"back"},
			out: []fwd{{"back", 15 * time.Second, 2}, {"still down", 20 * time.Second, 1},
				{"own wait", 5 * time.Second, 1}},
			rest: Hold,
		},
		{
			// A slow cluster's node: its due items and the later ones
			// behind them go to the lane unchanged, in order; what is not
			// due stays on the requeue topic; other nodes run at once.
			name: "a slow cluster's due work goes to the slow lane, the node's later items with it",
			items: []item{{"due n1", "n1", -time.Second, 2}, {"new n1", "n1", 0, 0}, {"new n2", "n2", 0, 0},
				{"follow-up n3", "n1", 15 * time.Second, 1}},
			slow: "n1",
			ran:  []string{"new n2"}, soon: []string{"new n2"},
			out: []fwd{{"lane: due n1", -time.Second, 2}, {"lane: new n1", 0, 0}, {"lane: follow-up n3", 15 * time.Second, 1}},
		},
		{
			name:  "a slow cluster's work not due yet stays on the requeue topic",
			items: []item{{"follow-up", "n1", 15 * time.Second, 3}, {"new n1", "n1", 0, 0}},
			slow:  "n1",
			out:   []fwd{{"follow-up", 15 * time.Second, 3}, {"new n1", 0, 0}},
			rest:  Hold,
		},
		{
			// Its step abandoned as the cluster turned slow: the item,
			// unchanged, and the node's later ones go to the lane, in
			// order; other nodes run.
			name:  "a step abandoned as its cluster turned slow: to the lane, the node's later items with it",
			items: []item{{"turning", "n1", 0, 0}, {"follow-up n1", "n1", -time.Second, 2}, {"new n2", "n2", 0, 0}},
			turns: "turning",
			ran:   []string{"turning", "new n2"}, soon: []string{"turning", "new n2"},
			out: []fwd{{"lane: turning", 0, 0}, {"lane: follow-up n1", -time.Second, 2}},
		},
		{
			// A batch redelivered after a crash re-produced its
			// follow-ups: the copy is merged into the first, so one step
			// and one follow-up, not two chains.
			name:  "a copy of a due requeue record is merged into it",
			items: []item{{"follow-up", "n1", -time.Second, 1}, {"follow-up", "n1", -time.Second, 1}},
			again: 15 * time.Second,
			ran:   []string{"follow-up"}, soon: []string{"follow-up"},
			out: []fwd{{"follow-up", 15 * time.Second, 2}},
		},
		{
			name:  "a copy of a requeue record not due is merged into it",
			items: []item{{"follow-up", "n1", 15 * time.Second, 3}, {"follow-up", "n1", 15 * time.Second, 3}},
			out:   []fwd{{"follow-up", 15 * time.Second, 3}},
			rest:  Hold,
		},
		{
			name: "a copy behind the node's other work is merged, the other work kept in order",
			items: []item{{"follow-up", "n1", -time.Second, 1}, {"new n1", "n1", 0, 0},
				{"follow-up", "n1", -time.Second, 1}},
			again: 15 * time.Second,
			ran:   []string{"follow-up", "new n1"}, soon: []string{"follow-up", "new n1"},
			out: []fwd{{"follow-up", 15 * time.Second, 2}, {"new n1", 15 * time.Second, 1}},
		},
		{
			// Originals are the upstream's to deduplicate: each is
			// stepped, as before.
			name:  "identical original records are not merged",
			items: []item{{"new", "n1", 0, 0}, {"new", "n1", 0, 0}},
			again: 15 * time.Second,
			ran:   []string{"new", "new"}, soon: []string{"new", "new"},
			out: []fwd{{"new", 15 * time.Second, 1}, {"new", 15 * time.Second, 1}},
		},
		{
			name:  "requeue records differing in a header are not merged",
			items: []item{{"follow-up", "n1", -time.Second, 1}, {"follow-up", "n1", -time.Second, 2}},
			again: 15 * time.Second,
			ran:   []string{"follow-up", "follow-up"}, soon: []string{"follow-up", "follow-up"},
			out: []fwd{{"follow-up", 15 * time.Second, 2}, {"follow-up", 15 * time.Second, 3}},
		},
		{
			name:   "shutdown hands everything on unchanged",
			items:  []item{{"follow-up", "n1", -time.Second, 5}, {"new", "n2", 0, 0}},
			cancel: true,
			out:    []fwd{{"follow-up", -time.Second, 5}, {"new", 0, 0}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			start := time.Now().Truncate(time.Millisecond) // headers carry milliseconds
			var recs []*kgo.Record
			for _, it := range tc.items {
				recs = append(recs, mk(start, it, tc.waits[it.id]))
			}
			var (
				mu  sync.Mutex
				ran = map[string]time.Duration{}
				seq []string
			)
			// The clock stands at the start: what is due and what is not
			// does not move with the machine's load.
			now := func() time.Time { return start }
			ready := func(_ context.Context, cluster string) bool { return cluster == "up" }
			slowNode := tc.slow
			aside := func(r *kgo.Record) string {
				mu.Lock()
				defer mu.Unlock()
				if slowNode != "" && string(r.Key) == slowNode {
					return "lane"
				}
				return ""
			}
			out, rest, err := ByNode(ctx, 2, topic, Turn, now, ready, aside, recs, func(r *kgo.Record) *kgo.Record { return r },
				func(_ context.Context, r *kgo.Record) ([]*faultlinev1.Action, Again) {
					mu.Lock()
					defer mu.Unlock()
					ran[string(r.Value)] = time.Since(start)
					seq = append(seq, string(r.Value))
					if string(r.Value) == tc.turns {
						slowNode = string(r.Key)
						return nil, Again{Slow: true}
					}
					if tc.again == 0 {
						return nil, Again{}
					}
					return nil, Again{At: start.Add(tc.again)}
				})
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if len(seq) != len(tc.ran) {
				t.Fatalf("steps ran for %v, want %v", seq, tc.ran)
			}
			for _, id := range tc.ran {
				if _, ok := ran[id]; !ok {
					t.Fatalf("steps ran for %v, want %v", seq, tc.ran)
				}
			}
			for _, id := range tc.soon {
				if ran[id] > slack {
					t.Errorf("step of %s ran after %v, want at once", id, ran[id])
				}
			}
			// Nothing waits for a record that is not due.
			if took > slack {
				t.Errorf("ByNode took %v, want at most %v", took, slack)
			}
			switch {
			case tc.rest == 0 && !rest.IsZero():
				t.Errorf("topic asked to rest until %v from the start, want no rest", rest.Sub(start))
			case tc.rest > 0 && (rest.Sub(start) < tc.rest || rest.Sub(start) > tc.rest+slack):
				t.Errorf("topic asked to rest until %v from the start, want %v", rest.Sub(start), tc.rest)
			}
			var got []fwd
			for _, r := range out {
				if r.Topic != topic && r.Topic != "lane" {
					t.Fatalf("record to %s, want %s or the lane", r.Topic, topic)
				}
				f := fwd{id: string(r.Value), attempt: Attempt(r)}
				if r.Topic == "lane" {
					f.id = "lane: " + f.id
				}
				if nb := NotBefore(r); !nb.IsZero() {
					f.in = nb.Sub(start)
				}
				got = append(got, f)
			}
			if len(got) != len(tc.out) {
				t.Fatalf("requeued %+v, want %+v", got, tc.out)
			}
			for i := range got {
				if got[i] != tc.out[i] {
					t.Fatalf("requeued %+v, want %+v", got, tc.out)
				}
			}
		})
	}
}

// TestForward: a record handed on keeps its key, value and headers (the
// cluster it waits for too); an original record stays one.
func TestForward(t *testing.T) {
	nb := time.UnixMilli(1_700_000_000_000)
	orig := &kgo.Record{Topic: "faultline.actions", Key: []byte("c/n"), Value: []byte("v")}
	req := Record("rq", Record("rq", orig, Again{At: nb}), Again{At: nb, Cluster: "c1"}) // attempt 2
	for _, tc := range []struct {
		name    string
		rec     *kgo.Record
		nb      time.Time
		attempt int
		cluster string
	}{
		{"original", orig, time.Time{}, 0, ""},
		{"requeued twice, waiting for its cluster", req, nb, 2, "c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Forward("rq", tc.rec)
			if f.Topic != "rq" || string(f.Key) != "c/n" || string(f.Value) != "v" {
				t.Fatalf("forwarded %+v", f)
			}
			if !NotBefore(f).Equal(tc.nb) || Attempt(f) != tc.attempt || header(f, HeaderCluster) != tc.cluster {
				t.Fatalf("not-before %v attempt %d cluster %q, want %v %d %q", NotBefore(f), Attempt(f), header(f, HeaderCluster),
					tc.nb, tc.attempt, tc.cluster)
			}
		})
	}
}

// TestByNodeTurn: past the batch's turn, a node's items not started are
// handed on unchanged, in order, to the requeue topic, so a long chain of
// one node's work does not hold the batch (and what the others' steps
// decided) beyond it; every item is either stepped or handed on, once.
func TestByNodeTurn(t *testing.T) {
	const (
		topic = "rq"
		took  = 40 * time.Millisecond // each step
		turn  = 60 * time.Millisecond // the third of a chain starts past it
	)
	var recs []*kgo.Record
	for _, id := range []string{"n1-a", "n1-b", "n1-c", "n1-d", "n2-a"} {
		recs = append(recs, &kgo.Record{Topic: "src", Key: []byte(id[:2]), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: HeaderAttempt, Value: []byte("2")}}})
	}
	var (
		mu  sync.Mutex
		ran []string
	)
	out, _, err := ByNode(context.Background(), 2, topic, turn, time.Now, nil, func(*kgo.Record) string { return "" }, recs,
		func(r *kgo.Record) *kgo.Record { return r },
		func(_ context.Context, r *kgo.Record) ([]*faultlinev1.Action, Again) {
			time.Sleep(took)
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, string(r.Value))
			return nil, Again{}
		})
	if err != nil {
		t.Fatal(err)
	}
	var handed []string
	for _, r := range out {
		if r.Topic != topic || Attempt(r) != 2 || !NotBefore(r).IsZero() {
			t.Fatalf("handed on %s to %s, attempt %d, not-before %v: want it unchanged on %s", r.Value, r.Topic, Attempt(r), NotBefore(r), topic)
		}
		handed = append(handed, string(r.Value))
	}
	if !slices.Contains(ran, "n1-a") || !slices.Contains(ran, "n2-a") {
		t.Fatalf("stepped %v: each node's first item must run", ran)
	}
	if len(handed) == 0 || handed[len(handed)-1] != "n1-d" {
		t.Fatalf("handed on %v: the chain's items past the turn must wait, in order", handed)
	}
	if got := append(slices.Clone(ran), handed...); len(got) != len(recs) {
		t.Fatalf("stepped %v, handed on %v: each item once", ran, handed)
	}
	for i := 1; i < len(handed); i++ {
		if handed[i-1] > handed[i] {
			t.Fatalf("handed on %v: out of order", handed)
		}
	}
}
