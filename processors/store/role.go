package store

import (
	"context"
	"runtime/debug"
	"time"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/role"
)

// Open is what the role does at start: connect to ClickHouse (waiting for
// it while it is unreachable, or while a migration statement fails on a
// lost connection or a timeout) and apply the migrations (a migration the
// server refuses stops start-up with the file and the error). The role is
// its consumer of Topics and the retention loop (RunRetention); closing it
// closes the connection.
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	deps = deps.WithDefaults()
	log := deps.Log.With("role", Role)
	conn, err := clickhouse.SetupWait(ctx, deps.ClickHouse, log)
	if err != nil {
		return nil, err
	}
	m := NewMetrics(deps.Registry)
	pc := cfg.Pipeline()
	if !pc.Overlap {
		log.Info("writing one batch at a time: the Go memory limit leaves no room for two",
			"gomemlimit_bytes", debug.SetMemoryLimit(-1), "two_need_bytes", OverlapMemory)
	}
	return &role.Role{
		Name:      Role,
		Consumers: []role.Consumer{{Pipeline: pc, Handler: New(conn, log, m)}},
		Loops: []role.Loop{{Name: "retention", Run: func(ctx context.Context) error {
			RunRetention(ctx, conn, deps.ClickHouse.Database, cfg, m, log, time.Now)
			return nil
		}}},
		Close: conn.Close,
	}, nil
}
