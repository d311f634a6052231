package relay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/nvsentinel"
	"github.com/faultline/faultline/schemas/validate"
)

// stallConn is a raw HTTP/2 client of the relay that opens streams calls
// of HealthEventOccurredV1, each announcing a message of about
// MaxMessageBytes, and sends all of each but its last byte, as fast as
// the relay's flow-control windows let it.
type stallConn struct {
	c  net.Conn
	fr *http2.Framer
}

func dialStall(t *testing.T, socket string) *stallConn {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return &stallConn{c: c, fr: fr}
}

// stall opens streams calls and sends what the windows let it until the
// relay grants no more for 500 ms (or 5 s pass); it returns the bytes
// sent.
func (s *stallConn) stall(t *testing.T, streams int) int {
	t.Helper()
	const msgLen = relay.MaxMessageBytes - 64
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: datamodels.PlatformConnector_HealthEventOccurredV1_FullMethodName},
		{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	initWin, connWin := int64(65535), int64(65535)
	win, left := map[uint32]int64{}, map[uint32]int{}
	for i := range streams {
		id := uint32(2*i + 1)
		if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		win[id], left[id] = initWin, 5+msgLen-1
	}
	prefix := make([]byte, 5)
	binary.BigEndian.PutUint32(prefix[1:], msgLen)
	chunk := make([]byte, 16<<10)
	sent := 0
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		progress := false
		for id, n := range left {
			k := int(min(int64(n), win[id], connWin, int64(len(chunk))))
			if k <= 0 {
				continue
			}
			b := chunk[:k]
			if n == 5+msgLen-1 { // the message's prefix first
				b = append(append([]byte{}, prefix...), chunk[:k-5]...)
			}
			if err := s.fr.WriteData(id, false, b); err != nil {
				return sent // the relay dropped the connection
			}
			left[id] -= k
			win[id] -= int64(k)
			connWin -= int64(k)
			sent += k
			progress = true
		}
		if progress {
			continue
		}
		_ = s.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		f, err := s.fr.ReadFrame()
		if err != nil {
			if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
				break // stalled: the relay grants no more
			}
			return sent
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				for id := range win {
					win[id] += int64(v) - initWin
				}
				initWin = int64(v)
			}
			_ = s.fr.WriteSettingsAck()
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connWin += int64(f.Increment)
			} else {
				win[f.StreamID] += int64(f.Increment)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = s.fr.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			delete(left, f.StreamID)
		case *http2.HeadersFrame: // answered (refused)
			if f.StreamEnded() {
				delete(left, f.StreamID)
			}
		case *http2.GoAwayFrame:
			return sent
		}
	}
	_ = s.c.SetReadDeadline(time.Time{})
	return sent
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestRelayBoundsStalledCalls: clients that open every call a connection
// allows, each announcing a message of 4 MiB and sending all of it but
// its last byte, make the relay hold a bounded amount of memory (each had
// it hold 64 MiB per connection, for good: two connections were past the
// agent's 128 MiB limit, and the agent was OOM-killed with all its
// checks). A monitor's call meanwhile is answered, taken or refused
// Unavailable (which NVSentinel's monitors and the preflight checks
// resend), never left hanging; once the stalled clients are gone it is
// taken.
func TestRelayBoundsStalledCalls(t *testing.T) {
	f := start(t, 1<<20)
	before := heapInUse()
	var conns []*stallConn
	sent := 0
	for range 3 {
		c := dialStall(t, f.socket)
		conns = append(conns, c)
		sent += c.stall(t, 16)
	}
	grown := int64(heapInUse()) - int64(before)
	t.Logf("stalled clients sent %.1f MiB; the heap in use grew %.1f MiB", float64(sent)/(1<<20), float64(grown)/(1<<20))
	if grown > 32<<20 {
		t.Errorf("the heap in use grew %d MiB while clients stalled their calls, want at most 32 MiB (the agent's limit is 128 MiB)", grown>>20)
	}

	start := time.Now()
	err := f.send(t, xid("gpu-node-42", "meanwhile"))
	if c := status.Code(err); c != codes.OK && c != codes.Unavailable {
		t.Errorf("a monitor's call while clients stall theirs: %v, want it taken or refused Unavailable", err)
	}
	t.Logf("a monitor's call meanwhile: %v", err)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a monitor's call was answered after %v", d)
	}

	for _, c := range conns {
		c.c.Close()
	}
	var last error
	for range 50 {
		if last = f.send(t, xid("gpu-node-42", "after")); status.Code(last) != codes.Unavailable {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("a monitor's call after the stalled clients left: %v", last)
	}
}

