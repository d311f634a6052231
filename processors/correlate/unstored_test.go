package correlate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// TestWindowSpansUnstoredBatches: a window's events in two batches of
// one replica, the first not yet written by the store (it lags behind
// correlate), still reach the threshold — per GPU (two Xid 31) and per
// cluster (four nodes' ports down, two in each batch) — and a node
// whose earlier event is remembered does not lend it to another node.
func TestWindowSpansUnstoredBatches(t *testing.T) {
	s := server(t)
	c := newCluster("unstored")
	hs := newHarness(t, s, DefaultRules, nil)
	hs.cluster = c
	handle := func(evs ...*datamodels.HealthEvent) []string {
		t.Helper()
		var recs []*kgo.Record
		for _, ev := range evs {
			recs = append(recs, evRecord(t, ev))
		}
		res, err := hs.h.Handle(ctx(t), recs) // not stored: the store lags
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range res.Out {
			ev, err := events.Unmarshal(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ev.GetDerivedBy()+"@"+nodeOf(ev))
		}
		return out
	}
	if got := handle(xid(c, "n1", 0, 31, false, 1)); len(got) != 0 {
		t.Fatalf("one Xid 31: %v", got)
	}
	if got := handle(xid(c, "n2", time.Minute, 31, false, 1)); len(got) != 0 {
		t.Fatalf("another node's Xid 31 counted with n1's: %v", got)
	}
	if got := handle(xid(c, "n1", 2*time.Minute, 31, false, 1)); len(got) != 1 || got[0] != "RepeatedXID31OnSameGPU@n1" {
		t.Fatalf("n1's second Xid 31, the first unstored: %v, want one RepeatedXID31OnSameGPU verdict on n1", got)
	}
	f := newCluster("unstored-fabric")
	handle(nicState(f, "n1", 0, false), nicState(f, "n2", time.Second, false))
	if got := handle(nicState(f, "n3", 2*time.Second, false), nicState(f, "n4", 3*time.Second, false)); len(got) != 1 || got[0] != "FabricIncident@"+ClusterNode {
		t.Fatalf("4 nodes down over two batches, the first unstored: %v, want FabricIncident", got)
	}
}

