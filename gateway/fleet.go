package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"

	"github.com/faultline/faultline/gateway/ui"
	"github.com/faultline/faultline/internal/fleet"
)

// Fleet serves the fleet page's reads (GET /v1/fleet/...), always for
// the caller's cluster; internal/fleet's Store implements it.
type Fleet interface {
	Summary(ctx context.Context, cluster string, r fleet.Range, page *fleet.NodesQuery) (*fleet.Summary, error)
	Nodes(ctx context.Context, cluster string, q fleet.NodesQuery) (*fleet.NodesPage, error)
	Node(ctx context.Context, cluster, node string) (*fleet.NodeDetail, error)
	Analytics(ctx context.Context, cluster, name string, params map[string]string) (*fleet.Table, error)
}

// fleetRoutes adds the fleet page (/ui/, static, no credential needed to
// load it: it holds no data) and its JSON reads to mux. The reads take the
// same credentials as the REST API and answer for the caller's cluster
// only; they share the history reads' per-caller rate and concurrency
// bounds and deadline (gateway.read_rate_per_caller, max_concurrent_reads,
// history_timeout).
func (s *Server) fleetRoutes(mux *http.ServeMux) {
	static, err := fs.Sub(ui.Files, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(static))
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Scripts and styles from the page's own files only; no frames.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	// The summary; with limit, state or pageToken also that page of nodes
	// (limit by default DefaultLimit, as /v1/fleet/nodes): the fleet view's
	// first render in one request.
	mux.HandleFunc("GET /v1/fleet/summary", s.fleetRead(false, func(ctx context.Context, c Caller, r *http.Request) (any, error) {
		if err := onlyParams(r, "since", "until", "limit", "state", "pageToken"); err != nil {
			return nil, err
		}
		rg, err := parseRange(r)
		if err != nil {
			return nil, err
		}
		var page *fleet.NodesQuery
		// Any of them asks for the page: a state or pageToken without limit
		// was neither checked nor applied (200 with the summary alone).
		if q := r.URL.Query(); q.Has("limit") || q.Has("state") || q.Has("pageToken") {
			q, err := nodesQuery(r)
			if err != nil {
				return nil, err
			}
			page = &q
		}
		return s.fleet.Summary(ctx, c.Cluster, rg, page)
	}))
	mux.HandleFunc("GET /v1/fleet/nodes", s.fleetRead(false, func(ctx context.Context, c Caller, r *http.Request) (any, error) {
		if err := onlyParams(r, "state", "limit", "pageToken"); err != nil {
			return nil, err
		}
		q, err := nodesQuery(r)
		if err != nil {
			return nil, err
		}
		return s.fleet.Nodes(ctx, c.Cluster, q)
	}))
	mux.HandleFunc("GET /v1/fleet/nodes/{node}", s.fleetRead(true, func(ctx context.Context, c Caller, r *http.Request) (any, error) {
		if err := onlyParams(r); err != nil {
			return nil, err
		}
		return s.fleet.Node(ctx, c.Cluster, r.PathValue("node"))
	}))
	mux.HandleFunc("GET /v1/fleet/analytics", s.fleetRead(false, func(_ context.Context, _ Caller, r *http.Request) (any, error) {
		if err := onlyParams(r); err != nil {
			return nil, err
		}
		qs, err := fleet.AnalyticsList()
		return map[string]any{"queries": qs}, err
	}))
	mux.HandleFunc("GET /v1/fleet/analytics/{name}", s.fleetRead(false, func(ctx context.Context, c Caller, r *http.Request) (any, error) {
		params := map[string]string{}
		for k, v := range r.URL.Query() {
			if len(v) != 1 {
				return nil, badParam(k + ": give it once")
			}
			params[k] = v[0]
		}
		return s.fleet.Analytics(ctx, c.Cluster, r.PathValue("name"), params)
	}))
}

// onlyParams refuses a query parameter the read does not take, or one
// given more than once (400 naming it): ignored, a misspelt filter
// (State=held) answered as if there were none.
func onlyParams(r *http.Request, names ...string) error {
	for k, v := range r.URL.Query() {
		switch {
		case !slices.Contains(names, k) && len(names) == 0:
			return badParam(truncate(k) + ": unknown parameter (this read takes none)")
		case !slices.Contains(names, k):
			return badParam(truncate(k) + ": unknown parameter (parameters: " + strings.Join(names, ", ") + ")")
		case len(v) != 1:
			return badParam(k + ": give it once")
		}
	}
	return nil
}

// nodesQuery reads state, limit and pageToken.
func nodesQuery(r *http.Request) (fleet.NodesQuery, error) {
	q := fleet.NodesQuery{State: r.URL.Query().Get("state"), PageToken: r.URL.Query().Get("pageToken")}
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			return q, badParam("limit: not a number")
		}
		q.Limit = n
	}
	return q, nil
}

