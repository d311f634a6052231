package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/internal/fleet"
	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// DevConfig configures the all-in-one mode.
type DevConfig struct {
	// Dir holds all state (Kafka log, ClickHouse data, tokens). Default .faultline.
	Dir string `toml:"dir"`
	// Cluster is the name of the local cluster whose agent token is written
	// to Dir/dev-token and operator token to Dir/operator-token. Default dev.
	Cluster string `toml:"cluster"`
	// KafkaPort of the embedded broker. Default 9192.
	KafkaPort int `toml:"kafka_port"`
	// Kubeconfig of the dev cluster; empty means dry-run (decide and record,
	// apply nothing).
	Kubeconfig string `toml:"kubeconfig"`
	// ClickHousePort is the native port of the local ClickHouse server
	// (data under Dir/clickhouse); 0 picks a free one. Default 9190.
	ClickHousePort int `toml:"clickhouse_port"`
	// FleetNodes is the size of the simulated fleet (0: no simulation).
	// Default 64.
	FleetNodes int `toml:"fleet_nodes"`
	// FleetRate is the simulated fleet's events/s: more than 0 and at most
	// what fits gateway.max_batch events a batch (10 batches a second) and
	// gateway.rate_per_caller. Default 20.
	FleetRate float64 `toml:"fleet_rate"`
}

// devUnused are the keys `faultline dev` reads but does not use, each with
// what it does instead: setting one is an error naming it.
var devUnused = config.Unused(map[string]string{
	"clickhouse.addr":         "it starts its own ClickHouse server (dev.clickhouse_port)",
	"clickhouse.tls":          "its own ClickHouse server speaks plaintext",
	"gateway.tokens_file":     "it writes its own tokens file, dev.dir/tokens (the tokens in dev.dir/dev-token and dev.dir/operator-token)",
	"kafka.brokers":           "it starts its own Kafka broker (dev.kafka_port)",
	"kafka.tls":               "its own Kafka broker speaks plaintext",
	"kafka.sasl":              "its own Kafka broker takes no authentication",
	"kube.clusters":           "its one cluster is dev.cluster, acting through dev.kubeconfig (dry-run without one)",
	"janitor.leader_election": "its one process is the only janitor",
})

// DefaultDevConfig returns the defaults documented on DevConfig.
func DefaultDevConfig() DevConfig {
	return DevConfig{Dir: ".faultline", Cluster: "dev", KafkaPort: 9192, ClickHousePort: 9190, FleetNodes: 64, FleetRate: 20}
}

func (c *DevConfig) registerFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "dir", c.Dir, "state directory")
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "name of the local cluster")
	fs.IntVar(&c.KafkaPort, "kafka-port", c.KafkaPort, "port of the embedded Kafka broker")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig of the local cluster (empty: dry-run)")
	fs.IntVar(&c.ClickHousePort, "clickhouse-port", c.ClickHousePort, "native port of the local ClickHouse server (0: any free port)")
	fs.IntVar(&c.FleetNodes, "fleet-nodes", c.FleetNodes, "nodes of the simulated fleet (0: none)")
	fs.Float64Var(&c.FleetRate, "fleet-rate", c.FleetRate, "events/s the simulated fleet sends")
}

// validate names the first bad key; gw is the gateway the simulated fleet
// sends to.
func (c DevConfig) validate(gw gateway.Config) error {
	switch {
	case c.Dir == "":
		return errors.New("dev.dir: required")
	case c.Cluster == "":
		return errors.New("dev.cluster: required")
	case !events.IsClusterName(c.Cluster):
		return fmt.Errorf("dev.cluster: %q is not a cluster name (lower-case letters, digits, '-' and '.', at most 63 characters)", c.Cluster)
	case c.KafkaPort < 0 || c.KafkaPort > 65535:
		return fmt.Errorf("dev.kafka_port: %d is not a port", c.KafkaPort)
	case c.ClickHousePort < 0 || c.ClickHousePort > 65535:
		return fmt.Errorf("dev.clickhouse_port: %d is not a port", c.ClickHousePort)
	case c.FleetNodes < 0:
		return fmt.Errorf("dev.fleet_nodes: must not be negative, got %d", c.FleetNodes)
	}
	if c.FleetNodes == 0 {
		return nil // no fleet: fleet_rate is not used
	}
	// Each batch is fleet_rate/BatchesPerSecond events: past the gateway's
	// max_batch every one would be refused.
	maxRate := float64(gw.MaxBatch * fleetsim.BatchesPerSecond)
	limit := fmt.Sprintf("gateway.max_batch (%d) × %d batches a second", gw.MaxBatch, fleetsim.BatchesPerSecond)
	if gw.RatePerCaller > 0 && gw.RatePerCaller < maxRate {
		maxRate, limit = gw.RatePerCaller, "gateway.rate_per_caller"
	}
	if !(c.FleetRate > 0 && c.FleetRate <= maxRate) { // NaN too
		return fmt.Errorf("dev.fleet_rate: must be more than 0 and at most %g (%s), got %g", maxRate, limit, c.FleetRate)
	}
	return nil
}

