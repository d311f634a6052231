package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"

	"github.com/faultline/faultline/internal/certfile"
	"github.com/faultline/faultline/internal/connlimit"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/warnlimit"
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
	// Fleet serves the fleet page's reads (GET /v1/fleet/...); nil
	// answers 501. The page itself (/ui/) is always served.
	Fleet Fleet
	// Conformance serves GET and POST /v1/conformance/score; nil answers 501.
	Conformance Conformance
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
	flight   *inflight
	codec    Codec
	fleet    Fleet
	// conformance serves GET /v1/conformance/score (nil: 501).
	conformance Conformance

	// cert is gateway.tls_cert and tls_key, clientCAs gateway.client_ca,
	// each shared by both doors and re-read when its files change; nil
	// when not set.
	cert      *certfile.Pair
	clientCAs *certfile.Pool
	// peers re-verifies open connections' client certificates against
	// clientCAs; nil without it.
	peers *peerCerts

	grpcLn, httpLn, unixLn net.Listener
	grpcSrv, unixSrv       *grpc.Server
	httpSrv                *http.Server

	// noSubmitFastPath sends POST /v1/events through grpc-gateway's mux
	// too (tests compare the two).
	noSubmitFastPath bool

	// busyWarns names the credentials whose requests the read share
	// refused; connWarns the addresses the connection caps refused.
	busyWarns, connWarns *warnlimit.Limit
}

// Warnings about refused callers and connections: each credential or
// address named at most once per warnWindow, warnKeys of them a window.
const (
	warnWindow = 10 * time.Second
	warnKeys   = 16
)

// refusedBusy counts a request of caller's that the in-flight budget
// refused with err and returns the answer's message. When it was the
// credential's read share, the log names the credential (each at most
// once per 10 s, warnlimit; under a flood the metric counts): the name an
// operator revokes when its messages never come.
func (s *Server) refusedBusy(err error, c Caller) string {
	reason, msg := busyRefusal(err)
	s.metrics.rejected(reason, 1)
	if reason != "caller_busy" {
		return msg
	}
	const why = "request refused: its credential's requests hold the credential's share of message reads (gateway.max_read_bytes_per_caller); if their messages never come, revoke the credential"
	switch named, full := s.busyWarns.Allow(c.Name, time.Now()); {
	case named:
		s.log.Warn(why, "caller", c.Name, "cluster", c.Cluster)
	case full:
		s.log.Warn(why + fmt.Sprintf("; more than %d credentials refused within %s, the rest not named until then (the metric counts them)", warnKeys, warnWindow))
	}
	return msg
}

// connRefused counts a connection a door closed on accept and logs the
// cap (the address over max_conns_per_address, each at most once per
// 10 s; warnlimit). The door's counter is exported at 0 from here on, so
// the alert on its rate (deploy/monitoring) sees the door before its first
// refusal.
func (s *Server) connRefused(door string) func(addr string, total bool) {
	refused := s.metrics.connsRefused.WithLabelValues(door)
	return func(addr string, total bool) {
		refused.Inc()
		key := door + " " + addr
		if total {
			key = door // one line for the total cap, not one per address
		}
		named, full := s.connWarns.Allow(key, time.Now())
		switch {
		case named && total:
			s.log.Warn("connection refused: gateway.max_conns reached", "door", door, "max_conns", s.cfg.MaxConns)
		case named:
			s.log.Warn("connection refused: gateway.max_conns_per_address reached (behind a NAT or a load balancer that hides client addresses, raise it)",
				"door", door, "client", addr, "max_conns_per_address", s.cfg.MaxConnsPerAddress)
		case full:
			s.log.Warn(fmt.Sprintf("connection refused: more than %d addresses refused within %s, the rest not named until then (faultline_gateway_connections_refused_total counts them)", warnKeys, warnWindow), "door", door)
		}
	}
}

