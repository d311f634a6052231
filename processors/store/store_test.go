package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	chproto "github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/rows/rowstest"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func produce(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	if err := cl.ProduceSync(ctxFor(t, 60*time.Second), recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// runStore runs the store role over brokers until the returned stop is
// called (or the test ends); stop waits for the runner to return.
func runStore(t *testing.T, brokers string, h *Handler, tune func(*pipeline.Config)) (stop func()) {
	t.Helper()
	pc := DefaultConfig().Pipeline()
	pc.Role = "store"
	pc.Linger = 200 * time.Millisecond
	pc.MaxBackoff = time.Second
	pc.BatchTimeout = 10 * time.Second
	pc.LagInterval = 500 * time.Millisecond
	pc.ConsumeOpts = []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)}
	if tune != nil {
		tune(&pc)
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = brokers
	r := pipeline.NewRunner(pc, kcfg, h, slog.Default(), pipeline.NewMetrics(prometheus.NewRegistry()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once atomic.Bool
	stop = func() {
		if once.Swap(true) {
			return
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runner: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("runner did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitCount waits until query returns want.
func waitCount(t *testing.T, srv *chtest.Server, want uint64, timeout time.Duration, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got uint64
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := srv.Conn.QueryRow(ctx, query, args...).Scan(&got)
		cancel()
		if err == nil && got == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: %d after %s, want %d", query, got, timeout, want)
}

func kfakeCluster(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, kafka.PipelineTopics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return strings.Join(c.ListenAddrs(), ",")
}

func client(t *testing.T, brokers string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.RequiredAcks(kgo.AllISRAcks())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestRoundTrip: events and actions produced to a real Kafka broker the way
// the gateway produces them come back from ClickHouse with every field
// intact; poison records go to the dead-letter topic with the reason.
func TestRoundTrip(t *testing.T) {
	k := testenv.StartKafka(t)
	srv := chtest.Start(t)
	evs := rowstest.Events(t)
	acts := rowstest.Actions(t)

	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = k.Addr(), 3, 1
	cl := client(t, k.Addr())
	if err := kafka.EnsureTopics(ctxFor(t, time.Minute), cl, kcfg, kafka.PipelineTopics...); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for _, ev := range evs {
		recs = append(recs, rowstest.EventRecord(t, ev))
	}
	for _, a := range acts {
		recs = append(recs, rowstest.ActionRecord(t, a))
	}
	noID := proto.Clone(evs[0]).(*datamodels.HealthEvent)
	noID.Id = ""
	otherCluster := rowstest.EventRecord(t, proto.Clone(evs[0]).(*datamodels.HealthEvent))
	otherCluster.Key = []byte("beta/gpu-node-42") // the payload says alpha
	recs = append(recs,
		&kgo.Record{Topic: events.TopicEvents, Key: []byte("alpha/gpu-node-42"), Value: []byte{0x00, 0x01}},
		rowstest.EventRecord(t, noID),
		&kgo.Record{Topic: events.TopicActions, Key: []byte("alpha/gpu-node-42"), Value: []byte{0xff}},
		otherCluster,
	)
	produce(t, cl, recs...)

	h := New(srv.Conn, slog.Default(), nil)
	runStore(t, k.Addr(), h, nil)
	waitCount(t, srv, uint64(len(evs)), time.Minute, "SELECT uniqExact(id) FROM events")
	waitCount(t, srv, uint64(len(acts)), time.Minute, "SELECT uniqExact(id) FROM actions")

	hist := history.New(srv.Conn, slog.Default())
	ctx := ctxFor(t, time.Minute)
	got := map[string]*datamodels.HealthEvent{}
	for _, c := range []string{"alpha", "beta"} {
		resp, err := hist.ListEvents(ctx, c, &faultlinev1.ListEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Events {
			if ev.GetCluster() != c {
				t.Errorf("ListEvents(%s) returned an event of %s", c, ev.GetCluster())
			}
			got[ev.GetId()] = ev
		}
	}
	for _, want := range evs {
		if g, ok := got[want.GetId()]; !ok {
			t.Errorf("event %s missing", want.GetId())
		} else if !proto.Equal(g, want) {
			t.Errorf("event %s changed on the way:\n got  %v\n want %v", want.GetId(), g, want)
		}
	}
	resp, err := hist.ListActions(ctx, "alpha", &faultlinev1.ListActionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Actions) != len(acts) {
		t.Fatalf("%d actions, want %d", len(resp.Actions), len(acts))
	}
	for i, want := range []*faultlinev1.Action{acts[1], acts[0]} { // newest first
		if !proto.Equal(resp.Actions[i], want) {
			t.Errorf("action %d:\n got  %v\n want %v", i, resp.Actions[i], want)
		}
	}

	// The four poison records are in the dead-letter topic with reasons.
	dl := client(t, k.Addr(), kgo.ConsumeTopics(events.TopicDeadLetter), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var reasons []string
	for len(reasons) < 4 {
		fs := dl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("dead letters: got %q", reasons)
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, hd := range r.Headers {
				if hd.Key == events.HeaderError {
					reasons = append(reasons, string(hd.Value))
				}
			}
		})
	}
	joined := strings.Join(reasons, "\n")
	for _, want := range []string{"decode HealthEvent", "event has no id", "decode Action",
		`record key and payload disagree: key "beta/gpu-node-42" names cluster "beta", the payload's cluster is "alpha"`} {
		if !strings.Contains(joined, want) {
			t.Errorf("dead-letter reasons %q lack %q", joined, want)
		}
	}
}

// TestClickHouseOutage: ClickHouse stops mid-stream while events keep
// arriving, then comes back: every event is stored, write errors are
// counted, and no query counts an event twice.
func TestClickHouseOutage(t *testing.T) {
	brokers := kfakeCluster(t)
	srv := chtest.Start(t)
	cl := client(t, brokers)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	send := func(from, n int) {
		var recs []*kgo.Record
		for _, ev := range rowstest.GenEvents("alpha", from, n, base) {
			recs = append(recs, rowstest.EventRecord(t, ev))
		}
		produce(t, cl, recs...)
	}
	m := NewMetrics(nil)
	h := New(srv.Conn, slog.Default(), m)
	runStore(t, brokers, h, nil)

	send(0, 500)
	waitCount(t, srv, 500, time.Minute, "SELECT uniqExact(id) FROM events")

	srv.Stop()
	send(500, 500)
	deadline := time.Now().Add(30 * time.Second)
	for counterValue(m.errors.WithLabelValues("events")) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if counterValue(m.errors.WithLabelValues("events")) == 0 {
		t.Fatal("no write error counted while ClickHouse was down")
	}
	srv.Start()
	send(1000, 500)
	waitCount(t, srv, 1500, 2*time.Minute, "SELECT uniqExact(id) FROM events")

	// Exact counts however many copies were written.
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExactIf(id, is_fatal = 1) FROM events"); n != 500 {
		t.Errorf("fatal events %d, want 500", n)
	}
	assertHistoryExact(t, srv, "alpha", 1500)
}

// assertHistoryExact pages through the cluster's history and checks each
// event appears once and the total is want.
func assertHistoryExact(t *testing.T, srv *chtest.Server, cluster string, want int) {
	t.Helper()
	hist := history.New(srv.Conn, slog.Default())
	ctx := ctxFor(t, time.Minute)
	seen := map[string]bool{}
	req := &faultlinev1.ListEventsRequest{Limit: 1000}
	for page := 0; ; page++ {
		resp, err := hist.ListEvents(ctx, cluster, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Events {
			if seen[ev.GetId()] {
				t.Fatalf("event %s listed twice", ev.GetId())
			}
			seen[ev.GetId()] = true
		}
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	if len(seen) != want {
		t.Fatalf("history lists %d events, want %d", len(seen), want)
	}
}

// TestCrashBetweenInsertAndCommit: the store dies after its insert and
// before the offsets are committed; its successor writes the batch again,
// and no query counts an event twice.
func TestCrashBetweenInsertAndCommit(t *testing.T) {
	brokers := kfakeCluster(t)
	srv := chtest.Start(t)
	cl := client(t, brokers)
	var recs []*kgo.Record
	for _, ev := range rowstest.GenEvents("alpha", 0, 300, time.Now().UTC().Add(-time.Hour)) {
		recs = append(recs, rowstest.EventRecord(t, ev))
	}
	produce(t, cl, recs...)

	crashed := make(chan struct{})
	h1 := New(srv.Conn, slog.Default(), nil)
	var stop1 func()
	h1.afterInsert = func(ctx context.Context, rows int) error {
		select {
		case <-crashed:
		default:
			close(crashed)
		}
		return errors.New("injected crash between insert and commit")
	}
	stop1 = runStore(t, brokers, h1, func(pc *pipeline.Config) { pc.MaxBackoff = time.Hour })
	select {
	case <-crashed:
	case <-time.After(time.Minute):
		t.Fatal("the first store never inserted")
	}
	stop1() // dies without committing

	first := chtest.Count(t, srv.Conn, "SELECT count() FROM events")
	if first == 0 {
		t.Fatal("the crashed store wrote nothing")
	}
	h2 := New(srv.Conn, slog.Default(), nil)
	runStore(t, brokers, h2, nil)
	waitCount(t, srv, 300, time.Minute, "SELECT uniqExact(id) FROM events")
	// Wait for the successor to have rewritten what the first one wrote.
	deadline := time.Now().Add(30 * time.Second)
	for chtest.Count(t, srv.Conn, "SELECT count() FROM events") < first+300 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := chtest.Count(t, srv.Conn, "SELECT count() FROM events"); n <= 300 {
		t.Fatalf("%d rows: the batch was not written twice, so the test proves nothing", n)
	}
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExactIf(id, is_fatal = 1) FROM events"); n != 100 {
		t.Errorf("fatal events %d, want 100", n)
	}
	assertHistoryExact(t, srv, "alpha", 300)
}

// TestHandleLargeBatch: a batch of several thousand records, events and
// actions with poison records among them, is stored row for row as it was
// sent (no column out of step with the others: the arrays are appended
// row by row, the rest whole), and its poison records dead-lettered in
// their order.
func TestHandleLargeBatch(t *testing.T) {
	srv := chtest.Start(t)
	h := New(srv.Conn, slog.Default(), nil)
	const n = 12345
	at := time.Now().UTC().Add(-time.Hour)
	act := rowstest.Actions(t)[0]
	var (
		recs      []*kgo.Record
		poison    []int // record indexes, in order
		evs, acts uint64
	)
	for i := range n {
		s := fmt.Sprintf("%06d", i)
		var rec *kgo.Record
		switch {
		case i%2000 == 1999 || i <= 1 || i == n-1: // the batch's first and last records too
			poison = append(poison, i)
			rec = &kgo.Record{Topic: events.TopicEvents, Key: []byte("alpha/n"), Value: []byte{0xff}}
		case i%1000 == 500:
			acts++
			a := proto.Clone(act).(*faultlinev1.Action)
			a.Id = "act-" + s
			rec = rowstest.ActionRecord(t, a)
		default:
			evs++
			rec = rowstest.EventRecord(t, &datamodels.HealthEvent{
				Id: "ev-" + s, Cluster: "alpha", NodeName: "node-" + s[:3], CheckName: "SysLogsXIDError", ErrorCode: []string{"XID-" + s},
				EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: "GPU-" + s}},
				Metadata:           map[string]string{"n": s},
				GeneratedTimestamp: timestamppb.New(at), ReceivedTimestamp: timestamppb.New(at),
			})
		}
		rec.Timestamp = at // as Kafka stamps them
		recs = append(recs, rec)
	}
	res, err := h.Handle(ctxFor(t, time.Minute), recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dead) != len(poison) {
		t.Fatalf("%d dead letters, want %d", len(res.Dead), len(poison))
	}
	for k, d := range res.Dead {
		if d.Record != recs[poison[k]] {
			t.Fatalf("dead letter %d is not record %d", k, poison[k])
		}
	}
	waitCount(t, srv, evs, 10*time.Second, "SELECT uniqExact(id) FROM events")
	waitCount(t, srv, acts, 10*time.Second, "SELECT uniqExact(id) FROM actions")
	// Every row's columns belong to the same event: its id's number is
	// in its node, entity, error code and metadata.
	waitCount(t, srv, evs, 10*time.Second, `SELECT count() FROM events WHERE node = concat('node-', substring(id, 4, 3))
		AND entity = concat('GPU=GPU-', substring(id, 4)) AND error_codes = [concat('XID-', substring(id, 4))]
		AND metadata.value = [substring(id, 4)]`)
}

// TestInsertSettings: every insert turns off the Replicated tables' block
// deduplication, and pins synchronous inserts on servers that have
// async_insert (21.11 on); older ones refuse a setting they do not know.
func TestInsertSettings(t *testing.T) {
	for _, tc := range []struct {
		version string
		async   bool
	}{
		{"18.16.1", false},
		{"21.10.6", false},
		{"21.11.0", true},
		{"21.12.1", true},
		{"24.3.2", true},
		{"26.9.0", true},
	} {
		got := insertSettings(hasAsyncInsert(chproto.ParseVersion(tc.version)))
		want := ch.Settings{"insert_deduplicate": 0}
		if tc.async {
			want["async_insert"] = 0
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: settings %v, want %v", tc.version, got, want)
		}
	}
}

// mixedConn is a pool whose ServerVersion reaches a server of version and
// whose inserts reach one that refuses async_insert (prepareErr, or
// sendErr at the block's send) like 18.16. It records each insert's
// settings (settings: the handler's, read when the insert starts).
type mixedConn struct {
	clickhouse.Conn
	version             string
	prepareErr, sendErr bool
	settings            func() ch.Settings
	prepared            []ch.Settings
}

var errNoAsyncInsert = &ch.Exception{Code: 115, Message: "Unknown setting async_insert"}

func (c *mixedConn) ServerVersion() (*ch.ServerVersion, error) {
	return &ch.ServerVersion{Version: chproto.ParseVersion(c.version)}, nil
}

func (c *mixedConn) PrepareBatch(context.Context, string, ...driver.PrepareBatchOption) (driver.Batch, error) {
	s := c.settings()
	c.prepared = append(c.prepared, s)
	_, async := s["async_insert"]
	if async && c.prepareErr {
		return nil, errNoAsyncInsert
	}
	return &fakeBatch{fail: async && c.sendErr}, nil
}

type fakeBatch struct {
	driver.Batch
	fail bool
}

func (b *fakeBatch) Send() error {
	if b.fail {
		return fmt.Errorf("shard 2: %w", errNoAsyncInsert)
	}
	return nil
}

func (b *fakeBatch) Close() error { return nil }

// TestAsyncInsertRefused: the version is asked once, by New; when an insert
// reaches a server that refuses async_insert (older than 21.11) the
// setting is dropped. Asked at each insert on a pooled connection other
// than the insert's, the version let every insert to the older server
// fail, and the batch was retried without end.
//
// Refused at the query (the server the insert reached: another of
// clickhouse.addr's servers, a replica behind a Service mid-upgrade), no
// row was sent: the insert is made again at once without it, and the
// setting is sent again after repinAfter — refused again while an old
// server remains, kept once the rolling upgrade is done (dropped for good,
// a profile with async_insert=1, wait_for_async_insert=0 acknowledged rows
// only buffered). Nothing fails, nothing is counted.
//
// Refused by a shard at the send (a cluster with a shard on 18.16), other
// shards may have written the rows: the insert fails, is counted in
// faultline_store_write_errors_total, and the setting is dropped for the
// process's life — sent again every repinAfter, each try failed a batch
// and wrote its rows twice, for as long as the old shard remained.
func TestAsyncInsertRefused(t *testing.T) {
	for _, tc := range []struct {
		name                string
		prepareErr, sendErr bool
	}{
		{"refused at the query", true, false},
		{"refused by a shard at the send", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := &mixedConn{version: "24.3.2", prepareErr: tc.prepareErr, sendErr: tc.sendErr}
			m := NewMetrics(nil)
			h := New(conn, slog.Default(), m)
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			h.now = func() time.Time { return now }
			conn.settings = func() ch.Settings { return insertSettings(h.pinned()) }
			ctx := ctxFor(t, 10*time.Second)
			var async []bool // per insert prepared: sent async_insert=0
			insert := func(wantErr bool) {
				t.Helper()
				from := len(conn.prepared)
				if err := h.insert(ctx, "events", "id", nil, 1); wantErr != (err != nil) {
					t.Fatalf("insert %d: %v, want an error %t", len(async)+1, err, wantErr)
				}
				for _, s := range conn.prepared[from:] {
					_, a := s["async_insert"]
					async = append(async, a)
				}
			}
			insert(tc.sendErr) // refused: dropped
			want := []bool{true}
			if tc.prepareErr {
				want = append(want, false) // made again at once
			}
			for range 3 {
				insert(false)
				want = append(want, false)
			}
			now = now.Add(repinAfter - time.Second)
			insert(false) // not yet
			want = append(want, false)
			now = now.Add(time.Second)
			if tc.prepareErr {
				insert(false) // tried again, refused again: dropped again
				want = append(want, true, false)
			} else {
				insert(false) // a shard refused: dropped for good
				want = append(want, false)
			}
			insert(false)
			want = append(want, false)
			now = now.Add(repinAfter)
			conn.prepareErr = false // the servers upgraded (the shard stays old)
			for range 2 {
				insert(false)
				want = append(want, tc.prepareErr)
			}
			if !slices.Equal(async, want) {
				t.Errorf("async_insert=0 sent per insert prepared: %v, want %v", async, want)
			}
			if got, want := counterValue(m.errors.WithLabelValues("events")), float64(btoi(tc.sendErr)); got != want {
				t.Errorf("%v write errors counted, want %v (a failed insert counts; one made again at once does not)", got, want)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestAsyncInsertRefusedServer: a handler that believes its server has
// async_insert (New asked another, newer one) writes to a server without
// it (the testenv's 18.16, or newer: then there is nothing to refuse) on
// its first try.
func TestAsyncInsertRefusedServer(t *testing.T) {
	srv := chtest.Start(t)
	h := New(srv.Conn, slog.Default(), nil)
	h.pinSync.Store(true)
	var recs []*kgo.Record
	for _, ev := range rowstest.GenEvents("alpha", 0, 10, time.Now().UTC().Add(-time.Hour)) {
		recs = append(recs, rowstest.EventRecord(t, ev))
	}
	if _, err := h.Handle(ctxFor(t, time.Minute), recs); err != nil {
		t.Fatal(err)
	}
	waitCount(t, srv, 10, 10*time.Second, "SELECT uniqExact(id) FROM events")
}

// TestRetryAfterViewInsertFailed: on a cluster (Replicated tables) a batch
// whose insert into events succeeded and whose materialized views' did not
// is handled again with the same records in the same order: the views get
// its rows. With the Replicated tables' block deduplication the retried
// block was dropped as a duplicate in events, and so skipped by the views:
// the events were never in recent_events nor derived_events. The block
// holds stored (DEFAULT now(), in seconds), so only a retry within the
// same second is a duplicate (the runner's first retry comes after 100
// ms): the scenario runs at the start of a second, again with new events
// until the two inserts fell in one second.
func TestRetryAfterViewInsertFailed(t *testing.T) {
	srv := chtest.StartCluster(t, testenv.ClusterSharded)
	h := New(srv.Conn, slog.Default(), nil)
	db := srv.Config.Database
	nodes := make([]clickhouse.Conn, len(srv.Cluster.Nodes))
	for i, node := range srv.Cluster.Nodes {
		nodes[i] = node.DB(t)
	}
	ctx := ctxFor(t, 2*time.Minute)
	at := time.Now().UTC().Add(-time.Hour)
	for try := range 5 {
		cl := fmt.Sprintf("try%d", try)
		var recs []*kgo.Record
		for i, ev := range rowstest.GenEvents(cl, 0, 200, at) {
			if i%4 == 0 {
				ev.DerivedBy = "rule-x"
			}
			recs = append(recs, rowstest.EventRecord(t, ev))
		}
		recent := "SELECT uniqExact(id) FROM recent_events WHERE cluster = '" + cl + "'"
		derived := "SELECT uniqExact(id) FROM derived_events WHERE cluster = '" + cl + "'"

		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
		if _, err := h.Handle(ctx, recs); err != nil {
			t.Fatal(err)
		}
		// The views' inserts failed: their tables lack the batch on every
		// shard (each shard is one replica here).
		for i, conn := range nodes {
			for _, table := range []string{"recent_events_local", "derived_events_local"} {
				if err := conn.Exec(ctx, "TRUNCATE TABLE "+db+"."+table); err != nil {
					t.Fatalf("server %d: %v", i+1, err)
				}
			}
		}
		// The runner retries the same records in the same order.
		if _, err := h.Handle(ctx, recs); err != nil {
			t.Fatal(err)
		}
		if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(stored) FROM events WHERE cluster = '"+cl+"'"); n > 1 {
			t.Logf("try %d: the inserts fell in %d seconds; again", try+1, n)
			continue
		}
		for i, conn := range nodes {
			if n := chtest.Count(t, conn, "SELECT count() FROM "+db+".events_local WHERE cluster = '"+cl+"'"); n == 0 {
				t.Fatalf("server %d holds none of the batch: the test does not cover both shards", i+1)
			}
		}
		waitCount(t, srv, 150, 10*time.Second, recent)
		waitCount(t, srv, 50, 10*time.Second, derived)
		waitCount(t, srv, 200, 10*time.Second, "SELECT uniqExact(id) FROM events WHERE cluster = '"+cl+"'")
		return
	}
	t.Fatal("no try fell in one second: the test proves nothing")
}