// loadDevConfig is `faultline dev`'s configuration: defaults, the
// --config file, flags, validated; the keys it does not use refused.
func loadDevConfig(args []string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	cfg.LibraryLogLevel = "warn" // the output is the pipeline's decisions and summaries
	_, err := config.Load("faultline dev", args, &cfg, func(fs *flag.FlagSet) {
		cfg.registerLogFlags(fs)
		config.Prefix(fs, "dev.", cfg.Dev.registerFlags)
		cfg.registerGatewayFlags(fs)
		cfg.Processors.RegisterFlags(fs)
	}, func() error {
		if err := cfg.Dev.validate(cfg.Gateway); err != nil {
			return err
		}
		// Its [kafka] settings (a --config file's: there are no --kafka.*
		// flags) apply to the embedded broker's topics and the clients.
		if err := cfg.Kafka.Validate("kafka."); err != nil {
			return err
		}
		cfg.Gateway.TokensFile = filepath.Join(cfg.Dev.Dir, "tokens")
		return cfg.Processors.Validate()
	}, stderr, moved, config.NoArgs(), devUnused)
	return cfg, err
}

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := loadDevConfig(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.Dev.Dir, 0o750); err != nil {
		return fmt.Errorf("dev.dir: %w", err)
	}
	if _, _, err := devTokens(cfg.Dev); err != nil {
		return err
	}

	broker, err := kfake.NewCluster(
		kfake.Ports(cfg.Dev.KafkaPort),
		kfake.DataDir(filepath.Join(cfg.Dev.Dir, "kafka")),
		kfake.SyncWrites(),
		kfake.SeedTopics(int32(cfg.Kafka.Partitions), kafka.PipelineTopics...),
	)
	if err != nil {
		return fmt.Errorf("embedded kafka on port %d: %w", cfg.Dev.KafkaPort, err)
	}
	defer broker.Close()
	cfg.Kafka.Brokers = strings.Join(broker.ListenAddrs(), ",")
	log.Info("embedded kafka started", "addr", cfg.Kafka.Brokers, "data", filepath.Join(cfg.Dev.Dir, "kafka"))

	// The local ClickHouse server: the history the store role writes and
	// GET /v1/events and /v1/actions read.
	chsrv, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(cfg.Dev.Dir, "clickhouse"), TCPPort: cfg.Dev.ClickHousePort, Log: log})
	if err != nil {
		return fmt.Errorf("local clickhouse: %w", err)
	}
	defer chsrv.Stop()
	cfg.Processors.ClickHouse.Addr = chsrv.Addr()
	chconn, err := clickhouse.Setup(ctx, cfg.Processors.ClickHouse, log)
	if err != nil {
		return err
	}
	defer chconn.Close()

	// Without a kubeconfig the local cluster is dry-run: every decision is
	// made and recorded, none applied.
	cfg.Processors.Kube.Clusters = []clusters.Cluster{{
		Name: cfg.Dev.Cluster, Kubeconfig: cfg.Dev.Kubeconfig, DryRun: cfg.Dev.Kubeconfig == "",
	}}
	// One process is the only janitor: no Lease to hold (nor its
	// namespace to ask of the local cluster).
	cfg.Processors.Janitor.LeaderElection = false
	if err := cfg.Processors.Validate(); err != nil {
		return err
	}
	roles, _ := cfg.Processors.Selected()
	admin, err := kafka.NewClient(cfg.Kafka, log)
	if err != nil {
		return err
	}
	defer admin.Close()

	reg := newRegistry(Config{}) // the embedded servers: no TLS
	fl, err := fleet.New(chconn, log, fleet.Options{})
	if err != nil {
		return err
	}
	gw, err := gateway.New(cfg.Gateway, cfg.Kafka, log, reg, gateway.Options{
		History: history.New(chconn, log),
		Fleet:   fl,
		Conformance: &conformance.Scorer{Staleness: cfg.Processors.Conformance.Staleness,
			Conn: func(context.Context) (clickhouse.Conn, error) { return chconn, nil }},
		Ready: []gateway.ReadyCheck{
			{Name: "clickhouse", Check: chconn.Ping},
			{Name: "processors", Check: groupsReady(admin, roles)},
		},
	})
	if err != nil {
		return err
	}
	if err := gw.Listen(); err != nil {
		return err
	}
	tokenPath := filepath.Join(cfg.Dev.Dir, "dev-token")
	mode := "dry-run (no --dev.kubeconfig): actions are decided and recorded, none applied"
	if cfg.Dev.Kubeconfig != "" {
		mode = "acting through " + cfg.Dev.Kubeconfig
	}
	fmt.Fprintf(stdout, "faultline dev\n  REST        http://%s   (agent token in %s, operator token in %s)\n  gRPC        %s\n  Kafka       %s (embedded)\n  ClickHouse  %s (database %s)\n  cluster     %s: %s\n",
		gw.HTTPAddr(), tokenPath, filepath.Join(cfg.Dev.Dir, "operator-token"), gw.GRPCAddr(), cfg.Kafka.Brokers, chsrv.Addr(), cfg.Processors.ClickHouse.Database, cfg.Dev.Cluster, mode)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return gw.Run(gctx) })
	g.Go(func() error {
		return processors.Run(gctx, cfg.Processors, processors.Deps{
			Log: log, Registry: reg, Kafka: cfg.Kafka, Metrics: pipeline.NewMetrics(reg),
		})
	})
	var sim fleetsim.Stats
	if cfg.Dev.FleetNodes > 0 {
		token, err := os.ReadFile(tokenPath)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  fleet       %d simulated nodes sending %g events/s (--dev.fleet-nodes=0 turns it off)\n", cfg.Dev.FleetNodes, cfg.Dev.FleetRate)
		g.Go(func() error {
			return fleetsim.Run(gctx, fleetsim.Options{
				GRPCAddr: gw.GRPCAddr(), Token: strings.TrimSpace(string(token)),
				Nodes: cfg.Dev.FleetNodes, EventsPerSecond: cfg.Dev.FleetRate,
			}, &sim, log)
		})
	}
	g.Go(func() error { return summarize(gctx, cfg.Kafka, log, stdout, &sim) })
	return g.Wait()
}

