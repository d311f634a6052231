package main

import (
	"context"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/testenv"
)

// TestSmoke runs the benchmark at a tiny size on a real ClickHouse server,
// so that it cannot rot between the runs that measure: it fails on an
// error, a panic, or a shipped rule that no phase evaluated.
func TestSmoke(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := run(ctx, []string{"--clickhouse.addr", ch.Addr(), "--history", "20000", "--events", "2000", "--batch", "500",
		"--nodes", "50"}); err != nil {
		t.Fatal(err)
	}
}
