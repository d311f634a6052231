package history_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

var base = time.Date(2025, 10, 1, 0, 0, 0, 0, time.UTC)

// seed writes, twice, 20 events of alpha (e00..e19, 250 ms apart, nodes
// n0/n1 alternating, every third fatal, GPU-<i%4>) and 3 of beta, and 5
// actions of alpha.
func seed(t *testing.T, srv *chtest.Server) {
	t.Helper()
	var recs []*kgo.Record
	add := func(c string, i int) {
		ev := &datamodels.HealthEvent{
			Id: fmt.Sprintf("%s-e%02d", c, i), Cluster: c, NodeName: fmt.Sprintf("n%d", i%2),
			CheckName: []string{"XID", "NIC"}[i%2], IsFatal: i%3 == 0,
			EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%d", i%4)}},
			GeneratedTimestamp: timestamppb.New(base.Add(time.Duration(i) * 250 * time.Millisecond)),
		}
		v, _ := events.Marshal(ev)
		recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(c, ev.NodeName), Value: v, Timestamp: base})
	}
	for i := range 20 {
		add("alpha", i)
	}
	for i := range 3 {
		add("beta", i)
	}
	for i := range 5 {
		a := &faultlinev1.Action{Id: fmt.Sprintf("a%d", i), Cluster: "alpha", Node: fmt.Sprintf("n%d", i%2), Kind: "quarantine",
			Timestamp: timestamppb.New(base.Add(time.Duration(i) * time.Second))}
		v, _ := events.MarshalAction(a)
		recs = append(recs, &kgo.Record{Topic: events.TopicActions, Key: events.Key("alpha", a.Node), Value: v, Timestamp: base})
	}
	h := store.New(srv.Conn, slog.Default(), nil)
	for range 2 {
		if _, err := h.Handle(context.Background(), recs); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(evs []*datamodels.HealthEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.GetId()
	}
	return out
}

// want returns alpha's ids for the indexes i in [from, to) that keep,
// newest first.
func want(from, to int, keep func(i int) bool) []string {
	var out []string
	for i := to - 1; i >= from; i-- {
		if keep == nil || keep(i) {
			out = append(out, fmt.Sprintf("alpha-e%02d", i))
		}
	}
	return out
}

