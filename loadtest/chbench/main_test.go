package main

import (
	"context"
	"io"
	"os"
	"strings"
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
		out := stdout(t, func() error {
			return run(ctx, []string{"window", "--clickhouse.addr", ch.Addr(), "--events", "20000", "--nodes", "100",
				"--queries", "5", "--rule-queries", "1"})
		})
		// The history figures time internal/history in this process: no
		// HTTP, auth or JSON, and the labels say so.
		for _, want := range []string{"internal/history ListEvents (in-process; no HTTP/auth/JSON)", "internal/history ListEvents, no node (in-process; no HTTP/auth/JSON)"} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q figure in:\n%s", want, out)
			}
		}
		if strings.Contains(out, "GET /v1/events") {
			t.Errorf("a figure names the HTTP API it does not call:\n%s", out)
		}
	})
	t.Run("store", func(t *testing.T) {
		k := testenv.StartKafka(t)
		if err := run(ctx, []string{"store", "--clickhouse.addr", ch.Addr(), "--kafka", k.Addr(), "--events", "5000"}); err != nil {
			t.Fatal(err)
		}
	})
}

// stdout runs f and returns what it printed to os.Stdout (also logged),
// failing the test on f's error.
func stdout(t *testing.T, f func() error) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	err = f()
	os.Stdout = saved
	w.Close()
	out := string(<-done)
	t.Log(out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
