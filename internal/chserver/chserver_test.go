package chserver_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
)

func TestStart(t *testing.T) {
	_, _, err := chserver.FindBinary()
	if !errors.Is(err, chserver.ErrNotInstalled) {
		err = nil
	}
	testenv.Server(t, "a ClickHouse server", err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	cfg := clickhouse.DefaultConfig()
	cfg.Addr, cfg.Password = srv.Addr(), config.Secret{}
	conn, err := clickhouse.Setup(ctx, cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	srv.Stop()
	select {
	case <-srv.Done():
	default:
		t.Fatal("server still running after Stop")
	}
	// A second start on the same directory finds the data.
	srv2, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Stop()
	cfg.Addr = srv2.Addr()
	conn, err = clickhouse.Open(ctx, cfg, slog.Default())
	if err != nil {
		t.Fatalf("database lost across restart: %v", err)
	}
	conn.Close()
}

func TestFindBinaryEnv(t *testing.T) {
	t.Setenv(chserver.BinEnv, filepath.Join(t.TempDir(), "nope"))
	if _, _, err := chserver.FindBinary(); !errors.Is(err, chserver.ErrNotInstalled) {
		t.Fatalf("err = %v, want ErrNotInstalled", err)
	}
}
