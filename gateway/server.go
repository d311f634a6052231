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
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/gateway/openapi"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// ReadyCheck is one condition of /readyz.
type ReadyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// Options are the gateway's optional parts.
type Options struct {
	// History serves GET /v1/events and /v1/actions; nil answers 501.
	History History
	// Ready are extra readiness conditions (Kafka's is always included).
	Ready []ReadyCheck
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Server is a running gateway.
type Server struct {
	cfg      Config
	log      *slog.Logger
	auth     *Authenticator
	svc      *service
	metrics  *metrics
	producer *Producer
	reg      *prometheus.Registry
	ready    []ReadyCheck

	grpcLn, httpLn, unixLn net.Listener
	grpcSrv, unixSrv       *grpc.Server
	httpSrv                *http.Server
}

// New builds a gateway: loads credentials, connects the producer.
func New(cfg Config, kcfg kafka.Config, log *slog.Logger, reg *prometheus.Registry, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	auth := &Authenticator{}
	if cfg.TokensFile != "" {
		t, err := LoadTokens(cfg.TokensFile)
		if err != nil {
			return nil, fmt.Errorf("gateway.tokens_file: %w", err)
		}
		auth.Tokens = t
	}
	prod, err := NewProducer(kcfg, cfg, log)
	if err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := newMetrics(reg)
	s := &Server{
		cfg: cfg, log: log, auth: auth, metrics: m, producer: prod, reg: reg,
		ready: append([]ReadyCheck{{Name: "kafka", Check: prod.Ping}}, opts.Ready...),
		svc: &service{
			validator: Validator{MaxBatch: cfg.MaxBatch, MaxFutureSkew: cfg.MaxFutureSkew},
			producer:  prod,
			limiter:   newLimiter(cfg.RatePerCaller, cfg.RateBurst),
			history:   opts.History,
			metrics:   m,
			now:       opts.Now,
		},
	}
	return s, nil
}

// Listen opens the listeners (so tests can use port 0 and read the addresses).
func (s *Server) Listen() error {
	var err error
	if s.grpcLn, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("gateway.grpc_addr: %w", err)
	}
	if s.httpLn, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
		return fmt.Errorf("gateway.http_addr: %w", err)
	}
	if s.cfg.UnixSocket != "" {
		_ = os.Remove(s.cfg.UnixSocket)
		if s.unixLn, err = net.Listen("unix", s.cfg.UnixSocket); err != nil {
			return fmt.Errorf("gateway.unix_socket: %w", err)
		}
	}
	return nil
}

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// HTTPAddr is the bound REST address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// Run listens (if Listen was not called) and serves until ctx ends, then
// stops intake, finishes in-flight requests and flushes the producer.
func (s *Server) Run(ctx context.Context) error {
	if s.grpcLn == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	tlsCfg, err := s.tlsConfig()
	if err != nil {
		return err
	}
	grpcOpts := []grpc.ServerOption{
		grpc.ForceServerCodec(Codec{}),
		grpc.MaxRecvMsgSize(s.cfg.MaxBodyBytes),
		grpc.ChainUnaryInterceptor(s.grpcMetrics("grpc"), s.grpcAuth),
	}
	if tlsCfg != nil {
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.grpcSrv = grpc.NewServer(grpcOpts...)
	s.register(s.grpcSrv)

	handler, err := s.httpHandler(ctx)
	if err != nil {
		return err
	}
	s.httpSrv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveErr(s.grpcSrv.Serve(s.grpcLn)) })
	g.Go(func() error {
		if tlsCfg != nil {
			return serveErr(s.httpSrv.ServeTLS(s.httpLn, "", ""))
		}
		return serveErr(s.httpSrv.Serve(s.httpLn))
	})
	if s.unixLn != nil {
		s.unixSrv = grpc.NewServer(grpc.ForceServerCodec(Codec{}), grpc.MaxRecvMsgSize(s.cfg.MaxBodyBytes),
			grpc.ChainUnaryInterceptor(s.grpcMetrics("unix"), s.unixAuth))
		s.register(s.unixSrv)
		g.Go(func() error { return serveErr(s.unixSrv.Serve(s.unixLn)) })
	}
	s.log.Info("gateway serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "unix", s.cfg.UnixSocket, "tls", tlsCfg != nil)
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown()
		return nil
	})
	return g.Wait()
}

