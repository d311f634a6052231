package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInflight: reservations count against their connection, their
// credential and the gateway, refuse what does not fit (naming the
// credential's share when it is that), and give everything back.
func TestInflight(t *testing.T) {
	f := newInflight(100, 60, 70)
	c1, c2 := f.connContext(context.Background()), f.connContext(context.Background())
	a := mustReserve(t, f, c1, "x", 50)
	if _, err := f.reserve(c1, "y", 20); !errors.Is(err, errBusy) {
		t.Fatalf("70 bytes on a connection of 60: %v, want errBusy", err)
	}
	if _, err := f.reserve(c2, "x", 30); !errors.Is(err, errCallerBusy) {
		t.Fatalf("80 bytes for a credential of 70: %v, want errCallerBusy", err)
	}
	b := mustReserve(t, f, c2, "y", 50)
	if _, err := f.reserve(context.Background(), "z", 1); !errors.Is(err, errBusy) {
		t.Fatalf("101 bytes held of a total of 100: %v, want errBusy", err)
	}
	a.shrink(10) // a message smaller than reserved
	c := mustReserve(t, f, c1, "x", 40)
	a.release()
	a.release() // idempotent
	b.release()
	if got := f.inUse(); got != 40 {
		t.Fatalf("%d bytes held with one reservation of 40 left", got)
	}
	c.release()
	if got, shares := f.inUse(), len(f.callers); got != 0 || shares != 0 {
		t.Fatalf("after every release: %d bytes held, %d credentials' shares kept", got, shares)
	}
	mustReserve(t, f, context.Background(), "x", 70).release() // whole again
}

func mustReserve(t *testing.T, f *inflight, ctx context.Context, caller string, n int64) *reservation {
	t.Helper()
	r, err := f.reserve(ctx, caller, n)
	if err != nil {
		t.Fatalf("%d bytes for %s refused: %v (%d held)", n, caller, err, f.inUse())
	}
	return r
}

// TestReadReserved: a body is held in the budget as it is read, chunk by
// chunk; a body past the budget or the size limit is refused.
func TestReadReserved(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 200<<10)
	f := newInflight(1<<20, 1<<20, 1<<20)
	res := mustReserve(t, f, f.connContext(context.Background()), "x", 0)
	got, err := readReserved(bytes.NewReader(body), -1, 1<<20, res)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if res.n < int64(len(body)) || res.n > 2*int64(len(body)) {
		t.Fatalf("reservation %d for a %d-byte body", res.n, len(body))
	}
	res.release()

	if _, err := readReserved(bytes.NewReader(body), -1, 100<<10, mustReserve(t, f, context.Background(), "x", 0)); !errors.Is(err, errTooLarge) {
		t.Fatalf("a 200 KiB body with a 100 KiB limit: %v", err)
	}
	small := newInflight(128<<10, 128<<10, 128<<10)
	if _, err := readReserved(bytes.NewReader(body), -1, 1<<20, mustReserve(t, small, context.Background(), "x", 0)); !errors.Is(err, errBusy) {
		t.Fatalf("a 200 KiB body in a 128 KiB budget: %v", err)
	}
	shared := newInflight(1<<20, 1<<20, 128<<10)
	if _, err := readReserved(bytes.NewReader(body), -1, 1<<20, mustReserve(t, shared, context.Background(), "x", 0)); !errors.Is(err, errCallerBusy) {
		t.Fatalf("a 200 KiB body with a credential's share of 128 KiB: %v", err)
	}
	// A body that stalls holds only what it sent, rounded up to a chunk.
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte(strings.Repeat("y", 10))) }()
	res = mustReserve(t, small, context.Background(), "x", 0)
	done := make(chan struct{})
	go func() { _, _ = readReserved(pr, -1, 1<<20, res); close(done) }()
	time.Sleep(50 * time.Millisecond)
	res.mu.Lock()
	held := res.n
	res.mu.Unlock()
	if held > restReadChunk {
		t.Fatalf("a stalled body of 10 bytes holds %d", held)
	}
	pw.CloseWithError(errors.New("gone"))
	<-done
}