// New builds a gateway: loads credentials, connects the producer.
func New(cfg Config, kcfg kafka.Config, log *slog.Logger, reg *prometheus.Registry, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	auth := &Authenticator{CertBindsNode: cfg.ClientCertBindsNode}
	if cfg.TokensFile != "" {
		if err := auth.LoadTokensFile(cfg.TokensFile); err != nil {
			return nil, fmt.Errorf("gateway.tokens_file: %w", err)
		}
	}
	prod, err := NewProducer(kcfg, cfg, log)
	if err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := newMetrics(reg)
	flight := newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes)
	var (
		cert      *certfile.Pair
		clientCAs *certfile.Pool
	)
	if cfg.TLSCert != "" {
		cert = certfile.New(cfg.TLSCert, cfg.TLSKey, "gateway.tls_cert, gateway.tls_key")
	}
	if cfg.ClientCA != "" {
		clientCAs = certfile.NewPool(cfg.ClientCA, "gateway.client_ca")
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "faultline_gateway_tls_certificate_expiry_timestamp_seconds",
		Help: "When the certificate the gateway serves expires (Unix seconds; its files are re-read when they change); 0 without TLS.",
	}, cert.ExpirySeconds))
	reg.MustRegister(certfile.CAExpiryGauge("gateway.client_ca", clientCAs.ExpirySeconds))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "faultline_gateway_inflight_bytes", Help: "Request bytes held now in the in-flight budget (gateway.max_inflight_bytes bounds it).",
	}, func() float64 { return float64(flight.inUse()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "faultline_gateway_decoded_bytes", Help: "What the submissions being answered hold now of decoded events, as estimated (gateway.max_decoded_bytes bounds it).",
	}, func() float64 { return float64(flight.decodedInUse()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "faultline_gateway_producer_buffered_bytes", Help: "Encoded bytes of the records the producer holds until Kafka acknowledges them, those of calls already answered 503 included (gateway.max_buffered_bytes bounds it).",
	}, func() float64 { return float64(prod.BufferedBytes()) }))
	s := &Server{
		cfg: cfg, log: log, auth: auth, metrics: m, cert: cert, clientCAs: clientCAs, producer: prod, reg: reg,
		ready:       append([]ReadyCheck{{Name: "kafka", Check: prod.Ping}}, opts.Ready...),
		flight:      flight,
		busyWarns:   warnlimit.New(warnWindow, warnKeys),
		connWarns:   warnlimit.New(warnWindow, warnKeys),
		codec:       Codec{limits: shapeLimits{maxEvents: cfg.MaxBatch}},
		fleet:       opts.Fleet,
		conformance: opts.Conformance,
		svc: &service{
			validator:    Validator{MaxBatch: cfg.MaxBatch, MaxFutureSkew: cfg.MaxFutureSkew},
			producer:     prod,
			limiter:      newLimiter(cfg.RatePerCaller, cfg.RateBurst),
			history:      opts.History,
			metrics:      m,
			now:          opts.Now,
			log:          log,
			readLimiter:  newLimiter(cfg.ReadRatePerCaller, cfg.ReadBurst),
			reads:        semaphore.NewWeighted(int64(cfg.MaxConcurrentReads)),
			readTimeout:  cfg.HistoryTimeout,
			produceWarns: warnlimit.New(warnWindow, warnKeys),
		},
	}
	if clientCAs != nil {
		s.peers = newPeerCerts(clientCAs, log, m.untrusted)
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
		s.grpcLn.Close()
		return fmt.Errorf("gateway.http_addr: %w", err)
	}
	if s.cfg.UnixSocket != "" {
		if s.unixLn, err = listenUnix(s.cfg.UnixSocket, s.cfg.UnixSocketGroup); err != nil {
			s.grpcLn.Close()
			s.httpLn.Close()
			return err
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
	grpcTLS, err := s.tlsConfig() // grpc-go adds h2
	if err != nil {
		return err
	}
	httpTLS, err := s.tlsConfig("h2", "http/1.1")
	if err != nil {
		return err
	}
	s.grpcSrv = s.newGRPCServer(doorGRPC, grpcTLS)
	handler, err := s.httpHandler(ctx)
	if err != nil {
		return err
	}
	s.httpSrv = s.newHTTPServer(handler, httpTLS)

	grpcLn := connlimit.Listener(s.grpcLn, s.cfg.MaxConns, s.cfg.MaxConnsPerAddress, s.connRefused(doorGRPC))
	httpLn := connlimit.Listener(s.httpLn, s.cfg.MaxConns, s.cfg.MaxConnsPerAddress, s.connRefused(doorREST))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		s.auth.FollowTokens(gctx, TokensEvery, s.log)
		return nil
	})
	if s.peers != nil {
		g.Go(func() error {
			s.peers.run(gctx, PeerCertsEvery)
			return nil
		})
	}
	g.Go(func() error { return serveErr(s.grpcSrv.Serve(grpcLn)) })
	g.Go(func() error {
		if httpTLS != nil {
			return serveErr(s.httpSrv.ServeTLS(httpLn, "", ""))
		}
		return serveErr(s.httpSrv.Serve(httpLn))
	})
	if s.unixLn != nil {
		s.unixSrv = s.newGRPCServer(doorUnix, nil)
		unixLn := connlimit.Listener(s.unixLn, s.cfg.MaxConns, 0, s.connRefused(doorUnix))
		g.Go(func() error { return serveErr(s.unixSrv.Serve(unixLn)) })
	}
	s.log.Info("gateway serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "unix", s.cfg.UnixSocket, "tls", httpTLS != nil)
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
		if g == nil {
			continue
		}
		done := make(chan struct{})
		go func() { g.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			g.Stop() // a client that holds a call open does not hold the shutdown
		}
	}
	s.producer.Close(ctx)
}

