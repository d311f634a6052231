package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/certfile"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/internal/fleet"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/tlsclient"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// loadGatewayConfig is `faultline gateway`'s configuration: defaults, the
// --config file, flags, validated.
func loadGatewayConfig(args []string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	_, err := config.Load("faultline gateway", args, &cfg, func(fs *flag.FlagSet) {
		cfg.registerLogFlags(fs)
		cfg.Kafka.RegisterFlags(fs, "kafka.")
		cfg.registerGatewayFlags(fs)
		cfg.Processors.ClickHouse.RegisterFlags(fs, "clickhouse.")
	}, func() error {
		if err := cfg.Kafka.Validate("kafka."); err != nil {
			return err
		}
		if err := cfg.Processors.ClickHouse.Validate("clickhouse."); err != nil {
			return err
		}
		// The conformance score door reads it (a cutoff in the future
		// counted no report: every node unknown).
		if s := cfg.Processors.Conformance.Staleness; s <= 0 {
			return fmt.Errorf("conformance.staleness: must be positive, got %v", s)
		}
		return cfg.Gateway.Validate()
	}, stderr, moved, config.NoArgs())
	return cfg, err
}

func runGateway(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, err := loadGatewayConfig(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg)
	if err != nil {
		return err
	}
	reg := newRegistry(cfg)
	hist := &lazyHistory{cfg: cfg.Processors.ClickHouse, log: log}
	defer hist.Close()
	// Credentials are loaded (and a bad tokens file refused) before Kafka
	// is contacted.
	srv, err := gateway.New(cfg.Gateway, cfg.Kafka, log, reg, gateway.Options{History: hist, Fleet: hist,
		Conformance: &conformance.Scorer{Conn: hist.Conn, Staleness: cfg.Processors.Conformance.Staleness}})
	if err != nil {
		return err
	}
	if err := kafka.CreatePipelineTopics(ctx, cfg.Kafka, log); err != nil {
		return err
	}
	return srv.Run(ctx)
}

// newRegistry is a process's registry: the Go and process collectors, and
// when the client certificates of cfg presented to Kafka and ClickHouse,
// and the CA bundles that verify them, expire.
func newRegistry(cfg Config) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for peer, tc := range map[string]tlsclient.Config{"kafka": cfg.Kafka.TLS, "clickhouse": cfg.Processors.ClickHouse.TLS} {
		prefix := peer + ".tls."
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "faultline_tls_client_certificate_expiry_timestamp_seconds",
			Help:        "When the client certificate presented to the peer (kafka, clickhouse: its tls.cert_file) expires (Unix seconds; re-read when its files change); 0 without one.",
			ConstLabels: prometheus.Labels{"peer": peer},
		}, tc.ClientCert(prefix).ExpirySeconds))
		reg.MustRegister(certfile.CAExpiryGauge(prefix+"ca_file", tc.CAs(prefix).ExpirySeconds))
	}
	return reg
}

// lazyHistory connects to ClickHouse on first use and again after a failed
// connect, so the gateway accepts events while the history is down (reads
// answer 503 until it is back).
type lazyHistory struct {
	cfg  clickhouse.Config
	log  *slog.Logger
	mu   sync.Mutex
	conn clickhouse.Conn
	h    *history.ClickHouse
	f    *fleet.Store
}

func (l *lazyHistory) get(ctx context.Context) (*history.ClickHouse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		conn, err := clickhouse.Open(ctx, l.cfg, l.log)
		if err != nil {
			return nil, err
		}
		f, err := fleet.New(conn, l.log, fleet.Options{})
		if err != nil {
			conn.Close()
			return nil, err
		}
		l.conn, l.h, l.f = conn, history.New(conn, l.log), f
	}
	return l.h, nil
}

func (l *lazyHistory) fleet(ctx context.Context) (*fleet.Store, error) {
	if _, err := l.get(ctx); err != nil {
		return nil, err
	}
	return l.f, nil
}

// Summary, Nodes, Node and Analytics serve the fleet page (gateway.Fleet).
func (l *lazyHistory) Summary(ctx context.Context, cluster string, r fleet.Range, page *fleet.NodesQuery) (*fleet.Summary, error) {
	f, err := l.fleet(ctx)
	if err != nil {
		return nil, err
	}
	return f.Summary(ctx, cluster, r, page)
}

func (l *lazyHistory) Nodes(ctx context.Context, cluster string, q fleet.NodesQuery) (*fleet.NodesPage, error) {
	f, err := l.fleet(ctx)
	if err != nil {
		return nil, err
	}
	return f.Nodes(ctx, cluster, q)
}

func (l *lazyHistory) Node(ctx context.Context, cluster, node string) (*fleet.NodeDetail, error) {
	f, err := l.fleet(ctx)
	if err != nil {
		return nil, err
	}
	return f.Node(ctx, cluster, node)
}

func (l *lazyHistory) Analytics(ctx context.Context, cluster, name string, params map[string]string) (*fleet.Table, error) {
	f, err := l.fleet(ctx)
	if err != nil {
		return nil, err
	}
	return f.Analytics(ctx, cluster, name, params)
}

// Conn returns the connection, connecting on first use.
func (l *lazyHistory) Conn(ctx context.Context) (clickhouse.Conn, error) {
	if _, err := l.get(ctx); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn, nil
}

func (l *lazyHistory) ListEvents(ctx context.Context, cluster string, req *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error) {
	h, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return h.ListEvents(ctx, cluster, req)
}

func (l *lazyHistory) ListActions(ctx context.Context, cluster string, req *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error) {
	h, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return h.ListActions(ctx, cluster, req)
}

// Close closes the connection if one was made.
func (l *lazyHistory) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
}
