package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestMetricsServerBounded: metrics_addr (any pod reaches it on the
// node's address) closes a connection after its answer, and past maxConns
// a new connection waits until one ends, then is served. Before, the
// server had only a header timeout: a connection stayed open for ever
// after one GET /healthz, and thousands of them took the agent's memory.
func TestMetricsServerBounded(t *testing.T) {
	a, err := New(testConfig(t, "127.0.0.1:1"), quiet(), Options{Checks: []Scheduled{}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.spool.Close()
	a.started = time.Now()
	lim := serverLimits{readHeader: 300 * time.Millisecond, read: 300 * time.Millisecond, write: time.Second, idle: 300 * time.Millisecond, maxConns: 2}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.serveMetrics(ctx, ln, lim) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serveMetrics: %v", err)
		}
	}()
	addr := ln.Addr().String()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	// Keep-alive clients: one GET /healthz each, then nothing; each
	// connection is closed by the server (the next one would otherwise
	// wait behind the first maxConns).
	for i := range 2*lim.maxConns + 1 {
		c := dial()
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(lim.idle + 3*time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d: healthz %d", i, resp.StatusCode)
		}
		if _, err := br.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d still open %v after its answer", i, lim.idle+3*time.Second)
		}
	}

	// maxConns connections that never finish their request: another
	// waits for one of them to time out, then is served.
	began := time.Now()
	for range lim.maxConns {
		if _, err := io.WriteString(dial(), "GET /healthz HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	hc := &http.Client{Transport: &http.Transport{}, Timeout: lim.read + 3*time.Second}
	resp, err := hc.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("with %d connections stalled: %v", lim.maxConns, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	if took := time.Since(began); took < lim.read/2 {
		t.Fatalf("served after %v with %d connections stalled: no connection limit", took, lim.maxConns)
	}
}
