package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"

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
func (s *Server) conformanceScore(w http.ResponseWriter, r *http.Request) {
	var chains [][]*x509.Certificate
	if r.TLS != nil {
		chains = r.TLS.VerifiedChains
	}
	caller, err := s.auth.Authenticate(r.Header.Get("Authorization"), chains)
	if err != nil {
		s.metrics.rejected("unauthenticated", 1)
		writeStatus(w, http.StatusUnauthorized, codes.Unauthenticated, err.Error())
		return
	}
	if s.conformance == nil {
		writeStatus(w, http.StatusNotImplemented, codes.Unimplemented, "conformance is not configured on this gateway (no ClickHouse)")
		return
	}
	if caller.Node != "" {
		writeStatus(w, http.StatusForbidden, codes.PermissionDenied, fmt.Sprintf("credential %s is bound to node %q and may not read other nodes' conformance", caller.Name, caller.Node))
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "nodes" {
			writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, fmt.Sprintf("%s: unknown parameter (only nodes)", truncate(k)))
			return
		}
	}
	raw := strings.Join(q["nodes"], ",")
	if strings.TrimSpace(raw) == "" {
		writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, "nodes: required, comma-separated node names")
		return
	}
	var nodes []string
	for i, n := range strings.Split(raw, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, fmt.Sprintf("nodes[%d]: empty", i))
			return
		case len(n) > 253 || !scoreNodeName.MatchString(n):
			writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, fmt.Sprintf("nodes[%d]: %q is not a Kubernetes node name", i, truncate(n)))
			return
		}
		nodes = append(nodes, n)
		if len(nodes) > MaxScoreNodes {
			writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, fmt.Sprintf("nodes: more than %d", MaxScoreNodes))
			return
		}
	}
	if !s.svc.readLimiter.allow(caller.Name, 1, s.svc.now()) {
		s.metrics.rejected("read_rate_limited", 1)
		writeStatus(w, http.StatusTooManyRequests, codes.ResourceExhausted, fmt.Sprintf("caller %s is over its history read rate; retry later", caller.Name))
		return
	}
	if s.svc.reads != nil {
		if !s.svc.reads.TryAcquire(1) {
			s.metrics.rejected("reads_busy", 1)
			writeStatus(w, http.StatusTooManyRequests, codes.ResourceExhausted, "too many history reads in progress; retry later")
			return
		}
		defer s.svc.reads.Release(1)
	}
	ctx, cancel := s.svc.readContext(r.Context())
	defer cancel()
	score, err := s.conformance.Score(ctx, caller.Cluster, nodes)
	if err != nil {
		if ctx.Err() != nil {
			writeStatus(w, http.StatusGatewayTimeout, codes.DeadlineExceeded, "conformance score: timed out")
			return
		}
		s.log.Warn("conformance score failed", "err", err)
		writeStatus(w, http.StatusServiceUnavailable, codes.Unavailable, "conformance score: history unavailable; retry later")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(score)
}