// TestRelayCapsConnections: a connection past relay.MaxConns is closed as
// soon as it is accepted (the client sees it closed, and resends); once
// one goes, the relay serves a new one.
func TestRelayCapsConnections(t *testing.T) {
	f := start(t, 1<<20)
	if err := f.send(t, xid("gpu-node-42", "connected")); err != nil { // the monitor's connection, one of them
		t.Fatal(err)
	}
	dial := func() net.Conn {
		c, err := net.Dial("unix", f.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// served reports whether the relay answers c's HTTP/2 preface with its
	// settings, or closes it.
	served := func(c net.Conn) bool {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
			return false
		}
		fr := http2.NewFramer(c, c)
		_ = fr.WriteSettings()
		_, err := fr.ReadFrame()
		return err == nil
	}
	var conns []net.Conn
	for range relay.MaxConns - 1 {
		conns = append(conns, dial())
	}
	if !served(conns[0]) {
		t.Fatal("a connection within relay.MaxConns was not served")
	}
	if served(dial()) {
		t.Fatal("a connection past relay.MaxConns was served")
	}
	conns[0].Close()
	var ok bool
	for range 50 {
		if ok = served(dial()); ok {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !ok {
		t.Fatal("no connection served after one of relay.MaxConns closed")
	}
}

// slowSpool takes one call at a time, each in about a second (a slow
// disk), until closed.
type slowSpool struct {
	mu   sync.Mutex
	done chan struct{}
}

func (s *slowSpool) AppendAll([]*datamodels.HealthEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-time.After(time.Second):
		return nil
	case <-s.done:
		return errors.New("closed")
	}
}

// serveSlow serves a relay over a slowSpool until the test ends, and
// returns its socket.
func serveSlow(t *testing.T) string {
	t.Helper()
	sp := &slowSpool{done: make(chan struct{})}
	socket := filepath.Join(t.TempDir(), "nvsentinel.sock")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := relay.New(relay.Config{Socket: socket, SystemUUID: machine}, "gpu-node-42", sp, log, prometheus.NewRegistry(), func() time.Time { return testNow })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() { close(sp.done); cancel(); <-served })
	return socket
}

// bigBatch is the largest call the relay takes: MaxBatch events, their
// messages as long as keeps the call within MaxMessageBytes.
func bigBatch(t *testing.T) []byte {
	t.Helper()
	evs := make([]nvsentinel.Event, relay.MaxBatch)
	var b []byte
	for n := validate.MaxMessageLen; n > 0; n -= 16 {
		for i := range evs {
			evs[i] = xid("gpu-node-42", strings.Repeat("x", n))
		}
		if b = nvsentinel.Encode(1, evs); len(b) <= relay.MaxMessageBytes {
			return b
		}
	}
	t.Fatal("no batch within MaxMessageBytes")
	return nil
}

// TestRelayBoundsCallsWaitingForTheSpool: complete, valid calls of the
// largest size, sent faster than a slow spool keeps them (one at a time,
// a second each), make the relay hold a bounded amount of memory (each
// decoded call waited for the spool outside the read budget: 4
// connections of 16 such calls grew the heap 268 MiB, past the agent's
// 128 MiB limit). Calls past the budget are refused Unavailable (resent)
// or wait, none past their deadline; a monitor's small call meanwhile is
// taken or refused Unavailable.
func TestRelayBoundsCallsWaitingForTheSpool(t *testing.T) {
	socket := serveSlow(t)

	msg := bigBatch(t) // shared by every call: the clients hold no copy
	before := heapInUse()
	const conns, calls = 4, 16
	var mons []*nvsentinel.Monitor
	for range conns {
		m, err := nvsentinel.Dial(socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		mons = append(mons, m)
	}
	start := time.Now()
	errs := make(chan error, conns*calls)
	for _, m := range mons {
		for range calls {
			go func() {
				cctx, ccancel := context.WithTimeout(context.Background(), 8*time.Second)
				defer ccancel()
				errs <- m.SendEncoded(cctx, msg)
			}()
		}
	}
	var grown int64
	for range 4 {
		time.Sleep(300 * time.Millisecond)
		grown = max(grown, int64(heapInUse())-int64(before))
	}
	small, err := nvsentinel.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 8*time.Second)
	err = small.Send(sctx, xid("gpu-node-42", "meanwhile"))
	scancel()
	if c := status.Code(err); c != codes.OK && c != codes.Unavailable {
		t.Errorf("a monitor's small call meanwhile: %v, want it taken or refused Unavailable", err)
	}
	t.Logf("a monitor's small call meanwhile: %v", err)
	got := map[codes.Code]int{}
	for range conns * calls {
		err := <-errs
		got[status.Code(err)]++
		if c := status.Code(err); c != codes.OK && c != codes.Unavailable {
			t.Errorf("a large call: %v, want it taken or refused Unavailable", err)
		}
	}
	t.Logf("%d calls of %.1f MiB: %v in %v; the heap in use grew %.1f MiB", conns*calls, float64(len(msg))/(1<<20), got, time.Since(start), float64(grown)/(1<<20))
	if grown > 48<<20 {
		t.Errorf("the heap in use grew %d MiB while calls waited for the spool, want at most 48 MiB (the agent's limit is 128 MiB)", grown>>20)
	}
}

// TestRelaySmallCallsBesideAStalledRead: one client stalled mid-message
// holds a read's room; monitors' small calls, waiting for a slow spool,
// hold none of the budget, so each is read and taken in its turn. Held
// (a few KiB each), they left less than a read's room and all but the
// first were refused Unavailable.
func TestRelaySmallCallsBesideAStalledRead(t *testing.T) {
	socket := serveSlow(t)

	dialStall(t, socket).stall(t, 1)
	const monitors = 4 // a second each at the spool: within the calls' 8 s
	errs := make(chan error, monitors)
	for i := range monitors {
		m, err := nvsentinel.Dial(socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		go func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer ccancel()
			errs <- m.Send(cctx, xid("gpu-node-42", fmt.Sprintf("monitor %d", i)))
		}()
	}
	for range monitors {
		if err := <-errs; err != nil {
			t.Errorf("a monitor's small call beside a stalled read: %v, want it taken", err)
		}
	}
}