func TestListEvents(t *testing.T) {
	srv := chtest.Start(t)
	seed(t, srv)
	h := history.New(srv.Conn, slog.Default())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	at := func(i int) *timestamppb.Timestamp {
		return timestamppb.New(base.Add(time.Duration(i) * 250 * time.Millisecond))
	}
	tests := []struct {
		name    string
		cluster string
		req     *faultlinev1.ListEventsRequest
		want    []string
	}{
		{"all of alpha, newest first, each once", "alpha", &faultlinev1.ListEventsRequest{}, want(0, 20, nil)},
		{"cluster scoped", "beta", &faultlinev1.ListEventsRequest{}, []string{"beta-e02", "beta-e01", "beta-e00"}},
		{"unknown cluster", "gamma", &faultlinev1.ListEventsRequest{}, nil},
		{"node", "alpha", &faultlinev1.ListEventsRequest{Node: "n1"}, want(0, 20, func(i int) bool { return i%2 == 1 })},
		{"check", "alpha", &faultlinev1.ListEventsRequest{Check: "XID"}, want(0, 20, func(i int) bool { return i%2 == 0 })},
		{"entity", "alpha", &faultlinev1.ListEventsRequest{Entity: "GPU-3"}, want(0, 20, func(i int) bool { return i%4 == 3 })},
		{"fatal only", "alpha", &faultlinev1.ListEventsRequest{FatalOnly: true}, want(0, 20, func(i int) bool { return i%3 == 0 })},
		{"since inclusive, to the millisecond", "alpha", &faultlinev1.ListEventsRequest{Since: at(5)}, want(5, 20, nil)},
		{"until exclusive, to the millisecond", "alpha", &faultlinev1.ListEventsRequest{Until: at(5)}, want(0, 5, nil)},
		{"since and until inside one second", "alpha", &faultlinev1.ListEventsRequest{Since: at(9), Until: at(11)}, want(9, 11, nil)},
		{"combined", "alpha", &faultlinev1.ListEventsRequest{Node: "n0", FatalOnly: true, Since: at(1)}, want(1, 20, func(i int) bool { return i%6 == 0 })},
		{"limit", "alpha", &faultlinev1.ListEventsRequest{Limit: 3}, want(17, 20, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := h.ListEvents(ctx, tt.cluster, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(resp.Events); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v\nwant %v", got, tt.want)
			}
		})
	}

	t.Run("paging", func(t *testing.T) {
		for _, limit := range []int32{1, 3, 7, 20, 1000} {
			var got []string
			req := &faultlinev1.ListEventsRequest{Limit: limit, Node: "n0"}
			for pages := 0; ; pages++ {
				if pages > 25 {
					t.Fatal("paging does not end")
				}
				resp, err := h.ListEvents(ctx, "alpha", req)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Events) > int(limit) {
					t.Fatalf("page of %d events, limit %d", len(resp.Events), limit)
				}
				got = append(got, ids(resp.Events)...)
				if resp.NextPageToken == "" {
					break
				}
				req.PageToken = resp.NextPageToken
			}
			if w := want(0, 20, func(i int) bool { return i%2 == 0 }); !slices.Equal(got, w) {
				t.Fatalf("limit %d: paged %v\nwant %v", limit, got, w)
			}
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		for _, req := range []*faultlinev1.ListEventsRequest{
			{PageToken: "not-a-token"},
			{Limit: -1},
			{Limit: history.MaxLimit + 1},
		} {
			_, err := h.ListEvents(ctx, "alpha", req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%v: err %v, want InvalidArgument", req, err)
			}
		}
	})
}

