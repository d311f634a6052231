package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/faultline/faultline/gateway/openapi"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// restMaxHeaderBytes bounds a REST request's request line and headers.
const restMaxHeaderBytes = 64 << 10

// restReadChunk is how much of a REST body is reserved in the in-flight
// budget at a time, as it arrives: a slow body holds only what it sent.
const restReadChunk = 64 << 10

// Marshaler is the REST JSON codec: NVSentinel's HealthEvent JSON field names (camelCase), enums
// by name, RFC 3339 timestamps; unknown fields are an error, and a body
// that does not decode says so ("request body: unexpected EOF"). The
// gateway's own codec also checks each body's shape before decoding it
// (see shapeLimits); this one does not.
var Marshaler runtime.Marshaler = newRESTCodec(shapeLimits{})

func newRESTCodec(l shapeLimits) restCodec {
	return restCodec{JSONPb: &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseEnumNumbers: false},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}, limits: l}
}

type restCodec struct {
	*runtime.JSONPb
	limits shapeLimits
}

// restBody is a REST request body read whole by readBody: the codec
// decodes it from its bytes, with no further copy.
type restBody struct {
	*bytes.Reader
	b []byte
}

func (restBody) Close() error { return nil }

// NewDecoder names the request body in decode errors (grpc-gateway returns
// the bare decoder error, e.g. "unexpected EOF"); an empty body (io.EOF) is
// left to the handler. A body read by the gateway is shape-checked, then
// decoded by protojson straight from its bytes (a POST /v1/events body
// of the common form by decodeSubmitFast, which protojson would decode
// the same).
func (c restCodec) NewDecoder(r io.Reader) runtime.Decoder {
	if rb, ok := r.(*restBody); ok {
		return runtime.DecoderFunc(func(v any) error {
			m, ok := v.(proto.Message)
			if !ok {
				return c.JSONPb.NewDecoder(rb).Decode(v)
			}
			if len(bytes.TrimSpace(rb.b)) == 0 {
				return io.EOF
			}
			if err := c.limits.checkJSON(rb.b, m.ProtoReflect().Descriptor()); err != nil {
				return err
			}
			if req, ok := m.(*faultlinev1.SubmitEventsRequest); ok && decodeSubmitFast(rb.b, req) {
				return nil
			}
			if err := c.UnmarshalOptions.Unmarshal(rb.b, m); err != nil {
				// protobuf-go writes "proto:" and a space or, at random per
				// build, a no-break space.
				msg := strings.TrimLeft(strings.TrimPrefix(err.Error(), "proto:"), " \u00a0")
				return fmt.Errorf("request body: %s", msg)
			}
			return nil
		})
	}
	d := c.JSONPb.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		err := d.Decode(v)
		if err != nil && err != io.EOF {
			return fmt.Errorf("request body: %w", err)
		}
		return err
	})
}

func (s *Server) newHTTPServer(h http.Handler, tlsCfg *tls.Config) *http.Server {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		// The handler's own deadline is CallTimeout; the write deadline is a
		// backstop a little later, so an answer is never cut short.
		WriteTimeout:   s.cfg.CallTimeout + 5*time.Second,
		IdleTimeout:    s.cfg.IdleTimeout,
		MaxHeaderBytes: restMaxHeaderBytes,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return s.flight.connContext(ctx)
		},
		// HTTP/2 (with TLS) takes a request's body ahead of the handler up
		// to its flow-control windows, outside the in-flight budgets:
		// net/http's 1 MiB per connection let one credential's connections
		// hold a GiB. 64 KiB, net/http's least, as the gRPC door's.
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          s.cfg.MaxStreamsPerConn,
			MaxReadFrameSize:              1 << 16,
			MaxReceiveBufferPerConnection: 1 << 16,
			MaxReceiveBufferPerStream:     1 << 16,
		},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if tlsCfg != nil && s.peers != nil {
		srv.ConnState = s.peers.connState(doorREST)
	}
	return srv
}