// TestUnstoredForget: a record is forgotten once the store's committed
// offset has passed it, after maxAge when the store's progress cannot be
// read, and over the bound (counted); of returns the batch's nodes' and
// the named clusters' records.
func TestUnstoredForget(t *testing.T) {
	now := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	var stored map[string]map[int32]int64
	var progressErr error
	forgot := prometheus.NewCounter(prometheus.CounterOpts{Name: "forgot"})
	var reads int // of the progress
	u := &unstored{maxAge: time.Minute, max: 5, maxBytes: maxUnstoredBytes, seedWait: 4 * seedRetry, now: func() time.Time { return now }, forgot: forgot, next: map[pipeline.TopicPart]int64{},
		progress: func(context.Context) (map[string]map[int32]int64, error) { reads++; return stored, progressErr }}
	rec := func(cluster, node string, part int32, off int64) *kgo.Record {
		return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Partition: part, Offset: off}
	}
	a0, a1, b0 := rec("a", "n1", 0, 10), rec("a", "n2", 0, 11), rec("b", "n1", 1, 7)
	u.add([]*kgo.Record{a0, a1, b0, {Key: []byte("no-node")}})
	names := func(recs []*kgo.Record) (out []string) {
		for _, r := range recs {
			out = append(out, string(r.Key))
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		batch    []*kgo.Record
		clusters map[string]bool
		want     []string
	}{
		{"same node", []*kgo.Record{rec("a", "n1", 0, 12)}, nil, []string{"a/n1"}},
		{"other node", []*kgo.Record{rec("a", "n3", 0, 12)}, nil, nil},
		{"cluster-wide", []*kgo.Record{rec("a", "n3", 0, 12)}, map[string]bool{"a": true}, []string{"a/n1", "a/n2"}},
	} {
		if got := names(u.of(tc.batch, tc.clusters)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	stored = map[string]map[int32]int64{events.TopicEvents: {0: 11, 1: 0}}
	if err := u.refresh(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := names(u.of([]*kgo.Record{rec("a", "n1", 0, 12), rec("a", "n2", 0, 12), rec("b", "n1", 1, 8)}, nil)); !slices.Equal(got, []string{"a/n2", "b/n1"}) {
		t.Errorf("after the store committed partition 0 to 11: %v, want a/n2 and b/n1", got)
	}
	progressErr = errors.New("broker down")
	reads = 0
	now = now.Add(2 * time.Minute)
	u.add([]*kgo.Record{rec("c", "n1", 2, 1)})
	if err := u.refresh(context.Background(), nil); !errors.Is(err, errProgressUnknown) {
		t.Errorf("the progress error is returned as %v, want errProgressUnknown (nothing missed)", err)
	}
	if got := names(u.of(nil, map[string]bool{"a": true, "b": true, "c": true})); !slices.Equal(got, []string{"c/n1"}) {
		t.Errorf("after maxAge without progress: %v, want only the new c/n1", got)
	}
	if reads != 1 {
		t.Errorf("the progress read %d times for a batch without a handed-over partition, want once (no retry)", reads)
	}
	// A batch of a partition handed to this replica cannot be read back
	// without the progress: it retries reading it for seedWait, then goes
	// on (a window may miss records) and says so.
	u.readBack = func(context.Context, string, int32, int64, int64) ([]*kgo.Record, error) {
		t.Fatal("read back without the store's progress")
		return nil, nil
	}
	reads = 0
	if err := u.refresh(context.Background(), []*kgo.Record{rec("e", "n1", 4, 10)}); err == nil || errors.Is(err, errProgressUnknown) {
		t.Errorf("a handed-over partition without progress: %v, want an error that is not errProgressUnknown", err)
	}
	if reads < 2 {
		t.Errorf("the progress read %d times for a handed-over partition, want retries (every %v for %v)", reads, seedRetry, u.seedWait)
	}
	u.readBack = nil
	for i := range 7 {
		u.add([]*kgo.Record{rec("d", "n1", 3, int64(i))})
	}
	forgotten := counterValue(t, forgot)
	if n := len(u.of(nil, map[string]bool{"c": true, "d": true})); n != 5 || forgotten != 3 {
		t.Errorf("over the bound of 5: %d kept, %v forgotten, want 5 and 3", n, forgotten)
	}
	// … and reads back once the progress is known within seedWait.
	var readFrom int64 = -1
	u.readBack = func(_ context.Context, _ string, _ int32, from, _ int64) ([]*kgo.Record, error) {
		readFrom = from
		return []*kgo.Record{rec("f", "n1", 5, from)}, nil
	}
	reads, u.seedWait = 0, time.Minute // it returns on the third read
	u.progress = func(context.Context) (map[string]map[int32]int64, error) {
		if reads++; reads < 3 {
			return nil, progressErr
		}
		return map[string]map[int32]int64{events.TopicEvents: {5: 20}}, nil
	}
	if err := u.refresh(context.Background(), []*kgo.Record{rec("f", "n2", 5, 22)}); err != nil {
		t.Errorf("a handed-over partition whose progress is known on the third read: %v", err)
	}
	if readFrom != 20 || !slices.Contains(names(u.of(nil, map[string]bool{"f": true})), "f/n1") {
		t.Errorf("read back from %d (want 20, the store's progress), remembered %v", readFrom, names(u.of(nil, map[string]bool{"f": true})))
	}
	held := 0
	for _, m := range u.recs {
		held += len(m.rec.Key) + len(m.rec.Value)
	}
	if u.bytes != held {
		t.Errorf("the memory counts %d bytes, holds %d", u.bytes, held)
	}
}

// TestUnstoredBoundedByBytes: the memory holds at most maxUnstoredBytes
// of records, the newest, and counts those it forgot as the count bound
// does. It was bounded by count only: at the gateway's largest event
// (~200 KB) 100,000 records were ~20 GB.
func TestUnstoredBoundedByBytes(t *testing.T) {
	ev := &datamodels.HealthEvent{Agent: "a", ComponentClass: "GPU", CheckName: "XID", Cluster: "c", NodeName: "n",
		Message: strings.Repeat("m", validate.MaxMessageLen), Metadata: map[string]string{}}
	for j := range validate.MaxErrorCodes {
		ev.ErrorCode = append(ev.ErrorCode, fmt.Sprintf("%0*d", validate.MaxErrorCodeLen, j))
	}
	for j := range validate.MaxEntities {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: fmt.Sprintf("%0*d", validate.MaxNameLen, j),
			EntityValue: fmt.Sprintf("%0*d", validate.MaxEntityValue, j)})
	}
	for j := range validate.MaxMetadata {
		ev.Metadata[fmt.Sprintf("%0*d", validate.MaxMetadataKey, j)] = strings.Repeat("v", validate.MaxMetadataVal)
	}
	if err := (validate.Validator{MaxBatch: 1, MaxFutureSkew: time.Minute}).Validate(ev, time.Now()); err != nil {
		t.Fatalf("the gateway refuses the event: %v", err)
	}
	large := evRecord(t, ev) // its value shared by every record below: the test holds ~200 KB
	size := len(large.Key) + len(large.Value)
	h := New(nil, nil, time.Now, time.Minute, slog.New(slog.DiscardHandler), nil)
	u := h.unstored
	n := maxUnstoredBytes/size + 1000
	for i := 0; i < n; i += 100 { // batches of 100
		var batch []*kgo.Record
		for j := i; j < min(i+100, n); j++ {
			r := *large
			r.Offset = int64(j)
			batch = append(batch, &r)
		}
		u.add(batch)
	}
	held := 0
	for _, m := range u.recs {
		held += len(m.rec.Key) + len(m.rec.Value)
	}
	forgotten := counterValue(t, u.forgot)
	t.Logf("%d records of %d bytes added: %d kept, %d bytes (bound %d), %v forgotten", n, size, len(u.recs), held, maxUnstoredBytes, forgotten)
	if held > maxUnstoredBytes || held+size <= maxUnstoredBytes {
		t.Errorf("%d bytes kept, want as many records as fit in %d", held, maxUnstoredBytes)
	}
	if int(forgotten) != n-len(u.recs) {
		t.Errorf("%v forgotten, want %d", forgotten, n-len(u.recs))
	}
	for i, r := range u.recs {
		if want := int64(n - len(u.recs) + i); r.rec.Offset != want {
			t.Fatalf("record %d kept is offset %d, want %d (the newest, in order)", i, r.rec.Offset, want)
		}
	}
	for _, r := range u.recs[len(u.recs):cap(u.recs)] {
		if r.rec != nil {
			t.Fatalf("a forgotten record (offset %d) is still held past the kept ones", r.rec.Offset)
		}
	}
}

// TestUnstoredReadsBackLater: a handed-over partition whose records below
// the batch could not be read back — the store's progress unreadable past
// seedWait, or the read itself failing — is read back with a later batch
// of the partition, once, without that batch waiting for the progress; not
// once the partition is revoked (its next owner reads it back).
func TestUnstoredReadsBackLater(t *testing.T) {
	var progressErr, readErr error
	var progressReads int
	var readBacks []string // "partition:[from,to)"
	u := &unstored{maxAge: time.Hour, max: 100, maxBytes: maxUnstoredBytes, seedWait: 2 * seedRetry, now: time.Now,
		forgot: prometheus.NewCounter(prometheus.CounterOpts{Name: "forgot"}), next: map[pipeline.TopicPart]int64{},
		progress: func(context.Context) (map[string]map[int32]int64, error) {
			progressReads++
			return map[string]map[int32]int64{events.TopicEvents: {4: 6, 5: 6, 7: 25}}, progressErr
		},
		readBack: func(_ context.Context, _ string, p int32, from, to int64) ([]*kgo.Record, error) {
			readBacks = append(readBacks, fmt.Sprintf("%d:[%d,%d)", p, from, to))
			if readErr != nil {
				return nil, readErr
			}
			return []*kgo.Record{{Topic: events.TopicEvents, Key: events.Key("a", fmt.Sprint("read-", p)), Partition: p, Offset: from}}, nil
		}}
	batch := func(p int32, off int64) []*kgo.Record {
		return []*kgo.Record{{Topic: events.TopicEvents, Key: events.Key("a", "n1"), Partition: p, Offset: off}}
	}
	steps := []struct {
		name                  string
		revoke                []int32 // before the batch
		progressErr, readErr  error
		batch                 []*kgo.Record
		wantErr               bool
		wantReads             []string
		wantProgressReadsOver int // more than this many reads of the progress
	}{
		{"partition 4 handed over, the progress unreadable", nil, errors.New("coordinator moving"), nil, batch(4, 10), true, nil, 1},
		{"its next batch reads back below the first, not waiting", nil, nil, nil, batch(4, 11), false, []string{"4:[6,10)"}, 0},
		{"and only once", nil, nil, nil, batch(4, 12), false, nil, 0},
		{"partition 5 handed over, the progress unreadable", nil, errors.New("coordinator moving"), nil, batch(5, 10), true, nil, 1},
		{"partition 5 revoked: its next owner reads it back, not this replica", []int32{5}, nil, nil, batch(4, 13), false, nil, 0},
		{"partition 7 handed over, the read back failing", nil, nil, errors.New("broker gone"), batch(7, 30), true, []string{"7:[25,30)"}, 0},
		{"its next batch reads back again", nil, nil, nil, batch(7, 31), false, []string{"7:[25,30)"}, 0},
	}
	for _, st := range steps {
		progressErr, readErr, readBacks, progressReads = st.progressErr, st.readErr, nil, 0
		u.revoked(events.TopicEvents, st.revoke)
		err := u.refresh(context.Background(), st.batch)
		if (err != nil) != st.wantErr || errors.Is(err, errProgressUnknown) {
			t.Errorf("%s: refresh: %v, want an error %v (not errProgressUnknown)", st.name, err, st.wantErr)
		}
		if !slices.Equal(readBacks, st.wantReads) {
			t.Errorf("%s: read back %v, want %v", st.name, readBacks, st.wantReads)
		}
		if over := st.wantProgressReadsOver; (over == 0 && progressReads != 1) || progressReads <= over {
			t.Errorf("%s: the progress read %d times, want %s", st.name, progressReads, map[bool]string{true: "once", false: "retries for seedWait"}[over == 0])
		}
		u.add(st.batch)
	}
	if got := len(u.of(nil, map[string]bool{"a": true})); got != 7+2 {
		t.Errorf("%d records remembered, want the 7 batches' and the 2 read back", got)
	}
}

// TestHandoverReadsBackUnstored: a partition handed over from another
// replica (here: a fresh handler whose first batch starts at offset 1)
// reads back from the real broker the records below its batch that the
// store has not written (its committed offset 0), so the pair's first
// Xid 31, correlated by the other replica, still counts. Without the read
// back the window counts 1.
func TestHandoverReadsBackUnstored(t *testing.T) {
	s := server(t)
	k := testenv.StartKafka(t)
	c := newCluster("handover")
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = k.Addr(), 1, 1
	log := slog.New(slog.DiscardHandler)
	if err := kafka.CreatePipelineTopics(ctx(t), kcfg, log); err != nil {
		t.Fatal(err)
	}
	cl := k.Client(t)
	var recs []*kgo.Record
	for _, at := range []time.Duration{0, time.Minute} {
		r := evRecord(t, xid(c, "n1", at, 31, false, 1))
		r.Timestamp = time.Time{}
		if err := cl.ProduceSync(ctx(t), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if recs[0].Partition != recs[1].Partition || recs[1].Offset != recs[0].Offset+1 {
		t.Fatalf("records at %d/%d and %d/%d, want one partition, consecutive", recs[0].Partition, recs[0].Offset, recs[1].Partition, recs[1].Offset)
	}
	rules, err := ParseRules(DefaultRules, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		readBack bool
		want     int
	}{{false, 0}, {true, 1}} {
		h := New(s.Conn, rules, func() time.Time { return base.Add(time.Hour) }, 2*time.Minute, log, nil)
		h.SetStoreProgress(func(context.Context) (map[string]map[int32]int64, error) {
			return map[string]map[int32]int64{events.TopicEvents: {recs[0].Partition: recs[0].Offset}}, nil // nothing stored
		})
		if tc.readBack {
			h.SetReadBack(readBack(kcfg, log, maxUnstoredBytes))
		}
		res, err := h.Handle(ctx(t), recs[1:])
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Out) != tc.want {
			t.Errorf("read back %v: %d derived events, want %d", tc.readBack, len(res.Out), tc.want)
		}
	}
}

// TestReadBackKeepsTheNewest: reading back a handed-over partition keeps
// the newest maxBytes of it as it reads — it held the whole range (up to
// 100,000 records: 20 GB of the gateway's largest events) before the
// memory trimmed it.
func TestReadBackKeepsTheNewest(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, events.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = strings.Join(kc.ListenAddrs(), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	value := make([]byte, 100<<10)
	for i := range 30 {
		if err := cl.ProduceSync(ctx(t), &kgo.Record{Topic: events.TopicEvents, Key: []byte(fmt.Sprint(i)), Value: value}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const maxBytes = 1 << 20
	recs, err := readBack(kcfg, slog.New(slog.DiscardHandler), maxBytes)(ctx(t), events.TopicEvents, 0, 0, 30)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 {
		t.Fatal("nothing read back")
	}
	held := 0
	for i, r := range recs {
		held += recordBytes(r)
		if i > 0 && r.Offset != recs[i-1].Offset+1 {
			t.Fatalf("offsets %d then %d: want the newest in order", recs[i-1].Offset, r.Offset)
		}
	}
	if len(recs) == 0 || recs[len(recs)-1].Offset != 29 || held > maxBytes || len(recs) < 9 {
		t.Fatalf("read back %d records (%d bytes, the last at %v); want the newest ~10, at most %d bytes, up to offset 29", len(recs), held, recs[len(recs)-1].Offset, maxBytes)
	}
}

// TestHandlerRevokedForgetsPending: the role's revocation (the pipeline's
// PartitionObserver) reaches both the sweep's ownership and the records
// not read back yet.
func TestHandlerRevokedForgetsPending(t *testing.T) {
	h := New(nil, nil, time.Now, time.Minute, slog.New(slog.DiscardHandler), nil)
	h.PartitionsAssigned(events.TopicEvents, []int32{0, 1}, 2)
	h.unstored.keepPending(map[pipeline.TopicPart]int64{{Topic: events.TopicEvents, Partition: 0}: 10, {Topic: events.TopicEvents, Partition: 1}: 20})
	var obs pipeline.PartitionObserver = h
	obs.PartitionsRevoked(events.TopicEvents, []int32{0})
	if _, ok := h.unstored.pending[pipeline.TopicPart{Topic: events.TopicEvents, Partition: 0}]; ok || len(h.unstored.pending) != 1 {
		t.Errorf("pending after revoking partition 0: %v, want partition 1's only", h.unstored.pending)
	}
	for _, key := range []string{"a/n1", "a/n2", "a/n3", "a/n4"} {
		if h.Owns([]byte(key)) == (kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(key)}, 2) == 0) {
			t.Errorf("Owns(%q) after revoking partition 0 disagrees with its partition", key)
		}
	}
}

// TestSweepCountsUnstoredRecords: a trigger a batch skipped (its group's
// verdict standing, recovered in the sweep only) that the store has not
// written yet counts in the sweep's window — per GPU (RepeatedXIDOnSameGPU:
// a fifth burst in 24h as the oldest leaves the window) and per cluster
// (FabricIncident: four more nodes down past the stabilization) — so the
// sweep does not recover the verdict; once the store has written it the
// sweep goes on as before. Before, the sweep had no records: it recovered
// the verdict, and nothing evaluated the skipped trigger again.
func TestSweepCountsUnstoredRecords(t *testing.T) {
	s := server(t)
	h := time.Hour
	m := time.Minute
	for _, tt := range []struct {
		name string
		rule string
		// stored: batches stored as they come, the last deriving the
		// verdict; late: the batch the store has not written at the sweep
		stored func(c string) [][]*datamodels.HealthEvent
		late   func(c string) []*datamodels.HealthEvent
		// holds: sweeps that see late and recover nothing; recovers: the
		// sweep that recovers once late has left the window
		holds    []time.Duration
		recovers time.Duration
	}{
		{
			name: "RepeatedXIDOnSameGPU", rule: "RepeatedXIDOnSameGPU",
			stored: func(c string) [][]*datamodels.HealthEvent {
				var bs [][]*datamodels.HealthEvent
				for i := range 5 {
					bs = append(bs, evs(xid(c, "n1", time.Duration(i)*h, 48, true, 1)))
				}
				return bs
			},
			// the burst at 0 leaves the window at 24h: the fifth burst
			late:     func(c string) []*datamodels.HealthEvent { return evs(xid(c, "n1", 23*h+30*m, 48, true, 1)) },
			holds:    []time.Duration{24*h + 1*m, 24*h + 2*m},
			recovers: 25*h + 1*m, // 4 bursts left, the last 1h31m ago
		},
		{
			name: "FabricIncident", rule: "FabricIncident",
			stored: func(c string) [][]*datamodels.HealthEvent {
				return [][]*datamodels.HealthEvent{downs(c, 0, 1)}
			},
			// past the 10m stabilization, four more nodes down
			late:     func(c string) []*datamodels.HealthEvent { return downs(c, 12*m, 5) },
			holds:    []time.Duration{13 * m, 13*m + 30*time.Second},
			recovers: 15 * m, // the 2m window empty
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster("sweepunstored")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			if got := only(tt.rule, hs.batches(tt.stored(c))); len(got) != 1 || got[0].GetIsHealthy() {
				t.Fatalf("stored batches: %s, want the verdict", describe(got))
			}
			late := records(t, tt.late(c))
			if got := only(tt.rule, hs.unstoredBatch(late...)); len(got) != 0 {
				t.Fatalf("trigger of the standing verdict: %s, want nothing (the sweep recovers)", describe(got))
			}
			if got := only(tt.rule, hs.sweep(tt.holds[0])); len(got) != 0 {
				t.Fatalf("sweep at %v, the late batch not stored: %s, want nothing (it holds)", tt.holds[0], describe(got))
			}
			hs.storeDerived(late, nil)
			for _, at := range tt.holds[1:] {
				if got := only(tt.rule, hs.sweep(at)); len(got) != 0 {
					t.Fatalf("sweep at %v, the late batch stored: %s, want nothing (it holds)", at, describe(got))
				}
			}
			if got := only(tt.rule, hs.sweep(tt.recovers)); len(got) != 1 || !got[0].GetIsHealthy() {
				t.Fatalf("sweep at %v: %s, want the recovery", tt.recovers, describe(got))
			}
		})
	}
}

// downs is four nodes' ports DOWN a second apart from at, nodes n<from>
// on.
func downs(c string, at time.Duration, from int) []*datamodels.HealthEvent {
	var out []*datamodels.HealthEvent
	for i := range 4 {
		out = append(out, nicState(c, fmt.Sprintf("n%d", from+i), at+time.Duration(i)*time.Second, false))
	}
	return out
}
