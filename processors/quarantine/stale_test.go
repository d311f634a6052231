package quarantine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestStaleEvents: an unhealthy event the gateway received longer ago
// than quarantine.max_event_age (a consumer group without committed
// offsets replaying the topic, a long-delayed record) is recorded as a
// skipped quarantine and not acted on; the age is the received time's,
// not the generated time's (a spooled fault sent a day late acts), a
// correlator verdict carries its trigger's received time, and 0 is no
// limit. Decided here for a cluster not configured (dry-run): what would
// act is quarantine/dry_run.
func TestStaleEvents(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(ev *datamodels.HealthEvent, generated, received time.Duration) *datamodels.HealthEvent {
		ev.GeneratedTimestamp = timestamppb.New(now.Add(-generated))
		ev.ReceivedTimestamp = timestamppb.New(now.Add(-received))
		return ev
	}
	verdict := func() *datamodels.HealthEvent {
		ev := fatal("n1", "RepeatedXIDOnSameGPU", "GPU-1")
		ev.DerivedBy = "RepeatedXIDOnSameGPU"
		return ev
	}
	storeOnly := func() *datamodels.HealthEvent {
		ev := fatal("n1", "XID_ERROR_48", "GPU-1")
		ev.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
		return ev
	}
	noReceived := fatal("n1", "XID_ERROR_48", "GPU-1")
	noReceived.GeneratedTimestamp = timestamppb.New(now.Add(-72 * time.Hour))
	for _, tc := range []struct {
		name   string
		maxAge time.Duration
		ev     *datamodels.HealthEvent
		want   string // kind/outcome of the decision
		stale  bool
	}{
		{"fresh fault", 6 * time.Hour, at(fatal("n1", "XID_ERROR_48", "GPU-1"), time.Minute, time.Minute), "quarantine/dry_run", false},
		{"fault received 3 days ago (a replay)", 6 * time.Hour, at(fatal("n1", "XID_ERROR_48", "GPU-1"), 72*time.Hour, 72*time.Hour), "quarantine/skipped", true},
		{"fault received just past the age", 6 * time.Hour, at(fatal("n1", "XID_ERROR_48", "GPU-1"), 6*time.Hour+time.Second, 6*time.Hour+time.Second), "quarantine/skipped", true},
		{"fault received exactly at the age", 6 * time.Hour, at(fatal("n1", "XID_ERROR_48", "GPU-1"), 6*time.Hour, 6*time.Hour), "quarantine/dry_run", false},
		{"spooled fault generated a day ago, received now", 6 * time.Hour, at(fatal("n1", "XID_ERROR_48", "GPU-1"), 24*time.Hour, time.Second), "quarantine/dry_run", false},
		{"the correlator's verdict on replayed faults", 6 * time.Hour, at(verdict(), 72*time.Hour, 72*time.Hour), "quarantine/skipped", true},
		{"the correlator's verdict on fresh faults", 6 * time.Hour, at(verdict(), time.Minute, time.Minute), "quarantine/dry_run", false},
		{"no received time (an older record)", 6 * time.Hour, noReceived, "quarantine/dry_run", false},
		{"no limit", 0, at(fatal("n1", "XID_ERROR_48", "GPU-1"), 72*time.Hour, 72*time.Hour), "quarantine/dry_run", false},
		{"STORE_ONLY says so, whatever its age", 6 * time.Hour, at(storeOnly(), 72*time.Hour, 72*time.Hour), "skip/skipped", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxEventAge = tc.maxAge
			var logs bytes.Buffer
			h, err := New(cfg, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{
				Log: slog.New(slog.NewTextHandler(&logs, nil)), Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			acts, _ := handle(t, h, record("c1", tc.ev))
			if got := kinds(acts); got != tc.want {
				t.Fatalf("actions %s, want %s (reasons %v)", got, tc.want, reasons(acts))
			}
			isStale := strings.Contains(acts[0].GetReason(), "older than quarantine.max_event_age")
			if isStale != tc.stale {
				t.Errorf("reason %q: stale %v, want %v", acts[0].GetReason(), isStale, tc.stale)
			}
			want := 0.0
			if tc.stale {
				want = 1
			}
			var m dto.Metric
			_ = h.m.stale.WithLabelValues("c1").Write(&m)
			if got := m.GetCounter().GetValue(); got != want {
				t.Errorf("faultline_quarantine_stale_events_total %v, want %v", got, want)
			}
			if got := strings.Count(logs.String(), "stale events not acted on"); got != int(want) {
				t.Errorf("%d stale warnings logged, want %v:\n%s", got, want, logs.String())
			}
		})
	}
}

// TestStaleEventsLoggedOncePerBatch: a replayed batch says once how many
// events it did not act on and how old the oldest was; a recovery is
// decided whatever its age.
func TestStaleEventsLoggedOncePerBatch(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{
		Log: slog.New(slog.NewTextHandler(&logs, nil)), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i, age := range []time.Duration{72 * time.Hour, 50 * time.Hour, 7 * time.Hour} {
		ev := fatal("n"+string(rune('1'+i)), "XID_ERROR_48", "GPU-1")
		ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(now.Add(-age)), timestamppb.New(now.Add(-age))
		recs = append(recs, record("c1", ev))
	}
	rec := healthy("n1", "XID_ERROR_48", "GPU-1")
	rec.ReceivedTimestamp = timestamppb.New(now.Add(-71 * time.Hour))
	recs = append(recs, record("c1", rec))
	acts, _ := handle(t, h, recs...)
	if got := kinds(acts); got != "quarantine/skipped,quarantine/skipped,quarantine/skipped" {
		t.Fatalf("actions %s, want three stale skips", got)
	}
	out := logs.String()
	if strings.Count(out, "stale events not acted on") != 1 || !strings.Contains(out, "records=3") || !strings.Contains(out, "oldest_age=72h0m0s") {
		t.Errorf("want one warning with records=3 oldest_age=72h0m0s, got:\n%s", out)
	}
}

func reasons(acts []*faultlinev1.Action) []string {
	var out []string
	for _, a := range acts {
		out = append(out, a.GetReason())
	}
	return out
}

// TestStaleRetryRedoSaysWhatWasApplied: a retry batch that failed for
// another cluster after applying a fault is redone; if the fault has grown
// stale meanwhile, the redo still says what was applied (the drain starts
// from it), not a stale skip of a node it cordoned.
func TestStaleRetryRedoSaysWhatWasApplied(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ev := fatal("n1", "XID_ERROR_48", "GPU-1")
	ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(now.Add(-7*time.Hour)), timestamppb.New(now.Add(-7*time.Hour))
	rec := retryRecord("c1", record("c1", ev))
	rec.Partition, rec.Offset = 0, 7
	applied := h.newAction(item{rec: rec, ev: ev, cluster: "c1", node: "n1"}, "quarantine", "applied", "rule r matched XID_ERROR_48", "r", nil)
	h.keepRetried([]seqResult{{applied: map[string][]*faultlinev1.Action{recordKey(rec): {applied}}}})
	res, err := h.HandleRetry(context.Background(), []*kgo.Record{rec})
	if err != nil {
		t.Fatal(err)
	}
	acts, _ := splitOut(t, res.Out)
	if kinds(acts) != "quarantine/applied" {
		t.Fatalf("redo: %s %v, want the kept quarantine/applied", kinds(acts), reasons(acts))
	}
}

// TestStaleJudgedOnceWhenFirstRead: a record is judged stale when the
// events consumer first reads it. One deferred for its cluster (here: a
// kubeconfig that cannot be loaded) is decided stale there if it is, not
// deferred, so the retry consumer — which does not judge age — never acts
// on it; and what the retry consumer reads acts whatever its age: it was
// fresh when deferred and held for its cluster since.
func TestStaleJudgedOnceWhenFirstRead(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	aged := func(node string, age time.Duration) *datamodels.HealthEvent {
		ev := fatal(node, "XID_ERROR_48", "GPU-1")
		ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(now.Add(-age)), timestamppb.New(now.Add(-age))
		return ev
	}
	kcfg := clusters.DefaultConfig()
	kcfg.Clusters = []clusters.Cluster{{Name: "c1", Kubeconfig: "/nonexistent/kubeconfig"}}
	h, err := New(DefaultConfig(), clusters.NewRegistry(kcfg, nil), Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	acts, retried := handle(t, h, record("c1", aged("n1", 72*time.Hour)), record("c1", aged("n1", time.Minute)))
	if kinds(acts) != "quarantine/skipped" || len(retried) != 1 {
		t.Fatalf("events consumer: actions %s %v, %d deferred; want the stale one skipped, the fresh one deferred", kinds(acts), reasons(acts), len(retried))
	}

	h, err = New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.HandleRetry(context.Background(), []*kgo.Record{retryRecord("c1", record("c1", aged("n1", 7*time.Hour)))})
	if err != nil {
		t.Fatal(err)
	}
	if acts, _ := splitOut(t, res.Out); kinds(acts) != "quarantine/dry_run" {
		t.Fatalf("retry consumer: %s %v, want the held fault decided (dry-run: cluster not configured)", kinds(acts), reasons(acts))
	}
}