func (s *Server) httpHandler(ctx context.Context) (http.Handler, error) {
	gw := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, newRESTCodec(s.codec.limits)),
		runtime.WithDisablePathLengthFallback(),
		// Run in this order once a request matched a route: note the
		// route for metrics, authenticate, admit the body.
		runtime.WithMiddlewares(recordRoute, s.restAuth, s.readBody),
		// grpc-gateway keeps the parser process-wide: every mux sets the same one.
		runtime.SetQueryParameterParser(strictQuery{}),
		runtime.WithErrorHandler(retryAfterBusy),
	)
	if err := faultlinev1.RegisterEventsHandlerServer(ctx, gw, s.svc); err != nil {
		return nil, err
	}
	if err := datamodels.RegisterPlatformConnectorHandlerServer(ctx, gw, s.svc); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", gw)
	var submit runtime.HandlerFunc
	if !s.noSubmitFastPath {
		submit = s.restAuth(s.readBody(s.submitEventsREST(gw)))
	}
	mux.HandleFunc("GET /v1/conformance/score", s.conformanceScore())
	mux.HandleFunc("POST /v1/conformance/score", s.conformanceScore())
	s.fleetRoutes(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.JSON)
	})
	return s.httpMetrics(mux, submit), nil
}

// strictQuery is grpc-gateway's query parser refusing a parameter the
// request has no field for (400 naming it), where grpc-gateway's own
// ignores it: GET /v1/events?nodeName=… (for node=) answered the whole
// cluster's history as if it were the node's.
type strictQuery struct{ runtime.DefaultQueryParser }

func (p strictQuery) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	fields := msg.ProtoReflect().Descriptor().Fields()
	for k := range values {
		// A field's own (since.seconds) or a map's (details[k]) key.
		name, _, _ := strings.Cut(k, ".")
		name, _, _ = strings.Cut(name, "[")
		if fields.ByName(protoreflect.Name(name)) == nil && fields.ByJSONName(name) == nil {
			names := make([]string, fields.Len())
			for i := range names {
				names[i] = fields.Get(i).JSONName()
			}
			slices.Sort(names)
			return fmt.Errorf("%s: unknown parameter (parameters: %s)", truncate(k), strings.Join(names, ", "))
		}
	}
	return p.DefaultQueryParser.Parse(msg, values, filter)
}

// submitRoute is the route of POST /v1/events, as grpc-gateway names it.
const submitRoute = "/v1/events"

// isSubmitFastPath reports whether a request may skip grpc-gateway's mux
// for POST /v1/events (submitEventsREST): only when the mux would route it
// there and grpc-gateway's request annotation could neither refuse it nor
// change its context. That annotation turns headers into gRPC metadata
// for a remote backend; the service, called in process, reads none of it
// (the caller travels in the context, set by restAuth). It can refuse a
// request or set its deadline only through Grpc-Timeout, an undecodable
// *-Bin header, or X-HTTP-Method-Override: those, and any other path or
// encoding of the path, go through grpc-gateway as before.
func isSubmitFastPath(r *http.Request) bool {
	if r.Method != http.MethodPost || r.URL.Path != submitRoute || r.URL.RawPath != "" {
		return false
	}
	for k := range r.Header {
		if len(k) >= 4 && strings.EqualFold(k[len(k)-4:], "-bin") {
			return false
		}
		if strings.EqualFold(k, "Grpc-Timeout") || strings.EqualFold(k, "X-Http-Method-Override") {
			return false
		}
	}
	return true
}

// submitEventsREST is POST /v1/events without grpc-gateway's routing and
// request annotation (see isSubmitFastPath), after the same middlewares
// (restAuth, readBody): the same decoder, the same service call, and the
// answer or error written by grpc-gateway's own ForwardResponseMessage
// and HTTPError with the (empty) server metadata it would have, so the
// status, headers and body are those of the generated handler.
func (s *Server) submitEventsREST(gw *runtime.ServeMux) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		inbound, outbound := runtime.MarshalerForRequest(gw, r)
		ctx := r.Context()
		var req faultlinev1.SubmitEventsRequest
		var resp proto.Message
		err := inbound.NewDecoder(r.Body).Decode(&req)
		if err != nil && !errors.Is(err, io.EOF) {
			err = status.Errorf(codes.InvalidArgument, "%v", err)
		} else {
			resp, err = s.svc.SubmitEvents(ctx, &req)
		}
		ctx = runtime.NewServerMetadataContext(ctx, runtime.ServerMetadata{})
		if err != nil {
			runtime.HTTPError(ctx, gw, outbound, w, r, err)
			return
		}
		runtime.ForwardResponseMessage(ctx, gw, outbound, w, r, resp, gw.GetForwardResponseOptions()...)
	}
}

