package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

// TestBrokersKilledDuringGatewayStream streams events through a real
// gateway to a three-broker KRaft cluster whose topics faultline created
// (replication factor 3, min.insync.replicas 2), the way an agent sends
// them (a refused request is sent again with the same event ids, which the
// gateway maps to the same stored ids):
//
//   - one broker is killed mid-stream: the stream goes on;
//   - a second one is killed: the cluster's controller (the third broker)
//     fences both and shrinks every partition's in-sync replicas to the
//     last broker, so min.insync.replicas 2 is what stops writes: nothing
//     can be replicated, and every request made then is answered 503,
//     none 200 (with min.insync.replicas 1 they would be acknowledged);
//   - the first one is started again: the stream goes on.
//
// Then, with the second broker still down (so what is read was on another
// broker), the events topic holds every acknowledged event, once after
// deduplication by id as the store does, and a duplicate only for an
// event whose request was refused at least once (the idempotent producer
// adds none of its own).
func TestBrokersKilledDuringGatewayStream(t *testing.T) {
	c := testenv.SharedKafkaCluster(t)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = c.Addrs(), 6, 3
	if err := kafka.CreatePipelineTopics(ctx, kcfg, log); err != nil {
		t.Fatal(err)
	}
	// What faultline created: 3 replicas per partition, min.insync.replicas
	// 2 set on the topic (a just-created topic may take a moment to reach
	// every broker's metadata).
	adm := c.Admin(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := topicIsReplicated(ctx, adm)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	gw := gatewaytest.Start(t, c.Addrs(), func(g *gateway.Config) { g.ProduceTimeout = 4 * time.Second }, gateway.Options{})
	s := &stream{url: gw.URL() + "/v1/events", token: gw.Token("alpha"), acked: map[string]int{}, refusedIDs: map[string]bool{}, codeCount: map[int]int{}}
	var wg sync.WaitGroup
	stop := make(chan struct{})            // finish the request in hand, then return
	quit, abort := context.WithCancel(ctx) // return now (the test ends)
	for w := range 3 {
		wg.Go(func() { s.run(t, quit, w, stop) })
	}
	// Registered after the gateway's: runs before it stops.
	t.Cleanup(func() { abort(); wg.Wait() })
	s.waitAcked(t, 30, 90*time.Second, "before any broker was killed")

	c.Brokers[0].Kill()
	killed1 := time.Now()
	s.waitAcked(t, s.ackedCount()+30, 90*time.Second, "with one broker of three killed")
	t.Logf("one broker down: %d events acknowledged %s after the kill", s.ackedCount(), time.Since(killed1).Round(time.Millisecond))

	c.Brokers[1].Kill()
	s.markSecondKill()
	// Every request made from now on must be refused: wait until several
	// were answered (each takes the gateway's 4 s produce timeout).
	deadline = time.Now().Add(60 * time.Second)
	for s.refusedAfterKill.Load() < 6 {
		if n := s.acceptedAfterKill.Load(); n > 0 {
			t.Fatalf("the gateway answered 200 to %d requests made while two brokers of three were down: their events were not replicated", n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests refused in a minute with two brokers of three down", s.refusedAfterKill.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := s.acceptedAfterKill.Load(); n > 0 {
		t.Fatalf("the gateway answered 200 to %d requests made while two brokers of three were down: their events were not replicated", n)
	}
	t.Logf("two brokers down: %d requests refused, none accepted; answers: %v", s.refusedAfterKill.Load(), s.codes())

	s.endSecondKill()
	began := time.Now()
	c.Brokers[0].Start()
	s.waitAcked(t, s.ackedCount()+30, 2*time.Minute, "after the first broker came back")
	t.Logf("first broker back: the stream went on %s after its start", time.Since(began).Round(time.Millisecond))
	close(stop)
	wg.Wait()

	// Read everything back with the second broker still down.
	got := readAll(t, c, ctx)
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var missing, dupNotRefused []string
	for id := range s.acked {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id, n := range seen {
		if _, ok := s.acked[id]; !ok {
			t.Errorf("event %s is in the topic but its request never got a 200 (the client sent it until one did)", id)
		}
		if n > 1 && !s.refusedIDs[id] {
			dupNotRefused = append(dupNotRefused, id)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("%d acknowledged events are not in the topic: %v", len(missing), missing[:min(10, len(missing))])
	}
	if len(dupNotRefused) > 0 {
		t.Errorf("%d events are in the topic more than once though no request of theirs was refused (producer retries must be idempotent): %v", len(dupNotRefused), dupNotRefused[:min(10, len(dupNotRefused))])
	}
	t.Logf("%d events acknowledged, %d records read (%d distinct), %d events were refused at least once", len(s.acked), len(got), len(seen), len(s.refusedIDs))
}

// topicIsReplicated checks the events topic: 3 replicas per partition and
// min.insync.replicas 2 set on the topic.
func topicIsReplicated(ctx context.Context, adm *kadm.Client) error {
	cfgs, err := adm.DescribeTopicConfigs(ctx, events.TopicEvents)
	if err != nil {
		return err
	}
	rc, err := cfgs.On(events.TopicEvents, nil)
	if err != nil {
		return err
	}
	if rc.Err != nil {
		return fmt.Errorf("describe %s: %w", events.TopicEvents, rc.Err)
	}
	found := false
	for _, kv := range rc.Configs {
		if kv.Key == "min.insync.replicas" {
			found = true
			if kv.MaybeValue() != "2" || kv.Source != kmsg.ConfigSourceDynamicTopicConfig {
				return fmt.Errorf("%s: min.insync.replicas = %q (source %v), want 2 set on the topic", rc.Name, kv.MaybeValue(), kv.Source)
			}
		}
	}
	if !found {
		return fmt.Errorf("%s: no min.insync.replicas among its configs", events.TopicEvents)
	}
	td, err := adm.ListTopics(ctx, events.TopicEvents)
	if err != nil {
		return err
	}
	parts := td[events.TopicEvents].Partitions.Sorted()
	if len(parts) != 6 {
		return fmt.Errorf("%s has %d partitions, want 6", events.TopicEvents, len(parts))
	}
	for _, p := range parts {
		if len(p.Replicas) != 3 {
			return fmt.Errorf("partition %d has replicas %v, want 3", p.Partition, p.Replicas)
		}
	}
	return nil
}

// stream sends events to the gateway's REST API from several workers,
// each request of 5 events resent (same client ids) until a 200.
type stream struct {
	url, token string

	mu         sync.Mutex
	acked      map[string]int  // stored id -> requests that returned it
	refusedIDs map[string]bool // stored ids of events refused at least once
	codeCount  map[int]int     // answers by status code

	secondKill        atomic.Int64 // unix nanos while two brokers are down
	refusedAfterKill  atomic.Int32
	acceptedAfterKill atomic.Int32
}

func (s *stream) markSecondKill() { s.secondKill.Store(time.Now().UnixNano()) }
func (s *stream) endSecondKill()  { s.secondKill.Store(0) }

func (s *stream) ackedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

func (s *stream) codes() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.codeCount)
}

func (s *stream) waitAcked(t *testing.T, n int, d time.Duration, when string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for s.ackedCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d events acknowledged in %s, want %d (answers: %v)", when, s.ackedCount(), d, n, s.codes())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

func (s *stream) run(t *testing.T, quit context.Context, worker int, stop <-chan struct{}) {
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		var evs, want []string
		for i := range 5 {
			id := fmt.Sprintf("w%d-r%d-e%d", worker, seq, i)
			node := fmt.Sprintf("node-%02d", (seq*5+i)%16)
			want = append(want, events.StoredID("alpha", node, id))
			evs = append(evs, fmt.Sprintf(`{"id":%q,"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError",`+
				`"isFatal":true,"errorCode":["XID-79"],"nodeName":%q,"entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-%d"}]}`,
				id, node, i))
		}
		body := `{"events":[` + strings.Join(evs, ",") + `]}`
		for {
			if quit.Err() != nil {
				return
			}
			sent := time.Now().UnixNano()
			code, ids, err := s.post(quit, body)
			if k := s.secondKill.Load(); k != 0 && sent > k {
				switch code {
				case http.StatusOK:
					s.acceptedAfterKill.Add(1)
				case http.StatusServiceUnavailable:
					s.refusedAfterKill.Add(1)
				}
			}
			s.mu.Lock()
			s.codeCount[code]++
			s.mu.Unlock()
			if err != nil {
				if quit.Err() == nil {
					t.Errorf("worker %d: %v", worker, err)
				}
				return
			}
			if code == http.StatusOK {
				if !slices.Equal(ids, want) {
					t.Errorf("worker %d: stored ids %v, want %v", worker, ids, want)
				}
				s.mu.Lock()
				for _, id := range ids {
					s.acked[id]++
				}
				s.mu.Unlock()
				break
			}
			if code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
				t.Errorf("worker %d: answer %d", worker, code)
				return
			}
			// Refused: send the same events again, as an agent does.
			s.mu.Lock()
			for _, id := range want {
				s.refusedIDs[id] = true
			}
			s.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (s *stream) post(ctx context.Context, body string) (int, []string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, nil
	}
	var out struct {
		IDs []string `json:"ids"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return 0, nil, fmt.Errorf("200 with body %q: %w", b, err)
	}
	return resp.StatusCode, out.IDs, nil
}

// readAll returns the ids of every record of the events topic, up to the
// end offsets of now.
func readAll(t *testing.T, c *testenv.KafkaCluster, ctx context.Context) []string {
	t.Helper()
	ends, err := c.Admin(t).ListEndOffsets(ctx, events.TopicEvents)
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{} // partition -> end offset not yet reached
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of partition %d: %v", o.Partition, o.Err)
		}
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	cl := c.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var ids []string
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading the topic back: %v (partitions left: %v)", ctx.Err(), left)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			ev, err := events.Unmarshal(r.Value)
			if err != nil {
				t.Fatalf("record %d/%d: %v", r.Partition, r.Offset, err)
			}
			ids = append(ids, ev.GetId())
			if end, ok := left[r.Partition]; ok && r.Offset >= end-1 {
				delete(left, r.Partition)
			}
		})
	}
	return ids
}
