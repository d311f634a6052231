// Package chtest gives tests a real ClickHouse server (internal/testenv)
// with faultline's schema applied.
package chtest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
)

// Server is a ClickHouse server started for a test, with faultline's
// migrations applied to Config.Database.
type Server struct {
	*testenv.ClickHouse
	// Config reaches the server's faultline database.
	Config clickhouse.Config
	// Conn is a connection to it, closed when the test ends.
	Conn clickhouse.Conn
}

// Start starts a server and applies the migrations.
func Start(tb testing.TB) *Server {
	tb.Helper()
	ch := testenv.StartClickHouse(tb)
	cfg := clickhouse.DefaultConfig()
	cfg.Addr = ch.Addr()
	cfg.Password = config.Secret{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := clickhouse.Setup(ctx, cfg, slog.Default())
	if err != nil {
		tb.Fatalf("chtest: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	return &Server{ClickHouse: ch, Config: cfg, Conn: conn}
}

// Count runs a query returning one unsigned number.
func Count(tb testing.TB, conn clickhouse.Conn, query string, args ...any) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n uint64
	if err := conn.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		tb.Fatalf("chtest: %s: %v", query, err)
	}
	return n
}