// retryAfterBusy is grpc-gateway's error answer, with Retry-After on a
// 429 (RESOURCE_EXHAUSTED: the service's refusals of a submission whose
// decoded events the in-flight budget cannot hold, of a caller over its
// rate, of a batch the producer has no room for), as readBody's own 429s
// have it.
func retryAfterBusy(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if status.Code(err) == codes.ResourceExhausted {
		w.Header().Set("Retry-After", "1")
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// restAuth authenticates REST calls before their body is read; the caller
// travels in the request context.
func (s *Server) restAuth(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		var chains [][]*x509.Certificate
		if r.TLS != nil {
			chains = r.TLS.VerifiedChains
		}
		caller, err := s.auth.Authenticate(r.Header.Get("Authorization"), chains)
		if err != nil {
			s.refuseUnauthenticated(w, err)
			return
		}
		next(w, r.WithContext(withCaller(r.Context(), caller)), params)
	}
}

// refuseUnauthenticated answers 401 and closes the connection (HTTP/1.1
// Connection: close, HTTP/2 GOAWAY), whether the request had a body or
// not: over keep-alive each refusal would start idle_timeout again, and a
// client with no credential would hold its connections, up to
// max_conns_per_address of them, for as long as it liked.
func (s *Server) refuseUnauthenticated(w http.ResponseWriter, err error) {
	s.metrics.rejected("unauthenticated", 1)
	w.Header().Set("Connection", "close")
	writeStatus(w, http.StatusUnauthorized, codes.Unauthenticated, err.Error())
}

// refuseUnread closes the connection after an answer given without
// reading the request's body, rather than letting the server wait for the
// body to discard it.
func refuseUnread(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody && r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

// remoteAddr is the TCP address of a request's client, nil when
// RemoteAddr is no IP and port.
func remoteAddr(r *http.Request) net.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

// readBody admits a request's body: a POST must be application/json
// (415), and the body is read whole, at most gateway.max_body_bytes (413),
// while holding its bytes in the in-flight budget, chunk by chunk as they
// arrive (429 when the connection's or the gateway's budget is full),
// until the request is answered, and its credential's read share while it
// is read (429 after waiting readWait for its turn); a body that has not
// arrived within gateway.read_timeout is refused (408).
func (s *Server) readBody(next runtime.HandlerFunc) runtime.HandlerFunc {
	return s.readBodyOf("application/json", next)
}

// readBodyOf is readBody for a POST whose body is of mediaType.
func (s *Server) readBodyOf(mediaType string, next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if r.Method != http.MethodPost {
			next(w, r, params)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != mediaType && !isMediaType(ct, mediaType) {
			s.metrics.rejected("content_type", 1)
			refuseUnread(w, r)
			writeStatus(w, http.StatusUnsupportedMediaType, codes.InvalidArgument,
				fmt.Sprintf("Content-Type must be %s, got %q", mediaType, truncate(r.Header.Get("Content-Type"))))
			return
		}
		max := int64(s.cfg.MaxBodyBytes)
		if r.ContentLength > max {
			s.metrics.rejected("too_large", 1)
			refuseUnread(w, r)
			writeStatus(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
				fmt.Sprintf("request body of %d bytes exceeds the limit of %d", r.ContentLength, max))
			return
		}
		res, _ := s.flight.reserve(r.Context(), 0, 0) // nothing yet: cannot be refused
		defer res.release()
		// While it is read, a body holds its credential's read share (from
		// its address, for a credential not bound to a node) for what it
		// declares (max_body_bytes when chunked): one credential's bodies
		// that never arrive hold at most its share of the budget.
		claim := max
		if r.ContentLength >= 0 {
			claim = r.ContentLength
		}
		caller, _ := CallerFrom(r.Context())
		err := res.takeRead(r.Context(), readShareKeyOf(caller, remoteAddr(r)), claim, readWait)
		var body []byte
		if err == nil {
			body, err = readReserved(r.Body, r.ContentLength, max, res)
		}
		switch {
		case errors.Is(err, errBusy), errors.Is(err, errCallerBusy):
			msg := s.refusedBusy(err, caller)
			refuseUnread(w, r)
			w.Header().Set("Retry-After", "1")
			writeStatus(w, http.StatusTooManyRequests, codes.ResourceExhausted, msg)
			return
		case errors.Is(err, errTooLarge):
			s.metrics.rejected("too_large", 1)
			refuseUnread(w, r)
			writeStatus(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
				fmt.Sprintf("request body exceeds the limit of %d bytes", max))
			return
		case isTimeout(err):
			s.metrics.rejected("unreadable", 1)
			refuseUnread(w, r)
			writeStatus(w, http.StatusRequestTimeout, codes.DeadlineExceeded,
				fmt.Sprintf("request body did not arrive within gateway.read_timeout (%s)", s.cfg.ReadTimeout))
			return
		case err != nil:
			s.metrics.rejected("unreadable", 1)
			refuseUnread(w, r)
			writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, "reading body: "+err.Error())
			return
		}
		res.shrink(int64(cap(body))) // read: the share is given back, the body held
		r.Body = &restBody{Reader: bytes.NewReader(body), b: body}
		r.ContentLength = int64(len(body))
		// A submission's service call holds what its decoded events cost
		// besides (holdDecoded).
		next(w, r.WithContext(withReservation(r.Context(), res)), params)
	}
}

// isMediaType reports whether a Content-Type is mediaType, with
// parameters or in any case.
func isMediaType(ct, mediaType string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == mediaType
}

// isTimeout reports whether a read failed on its deadline (the server's
// read_timeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var errTooLarge = errors.New("body too large")

// readReserved reads a body of at most maxBytes bytes (declared, when not -1,
// is its Content-Length), growing res by the buffer's capacity before
// allocating it: what the body costs is held in the budget as it arrives.
func readReserved(r io.Reader, declared, maxBytes int64, res *reservation) ([]byte, error) {
	limit := maxBytes + 1 // one byte past max tells a body that is too large
	if declared >= 0 {
		limit = min(declared+1, limit)
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			c := int64(cap(buf))
			next := min(max(2*c, restReadChunk), limit)
			if next <= c {
				next = min(c+restReadChunk, maxBytes+1)
			}
			if next <= c {
				return nil, errTooLarge
			}
			if err := res.grow(next - c); err != nil {
				return nil, err
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > maxBytes {
			return nil, errTooLarge
		}
		switch {
		case errors.Is(err, io.EOF):
			return buf, nil
		case err != nil:
			return nil, err
		}
	}
}

// writeStatus writes an error in grpc-gateway's body shape.
func writeStatus(w http.ResponseWriter, httpCode int, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpCode)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]any{"code": int(code), "message": msg, "details": []any{}})
}

