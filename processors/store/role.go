package store

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/internal/clickhouse"
)

// Open is what the role does at start: connect to ClickHouse (waiting for
// it while it is unreachable), apply the migrations (a failed migration
// stops start-up with the file and the error), start retention, and return
// the handler. The closer stops retention and closes the connection.
func Open(ctx context.Context, chCfg clickhouse.Config, cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Handler, io.Closer, error) {
	log = log.With("role", "store")
	conn, err := clickhouse.SetupWait(ctx, chCfg, log)
	if err != nil {
		return nil, nil, err
	}
	m := NewMetrics(reg)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunRetention(rctx, conn, chCfg.Database, cfg, m, log, time.Now)
	}()
	return New(conn, log, m), closerFunc(func() error {
		stop()
		<-done
		return conn.Close()
	}), nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