// groupsReady reports whether every role's consumer group has a member.
func groupsReady(admin *kgo.Client, roles []processors.Role) func(context.Context) error {
	adm := kadm.NewClient(admin)
	return func(ctx context.Context) error {
		groups := make([]string, 0, len(roles))
		for _, r := range roles {
			if !r.NoGroup {
				groups = append(groups, "faultline-"+r.Name)
			}
		}
		described, err := adm.DescribeGroups(ctx, groups...)
		if err != nil {
			return err
		}
		var missing []string
		for _, gr := range groups {
			if d, ok := described[gr]; !ok || d.Err != nil || len(d.Members) == 0 {
				missing = append(missing, strings.TrimPrefix(gr, "faultline-"))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not yet consuming: %s", strings.Join(missing, ", "))
		}
		return nil
	}
}

// devTokens returns the local cluster's agent token (Dir/dev-token: it
// reports events) and operator token (Dir/operator-token: it may also
// override the safety policy), creating them on first start, and writes
// the tokens file the gateway reads. Every file is mode 0600.
func devTokens(c DevConfig) (agent, operator string, err error) {
	if agent, err = devToken(filepath.Join(c.Dir, "dev-token")); err != nil {
		return "", "", err
	}
	if operator, err = devToken(filepath.Join(c.Dir, "operator-token")); err != nil {
		return "", "", err
	}
	if agent == operator {
		return "", "", fmt.Errorf("%s and %s hold the same token: remove one", filepath.Join(c.Dir, "dev-token"), filepath.Join(c.Dir, "operator-token"))
	}
	lines := fmt.Sprintf("# written by faultline dev: token,cluster,role\n%s,%s,agent\n%s,%s,operator\n", agent, c.Cluster, operator, c.Cluster)
	if err := writePrivate(filepath.Join(c.Dir, "tokens"), lines); err != nil {
		return "", "", fmt.Errorf("write tokens file: %w", err)
	}
	return agent, operator, nil
}

// devToken reads the token in path, creating a random one first.
func devToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		raw := make([]byte, 24)
		if _, err := rand.Read(raw); err != nil {
			return "", err
		}
		b = []byte(hex.EncodeToString(raw))
		if err := writePrivate(path, string(b)+"\n"); err != nil {
			return "", fmt.Errorf("write token: %w", err)
		}
	} else if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil { // an older file may be wider
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// writePrivate writes a file only its owner can read.
func writePrivate(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600) // WriteFile keeps an existing file's mode
}