// readyz answers 200 "ok" or 503 "not ready"; which check failed, and why,
// goes to the log only (the endpoint is unauthenticated).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	ok := true
	for _, c := range s.ready {
		if err := c.Check(ctx); err != nil {
			ok = false
			s.log.Info("not ready", "check", c.Name, "err", err)
		}
	}
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready\n")
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// routeLabel carries the route a request matched out of grpc-gateway's mux.
type routeLabel struct{ route string }

type routeLabelKey struct{}

// recordRoute is the grpc-gateway middleware that notes the route pattern
// a request matched (e.g. /v1/events).
func recordRoute(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if l, ok := r.Context().Value(routeLabelKey{}).(*routeLabel); ok {
			if p, ok := runtime.HTTPPattern(r.Context()); ok {
				l.route = p.String()
			}
		}
		next(w, r, params)
	}
}

// noStore marks an answer of the API (one credential's data, or its
// refusal) as not to be kept by any cache, the browser's included, nor
// read as anything but its Content-Type.
func noStore(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
}

// restMethods are the methods metrics name; any other is "other".
var restMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// httpMetrics counts REST requests by route pattern (never the raw path)
// and by a fixed set of methods, so that made-up paths and methods do not
// grow the metrics; it also gives every request the gateway.call_timeout
// deadline, and marks the API's answers (/v1/…) no-store and nosniff.
//
// POST /v1/events, the hot path, goes to submit when isSubmitFastPath
// (nil: always through mux).
func (s *Server) httpMetrics(mux *http.ServeMux, submit runtime.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		lbl := &routeLabel{}
		ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), routeLabelKey{}, lbl), s.cfg.CallTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			noStore(rec) // the API's answers, never /ui/'s files
		}
		if submit != nil && isSubmitFastPath(r) {
			lbl.route = submitRoute
			submit(rec, r, nil)
		} else {
			mux.ServeHTTP(rec, r) // sets r.Pattern
		}
		route := lbl.route // grpc-gateway's route, e.g. /v1/events
		if route == "" {
			// The standard mux's pattern ("GET /healthz"), minus its method.
			route = r.Pattern
			if _, path, ok := strings.Cut(route, " "); ok {
				route = path
			}
		}
		if route == "" || route == "/v1/" {
			route = "other"
		}
		method := r.Method
		if !restMethods[method] {
			method = "other"
		}
		s.metrics.restRequest(method, route, rec.code)
	})
}
