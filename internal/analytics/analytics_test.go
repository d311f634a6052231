package analytics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentconf "github.com/faultline/faultline/agents/conformance"

	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/processors/conformance"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the results (review the diff!)")

// seedRecords turns testdata/seed_*.json into the Kafka records the
// gateway and the processors produce.
func seedRecords(t *testing.T) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	read := func(file string) []json.RawMessage {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		var raws []json.RawMessage
		if err := json.Unmarshal(b, &raws); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return raws
	}
	for _, r := range read("seed_events.json") {
		ev := &datamodels.HealthEvent{}
		if err := protojson.Unmarshal(r, ev); err != nil {
			t.Fatal(err)
		}
		v, _ := events.Marshal(ev)
		recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(ev.Cluster, ev.NodeName), Value: v})
	}
	for _, r := range read("seed_actions.json") {
		a := &faultlinev1.Action{}
		if err := protojson.Unmarshal(r, a); err != nil {
			t.Fatal(err)
		}
		v, _ := events.MarshalAction(a)
		recs = append(recs, &kgo.Record{Topic: events.TopicActions, Key: events.Key(a.Cluster, a.Node), Value: v, Timestamp: a.Timestamp.AsTime()})
	}
	return recs
}

// TestQueries runs every named query on seeded data written twice (as a
// store retry would) and compares with hand-checked answers.
func TestQueries(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := store.New(srv.Conn, slog.Default(), nil)
	recs := seedRecords(t)
	for range 2 {
		if res, err := h.Handle(ctx, recs); err != nil || len(res.Dead) > 0 {
			t.Fatalf("seed: %v %v", err, res.Dead)
		}
	}
	seedConformance(t, srv)
	qs, err := analytics.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 10, 8, 0, 0, 0, 0, time.UTC)
	week := analytics.Params{"since": "2025-10-01", "until": "2025-10-08"}
	with := func(p analytics.Params, kv ...string) analytics.Params {
		out := analytics.Params{}
		for k, v := range p {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	port := analytics.Params{"cluster": "alpha", "node": "node-a", "check": "InfiniBandStateCheck", "entity": "NIC=mlx5_0,NICPort=1"}
	xid := analytics.Params{"cluster": "alpha", "node": "node-a", "check": "SysLogsXIDError"}
	tests := []struct {
		golden string
		query  string
		params analytics.Params
	}{
		{"events_per_day", "events_per_day", week},
		{"events_per_day_beta", "events_per_day", with(week, "cluster", "beta")},
		{"top_error_codes", "top_error_codes", week},
		{"top_error_codes_xid_limit1", "top_error_codes", with(week, "prefix", "XID-", "limit", "1")},
		{"flapping_nic_ports", "flapping_nic_ports", week},
		{"flapping_nic_ports_min2", "flapping_nic_ports", with(week, "min_downs", "2")},
		{"mtbf_fatal", "mtbf_fatal", week},
		{"quarantined_longest", "quarantined_longest", analytics.Params{}},
		{"remediation_outcomes", "remediation_outcomes", week},
		{"link_down_window", "link_down_window", with(port, "until", "2025-10-03 08:05:00")},
		{"link_down_window_edge", "link_down_window", with(port, "until", "2025-10-03 08:04:00", "window", "240")},
		{"xid_bursts", "xid_bursts", with(xid, "until", "2025-10-02T00:00:00Z")},
		{"xid_bursts_later", "xid_bursts", with(xid, "until", "2025-10-02 12:00:00")},
		{"conformance_groups", "conformance_groups", analytics.Params{"until": "2025-10-08 12:00:00"}},
		{"conformance_groups_beta", "conformance_groups", analytics.Params{"until": "2025-10-08 12:00:00", "cluster": "beta"}},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			covered[tt.query] = true
			res, err := analytics.Run(ctx, srv.Conn, qs[tt.query], tt.params, now)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := res.Write(&buf, "csv"); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "golden", tt.golden+".csv")
			if *update {
				if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("%s %v:\ngot:\n%s\nwant:\n%s", tt.query, tt.params, buf.String(), want)
			}
		})
	}
	for name := range qs {
		if !covered[name] {
			t.Errorf("query %s has no test case", name)
		}
	}
	// The default parameters (now-7d etc.) also bind and run.
	for name, q := range qs {
		if _, err := analytics.Run(ctx, srv.Conn, q, nil, time.Now()); err != nil {
			t.Errorf("%s with defaults: %v", name, err)
		}
	}
}