// TestLimitListener: connections past the per-address and total limits
// are closed as soon as they are accepted, and closing one frees its slot.
func TestLimitListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan bool, 10)
	ln := newLimitListener(raw, 0, 2, func(_ string, total bool) { refused <- total })
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	first, second := <-accepted, <-accepted
	third := dial()
	if total := <-refused; total {
		t.Fatal("refused for the total; want per address")
	}
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil {
		t.Fatal("the third connection from one address is open")
	}
	first.Close()
	dial()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("a slot freed by a close was not reused")
	}
	second.Close()
}

// TestInflightGrowWait: a call waiting to read its message gets the bytes
// as soon as another gives them back, does not make smaller requests that
// fit fail meanwhile, and gives up when its context is done.
func TestInflightGrowWait(t *testing.T) {
	f := newInflight(100, 100, 100)
	conn := f.connContext(context.Background())
	a := mustReserve(t, f, conn, "x", 80)
	w := mustReserve(t, f, conn, "x", 10)
	got := make(chan error)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got <- w.growWait(ctx, 50)
	}()
	time.Sleep(20 * time.Millisecond)
	mustReserve(t, f, conn, "x", 5).release() // fits while another waits
	a.shrink(30)
	if err := <-got; err != nil {
		t.Fatalf("growWait did not get the bytes given back: %v", err)
	}
	if w.held() != 60 {
		t.Errorf("held %d, want 60", w.held())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.growWait(ctx, 50); !errors.Is(err, errBusy) {
		t.Errorf("growWait for bytes the budget does not have: %v, want errBusy", err)
	}
	if w.held() != 60 {
		t.Errorf("after a failed wait: held %d, want 60", w.held())
	}
}

// TestInflightWaitIsIdle: a call waiting for the budget costs no CPU while
// nothing is given back. (The budget was three semaphores tried one after
// the other; a waiter refused by the total gave back its connection's
// bytes and woke every waiter, itself included, so each waiter spun for
// its whole wait.)
func TestInflightWaitIsIdle(t *testing.T) {
	f := newInflight(100, 100, 100)
	conn := f.connContext(context.Background())
	mustReserve(t, f, context.Background(), "hog", 90)
	w := mustReserve(t, f, conn, "x", 10)
	before := cpuTime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := w.growWait(ctx, 50); !errors.Is(err, errBusy) {
		t.Fatalf("growWait: %v, want errBusy", err)
	}
	if used := cpuTime(t) - before; used > 100*time.Millisecond {
		t.Fatalf("a 500 ms wait for the budget used %s of CPU", used)
	}
}

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestInflightReleasedForGood: a released reservation never holds bytes
// again — not by grow, nor by a growWait woken by its own release (the
// gRPC tap releases a call's bytes when its context ends, while the
// call's goroutine may still be waiting to read its message).
func TestInflightReleasedForGood(t *testing.T) {
	f := newInflight(100, 100, 100)
	conn := f.connContext(context.Background())
	hog := mustReserve(t, f, conn, "x", 90)
	w := mustReserve(t, f, conn, "x", 10)
	got := make(chan error)
	go func() { got <- w.growWait(context.Background(), 50) }()
	time.Sleep(20 * time.Millisecond)
	w.release() // wakes the waiter: 10 bytes given back
	hog.release()
	select {
	case err := <-got:
		if !errors.Is(err, errReleased) {
			t.Errorf("growWait on a released reservation: %v, want errReleased", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("growWait still waiting after its reservation was released")
	}
	if err := w.grow(10); !errors.Is(err, errReleased) {
		t.Errorf("grow on a released reservation: %v, want errReleased", err)
	}
	if held := f.inUse(); held != 0 {
		t.Errorf("%d bytes held after every reservation was released", held)
	}
	mustReserve(t, f, conn, "x", 100).release() // the budget is whole again
}
