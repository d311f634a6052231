package csp

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzCheck: whatever the metadata server answers, the check does not
// panic; it returns an error or events the gateway takes once stamped as
// the agent stamps them; the same answer read again a minute later
// reports nothing new, nor after a restart from the state file; and once
// the server says NONE, a reported maintenance is recovered.
func FuzzCheck(f *testing.F) {
	f.Add("NONE", `{"can_reschedule":true,"type":"SCHEDULED","maintenance_status":"PENDING","window_start_time":"2026-11-24T02:00:00Z","window_end_time":"2026-11-24T06:00:00Z"}`)
	f.Add("MIGRATE_ON_HOST_MAINTENANCE", `{"type":"SCHEDULED","maintenance_status":"ONGOING","window_start_time":"2026-11-24T02:00:00Z"}`)
	f.Add("TERMINATE_ON_HOST_MAINTENANCE", "")
	f.Add("NONE", `{"type":"SCHEDULED","window_start_time":"2026-11-23T10:00:00Z","window_end_time":"2026-11-23T11:00:00Z"}`)
	f.Add("\x1b[31mMIGRATE\x00", `{"type":"\u0000","window_start_time":"yesterday","window_end_time":"9999-12-31T23:59:59+14:00"}`)
	f.Add("NONE", `{"window_end_time":1}`)
	md := &metadata{}
	srv := httptest.NewServer(md)
	f.Cleanup(srv.Close)
	cfg := DefaultConfig()
	cfg.MetadataURL = srv.URL + "/computeMetadata/v1/instance"
	f.Fuzz(func(t *testing.T, event, upcoming string) {
		cfg := cfg
		cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
		g := New(cfg, slog.New(slog.DiscardHandler))
		defer func() { g.client.CloseIdleConnections() }() // a transport per input: free its sockets
		now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
		g.now = func() time.Time { return now }
		poll := func(step string) int {
			t.Helper()
			evs, err := g.Check(context.Background())
			if err != nil {
				if err.Error() == "" {
					t.Fatalf("%s: an error with no message", step)
				}
				return -1
			}
			fuzzseed.Stamped(t, step, evs, now)
			return len(evs)
		}
		md.set(event, upcoming)
		first := poll("first read")
		now = now.Add(time.Minute)
		if n := poll("same answer again"); n > 0 {
			t.Fatalf("the same answer read again reported %d new events", n)
		}
		// Kept across a restart: nothing new either.
		if err := g.Commit(); err != nil {
			t.Fatal(err)
		}
		g.client.CloseIdleConnections()
		g = New(cfg, slog.New(slog.DiscardHandler))
		g.now = func() time.Time { return now }
		if n := poll("same answer after a restart"); n > 0 {
			t.Fatalf("the same answer read after a restart reported %d new events", n)
		}
		md.set("NONE", "")
		if n := poll("NONE"); first > 0 && n != 1 {
			t.Fatalf("a reported maintenance gone: %d events, want its recovery", n)
		}
	})
}
