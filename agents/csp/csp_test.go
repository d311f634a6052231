package csp

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// metadata is a local stand-in for GCP's metadata server: the two keys
// the check reads, and the Metadata-Flavor header the real one requires.
type metadata struct {
	mu       sync.Mutex
	event    string // maintenance-event
	upcoming string // upcoming-maintenance JSON; "" → 404
}

func (m *metadata) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch r.URL.Path {
	case "/computeMetadata/v1/instance/maintenance-event":
		_, _ = w.Write([]byte(m.event))
	case "/computeMetadata/v1/instance/upcoming-maintenance":
		if m.upcoming == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(m.upcoming))
	default:
		http.NotFound(w, r)
	}
}

func (m *metadata) set(event, upcoming string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.event, m.upcoming = event, upcoming
}

func TestGCP(t *testing.T) {
	md := &metadata{event: "NONE"}
	srv := httptest.NewServer(md)
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.MetadataURL = srv.URL + "/computeMetadata/v1/instance"
	cfg.StateFile = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := New(cfg, slog.New(slog.DiscardHandler))
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	g.now = func() time.Time { return now }
	ctx := context.Background()
	step := func(want int) (kind, start, end string, healthy bool) {
		t.Helper()
		evs, err := g.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != want {
			t.Fatalf("%d events, want %d: %v", len(evs), want, evs)
		}
		if want == 0 {
			return
		}
		e := evs[0]
		if e.GetIsFatal() || e.GetAgent() != Agent || e.GetComponentClass() != Class || e.GetCheckName() != Check || e.GetRecommendedAction().String() != "NONE" {
			t.Fatalf("event %v", e)
		}
		m := e.GetMetadata()
		return m["maintenance_kind"], m["maintenance_start"], m["maintenance_end"], e.GetIsHealthy()
	}
	step(0) // nothing scheduled
	// Scheduled ahead: the window from upcoming-maintenance.
	md.set("NONE", `{"can_reschedule":true,"type":"SCHEDULED","maintenance_status":"PENDING","window_start_time":"2026-11-24T02:00:00Z","window_end_time":"2026-11-24T06:00:00Z"}`)
	if k, s, e, h := step(1); k != "SCHEDULED_MAINTENANCE" || s != "2026-11-24T02:00:00Z" || e != "2026-11-24T06:00:00Z" || h {
		t.Fatalf("scheduled: %s %s %s %v", k, s, e, h)
	}
	step(0) // standing: not again
	// Imminent: maintenance-event says what happens; the window stays.
	md.set("MIGRATE_ON_HOST_MAINTENANCE", `{"type":"SCHEDULED","maintenance_status":"ONGOING","window_start_time":"2026-11-24T02:00:00Z","window_end_time":"2026-11-24T06:00:00Z"}`)
	if k, _, e, h := step(1); k != "MIGRATE_ON_HOST_MAINTENANCE" || e != "2026-11-24T06:00:00Z" || h {
		t.Fatalf("imminent: %s %s %v", k, e, h)
	}
	now = now.Add(time.Minute)
	step(0)
	// Over: recovery.
	md.set("NONE", "")
	if k, _, _, h := step(1); k != "MIGRATE_ON_HOST_MAINTENANCE" || !h {
		t.Fatalf("recovery: %s %v", k, h)
	}
	step(0)
	// A maintenance-event without a window, first seen time kept.
	md.set("TERMINATE_ON_HOST_MAINTENANCE", "")
	if k, s, _, h := step(1); k != "TERMINATE_ON_HOST_MAINTENANCE" || s != now.Format(time.RFC3339) || h {
		t.Fatalf("terminate: %s %s %v", k, s, h)
	}
	now = now.Add(time.Minute)
	step(0)
	// A window that has passed while it stands: recovered.
	md.set("NONE", `{"type":"SCHEDULED","window_start_time":"2026-11-23T10:00:00Z","window_end_time":"2026-11-23T11:00:00Z"}`)
	if _, _, _, h := step(1); !h {
		t.Fatal("want the recovery of the terminate event")
	}
	step(0)
	// A window time that does not parse: reported, the window said unknown.
	md.set("NONE", `{"type":"SCHEDULED","window_start_time":"tomorrow 02:00","window_end_time":"2026-11-24T06:00:00Z"}`)
	evs, err := g.Check(ctx)
	if err != nil || len(evs) != 1 {
		t.Fatalf("unreadable start: %v %v", evs, err)
	}
	if msg, md := evs[0].GetMessage(), evs[0].GetMetadata(); msg != `GCP host maintenance SCHEDULED_MAINTENANCE, window now to 2026-11-24T06:00:00Z (unreadable: window_start_time "tomorrow 02:00")` ||
		md["window_unreadable"] != `window_start_time "tomorrow 02:00"` || md["maintenance_start"] != "" {
		t.Fatalf("unreadable start: %q %v", msg, md)
	}
	step(0)
	// The metadata server gone: an error, not an event.
	srv.Close()
	if _, err := g.Check(ctx); err == nil {
		t.Fatal("no error with the metadata server gone")
	}
}

// TestGCPStateAcrossRestarts: the maintenance reported as standing is kept
// in the state file once its event is spooled (Commit), so that an agent
// restarted while it stands does not report it again, and one that starts
// after it (the VM stopped for a TERMINATE_ON_HOST_MAINTENANCE) reports
// its end. Before, the agent kept it in memory: after the VM's restart the
// maintenance's unhealthy event stood for good. An event not committed (a
// crash before it was spooled) is reported again; a damaged file is
// warned of and the check starts afresh.
func TestGCPStateAcrossRestarts(t *testing.T) {
	md := &metadata{event: "TERMINATE_ON_HOST_MAINTENANCE"}
	srv := httptest.NewServer(md)
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.MetadataURL = srv.URL + "/computeMetadata/v1/instance"
	cfg.StateFile = filepath.Join(t.TempDir(), "csp", "state.json")
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	start := func() *GCP { // the agent (re)started
		g := New(cfg, slog.New(slog.DiscardHandler))
		g.now = func() time.Time { return now }
		return g
	}
	check := func(g *GCP, commit bool) []string {
		t.Helper()
		evs, err := g.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := g.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for _, e := range evs {
			got = append(got, fmt.Sprintf("%s healthy=%t", e.GetMetadata()["maintenance_kind"], e.GetIsHealthy()))
		}
		return got
	}
	want := func(got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("reported %q, want %q", got, want)
		}
	}
	want(check(start(), true), "TERMINATE_ON_HOST_MAINTENANCE healthy=false")
	now = now.Add(time.Minute)
	want(check(start(), true)) // restarted while it stands: not again
	md.set("NONE", "")         // the VM stopped, and started after it
	want(check(start(), true), "TERMINATE_ON_HOST_MAINTENANCE healthy=true")
	want(check(start(), true))
	// Not committed (killed before its event was spooled): again.
	md.set("NONE", `{"type":"SCHEDULED","window_start_time":"2026-11-24T02:00:00Z","window_end_time":"2026-11-24T06:00:00Z"}`)
	want(check(start(), false), "SCHEDULED_MAINTENANCE healthy=false")
	want(check(start(), true), "SCHEDULED_MAINTENANCE healthy=false")
	want(check(start(), true))
	if err := os.WriteFile(cfg.StateFile, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	want(check(start(), true), "SCHEDULED_MAINTENANCE healthy=false")
}