func TestArgs(t *testing.T) {
	qs, err := analytics.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	q := qs["events_per_day"]
	tests := []struct {
		params  analytics.Params
		wantErr string
	}{
		{analytics.Params{"since": "now-2d"}, ""},
		{analytics.Params{"since": "1759276800"}, ""},
		{analytics.Params{"since": "yesterday"}, "param since (DateTime)"},
		{analytics.Params{"nope": "1"}, `no parameter "nope"`},
		// Outside what a DateTime holds: ClickHouse 18.16 wrapped these
		// and answered for another window.
		{analytics.Params{"until": "2200-01-01"}, "param until (DateTime): \"2200-01-01\" is outside"},
		{analytics.Params{"until": "99999999999"}, "param until (DateTime): \"99999999999\" is outside"},
		{analytics.Params{"since": "1969-12-31"}, "param since (DateTime): \"1969-12-31\" is outside"},
		{analytics.Params{"since": "-1"}, "param since (DateTime): \"-1\" is outside"},
		{analytics.Params{"since": "now-100000d"}, "param since (DateTime): bad duration"},
		{analytics.Params{"since": "now-1e300d"}, "param since (DateTime): bad duration"},
		{analytics.Params{"since": "now-NaNd"}, "param since (DateTime): bad duration"},
		{analytics.Params{"since": "now-Infd"}, "param since (DateTime): bad duration"},
		{analytics.Params{"since": "now--1d"}, "param since (DateTime): bad duration"},
		{analytics.Params{"since": "now--5h"}, "param since (DateTime): bad duration"},
		{analytics.Params{"since": "now-30000d"}, "param since (DateTime): \"now-30000d\" is outside"},
		{analytics.Params{"since": "1970-01-01", "until": "2106-02-07"}, ""},
		{analytics.Params{"since": "now-2d", "until": "now-3d"}, "param until"},
		{analytics.Params{"until": "2020-01-01"}, "is before since"},
		{analytics.Params{"since": "2025-10-01", "until": "2025-10-01"}, ""},
	}
	for _, tt := range tests {
		_, err := q.Args(tt.params, time.Now())
		if (err == nil) != (tt.wantErr == "") || (err != nil && !bytes.Contains([]byte(err.Error()), []byte(tt.wantErr))) {
			t.Errorf("Args(%v) = %v, want error containing %q", tt.params, err, tt.wantErr)
		}
	}
}

// TestArgsWindowBefore1970: @until - @window with a window reaching before
// 1970 wrapped modulo 2^32 on ClickHouse 18.16 (window=1800000000, "the
// last ~57 years", answered 0 rows); it is refused, naming the parameter.
func TestArgsWindowBefore1970(t *testing.T) {
	qs, err := analytics.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		query   string
		params  analytics.Params
		wantErr string
	}{
		{"link_down_window", analytics.Params{}, ""},
		{"link_down_window", analytics.Params{"window": "1796601600"}, ""}, // back to 1970-01-01 exactly
		{"link_down_window", analytics.Params{"window": "1796601601"}, "param window (UInt64): 1796601601 seconds before until"},
		{"link_down_window", analytics.Params{"window": "1800000000"}, "param window (UInt64)"},
		{"link_down_window", analytics.Params{"window": "5000000000"}, "param window (UInt64)"},
		{"link_down_window", analytics.Params{"window": "600", "until": "1970-01-01"}, "param window (UInt64)"},
		{"xid_bursts", analytics.Params{"window": "1800000000"}, "param window (UInt64)"},
		{"xid_bursts", analytics.Params{"window": "86400"}, ""},
		{"conformance_groups", analytics.Params{"staleness": "1800000000"}, "param staleness (UInt64)"},
		{"conformance_groups", analytics.Params{"staleness": "46800"}, ""},
	}
	for _, tt := range tests {
		q, ok := qs[tt.query]
		if !ok {
			t.Fatalf("no query %s", tt.query)
		}
		_, err := q.Args(tt.params, now)
		if (err == nil) != (tt.wantErr == "") || (err != nil && !bytes.Contains([]byte(err.Error()), []byte(tt.wantErr))) {
			t.Errorf("%s Args(%v) = %v, want error containing %q", tt.query, tt.params, err, tt.wantErr)
		}
	}
}