func badParam(msg string) error { return &fleetBad{msg} }

type fleetBad struct{ msg string }

func (e *fleetBad) Error() string { return e.msg }

// parseRange reads since and until (RFC 3339), both optional.
func parseRange(r *http.Request) (fleet.Range, error) {
	var rg fleet.Range
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"since", &rg.Since}, {"until", &rg.Until}} {
		v := r.URL.Query().Get(p.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return rg, badParam(p.name + ": not an RFC 3339 time (2026-03-02T10:00:00Z)")
		}
		*p.dst = t
	}
	return rg, nil
}

// fleetRead is a read of the fleet page (clusterRead).
func (s *Server) fleetRead(nodeScoped bool, read func(ctx context.Context, c Caller, r *http.Request) (any, error)) http.HandlerFunc {
	return s.clusterRead("fleet read", func() bool { return s.fleet != nil }, nodeScoped, read)
}

// clusterRead authenticates a read of the caller's cluster (the fleet
// page's, the conformance score) and admits it like a history read
// (per-caller rate, concurrent reads, history_timeout), runs it and writes
// its answer as JSON; what names it in errors, configured tells whether the
// gateway has what it reads (ClickHouse). nodeScoped reads (one node's)
// are open to a node-bound credential for its own node; the others are
// refused to it. A read returns a badParam error for a bad request (400).
//
// A POST's body (application/x-www-form-urlencoded) is read whole first,
// as readBody reads the other doors' bodies, before the read is admitted:
// admitted first, a body that dribbled in held a read slot (and its
// caller's read rate) until read_timeout, and max_concurrent_reads of them
// refused every caller's reads.
func (s *Server) clusterRead(what string, configured func() bool, nodeScoped bool, read func(ctx context.Context, c Caller, r *http.Request) (any, error)) http.HandlerFunc {
	admit := s.admitClusterRead(what, read)
	return func(w http.ResponseWriter, r *http.Request) {
		var chains [][]*x509.Certificate
		if r.TLS != nil {
			chains = r.TLS.VerifiedChains
		}
		caller, err := s.auth.Authenticate(r.Header.Get("Authorization"), chains)
		if err != nil {
			s.refuseUnauthenticated(w, err)
			return
		}
		if !configured() {
			writeStatus(w, http.StatusNotImplemented, codes.Unimplemented, what+": not configured on this gateway (no ClickHouse)")
			return
		}
		if caller.Node != "" && (!nodeScoped || r.PathValue("node") != caller.Node) {
			writeStatus(w, http.StatusForbidden, codes.PermissionDenied, "credential "+caller.Name+" is bound to node "+caller.Node+": it may read that node's own only")
			return
		}
		s.readBodyOf("application/x-www-form-urlencoded", admit)(w, r.WithContext(withCaller(r.Context(), caller)), nil)
	}
}

// admitClusterRead is clusterRead past authentication (and a POST's body):
// the read rate, a read slot, history_timeout, the read and its answer.
func (s *Server) admitClusterRead(what string, read func(ctx context.Context, c Caller, r *http.Request) (any, error)) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		caller, _ := CallerFrom(r.Context())
		if !s.svc.readLimiter.allow(caller.Name, 1, s.svc.now()) {
			s.metrics.rejected("read_rate_limited", 1)
			w.Header().Set("Retry-After", "1")
			writeStatus(w, http.StatusTooManyRequests, codes.ResourceExhausted, "caller "+caller.Name+" is over its read rate; retry later")
			return
		}
		if s.svc.reads != nil {
			if !s.svc.reads.TryAcquire(1) {
				s.metrics.rejected("reads_busy", 1)
				w.Header().Set("Retry-After", "1")
				writeStatus(w, http.StatusTooManyRequests, codes.ResourceExhausted, "too many reads in progress; retry later")
				return
			}
			defer s.svc.reads.Release(1)
		}
		ctx, cancel := s.svc.readContext(r.Context())
		defer cancel()
		out, err := read(ctx, caller, r)
		if err != nil {
			var bad *fleet.BadRequest
			var fb *fleetBad
			switch {
			case errors.As(err, &bad), errors.As(err, &fb):
				writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, err.Error())
			case ctx.Err() != nil:
				writeStatus(w, http.StatusGatewayTimeout, codes.DeadlineExceeded, what+": took longer than gateway.history_timeout")
			default:
				s.log.Warn(what+" failed", "path", r.URL.Path, "err", err)
				writeStatus(w, http.StatusServiceUnavailable, codes.Unavailable, what+": history unavailable; retry later")
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(true)
		_ = enc.Encode(out)
	}
}