func TestListActions(t *testing.T) {
	srv := chtest.Start(t)
	seed(t, srv)
	h := history.New(srv.Conn, slog.Default())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tests := []struct {
		name    string
		cluster string
		req     *faultlinev1.ListActionsRequest
		want    []string
	}{
		{"all", "alpha", &faultlinev1.ListActionsRequest{}, []string{"a4", "a3", "a2", "a1", "a0"}},
		{"cluster scoped", "beta", &faultlinev1.ListActionsRequest{}, nil},
		{"node", "alpha", &faultlinev1.ListActionsRequest{Node: "n1"}, []string{"a3", "a1"}},
		{"since", "alpha", &faultlinev1.ListActionsRequest{Since: timestamppb.New(base.Add(3 * time.Second))}, []string{"a4", "a3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			req := tt.req
			req.Limit = 2
			for {
				resp, err := h.ListActions(ctx, tt.cluster, req)
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range resp.Actions {
					got = append(got, a.GetId())
				}
				if resp.NextPageToken == "" {
					break
				}
				req.PageToken = resp.NextPageToken
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestBadParameters: parameters that cannot match anything are refused as
// InvalidArgument (400) naming the parameter, before any query (the
// History here has no connection at all).
func TestBadParameters(t *testing.T) {
	h := history.New(nil, slog.Default())
	ts := func(sec int64) *timestamppb.Timestamp { return &timestamppb.Timestamp{Seconds: sec} }
	tok := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name string
		ev   *faultlinev1.ListEventsRequest
		act  *faultlinev1.ListActionsRequest
		want string
	}{
		{name: "since 1e15 seconds", ev: &faultlinev1.ListEventsRequest{Since: ts(1e15)}, want: "since: not a valid timestamp"},
		{name: "since before 1970", ev: &faultlinev1.ListEventsRequest{Since: ts(-86400)}, want: "since: 1969-12-31T00:00:00Z is outside the stored range"},
		{name: "until after 2106", ev: &faultlinev1.ListEventsRequest{Until: ts(5e9)}, want: "until: 2128-06-11T08:53:20Z is outside the stored range"},
		{name: "until before since", ev: &faultlinev1.ListEventsRequest{Since: ts(2e9), Until: ts(1e9)}, want: "until: before since"},
		{name: "1 MiB node", ev: &faultlinev1.ListEventsRequest{Node: strings.Repeat("n", 1<<20)}, want: "node: longer than 253 bytes"},
		{name: "node not a node name", ev: &faultlinev1.ListEventsRequest{Node: "Node_1"}, want: "node: not a Kubernetes node name"},
		{name: "control character in check", ev: &faultlinev1.ListEventsRequest{Check: "XID\x00"}, want: "check: must be at most 256 bytes with no control characters"},
		{name: "long entity", ev: &faultlinev1.ListEventsRequest{Entity: strings.Repeat("e", 513)}, want: "entity: must be at most 512"},
		{name: "absurd page token", ev: &faultlinev1.ListEventsRequest{PageToken: strings.Repeat("A", 1<<20)}, want: "pageToken: not a token this server issued"},
		{name: "page token past 2106", ev: &faultlinev1.ListEventsRequest{PageToken: tok("99999999999999999|e1")}, want: "pageToken: not a token"},
		{name: "page token with a control character", ev: &faultlinev1.ListEventsRequest{PageToken: tok("1000|e\n1")}, want: "pageToken: not a token"},
		{name: "actions: since before 1970", act: &faultlinev1.ListActionsRequest{Since: ts(-1)}, want: "since: 1969-12-31T23:59:59Z is outside"},
		{name: "actions: long node", act: &faultlinev1.ListActionsRequest{Node: strings.Repeat("n", 254)}, want: "node: longer than 253"},
		{name: "actions: absurd page token", act: &faultlinev1.ListActionsRequest{PageToken: "%%%"}, want: "pageToken: not a token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.ev != nil {
				_, err = h.ListEvents(context.Background(), "alpha", tt.ev)
			} else {
				_, err = h.ListActions(context.Background(), "alpha", tt.act)
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
}

// TestPageBytes: a page of the largest events the gateway accepts (8 KiB
// message, 64 metadata values of 2 KiB: ~140 KB each) ends at 4 MiB
// (history.MaxPageBytes) whatever the limit, and the pages that follow
// give every event once. Before, limit=1000 answered 1000 such events in
// one page: ~140 MB read, held and encoded at once per request (~200 MB
// with entities and error codes too).
func TestPageBytes(t *testing.T) {
	const pageBytes = 4 << 20
	srv := chtest.Start(t)
	meta := map[string]string{}
	for i := range 64 {
		meta[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 2048)
	}
	var recs []*kgo.Record
	for i := range 40 {
		ev := &datamodels.HealthEvent{
			Id: fmt.Sprintf("big-e%02d", i), Cluster: "alpha", NodeName: "big", CheckName: "XID",
			Message: strings.Repeat("m", 8192), Metadata: meta,
			GeneratedTimestamp: timestamppb.New(base.Add(time.Duration(i) * time.Second)),
		}
		v, _ := events.Marshal(ev)
		recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key("alpha", "big"), Value: v, Timestamp: base})
	}
	if _, err := store.New(srv.Conn, slog.Default(), nil).Handle(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	h := history.New(srv.Conn, slog.Default())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []string
	tok := ""
	for page := 0; ; page++ {
		resp, err := h.ListEvents(ctx, "alpha", &faultlinev1.ListEventsRequest{Node: "big", Limit: 1000, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if n := proto.Size(resp); n > pageBytes {
			t.Fatalf("page %d: %d events, %d bytes: over %d", page, len(resp.Events), n, pageBytes)
		}
		got = append(got, ids(resp.Events)...)
		if tok = resp.NextPageToken; tok == "" {
			break
		}
	}
	var want []string
	for i := 39; i >= 0; i-- {
		want = append(want, fmt.Sprintf("big-e%02d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("pages gave %v, want %v", got, want)
	}
}

// TestPageBytesFramed: a page ends where its encoded response would pass
// 4 MiB (grpc-go's default receive limit), counting each event's framing
// and the nextPageToken: 29 large events and a newest one sized so that
// the events alone come 60 bytes short of 4 MiB. Before, the page held
// all 30 and encoded to 4 MiB + ~60 bytes, refused by every default gRPC
// client on every retry.
func TestPageBytesFramed(t *testing.T) {
	srv := chtest.Start(t)
	st := store.New(srv.Conn, slog.Default(), nil)
	h := history.New(srv.Conn, slog.Default())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	meta := map[string]string{}
	for i := range 64 {
		meta[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 2048)
	}
	put := func(node, id string, at time.Duration, msg int) {
		ev := &datamodels.HealthEvent{Id: id, Cluster: "alpha", NodeName: node, CheckName: "XID",
			Message: strings.Repeat("m", msg), Metadata: meta, GeneratedTimestamp: timestamppb.New(base.Add(at))}
		v, _ := events.Marshal(ev)
		rec := &kgo.Record{Topic: events.TopicEvents, Key: events.Key("alpha", node), Value: v, Timestamp: base}
		if _, err := st.Handle(ctx, []*kgo.Record{rec}); err != nil {
			t.Fatal(err)
		}
	}
	list := func(node, tok string) *faultlinev1.ListEventsResponse {
		resp, err := h.ListEvents(ctx, "alpha", &faultlinev1.ListEventsRequest{Node: node, Limit: 1000, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	const probe = 100_000
	put("edge-b", "edge-e99", time.Hour, probe) // what an event costs beyond its message
	over := list("edge-b", "").Events[0].SizeVT() - probe
	for i := range 29 {
		put("edge-a", fmt.Sprintf("edge-e%02d", i), time.Duration(i)*time.Second, 8192)
	}
	sum := 0
	for _, ev := range list("edge-a", "").Events {
		sum += ev.SizeVT()
	}
	put("edge-a", "edge-e29", time.Minute, (4<<20)-60-sum-over)
	var got []string
	for tok := ""; ; {
		resp := list("edge-a", tok)
		if n := proto.Size(resp); n > 4<<20 {
			t.Fatalf("a page of %d events encodes to %d bytes: over 4 MiB", len(resp.Events), n)
		}
		got = append(got, ids(resp.Events)...)
		if tok = resp.NextPageToken; tok == "" {
			break
		}
	}
	if len(got) != 30 || got[0] != "edge-e29" {
		t.Errorf("pages gave %d events %v, want all 30, edge-e29 first", len(got), got)
	}
}

// storeEvents stores n events of check in cluster through the store, the
// newest at at, then one every step back, received when generated; node
// names the node of the i-th. It returns their ids, newest first.
func storeEvents(t *testing.T, h *store.Handler, cluster, check string, n int, at time.Time, step time.Duration, node func(i int) string) []string {
	t.Helper()
	var recs []*kgo.Record
	var out []string
	for i := range n {
		ts := at.Add(-time.Duration(i) * step)
		ev := &datamodels.HealthEvent{Id: fmt.Sprintf("%s-%s-%05d", check, at.Format("0102"), i), Cluster: cluster,
			NodeName: node(i), CheckName: check, GeneratedTimestamp: timestamppb.New(ts)}
		v, _ := events.Marshal(ev)
		recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, ev.NodeName), Value: v, Timestamp: ts})
		out = append(out, ev.Id)
	}
	if _, err := h.Handle(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	return out
}

// pageThrough lists every page of req, 1,000 at a time, and returns the ids.
func pageThrough(t *testing.T, hist *history.ClickHouse, cluster string, req *faultlinev1.ListEventsRequest) []string {
	t.Helper()
	var got []string
	for {
		req.Limit = 1000
		resp, err := hist.ListEvents(context.Background(), cluster, req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(resp.Events)...)
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			return got
		}
	}
}

// bounded fails a query that reads more than 5,000 rows.
var bounded = ch.Context(context.Background(), ch.WithSettings(ch.Settings{"max_rows_to_read": 5000}))

// TestListingWithoutNodeReadsRecentParts: a listing without a node read
// and deduplicated every row of the cluster for a page of its newest
// (seconds and gigabytes of ClickHouse's memory over a large history);
// it now looks in the last hour, day, week and month first, and skips
// what was received before them. Here ClickHouse refuses to read more
// than 5,000 rows: the newest page, and a page of a filter whose rows are
// 3 days old, are found beside 20,000 rows received two months ago
// without reading them (a last page, or a filter with less than a page
// in the last month, still reads the whole range); paging through
// everything gives every event once, in order.
func TestListingWithoutNodeReadsRecentParts(t *testing.T) {
	srv := chtest.Start(t)
	now := time.Now().UTC()
	h := store.New(srv.Conn, slog.Default(), nil)
	spread := func(i int) string { return fmt.Sprintf("n%03d", i%500) }
	all := storeEvents(t, h, "gamma", "XID", 150, now.Add(-time.Minute), 10*time.Second, spread) // newest first
	all = append(all, storeEvents(t, h, "gamma", "RARE", 50, now.Add(-72*time.Hour), time.Second, spread)...)
	all = append(all, storeEvents(t, h, "gamma", "XID", 20000, now.Add(-60*24*time.Hour), time.Second, spread)...)
	hist := history.New(srv.Conn, slog.Default())

	resp, err := hist.ListEvents(bounded, "gamma", &faultlinev1.ListEventsRequest{})
	if err != nil {
		t.Fatalf("newest page: %v", err)
	}
	if got := ids(resp.Events); !slices.Equal(got, all[:100]) || resp.NextPageToken == "" {
		t.Fatalf("newest page: %d events from %v, next %q", len(got), got[:min(3, len(got))], resp.NextPageToken)
	}
	resp, err = hist.ListEvents(bounded, "gamma", &faultlinev1.ListEventsRequest{Check: "RARE", Limit: 20})
	if err != nil || !slices.Equal(ids(resp.Events), all[150:170]) || resp.NextPageToken == "" {
		t.Fatalf("RARE: %d events, next %q, err %v", len(resp.GetEvents()), resp.GetNextPageToken(), err)
	}
	if got := pageThrough(t, hist, "gamma", &faultlinev1.ListEventsRequest{}); !slices.Equal(got, all) {
		t.Fatalf("paging through: %d events, want %d in order", len(got), len(all))
	}
}

// TestNodeListingReadsTheLastDayFirst: a node's newest page read every
// row of the node, all its history; it now reads the parts received in the
// last two days (the day, and the skew an event may have) when they hold a
// page. A node with less than a page that day gets it from the whole range.
func TestNodeListingReadsTheLastDayFirst(t *testing.T) {
	srv := chtest.Start(t)
	now := time.Now().UTC()
	h := store.New(srv.Conn, slog.Default(), nil)
	hot := func(int) string { return "hot" }
	all := storeEvents(t, h, "delta", "XID", 150, now.Add(-time.Minute), 10*time.Second, hot)
	all = append(all, storeEvents(t, h, "delta", "XID", 20000, now.Add(-60*24*time.Hour), time.Second, hot)...)
	cold := storeEvents(t, h, "delta", "NIC", 30, now.Add(-72*time.Hour), time.Minute, func(int) string { return "cold" })
	hist := history.New(srv.Conn, slog.Default())

	resp, err := hist.ListEvents(bounded, "delta", &faultlinev1.ListEventsRequest{Node: "hot"})
	if err != nil {
		t.Fatalf("hot node's newest page: %v", err)
	}
	if got := ids(resp.Events); !slices.Equal(got, all[:100]) || resp.NextPageToken == "" {
		t.Fatalf("hot node's newest page: %d events from %v, next %q", len(got), got[:min(3, len(got))], resp.NextPageToken)
	}
	resp, err = hist.ListEvents(bounded, "delta", &faultlinev1.ListEventsRequest{Node: "cold"})
	if err != nil || !slices.Equal(ids(resp.Events), cold) || resp.NextPageToken != "" {
		t.Fatalf("cold node: %d events, next %q, err %v", len(resp.GetEvents()), resp.GetNextPageToken(), err)
	}
	if got := pageThrough(t, hist, "delta", &faultlinev1.ListEventsRequest{Node: "hot"}); !slices.Equal(got, all) {
		t.Fatalf("paging through the hot node: %d events, want %d in order", len(got), len(all))
	}
}

// TestPageStopsAtItsBytes: a page of the largest events received and
// decoded every row of its limit before cutting the page at 4 MiB: 1,000
// of them (~200 KB each), 29 kept, allocated 783 MB and took 2.3 s per
// request (load 18); 98 MB and 0.74 s now (the first round's 101 rows).
// Here 500 of them, 403 MB before.
func TestPageStopsAtItsBytes(t *testing.T) {
	srv := chtest.Start(t)
	meta := map[string]string{}
	for i := range 64 {
		meta[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 2048)
	}
	h := store.New(srv.Conn, slog.Default(), nil)
	now := time.Now()
	for b := range 5 {
		var recs []*kgo.Record
		for i := range 100 {
			ev := &datamodels.HealthEvent{Id: fmt.Sprintf("big-%d-%03d", b, i), Cluster: "alpha", NodeName: "big", CheckName: "XID",
				Message: strings.Repeat("m", 8192), Metadata: meta, GeneratedTimestamp: timestamppb.New(now.Add(-time.Duration(b*100+i) * time.Second))}
			v, _ := events.Marshal(ev)
			recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key("alpha", "big"), Value: v, Timestamp: now})
		}
		if _, err := h.Handle(context.Background(), recs); err != nil {
			t.Fatal(err)
		}
	}
	hist := history.New(srv.Conn, slog.Default())
	list := func() (*faultlinev1.ListEventsResponse, uint64) {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		resp, err := hist.ListEvents(context.Background(), "alpha", &faultlinev1.ListEventsRequest{Node: "big", Limit: 1000})
		runtime.ReadMemStats(&m1)
		if err != nil {
			t.Fatal(err)
		}
		return resp, m1.TotalAlloc - m0.TotalAlloc
	}
	resp, alloc := list()
	if len(resp.Events) < 10 || resp.NextPageToken == "" || proto.Size(resp) > history.MaxPageBytes+(1<<20) {
		t.Fatalf("%d events, %d bytes, next %q", len(resp.Events), proto.Size(resp), resp.NextPageToken)
	}
	if alloc > 150<<20 {
		t.Fatalf("a page of %d events allocated %d MB: the rest of the limit was read", len(resp.Events), alloc>>20)
	}
	t.Logf("%d events, %d MB allocated", len(resp.Events), alloc>>20)
	again, _ := list() // the stopped query left the connection usable
	if !slices.Equal(ids(again.Events), ids(resp.Events)) {
		t.Fatalf("second call: %d events", len(again.Events))
	}
}

// TestResentEventListedOnce: a monitor that resends an event under the
// same idempotency key without a generatedTimestamp gets the same id for
// each try, stamped with the time each was received, so two copies with
// different ts are stored and never merged. The cursor and the time bounds
// applied before the deduplication: paging by 2 listed it twice ([dup e5
// e4 e3 e2 dup e1 e0]). A listing now shows each id once, at its earliest
// copy in the listing's range.
func TestResentEventListedOnce(t *testing.T) {
	srv := chtest.Start(t)
	now := time.Now().UTC().Truncate(time.Second)
	h := store.New(srv.Conn, slog.Default(), nil)
	batch := func(names []string, ago []time.Duration) {
		var recs []*kgo.Record
		for i, name := range names {
			at := timestamppb.New(now.Add(-ago[i]))
			ev := &datamodels.HealthEvent{Id: name, Cluster: "eps", NodeName: "n0", CheckName: "XID",
				GeneratedTimestamp: at, ReceivedTimestamp: at} // as the gateway stamps it
			v, _ := events.Marshal(ev)
			recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key("eps", "n0"), Value: v, Timestamp: at.AsTime()})
		}
		if _, err := h.Handle(context.Background(), recs); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	var ago []time.Duration
	for i := range 6 {
		names, ago = append(names, fmt.Sprintf("e%d", i)), append(ago, time.Duration(10-i)*time.Second)
	}
	batch(append(names, "dup"), append(ago, 8500*time.Millisecond))
	batch([]string{"dup"}, []time.Duration{3500 * time.Millisecond})
	hist := history.New(srv.Conn, slog.Default())

	for _, node := range []string{"", "n0"} {
		for _, tt := range []struct {
			since, until time.Duration
			want         []string
		}{
			{want: []string{"e5", "e4", "e3", "e2", "dup", "e1", "e0"}},
			{since: 9 * time.Second, want: []string{"e5", "e4", "e3", "e2", "dup", "e1"}},
			// Its first copy before since: listed once, at the copy in range.
			{since: 6 * time.Second, want: []string{"dup", "e5", "e4"}},
			{until: 6 * time.Second, want: []string{"e3", "e2", "dup", "e1", "e0"}},
		} {
			req := &faultlinev1.ListEventsRequest{Node: node, Limit: 2}
			if tt.since != 0 {
				req.Since = timestamppb.New(now.Add(-tt.since))
			}
			if tt.until != 0 {
				req.Until = timestamppb.New(now.Add(-tt.until))
			}
			var got []string
			for {
				resp, err := hist.ListEvents(context.Background(), "eps", req)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ids(resp.Events)...)
				if req.PageToken = resp.NextPageToken; req.PageToken == "" {
					break
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("node %q, since -%s, until -%s, pages of 2: %v, want %v", node, tt.since, tt.until, got, tt.want)
			}
		}
	}
}

// TestResentEventAcrossWindowListedOnce: a listing reads a window first
// (the last hour, day, … before its newest bound; a node's, the last day)
// and deduplicated only the copies inside it, so with an event's copies on
// either side of the window's edge a page listed the later copy and a later
// page, its window measured from the token, the earliest again: eps
// without a node, by 2, [a dup b dup]; edge's node n1 [c dup2 d dup2].
func TestResentEventAcrossWindowListedOnce(t *testing.T) {
	srv := chtest.Start(t)
	now := time.Now().UTC().Truncate(time.Second)
	h := store.New(srv.Conn, slog.Default(), nil)
	for _, r := range []struct {
		cluster, id, node string
		ago               time.Duration
	}{
		{"eps", "a", "n0", 10 * time.Minute}, {"eps", "dup", "n0", 50 * time.Minute}, {"eps", "b", "n0", 55 * time.Minute},
		{"edge", "a", "n0", 10 * time.Minute}, {"edge", "dup", "n0", 50 * time.Minute}, {"edge", "b", "n0", 55 * time.Minute},
		{"edge", "c", "n1", 20 * time.Minute}, {"edge", "dup2", "n1", 2 * time.Hour}, {"edge", "d", "n1", 3 * time.Hour},
		// The second copies, each resend stamped when received.
		{"eps", "dup", "n0", 70 * time.Minute}, {"edge", "dup", "n0", 70 * time.Minute}, {"edge", "dup2", "n1", 25 * time.Hour},
	} {
		at := timestamppb.New(now.Add(-r.ago))
		ev := &datamodels.HealthEvent{Id: r.id, Cluster: r.cluster, NodeName: r.node, CheckName: "XID",
			GeneratedTimestamp: at, ReceivedTimestamp: at}
		v, _ := events.Marshal(ev)
		rec := &kgo.Record{Topic: events.TopicEvents, Key: events.Key(r.cluster, r.node), Value: v, Timestamp: at.AsTime()}
		if _, err := h.Handle(context.Background(), []*kgo.Record{rec}); err != nil {
			t.Fatal(err)
		}
	}
	hist := history.New(srv.Conn, slog.Default())
	for _, tt := range []struct {
		cluster, node string
		want          []string
	}{
		{"eps", "", []string{"a", "b", "dup"}},
		{"eps", "n0", []string{"a", "b", "dup"}},
		{"edge", "", []string{"a", "c", "b", "dup", "d", "dup2"}},
		{"edge", "n0", []string{"a", "b", "dup"}},
		{"edge", "n1", []string{"c", "d", "dup2"}},
	} {
		cluster, node, want := tt.cluster, tt.node, tt.want
		for limit := int32(1); limit <= 4; limit++ {
			req := &faultlinev1.ListEventsRequest{Node: node, Limit: limit}
			var got []string
			for {
				resp, err := hist.ListEvents(context.Background(), cluster, req)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Events) == 0 && resp.NextPageToken != "" {
					t.Errorf("%s, node %q, limit %d: an empty page with a nextPageToken", cluster, node, limit)
				}
				got = append(got, ids(resp.Events)...)
				if req.PageToken = resp.NextPageToken; req.PageToken == "" || len(got) > 10 {
					break
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s, node %q, pages of %d: %v, want %v", cluster, node, limit, got, want)
			}
		}
	}
}

// TestResentActionAcrossWindowListedOnce: the roles write an action under
// a deterministic id but stamp it when written, so a trigger redelivered
// after a crash writes a second copy, later. A listing without a node
// reads a window first and deduplicated only the copies inside it: with
// the copies on either side of the window's edge a page listed the later
// copy and a later page the earliest again, as it did for events.
func TestResentActionAcrossWindowListedOnce(t *testing.T) {
	srv := chtest.Start(t)
	now := time.Now().UTC().Truncate(time.Second)
	h := store.New(srv.Conn, slog.Default(), nil)
	for _, r := range []struct {
		id, node string
		ago      time.Duration
	}{
		{"a", "n0", 10 * time.Minute}, {"dup", "n0", 50 * time.Minute}, {"b", "n0", 55 * time.Minute},
		{"c", "n1", 20 * time.Minute}, {"dup2", "n1", 2 * time.Hour}, {"d", "n1", 3 * time.Hour},
		// The second copies, each written when its trigger was redelivered.
		{"dup", "n0", 70 * time.Minute}, {"dup2", "n1", 25 * time.Hour},
	} {
		at := now.Add(-r.ago)
		a := &faultlinev1.Action{Id: r.id, Cluster: "edge", Node: r.node, Kind: "quarantine", Timestamp: timestamppb.New(at)}
		v, _ := events.MarshalAction(a)
		rec := &kgo.Record{Topic: events.TopicActions, Key: events.Key("edge", r.node), Value: v, Timestamp: at}
		if _, err := h.Handle(context.Background(), []*kgo.Record{rec}); err != nil {
			t.Fatal(err)
		}
	}
	hist := history.New(srv.Conn, slog.Default())
	for _, tt := range []struct {
		node string
		want []string
	}{
		{"", []string{"a", "c", "b", "dup", "d", "dup2"}},
		{"n0", []string{"a", "b", "dup"}},
		{"n1", []string{"c", "d", "dup2"}},
	} {
		for limit := int32(1); limit <= 4; limit++ {
			req := &faultlinev1.ListActionsRequest{Node: tt.node, Limit: limit}
			var got []string
			for {
				resp, err := hist.ListActions(context.Background(), "edge", req)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Actions) == 0 && resp.NextPageToken != "" {
					t.Errorf("node %q, limit %d: an empty page with a nextPageToken", tt.node, limit)
				}
				for _, a := range resp.Actions {
					got = append(got, a.GetId())
				}
				if req.PageToken = resp.NextPageToken; req.PageToken == "" || len(got) > 10 {
					break
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("node %q, pages of %d: %v, want %v", tt.node, limit, got, tt.want)
			}
		}
	}
}
