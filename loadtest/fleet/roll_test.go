package fleet

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// pushbackGateway answers RESOURCE_EXHAUSTED to the first calls of each
// event id (pushbacks of them) and accepts the next; it records when
// each id was first received.
type pushbackGateway struct {
	faultlinev1.UnimplementedEventsServer
	pushbacks int
	mu        sync.Mutex
	calls     map[string]int
	first     map[string]time.Time
}

func (g *pushbackGateway) SubmitEvents(_ context.Context, req *faultlinev1.SubmitEventsRequest) (*faultlinev1.SubmitEventsResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id := req.GetEvents()[0].GetId()
	if g.calls[id] == 0 {
		g.first[id] = time.Now()
	}
	g.calls[id]++
	if g.calls[id] <= g.pushbacks {
		return nil, status.Error(codes.ResourceExhausted, "pushed back")
	}
	return &faultlinev1.SubmitEventsResponse{}, nil
}

// TestSendPairClockFromFirstTry: a pair's second Xid 31 pushed back
// before it is accepted is timed from its first try, not from the try
// the gateway accepted.
func TestSendPairClockFromFirstTry(t *testing.T) {
	for _, pushbacks := range []int{0, 1, 3} {
		gw := &pushbackGateway{pushbacks: pushbacks, calls: map[string]int{}, first: map[string]time.Time{}}
		lis := bufconn.Listen(1 << 20)
		srv := grpc.NewServer()
		faultlinev1.RegisterEventsServer(srv, gw)
		go func() { _ = srv.Serve(lis) }()
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		e := &Env{TB: t, conns: []*grpc.ClientConn{conn}}
		var n atomic.Int64
		at, err := e.sendPair(context.Background(), "sim-00", "pair-0", 7, &n)
		conn.Close()
		srv.Stop()
		if err != nil {
			t.Fatalf("%d pushbacks: %v", pushbacks, err)
		}
		if got, want := n.Load(), int64(2*pushbacks); got != want {
			t.Errorf("%d pushbacks: counted %d, want %d", pushbacks, got, want)
		}
		first := gw.first["broker-roll-pair-7-1"]
		if first.IsZero() || at.After(first) {
			t.Errorf("%d pushbacks: sendPair's time %v after the second Xid's first try received at %v", pushbacks, at.Format(time.StampMicro), first.Format(time.StampMicro))
		}
	}
}
