package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/internal/fleet"
)

// fakeFleet answers every fleet read with an empty page.
type fakeFleet struct{}

// Summary refuses a page's state and pageToken as fleet.Service does (a
// state not listed, a token other than "x", this fake's only one).
func (fakeFleet) Summary(_ context.Context, _ string, _ fleet.Range, page *fleet.NodesQuery) (*fleet.Summary, error) {
	if page != nil {
		if page.State != "" && (page.State == fleet.StateHealthy || !slices.Contains(fleet.States, page.State)) {
			return nil, badParam("state: not a listed state")
		}
		if page.PageToken != "" && page.PageToken != "x" {
			return nil, badParam("pageToken: not a token this server issued")
		}
		return &fleet.Summary{Page: &fleet.NodesPage{}}, nil
	}
	return &fleet.Summary{}, nil
}

func (fakeFleet) Nodes(context.Context, string, fleet.NodesQuery) (*fleet.NodesPage, error) {
	return &fleet.NodesPage{}, nil
}

func (fakeFleet) Node(context.Context, string, string) (*fleet.NodeDetail, error) {
	return &fleet.NodeDetail{}, nil
}

func (fakeFleet) Analytics(context.Context, string, string, map[string]string) (*fleet.Table, error) {
	return &fleet.Table{}, nil
}

// newReadTestServer is a gateway's REST handler over a fake history and
// fleet (no Kafka, no ClickHouse).
func newReadTestServer(t *testing.T) (http.Handler, *fakeHistory) {
	t.Helper()
	tokens, err := ParseTokens(strings.NewReader("test-token-of-alpha-0001,alpha,operator\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := &fakeHistory{}
	s := &Server{
		cfg: cfg, log: log, auth: &Authenticator{Tokens: tokens}, metrics: m, reg: reg,
		flight: newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes),
		codec:  Codec{limits: shapeLimits{maxEvents: cfg.MaxBatch}},
		fleet:  fakeFleet{},
		svc: &service{
			validator: Validator{MaxBatch: cfg.MaxBatch, MaxFutureSkew: cfg.MaxFutureSkew},
			producer:  &fakeProducer{}, history: h,
			metrics: m, now: func() time.Time { return testNow }, log: log,
		},
	}
	hh, err := s.httpHandler(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return hh, h
}

// TestReadsRefuseUnknownParameters: a read refuses a parameter it does not
// take (400 naming it) and one given twice, rather than ignoring it: a
// misspelt filter (nodeName= for node=, fatal_only=, State=) used to
// answer 200 with the unfiltered answer — the whole cluster's history,
// every node out of service — as if the filter had been applied.
func TestReadsRefuseUnknownParameters(t *testing.T) {
	h, hist := newReadTestServer(t)
	get := func(path string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer test-token-of-alpha-0001")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var body struct{ Message string }
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		return rec.Code, body.Message
	}
	for path, name := range map[string]string{
		"/v1/events?nodeName=gpu-node-1":                                          "nodeName",
		"/v1/events?node=gpu-node-1&fatal_only=true":                              "fatal_only",
		"/v1/events?cluster=beta":                                                 "cluster",
		"/v1/actions?node=gpu-node-1&check=XID":                                   "check",
		"/v1/actions?until=2026-03-02T10:00:00Z":                                  "until",
		"/v1/fleet/nodes?State=held":                                              "State",
		"/v1/fleet/nodes?state=held&state=draining":                               "state",
		"/v1/fleet/summary?node=gpu-node-1":                                       "node",
		"/v1/fleet/summary?since=2026-03-02T10:00:00Z&since=2026-03-01T10:00:00Z": "since",
		"/v1/fleet/nodes/gpu-node-1?since=2026-03-02T10:00:00Z":                   "since",
		"/v1/fleet/analytics?q=xid_bursts":                                        "q",
		// Checked without limit too: they answered 200, unfiltered.
		"/v1/fleet/summary?state=bogus":       "state",
		"/v1/fleet/summary?pageToken=garbage": "pageToken",
	} {
		code, msg := get(path)
		if code != http.StatusBadRequest || !strings.HasPrefix(msg, name+":") {
			t.Errorf("GET %s: %d %q, want 400 naming %s", path, code, msg, name)
		}
	}
	for _, path := range []string{
		"/v1/events?node=gpu-node-1&check=XID&entity=GPU-0&since=2026-03-02T10:00:00Z&until=2026-03-03T10:00:00Z&fatalOnly=true&limit=10&pageToken=x",
		"/v1/actions?node=gpu-node-1&since=2026-03-02T10:00:00Z&limit=10",
		"/v1/fleet/summary?since=2026-03-02T10:00:00Z&until=2026-03-03T10:00:00Z&limit=50&state=held&pageToken=x",
		"/v1/fleet/nodes?state=held&limit=10&pageToken=x",
		"/v1/fleet/nodes/gpu-node-1",
		"/v1/fleet/analytics",
	} {
		if code, msg := get(path); code != http.StatusOK {
			t.Errorf("GET %s: %d %q, want 200", path, code, msg)
		}
	}
	// state alone filters the summary's page (of the default limit).
	req := httptest.NewRequest(http.MethodGet, "/v1/fleet/summary?state=held", nil)
	req.Header.Set("Authorization", "Bearer test-token-of-alpha-0001")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"page"`) {
		t.Errorf("GET /v1/fleet/summary?state=held: %d %s, want 200 with the page", rec.Code, rec.Body)
	}
	if hist.lastReq.GetNode() != "gpu-node-1" || !hist.lastReq.GetFatalOnly() || hist.lastReq.GetLimit() != 10 {
		t.Errorf("the parameters a read takes still reach it: %v", hist.lastReq)
	}
}

// TestReadsAreNotCached: every read's answer, the history's as the fleet
// page's, is marked no-store (the page fetches GET /v1/events and
// /v1/actions with the token; their answers had no Cache-Control, so a
// browser could keep a cluster's history in its disk cache after the tab,
// and the token, are gone) and nosniff.
func TestReadsAreNotCached(t *testing.T) {
	h, _ := newReadTestServer(t)
	for _, path := range []string{
		"/v1/events?node=gpu-node-1", "/v1/actions", "/v1/events?limit=x",
		"/v1/fleet/nodes", "/v1/fleet/nodes?state=bogus",
	} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer test-token-of-alpha-0001")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if cc, ns := rec.Header().Get("Cache-Control"), rec.Header().Get("X-Content-Type-Options"); cc != "no-store" || ns != "nosniff" {
			t.Errorf("GET %s: %d, Cache-Control %q, X-Content-Type-Options %q: want no-store, nosniff", path, rec.Code, cc, ns)
		}
	}
}
