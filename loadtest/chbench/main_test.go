package main

import (
	"context"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/testenv"
)

// TestSmoke runs both benchmarks at a tiny size on real servers (a
// ClickHouse server, a Kafka broker), so that they cannot rot between the
// runs that measure: each fails on an error, a panic, or (store) events
// not all stored within the time allowed.
func TestSmoke(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Run("window", func(t *testing.T) {
		if err := run(ctx, []string{"window", "--clickhouse.addr", ch.Addr(), "--events", "20000", "--nodes", "100",
			"--queries", "5", "--rule-queries", "1"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("store", func(t *testing.T) {
		k := testenv.StartKafka(t)
		if err := run(ctx, []string{"store", "--clickhouse.addr", ch.Addr(), "--kafka", k.Addr(), "--events", "5000"}); err != nil {
			t.Fatal(err)
		}
	})
}