// seedConformance writes NodeConformance reports through the conformance
// role's handler and conformance actions through the store, on 2025-10-08
// (after the other queries' week): alpha n1-n3 on fingerprint A, n4 on B
// (drifted), n5 stale (13h before until), n3 drifted then restored; beta m1 on A.
func seedConformance(t *testing.T, srv *chtest.Server) {
	t.Helper()
	day := time.Date(2025, 10, 8, 6, 0, 0, 0, time.UTC)
	a := map[string]string{"gpu_driver": "550.54.14", "nic_firmware": "28.39.1002"}
	b := map[string]string{"gpu_driver": "550.54.14", "nic_firmware": "28.41.1000"}
	var recs []*kgo.Record
	rep := func(cluster, node string, c map[string]string, at time.Time) {
		ev := agentconf.Event(c)
		ev.Id, ev.Cluster, ev.NodeName = cluster+"-"+node+at.Format("150405"), cluster, node
		ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(at), timestamppb.New(at)
		v, _ := events.Marshal(ev)
		recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: v})
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		rep("alpha", n, a, day)
	}
	rep("alpha", "n4", b, day)
	rep("alpha", "n5", b, day.Add(-31*time.Hour))
	rep("beta", "m1", a, day)
	h := conformance.NewHandler(srv.Conn, slog.Default(), nil)
	if res, err := h.Handle(context.Background(), recs); err != nil || len(res.Dead) > 0 {
		t.Fatalf("seed conformance: %v %v", err, res.Dead)
	}
	var acts []*kgo.Record
	for i, x := range []struct {
		node, kind string
		at         time.Time
	}{{"n4", events.KindConformanceDrift, day.Add(time.Minute)}, {"n3", events.KindConformanceDrift, day.Add(time.Minute)},
		{"n3", events.KindConformanceRestored, day.Add(5 * time.Minute)}} {
		v, _ := events.MarshalAction(&faultlinev1.Action{Id: fmt.Sprintf("conf-%d", i), Cluster: "alpha", Node: x.node, Role: events.RoleConformance,
			Kind: x.kind, Outcome: events.OutcomeApplied, Timestamp: timestamppb.New(x.at)})
		acts = append(acts, &kgo.Record{Topic: events.TopicActions, Key: events.Key("alpha", x.node), Value: v, Timestamp: x.at})
	}
	if res, err := store.New(srv.Conn, slog.Default(), nil).Handle(context.Background(), acts); err != nil || len(res.Dead) > 0 {
		t.Fatalf("seed conformance actions: %v %v", err, res.Dead)
	}
}

// TestRunMaxStopsTheQuery: RunMax reads its bound of rows and stops the
// query (here an endless one), and the connection pool serves the next.
func TestRunMaxStopsTheQuery(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	res, err := analytics.RunMax(ctx, srv.Conn, analytics.Query{Name: "endless", SQL: "SELECT number FROM system.numbers"}, nil, start, 10)
	if err != nil || len(res.Rows) != 10 || !res.Truncated {
		t.Fatalf("RunMax: %v, %d rows, truncated %v", err, len(res.Rows), res != nil && res.Truncated)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("RunMax took %s to stop an endless query", d)
	}
	res, err = analytics.RunMax(ctx, srv.Conn, analytics.Query{Name: "three", SQL: "SELECT number FROM system.numbers LIMIT 3"}, nil, start, 3)
	if err != nil || len(res.Rows) != 3 || res.Truncated {
		t.Fatalf("then a query of 3 rows, bound 3: %v, %+v", err, res)
	}
}
