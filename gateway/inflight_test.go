package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestInflight: reservations count against their connection and the
// gateway, refuse what does not fit, and give everything back.
func TestInflight(t *testing.T) {
	f := newInflight(100, 60)
	c1, c2 := f.connContext(context.Background()), f.connContext(context.Background())
	a := f.reserve(c1, 50)
	if a == nil {
		t.Fatal("50 of 60 on a fresh connection refused")
	}
	if f.reserve(c1, 20) != nil {
		t.Fatal("70 bytes held on a connection of 60")
	}
	b := f.reserve(c2, 50)
	if b == nil {
		t.Fatal("a second connection's 50 refused (100 in total)")
	}
	if f.reserve(context.Background(), 1) != nil {
		t.Fatal("101 bytes held of a total of 100")
	}
	a.shrink(10) // a message smaller than reserved
	if f.reserve(c1, 40) == nil {
		t.Fatal("after shrinking to 10, 40 more on the connection refused")
	}
	a.release()
	a.release() // idempotent
	b.release()
	if !f.total.TryAcquire(60) { // 40 still held by the last reservation
		t.Fatal("released bytes not given back")
	}
}

// TestReadReserved: a body is held in the budget as it is read, chunk by
// chunk; a body past the budget or the size limit is refused.
func TestReadReserved(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 200<<10)
	f := newInflight(1<<20, 1<<20)
	res := f.reserve(f.connContext(context.Background()), 0)
	got, err := readReserved(bytes.NewReader(body), -1, 1<<20, res)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if res.n < int64(len(body)) || res.n > 2*int64(len(body)) {
		t.Fatalf("reservation %d for a %d-byte body", res.n, len(body))
	}
	res.release()

	if _, err := readReserved(bytes.NewReader(body), -1, 100<<10, f.reserve(context.Background(), 0)); !errors.Is(err, errTooLarge) {
		t.Fatalf("a 200 KiB body with a 100 KiB limit: %v", err)
	}
	small := newInflight(128<<10, 128<<10)
	if _, err := readReserved(bytes.NewReader(body), -1, 1<<20, small.reserve(context.Background(), 0)); !errors.Is(err, errBusy) {
		t.Fatalf("a 200 KiB body in a 128 KiB budget: %v", err)
	}
	// A body that stalls holds only what it sent, rounded up to a chunk.
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte(strings.Repeat("y", 10))) }()
	res = small.reserve(context.Background(), 0)
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
	f := newInflight(100, 100)
	conn := f.connContext(context.Background())
	a := f.reserve(conn, 80)
	w := f.reserve(conn, 10)
	if a == nil || w == nil {
		t.Fatal("reservations that fit were refused")
	}
	got := make(chan bool)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got <- w.growWait(ctx, 50)
	}()
	time.Sleep(20 * time.Millisecond)
	if s := f.reserve(conn, 5); s == nil {
		t.Error("a reservation that fits was refused while another waits")
	} else {
		s.release()
	}
	a.shrink(30)
	if !<-got {
		t.Fatal("growWait did not get the bytes given back")
	}
	if w.held() != 60 {
		t.Errorf("held %d, want 60", w.held())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if w.growWait(ctx, 50) {
		t.Error("growWait got bytes the budget does not have")
	}
	if w.held() != 60 {
		t.Errorf("after a failed wait: held %d, want 60", w.held())
	}
}

// TestInflightReleasedForGood: a released reservation never holds bytes
// again — not by grow, nor by a growWait woken by its own release (the
// gRPC tap releases a call's bytes when its context ends, while the
// call's goroutine may still be waiting to read its message).
func TestInflightReleasedForGood(t *testing.T) {
	f := newInflight(100, 100)
	conn := f.connContext(context.Background())
	hog := f.reserve(conn, 90)
	w := f.reserve(conn, 10)
	got := make(chan bool)
	go func() { got <- w.growWait(context.Background(), 50) }()
	time.Sleep(20 * time.Millisecond)
	w.release() // wakes the waiter: 10 bytes given back
	hog.release()
	select {
	case ok := <-got:
		if ok {
			t.Error("growWait grew a released reservation")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("growWait still waiting after its reservation was released")
	}
	if w.grow(10) {
		t.Error("grow grew a released reservation")
	}
	if held := f.held.Load(); held != 0 {
		t.Errorf("%d bytes held after every reservation was released", held)
	}
	if !f.total.TryAcquire(100) {
		t.Error("the budget is not whole again")
	}
}
