package analytics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
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
	}
	for _, tt := range tests {
		_, err := q.Args(tt.params, time.Now())
		if (err == nil) != (tt.wantErr == "") || (err != nil && !bytes.Contains([]byte(err.Error()), []byte(tt.wantErr))) {
			t.Errorf("Args(%v) = %v, want error containing %q", tt.params, err, tt.wantErr)
		}
	}
}
