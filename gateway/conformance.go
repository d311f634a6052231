package gateway

import (
	"context"
	"fmt"
	"io"
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

// MaxScoreNodes bounds the nodes of one score request. A GET's list must
// also fit the request line (restMaxHeaderBytes, 64 KiB: about 1,700 names
// of 37 characters; past it a bare 431); a longer list is sent as a POST
// body.
const MaxScoreNodes = 10000

// maxScoreBody bounds a POST score request's body: MaxScoreNodes names of
// the longest (253 characters) and their commas, and "nodes=".
const maxScoreBody = MaxScoreNodes*254 + 64

var scoreNodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// conformanceScore is GET /v1/conformance/score?nodes=a,b,… (or POST with
// the body nodes=a,b,…, application/x-www-form-urlencoded, for a list
// longer than a request line holds): f₉ (the
// largest conformance group ÷ the nodes requested) and the groups
// (fingerprint, nodes) of the caller's cluster's nodes; a node without a
// fresh report is a group of one, fingerprint "unknown". A POST's body is
// read first, as the other doors' bodies (clusterRead); then the request
// is admitted like a history read (per-caller read rate, bound on reads
// in progress, the history timeout); a credential bound to one node is
// refused (it reads its own node only).
func (s *Server) conformanceScore() http.HandlerFunc {
	return s.clusterRead("conformance score", func() bool { return s.conformance != nil }, false, func(ctx context.Context, c Caller, r *http.Request) (any, error) {
		q := r.URL.Query()
		if r.Method == http.MethodPost {
			if r.URL.RawQuery != "" {
				return nil, badParam("a POST takes its nodes in the body (nodes=a,b,…), not in the URL")
			}
			b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxScoreBody))
			if err != nil {
				return nil, badParam(fmt.Sprintf("request body: %v (at most %d bytes)", err, maxScoreBody))
			}
			if q, err = url.ParseQuery(string(b)); err != nil {
				return nil, badParam("request body: not nodes=a,b,… (application/x-www-form-urlencoded): " + err.Error())
			}
		}
		nodes, err := scoreNodes(q)
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
