package store

import (
	"context"
	"errors"
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
	var conn clickhouse.Conn
	backoff := 200 * time.Millisecond
	for {
		var err error
		conn, err = clickhouse.Setup(ctx, chCfg, log)
		if err == nil {
			break
		}
		if _, bad := errors.AsType[*clickhouse.MigrationError](err); bad || ctx.Err() != nil {
			return nil, nil, err
		}
		log.Warn("clickhouse not ready; retrying", "addr", chCfg.Addr, "backoff", backoff, "err", err)
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
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
