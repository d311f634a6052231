package gateway

import (
	"bytes"
	"context"
	"errors"
	"github.com/faultline/faultline/internal/connlimit"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInflight: reservations count against their connection and the
// gateway, refuse what does not fit, and give everything back.
func TestInflight(t *testing.T) {
	f := newInflight(100, 60, 100, 1000)
	c1, c2 := f.connContext(context.Background()), f.connContext(context.Background())
	a := mustReserve(t, f, c1, 50)
	if _, err := f.reserve(c1, 20, 0); !errors.Is(err, errConnBusy) {
		t.Fatalf("70 bytes on a connection of 60: %v, want errConnBusy", err)
	}
	b := mustReserve(t, f, c2, 50)
	if _, err := f.reserve(context.Background(), 1, 0); !errors.Is(err, errBusy) || errors.Is(err, errConnBusy) {
		t.Fatalf("101 bytes held of a total of 100: %v, want errBusy (the gateway's)", err)
	}
	a.shrink(10) // a message smaller than reserved
	c := mustReserve(t, f, c1, 40)
	a.release()
	a.release() // idempotent
	b.release()
	if got := f.inUse(); got != 40 {
		t.Fatalf("%d bytes held with one reservation of 40 left", got)
	}
	c.release()
	mustReserve(t, f, context.Background(), 100).release() // whole again

	// A window leaves room for a read: 40 bytes kept free.
	w := mustReserve(t, f, c1, 30)
	if _, err := f.reserve(c2, 40, 40); !errors.Is(err, errBusy) {
		t.Fatalf("a reservation leaving 30 of the 40 bytes to keep free: %v, want errBusy", err)
	}
	if err := w.grow(30); err != nil { // a read may use what windows leave
		t.Fatalf("a read into the bytes kept free: %v", err)
	}
}

// TestInflightWindowBesideARead: the bytes a call holds while its message
// is read are the room windows leave, in use: a window that leaves room
// for a read beside the other windows is admitted on a connection where a
// read is under way (it was refused: a client's calls on one connection
// were refused whenever one of them was read), up to the budgets' whole.
// Once the message is decoded the windows leave room for a read again.
func TestInflightWindowBesideARead(t *testing.T) {
	// The shipped shape, scaled down: a budget of 80 per connection, reads
	// of 40 (max_body_bytes), windows of 10 keeping 30 free.
	const perConn, body, window = 80, 40, 10
	f := newInflight(1000, perConn, 1000, 1000)
	conn := f.connContext(context.Background())
	win := func() (*reservation, error) { return f.reserve(conn, window, body-window) }
	reader, err := win()
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.takeRead(conn, readShareKey{caller: "x"}, body-window, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := reader.grow(body - window); err != nil { // its message is read: 40 held
		t.Fatal(err)
	}
	var windows []*reservation
	for i := range 4 { // 40 + 4 × 10 = 80: the connection's whole
		r, err := win()
		if err != nil {
			t.Fatalf("window %d beside a read (%d held, %d of it reading): %v", i+1, f.inUse(), f.reading, err)
		}
		windows = append(windows, r)
	}
	if _, err := win(); !errors.Is(err, errConnBusy) {
		t.Fatalf("a window past the connection's 80 bytes: %v, want errConnBusy", err)
	}
	reader.shrink(5) // decoded: a message of 5 held until answered
	if f.reading != 0 || f.inUse() != 45 {
		t.Fatalf("after the decode: %d held, %d reading; want 45, 0", f.inUse(), f.reading)
	}
	if _, err := win(); !errors.Is(err, errConnBusy) {
		t.Fatalf("a window that leaves less than a read's room beside 45 bytes: %v, want errConnBusy", err)
	}
	windows[0].release()
	if err := windows[1].grow(body - window); err != nil { // the next read has its room
		t.Fatalf("a read beside the other windows: %v", err)
	}
	for _, r := range append(windows, reader) {
		r.release()
	}
	if f.inUse() != 0 || f.reading != 0 {
		t.Fatalf("%d held, %d reading after every call was done", f.inUse(), f.reading)
	}
}

func mustReserve(t *testing.T, f *inflight, ctx context.Context, n int64) *reservation {
	t.Helper()
	r, err := f.reserve(ctx, n, 0)
	if err != nil {
		t.Fatalf("%d bytes refused: %v (%d held)", n, err, f.inUse())
	}
	return r
}

// TestInflightReadShare: one credential's calls hold at most its read
// share for messages being read, in turn; another credential's calls are
// not held back by it; a share is given back when the message is decoded
// (shrink) or the call released, and dropped once nobody uses it.
func TestInflightReadShare(t *testing.T) {
	f := newInflight(1000, 1000, 100, 0)
	ctx := context.Background()
	a, b, c := mustReserve(t, f, ctx, 10), mustReserve(t, f, ctx, 10), mustReserve(t, f, ctx, 10)
	if err := a.takeRead(ctx, readShareKey{caller: "x"}, 60, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.takeRead(ctx, readShareKey{caller: "x"}, 60, 20*time.Millisecond); !errors.Is(err, errCallerBusy) {
		t.Fatalf("120 bytes of a share of 100: %v, want errCallerBusy", err)
	}
	if err := c.takeRead(ctx, readShareKey{caller: "y"}, 60, 20*time.Millisecond); err != nil {
		t.Fatalf("another credential's read: %v", err)
	}
	got := make(chan error)
	go func() { got <- b.takeRead(ctx, readShareKey{caller: "x"}, 60, 5*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	a.shrink(10) // a's message decoded: its read share is given back
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("a waiting read after the share was given back: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting read did not get the share given back")
	}
	b.release()
	c.release()
	a.release()
	if n := len(f.reads); n != 0 {
		t.Fatalf("%d read shares kept after every call was done", n)
	}
	d := mustReserve(t, f, ctx, 0)
	if err := d.takeRead(ctx, readShareKey{caller: "x"}, 100, 20*time.Millisecond); err != nil {
		t.Fatalf("the whole share after every call was done: %v", err)
	}
	d.release()
	if err := d.takeRead(ctx, readShareKey{caller: "x"}, 10, time.Second); !errors.Is(err, errReleased) {
		t.Fatalf("a read on a released reservation: %v, want errReleased", err)
	}
	if n := len(f.reads); n != 0 {
		t.Fatalf("%d read shares kept after a released reservation's read", n)
	}
}

// TestReadReserved: a body is held in the budget as it is read, chunk by
// chunk; a body past the budget or the size limit is refused.
func TestReadReserved(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 200<<10)
	f := newInflight(1<<20, 1<<20, 1<<20, 0)
	res := mustReserve(t, f, f.connContext(context.Background()), 0)
	got, err := readReserved(bytes.NewReader(body), -1, 1<<20, res)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if res.n < int64(len(body)) || res.n > 2*int64(len(body)) {
		t.Fatalf("reservation %d for a %d-byte body", res.n, len(body))
	}
	res.release()

	if _, err := readReserved(bytes.NewReader(body), -1, 100<<10, mustReserve(t, f, context.Background(), 0)); !errors.Is(err, errTooLarge) {
		t.Fatalf("a 200 KiB body with a 100 KiB limit: %v", err)
	}
	small := newInflight(128<<10, 128<<10, 128<<10, 0)
	if _, err := readReserved(bytes.NewReader(body), -1, 1<<20, mustReserve(t, small, context.Background(), 0)); !errors.Is(err, errBusy) {
		t.Fatalf("a 200 KiB body in a 128 KiB budget: %v", err)
	}
	// A body that stalls holds only what it sent, rounded up to a chunk.
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte(strings.Repeat("y", 10))) }()
	res = mustReserve(t, small, context.Background(), 0)
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
	ln := connlimit.Listener(raw, 0, 2, func(_ string, total bool) { refused <- total })
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
	f := newInflight(100, 100, 100, 0)
	conn := f.connContext(context.Background())
	a := mustReserve(t, f, conn, 80)
	w := mustReserve(t, f, conn, 10)
	got := make(chan error)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got <- w.growWait(ctx, 50)
	}()
	time.Sleep(20 * time.Millisecond)
	mustReserve(t, f, conn, 5).release() // fits while another waits
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
	f := newInflight(100, 100, 100, 0)
	conn := f.connContext(context.Background())
	mustReserve(t, f, context.Background(), 90)
	w := mustReserve(t, f, conn, 10)
	// The CPU is the whole process's: the garbage of earlier tests and
	// their goroutines winding down count too. So each try starts after a
	// GC, and up to three tries are made: a wait that spins uses its
	// 500 ms in every try, noise does not come back each time.
	var used []time.Duration
	for range 3 {
		runtime.GC()
		before := cpuTime(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := w.growWait(ctx, 50)
		cancel()
		if !errors.Is(err, errBusy) {
			t.Fatalf("growWait: %v, want errBusy", err)
		}
		if used = append(used, cpuTime(t)-before); used[len(used)-1] <= 100*time.Millisecond {
			return
		}
	}
	t.Fatalf("a 500 ms wait for the budget used %v of CPU (three tries)", used)
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
	f := newInflight(100, 100, 100, 0)
	conn := f.connContext(context.Background())
	hog := mustReserve(t, f, conn, 90)
	w := mustReserve(t, f, conn, 10)
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
	mustReserve(t, f, conn, 100).release() // the budget is whole again
}

// TestInflightHoldDecoded: decoded events are held in their own budget,
// beside a reservation's request bytes, never past it (errDecoded, what
// was held kept), and given back when the reservation is released; a
// released reservation holds no more.
func TestInflightHoldDecoded(t *testing.T) {
	f := newInflight(100, 100, 100, 1000)
	ctx := f.connContext(context.Background())
	a, b := mustReserve(t, f, ctx, 50), mustReserve(t, f, ctx, 50)
	if err := a.holdDecoded(700); err != nil {
		t.Fatal(err)
	}
	if err := a.holdDecoded(600); err != nil { // less than it holds: nothing more
		t.Fatal(err)
	}
	if err := b.holdDecoded(400); !errors.Is(err, errDecoded) || !errors.Is(err, errBusy) {
		t.Fatalf("400 beside 700 of 1000: %v, want errDecoded", err)
	}
	if err := b.holdDecoded(300); err != nil {
		t.Fatal(err)
	}
	if held, decoded := f.inUse(), f.decodedInUse(); held != 100 || decoded != 1000 {
		t.Fatalf("%d request bytes, %d decoded held; want 100, 1000", held, decoded)
	}
	a.release()
	a.release()
	if err := a.holdDecoded(10); !errors.Is(err, errReleased) {
		t.Fatalf("a released reservation grew: %v", err)
	}
	if held, decoded := f.inUse(), f.decodedInUse(); held != 50 || decoded != 300 {
		t.Fatalf("after a's release: %d request bytes, %d decoded held; want 50, 300", held, decoded)
	}
	b.release()
	if held, decoded := f.inUse(), f.decodedInUse(); held != 0 || decoded != 0 {
		t.Fatalf("after every release: %d request bytes, %d decoded held", held, decoded)
	}
}