func serveErr(err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

func (s *Server) shutdown() {
	s.log.Info("gateway stopping: draining requests and flushing to Kafka")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = s.httpSrv.Shutdown(ctx)
	for _, g := range []*grpc.Server{s.grpcSrv, s.unixSrv} {
		if g != nil {
			g.GracefulStop()
		}
	}
	s.producer.Close(ctx)
}

func (s *Server) register(g *grpc.Server) {
	faultlinev1.RegisterEventsServer(g, s.svc)
	datamodels.RegisterPlatformConnectorServer(g, s.svc)
}

func (s *Server) tlsConfig() (*tls.Config, error) {
	if s.cfg.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("gateway.tls_cert: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if s.cfg.ClientCA != "" {
		pem, err := os.ReadFile(s.cfg.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("gateway.client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("gateway.client_ca: no PEM certificates in %s", s.cfg.ClientCA)
		}
		cfg.ClientCAs = pool
		// Tokens may still be used over TLS without a client certificate.
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// grpcAuth authenticates gRPC calls from the authorization metadata or the
// verified client certificate.
func (s *Server) grpcAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	var authz string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authz = v[0]
		}
	}
	var chains [][]*x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			chains = ti.State.VerifiedChains
		}
	}
	caller, err := s.auth.Authenticate(authz, chains)
	if err != nil {
		s.metrics.rejected("unauthenticated", 1)
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	return h(withCaller(ctx, caller), req)
}

// unixAuth gives every call on the node-local socket the configured cluster.
func (s *Server) unixAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	return h(withCaller(ctx, Caller{Cluster: s.cfg.UnixSocketCluster, Name: "unix-socket"}), req)
}

func (s *Server) grpcMetrics(door string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		s.metrics.requests.WithLabelValues(door, info.FullMethod, status.Code(err).String()).Inc()
		return resp, err
	}
}

// Marshaler is the REST JSON codec: the seed's camelCase field names, enums
// by name, RFC 3339 timestamps; unknown fields are an error, and a body
// that does not decode says so ("request body: unexpected EOF").
var Marshaler runtime.Marshaler = restCodec{&runtime.JSONPb{
	MarshalOptions:   protojson.MarshalOptions{UseEnumNumbers: false},
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
}}

type restCodec struct{ *runtime.JSONPb }

// NewDecoder names the request body in decode errors (grpc-gateway returns
// the bare decoder error, e.g. "unexpected EOF"); an empty body (io.EOF) is
// left to the handler.
func (c restCodec) NewDecoder(r io.Reader) runtime.Decoder {
	d := c.JSONPb.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		err := d.Decode(v)
		if err != nil && err != io.EOF {
			return fmt.Errorf("request body: %w", err)
		}
		return err
	})
}

func (s *Server) httpHandler(ctx context.Context) (http.Handler, error) {
	gw := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, Marshaler),
	)
	if err := faultlinev1.RegisterEventsHandlerServer(ctx, gw, s.svc); err != nil {
		return nil, err
	}
	if err := datamodels.RegisterPlatformConnectorHandlerServer(ctx, gw, s.svc); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", s.restAuth(s.limitBody(gw)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.JSON)
	})
	return s.httpMetrics(mux), nil
}

// restAuth authenticates REST calls; the caller travels in the request context.
func (s *Server) restAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		next.ServeHTTP(w, r.WithContext(withCaller(r.Context(), caller)))
	})
}

// limitBody answers 413 for a body over MaxBodyBytes, whether or not it
// declared its length.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Method != http.MethodGet {
			max := int64(s.cfg.MaxBodyBytes)
			if r.ContentLength > max {
				s.metrics.rejected("too_large", 1)
				writeStatus(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
					fmt.Sprintf("request body of %d bytes exceeds the limit of %d", r.ContentLength, max))
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
			if err != nil {
				writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, "reading body: "+err.Error())
				return
			}
			if int64(len(body)) > max {
				s.metrics.rejected("too_large", 1)
				writeStatus(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
					fmt.Sprintf("request body exceeds the limit of %d bytes", max))
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		next.ServeHTTP(w, r)
	})
}

// writeStatus writes an error in grpc-gateway's body shape.
func writeStatus(w http.ResponseWriter, httpCode int, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpCode)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]any{"code": int(code), "message": msg, "details": []any{}})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var failed []string
	for _, c := range s.ready {
		if err := c.Check(ctx); err != nil {
			failed = append(failed, c.Name+": "+err.Error())
		}
	}
	if len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		for _, f := range failed {
			_, _ = io.WriteString(w, f+"\n")
		}
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

func (s *Server) httpMetrics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := r.URL.Path
		if len(route) > 32 {
			route = "other"
		}
		s.metrics.requests.WithLabelValues("rest", r.Method+" "+route, strconv.Itoa(rec.code)).Inc()
	})
}