// tlsCipherSuites are the TLS 1.2 suites the gateway accepts: ECDHE key
// exchange (forward secrecy) with an AEAD cipher. TLS 1.3's suites are not
// configurable and all qualify.
var tlsCipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// tlsConfig is a door's TLS configuration, nil without gateway.tls_cert.
// protos are the door's ALPN protocols, set here because a configuration
// chosen at the handshake (a client CA rotated) must carry them itself.
func (s *Server) tlsConfig(protos ...string) (*tls.Config, error) {
	if s.cert == nil {
		return nil, nil
	}
	// Re-read when its files change: a certificate rotated in place
	// (cert-manager renewing the chart's Secret) is served without a
	// restart, before the one loaded at start expires.
	if _, err := s.cert.GetCertificate(nil); err != nil {
		return nil, err
	}
	cfg := &tls.Config{GetCertificate: s.cert.GetCertificate, MinVersion: tls.VersionTLS12, CipherSuites: tlsCipherSuites, NextProtos: protos}
	if s.clientCAs != nil {
		pool, err := s.clientCAs.Get()
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		// Tokens may still be used over TLS without a client certificate.
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		cfg.GetConfigForClient = followClientCAs(cfg, s.clientCAs)
	}
	return cfg, nil
}

// followClientCAs is cfg's GetConfigForClient: client certificates are
// verified against the CA file as it is at the handshake, so a CA rotated
// in place admits the certificates it signs, and one removed from the
// bundle admits none, without a restart (a resumed session is checked
// against the bundle too, by crypto/tls). cfg serves as it is until the
// file changes; then a copy with the new pool, made once per change.
func followClientCAs(cfg *tls.Config, cas *certfile.Pool) func(*tls.ClientHelloInfo) (*tls.Config, error) {
	var (
		mu         sync.Mutex
		start      = cfg.ClientCAs
		current    = start
		currentCfg *tls.Config
	)
	return func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := cas.Get() // once loaded, the last good pool
		if err != nil || pool == start {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if pool != current {
			c := cfg.Clone()
			c.GetConfigForClient = nil
			c.ClientCAs = pool
			current, currentCfg = pool, c
		}
		return currentCfg, nil
	}
}
