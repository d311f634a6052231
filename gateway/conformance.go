package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/faultline/faultline/internal/conformance"
)

// Conformance serves GET /v1/conformance/score, scoped to the caller's
// cluster.
type Conformance interface {
	Score(ctx context.Context, cluster string, nodes []string) (conformance.Score, error)
}

// MaxScoreNodes bounds the nodes of one score request.
const MaxScoreNodes = 10000

var scoreNodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// conformanceScore is GET /v1/conformance/score?nodes=a,b,…: f₉ (the
// largest conformance group ÷ the nodes requested) and the groups
// (fingerprint, nodes) of the caller's cluster's nodes; a node without a
// fresh report is a group of one, fingerprint "unknown". Admitted like a
// history read (per-caller read rate, bound on reads in progress, the
// history timeout); a credential bound to one node is refused (it reads
// its own node only).
func (s *Server) conformanceScore() http.HandlerFunc {
	return s.clusterRead("conformance score", func() bool { return s.conformance != nil }, false, func(ctx context.Context, c Caller, r *http.Request) (any, error) {
		nodes, err := scoreNodes(r.URL.Query())
		if err != nil {
			return nil, err
		}
		return s.conformance.Score(ctx, c.Cluster, nodes)
	})
}

// scoreNodes reads the score request's one parameter, nodes=a,b,….
func scoreNodes(q url.Values) ([]string, error) {
	for k := range q {
		if k != "nodes" {
			return nil, badParam(fmt.Sprintf("%s: unknown parameter (only nodes)", truncate(k)))
		}
	}
	raw := strings.Join(q["nodes"], ",")
	if strings.TrimSpace(raw) == "" {
		return nil, badParam("nodes: required, comma-separated node names")
	}
	var nodes []string
	for i, n := range strings.Split(raw, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, badParam(fmt.Sprintf("nodes[%d]: empty", i))
		case len(n) > 253 || !scoreNodeName.MatchString(n):
			return nil, badParam(fmt.Sprintf("nodes[%d]: %q is not a Kubernetes node name", i, truncate(n)))
		}
		if nodes = append(nodes, n); len(nodes) > MaxScoreNodes {
			return nil, badParam(fmt.Sprintf("nodes: more than %d", MaxScoreNodes))
		}
	}
	return nodes, nil
}
