package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/internal/testenv"
)

// countNodes answers a score with the number of nodes it was asked for.
type countNodes struct{}

func (countNodes) Score(_ context.Context, _ string, nodes []string) (conformance.Score, error) {
	return conformance.Score{F9: 1, Requested: len(nodes)}, nil
}

// TestConformanceScoreLongList: MaxScoreNodes is 10,000, but a GET's
// node list must fit the 64 KiB request line: more than ~1,700 realistic
// names got a bare 431. The list is now also taken as a POST body
// (nodes=a,b,…); the GET is unchanged.
func TestConformanceScoreLongList(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	k := testenv.StartKafka(t)
	const token = "score-test-token-alpha-0001"
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte(token+",alpha,operator\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c.TokensFile = path
		c.ReadRatePerCaller = 0
	}, gateway.Options{Conformance: countNodes{}})
	url := "http://" + gw.HTTPAddr() + "/v1/conformance/score"

	names := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "gpu-node-%05d.rack-12.dc-west.example", i) // 37 characters
		}
		return b.String()
	}
	do := func(method, query, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url+query, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	requested := func(body string) int {
		var s conformance.Score
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return s.Requested
	}

	if code, body := do(http.MethodGet, "?nodes="+names(100), ""); code != 200 || requested(body) != 100 {
		t.Errorf("GET of 100 nodes: %d %s", code, body)
	}
	if code, _ := do(http.MethodGet, "?nodes="+names(gateway.MaxScoreNodes), ""); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("GET of %d nodes: %d, want 431 (the request line's bound)", gateway.MaxScoreNodes, code)
	}
	if code, body := do(http.MethodPost, "", "nodes="+names(gateway.MaxScoreNodes)); code != 200 || requested(body) != gateway.MaxScoreNodes {
		t.Errorf("POST of %d nodes: %d %.200s", gateway.MaxScoreNodes, code, body)
	}
	for _, tt := range []struct{ query, body, want string }{
		{"", "nodes=" + names(gateway.MaxScoreNodes+1), "nodes: more than 10000"},
		{"?nodes=a", "nodes=b", "not in the URL"},
		{"", "nodes=a&x=1", "x: unknown parameter"},
		{"", "nodes=" + strings.Repeat("a", 3<<20), "request body"},
	} {
		if code, body := do(http.MethodPost, tt.query, tt.body); code != 400 || !strings.Contains(body, tt.want) {
			t.Errorf("POST %q %.40q: %d %.200s, want 400 %q", tt.query, tt.body, code, body, tt.want)
		}
	}
}
