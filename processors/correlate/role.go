package correlate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/pipeline"
)

// Open is what the role does at start: compile the rules (a bad rule stops
// start-up naming the rule and field), connect to ClickHouse (waiting while
// it is unreachable; the schema is applied idempotently), and start the
// sweep, which produces with its own client. The closer stops the sweep and
// closes the connection.
func Open(ctx context.Context, chCfg clickhouse.Config, kcfg kafka.Config, cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Handler, io.Closer, error) {
	log = log.With("role", "correlate")
	rules, err := LoadRules(cfg.Rules)
	if err != nil {
		return nil, nil, err
	}
	if rules, err = cfg.applyShadow(rules); err != nil {
		return nil, nil, fmt.Errorf("correlate.shadow: %w", err)
	}
	conn, err := clickhouse.SetupWait(ctx, chCfg, log)
	if err != nil {
		return nil, nil, err
	}
	h := New(conn, rules, time.Now, cfg.CacheTTL, log, NewMetrics(reg))
	log.Info("correlation rules loaded", "rules", Names(rules))
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	if cfg.SweepInterval > 0 {
		cl, err := kafka.NewClient(kcfg, log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
		if err != nil {
			stop()
			conn.Close()
			return nil, nil, err
		}
		go func() {
			defer close(done)
			defer cl.Close()
			h.RunSweeps(sctx, cfg.SweepInterval, cl)
		}()
	} else {
		close(done)
	}
	return h, closerFunc(func() error {
		stop()
		<-done
		return conn.Close()
	}), nil
}

// RunSweeps runs Sweep every interval until ctx ends, producing what it
// returns. A failed sweep is logged and tried again at the next tick.
func (h *Handler) RunSweeps(ctx context.Context, interval time.Duration, p pipeline.Producer) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		recs, err := h.Sweep(ctx)
		if err == nil && len(recs) > 0 {
			err = p.ProduceSync(ctx, recs...).FirstErr()
		}
		if err != nil && ctx.Err() == nil {
			h.log.Warn("sweep failed; retrying at the next tick", "err", err)
		}
	}
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
