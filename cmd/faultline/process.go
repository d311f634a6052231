package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/pipeline"
)

// loadProcessConfig is `faultline process`'s configuration: defaults, the
// --config file, flags, validated.
func loadProcessConfig(args []string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	_, err := config.Load("faultline process", args, &cfg, func(fs *flag.FlagSet) {
		cfg.registerLogFlags(fs)
		cfg.Kafka.RegisterFlags(fs, "kafka.")
		cfg.Processors.RegisterFlags(fs)
		fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "address of /metrics, /healthz and /readyz (empty: off)")
	}, func() error {
		if err := cfg.Kafka.Validate("kafka."); err != nil {
			return err
		}
		return cfg.Processors.Validate()
	}, stderr, moved, config.NoArgs())
	return cfg, err
}

func runProcess(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, err := loadProcessConfig(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg)
	if err != nil {
		return err
	}
	if kube := cfg.Processors.Kube; len(kube.Clusters) > 0 {
		if names := kube.UnlistedDryRun(); len(names) > 0 {
			listed := make([]string, 0, len(kube.Clusters))
			for _, cl := range kube.Clusters {
				listed = append(listed, cl.Name)
			}
			log.Warn("kube.dry_run_clusters names clusters kube.clusters does not list: they are dry-run as any unlisted cluster is; a misspelt name leaves the cluster it meant live",
				"unlisted", names, "clusters", listed)
		}
	}
	reg := newRegistry(cfg)
	if err := kafka.CreatePipelineTopics(ctx, cfg.Kafka, log); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	// Ready once every role is open: a role waiting for ClickHouse (or
	// migrating it) is alive (/healthz) but not ready, so a rolling update
	// keeps the old pods until the new ones run.
	var opened atomic.Bool
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !opened.Load() {
				http.Error(w, "not ready: roles starting", http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok\n")
		})
		srv := &http.Server{Addr: cfg.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error { return serveErr(srv.ListenAndServe()) })
		g.Go(func() error {
			<-gctx.Done()
			return srv.Close()
		})
	}
	g.Go(func() error {
		return processors.Run(gctx, cfg.Processors, processors.Deps{
			Log: log, Registry: reg, Kafka: cfg.Kafka, Metrics: pipeline.NewMetrics(reg),
			Opened: func() { opened.Store(true) },
		})
	})
	return g.Wait()
}
