package gateway_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/fleet"
	"github.com/faultline/faultline/internal/fleet/fleettest"
	"github.com/faultline/faultline/internal/testenv"
)

// TestFleetAPI serves the fleet page's reads from a real ClickHouse
// holding fleettest's seed, through a real gateway (real Kafka): each
// cluster's credential sees its own cluster only, a node-bound credential
// its own node only, and bad parameters are named.
func TestFleetAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and ClickHouse")
	}
	k := testenv.StartKafka(t)
	ch := chtest.Start(t)
	fleettest.Seed(t, ch.Conn)
	st, err := fleet.New(ch.Conn, slog.Default(), fleet.Options{Now: func() time.Time { return fleettest.Base.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	const (
		alpha    = "fleet-test-token-alpha-0001"
		beta     = "fleet-test-token-beta-00001"
		boundN01 = "fleet-test-token-bound-n01"
	)
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		path := filepath.Join(t.TempDir(), "tokens")
		lines := alpha + ",alpha,operator\n" + beta + ",beta,agent\n" + boundN01 + ",alpha,agent,n01\n"
		if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		c.TokensFile = path
		c.ReadRatePerCaller = 0
	}, gateway.Options{Fleet: st})
	base := "http://" + gw.HTTPAddr()

	get := func(t *testing.T, token, path string, want int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("GET %s: %d %s, want %d", path, resp.StatusCode, b, want)
		}
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
		return out
	}

	t.Run("Summary", func(t *testing.T) {
		s := get(t, alpha, "/v1/fleet/summary?since=2026-03-02T00:00:00Z&until=2026-03-03T00:00:00Z", 200)
		nodes := s["nodes"].(map[string]any)
		if s["cluster"] != "alpha" || nodes["quarantined"] != 2.0 || nodes["healthy"] != 6.0 || s["breaker"].(map[string]any)["state"] != "open" {
			t.Errorf("alpha summary: %v", s)
		}
		withPage := get(t, alpha, "/v1/fleet/summary?limit=2&state=quarantined", 200)
		page := withPage["page"].(map[string]any)
		if ns := page["nodes"].([]any); len(ns) != 2 || page["nextPageToken"] != nil {
			t.Errorf("alpha summary's page: %v", page)
		}
		b := get(t, beta, "/v1/fleet/summary", 200)
		if b["cluster"] != "beta" || b["dryRun"] != true {
			t.Errorf("beta summary: %v", b)
		}
	})
	t.Run("ScopedToTheCaller", func(t *testing.T) {
		p := get(t, beta, "/v1/fleet/nodes", 200)
		ns := p["nodes"].([]any)
		if len(ns) != 1 || ns[0].(map[string]any)["node"] != "b01" {
			t.Errorf("beta's nodes: %v", ns)
		}
		// alpha's n01 does not exist for beta.
		d := get(t, beta, "/v1/fleet/nodes/n01", 200)
		if d["state"] != "healthy" || len(d["faults"].([]any)) != 0 {
			t.Errorf("beta reads alpha's n01: %v", d)
		}
		a := get(t, alpha, "/v1/fleet/analytics/remediation_outcomes?since=2026-03-01T00:00:00Z", 200)
		for _, r := range a["rows"].([]any) {
			if r.([]any)[2] == "dry_run" {
				t.Errorf("alpha sees beta's dry-run action: %v", a["rows"])
			}
		}
		get(t, alpha, "/v1/fleet/analytics/remediation_outcomes?cluster=beta", 400)
	})
	t.Run("NodeBound", func(t *testing.T) {
		d := get(t, boundN01, "/v1/fleet/nodes/n01", 200)
		if d["state"] != "quarantined" {
			t.Errorf("n01: %v", d)
		}
		get(t, boundN01, "/v1/fleet/nodes/n02", 403)
		get(t, boundN01, "/v1/fleet/summary", 403)
		get(t, boundN01, "/v1/fleet/nodes", 403)
	})
	t.Run("Refusals", func(t *testing.T) {
		get(t, "", "/v1/fleet/summary", 401)
		get(t, "not-a-token-of-this-gateway", "/v1/fleet/nodes", 401)
		for path, msg := range map[string]string{
			"/v1/fleet/nodes?state=bogus":          "state:",
			"/v1/fleet/nodes?limit=x":              "limit:",
			"/v1/fleet/nodes?limit=5000":           "limit:",
			"/v1/fleet/nodes?pageToken=AAAA":       "pageToken:",
			"/v1/fleet/nodes?pageToken=bzEwMA":     "pageToken: an offset token of an earlier version",
			"/v1/fleet/nodes/Not_A_Node":           "node:",
			"/v1/fleet/summary?since=yesterday":    "since:",
			"/v1/fleet/analytics/nope":             "query:",
			"/v1/fleet/analytics/xid_bursts?gap=x": "gap",
		} {
			e := get(t, alpha, path, 400)
			if !strings.Contains(e["message"].(string), msg) {
				t.Errorf("%s: message %q does not name %q", path, e["message"], msg)
			}
		}
	})
	t.Run("Page", func(t *testing.T) {
		resp, err := http.Get(base + "/ui/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `<script src="app.js"`) ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("/ui/: %d %v %.200s", resp.StatusCode, resp.Header, b)
		}
		for _, f := range []string{"app.js", "style.css"} {
			resp, err := http.Get(base + "/ui/" + f)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("/ui/%s: %d", f, resp.StatusCode)
			}
		}
		// The routes are counted by pattern, never by raw path.
		resp, err = http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(m), `method="GET /v1/fleet/nodes/{node}"`) || strings.Contains(string(m), "/v1/fleet/nodes/n01") {
			t.Errorf("metrics do not count fleet reads by route pattern")
		}
	})
}
