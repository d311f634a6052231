package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/internal/protoshape"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// The gateway's doors, as metrics label them.
const (
	doorGRPC = "grpc"
	doorREST = "rest"
	doorUnix = "unix"
)

// grpcMaxHeaderListSize bounds the headers (metadata) of one gRPC call:
// they are read before the call is authenticated. 32 KiB is far more than
// a token and the usual metadata need.
const grpcMaxHeaderListSize = 32 << 10

// grpcStreamWindow is each gRPC stream's HTTP/2 flow-control window, fixed
// (no BDP estimation): what a client can send on a call before its
// handler starts reading the message, so all a call holds until then. The
// transport opens the window to the message's declared length only once
// the handler reads it, after the call's reservation grew to
// gateway.max_body_bytes (see tap and shapeChecked).
const grpcStreamWindow = 64 << 10

// The methods the gateway serves, and which of them ingest events (the
// only ones the node-local unix socket serves).
var (
	ingestMethods = map[string]bool{
		faultlinev1.Events_SubmitEvents_FullMethodName:                    true,
		datamodels.PlatformConnector_HealthEventOccurredV1_FullMethodName: true,
	}
	knownMethods = map[string]bool{
		faultlinev1.Events_SubmitEvents_FullMethodName:                    true,
		datamodels.PlatformConnector_HealthEventOccurredV1_FullMethodName: true,
		faultlinev1.Events_ListEvents_FullMethodName:                      true,
		faultlinev1.Events_ListActions_FullMethodName:                     true,
	}
)

// newGRPCServer builds the gRPC server of one door. Everything that costs
// memory is bounded before a call's message is read: the tap handle
// authenticates the call from its headers and the connection's verified
// client certificate, and reserves the call's bytes in the in-flight
// budget; the connection's streams, header size, message size, idle time
// and age are capped; the codec checks each message's shape before it
// decodes it.
func (s *Server) newGRPCServer(door string, tlsCfg *tls.Config) *grpc.Server {
	callGrace := s.cfg.CallTimeout + 5*time.Second
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(serverCodec{s.codec}),
		grpc.MaxRecvMsgSize(s.cfg.MaxBodyBytes),
		grpc.MaxConcurrentStreams(uint32(s.cfg.MaxStreamsPerConn)),
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(int32(min(max(s.cfg.MaxInflightBytesPerConn, grpcStreamWindow), 1<<30))),
		grpc.MaxHeaderListSize(grpcMaxHeaderListSize),
		grpc.ConnectionTimeout(s.cfg.ReadHeaderTimeout),
		grpc.InTapHandle(s.tap(door)),
		grpc.StatsHandler(connStats{s.flight}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			// Clients may ping every 20 s, also between calls; faster
			// pingers are disconnected (GOAWAY too_many_pings).
			MinTime: 20 * time.Second, PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     s.cfg.IdleTimeout,
			MaxConnectionAge:      s.cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: callGrace,
			Time:                  2 * time.Minute,  // ping a silent client, and drop it
			Timeout:               20 * time.Second, // when it does not answer
		}),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(recovery.WithRecoveryHandlerContext(s.recovered(door))),
			s.grpcMetrics(door), s.grpcAdmit),
	}
	if tlsCfg != nil {
		creds := credentials.NewTLS(tlsCfg)
		if s.peers != nil {
			creds = s.peers.creds(creds, door)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	g := grpc.NewServer(opts...)
	for _, sd := range []*grpc.ServiceDesc{&faultlinev1.Events_ServiceDesc, &datamodels.PlatformConnector_ServiceDesc} {
		g.RegisterService(s.shapeChecked(sd), s.svc)
	}
	return g
}

// recovered answers a call whose handler panicked Internal and logs the
// panic with its stack: that call fails, not the gateway (and with it, in
// `faultline dev`, every role) — as net/http does for the REST door.
func (s *Server) recovered(door string) recovery.RecoveryHandlerFuncContext {
	return func(_ context.Context, p any) error {
		s.log.Error("gateway: call panicked", "door", door, "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	}
}

// tap admits a call when its headers arrive, before its message is read:
// a known method, an authenticated caller (the unix socket's configured
// one, ingest only), room in the connection's and the gateway's in-flight
// budgets for what the call can hold before its handler reads the message
// (its stream's flow-control window, grpcStreamWindow; the reservation
// grows to gateway.max_body_bytes before the message is read, and the
// windows leave room for that). It runs on the connection's reader
// goroutine, so it only does map lookups, a hash and the in-flight
// budget's counters under its lock.
func (s *Server) tap(door string) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		method := info.FullMethodName
		refuse := func(code codes.Code, reason, msg string) (context.Context, error) {
			label := method
			if !knownMethods[method] {
				label = "other"
			}
			s.metrics.request(door, label, code.String())
			s.metrics.rejected(reason, 1)
			return nil, status.Error(code, msg)
		}
		if !knownMethods[method] {
			return refuse(codes.Unimplemented, "unknown_method", "unknown method")
		}
		var caller Caller
		if door == doorUnix {
			if !ingestMethods[method] {
				return refuse(codes.PermissionDenied, "ingest_only",
					"the node-local socket accepts events only; read the history through the gateway's gRPC or REST address")
			}
			caller = Caller{Cluster: s.cfg.UnixSocketCluster, Name: "unix-socket", Role: RoleAgent, Node: s.cfg.UnixSocketNode}
		} else {
			var authz string
			if v := info.Header.Get("authorization"); len(v) > 0 {
				authz = v[0]
			}
			var chains [][]*x509.Certificate
			if p, ok := peer.FromContext(ctx); ok {
				if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
					chains = ti.State.VerifiedChains
				}
			}
			c, err := s.auth.Authenticate(authz, chains)
			if err != nil {
				return refuse(codes.Unauthenticated, "unauthenticated", err.Error())
			}
			caller = c
		}
		window := int64(min(s.cfg.MaxBodyBytes, grpcStreamWindow))
		res, err := s.flight.reserve(ctx, window, int64(s.cfg.MaxBodyBytes)-window)
		if err != nil {
			reason, msg := busyRefusal(err)
			return refuse(codes.ResourceExhausted, reason, msg)
		}
		ctx, cancel := context.WithTimeout(withReservation(withCaller(ctx, caller), res), s.cfg.CallTimeout)
		context.AfterFunc(ctx, func() { cancel(); res.release() })
		return ctx, nil
	}
}

// sizer is a message that knows its encoded size without reflection.
type sizer interface{ SizeVT() int }

// grpcAdmit runs once the message is decoded: the call's caller is the
// one its tap handle authenticated, and its in-flight reservation shrinks
// from gateway.max_body_bytes to the message's size, and is given back as
// soon as the handler has answered (not when gRPC gets round to cancelling
// the call's context: a client's next call on the connection would find
// the bytes still held).
func (s *Server) grpcAdmit(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if _, ok := CallerFrom(ctx); !ok { // the tap handle always sets one
		return nil, status.Error(codes.Unauthenticated, ErrNoCredential.Error())
	}
	res := reservationFrom(ctx)
	defer res.release()
	if m, ok := req.(sizer); ok {
		res.shrink(int64(m.SizeVT()))
	} else if m, ok := req.(proto.Message); ok {
		res.shrink(int64(proto.Size(m)))
	}
	return h(ctx, req)
}

func (s *Server) grpcMetrics(door string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		s.metrics.request(door, info.FullMethod, status.Code(err).String())
		return resp, err
	}
}

// shapeChecked returns a copy of a generated service description whose
// handlers grow the call's in-flight reservation to gateway.max_body_bytes
// before the message is read (waiting up to readWait, then
// RESOURCE_EXHAUSTED when the connection's or the gateway's budget cannot
// take it: meanwhile the client's message stays behind its stream's
// window), decode each request through the codec's
// shape check, and answer a request with too many elements
// InvalidArgument, like the validator (the codec alone could only fail the
// decode, which gRPC answers as Internal, and a client would retry it
// forever).
func (s *Server) shapeChecked(sd *grpc.ServiceDesc) *grpc.ServiceDesc {
	return protoshape.ServiceDesc(sd, func(ctx context.Context, method string, sv *protoshape.Shaped, dec func(any) error) error {
		if err := s.growForRead(ctx, reservationFrom(ctx)); err != nil {
			if err := ctx.Err(); err != nil { // the call is over: not a refusal
				return status.FromContextError(err).Err()
			}
			caller, _ := CallerFrom(ctx)
			msg := s.refusedBusy(err, caller)
			s.metrics.request(doorOf(ctx), method, codes.ResourceExhausted.String())
			return status.Error(codes.ResourceExhausted, msg)
		}
		if err := dec(sv); err != nil {
			return err
		}
		if sv.DecodeErr != nil {
			s.metrics.rejected("invalid", 1)
			s.metrics.request(doorOf(ctx), method, codes.InvalidArgument.String())
			return status.Error(codes.InvalidArgument, "the message does not decode: "+sv.DecodeErr.Error())
		}
		if sv.Err != nil {
			s.metrics.rejected("too_many_elements", 1)
			s.metrics.request(doorOf(ctx), method, codes.InvalidArgument.String())
			return status.Error(codes.InvalidArgument, sv.Err.Error())
		}
		return nil
	})
}

// growForRead grows a call's reservation to gateway.max_body_bytes before
// its message is read: in its credential's read share first (in turn with
// the credential's other calls; from its address, for a credential not
// bound to a node: readShareKeyOf), then in the in-flight budgets, waiting
// up to readWait for each. It runs on the call's goroutine: while it
// waits the client's message stays behind the stream's window, which the
// reservation already holds. A call refused gives everything back at once.
func (s *Server) growForRead(ctx context.Context, res *reservation) error {
	if res == nil {
		return nil
	}
	caller, _ := CallerFrom(ctx)
	var addr net.Addr
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr
	}
	need := int64(s.cfg.MaxBodyBytes) - res.held()
	err := res.takeRead(ctx, readShareKeyOf(caller, addr), need, readWait)
	if err == nil {
		if err = res.grow(need); err != nil {
			wctx, cancel := context.WithTimeout(ctx, readWait)
			err = res.growWait(wctx, need)
			cancel()
		}
	}
	if err != nil {
		res.release()
	}
	return err
}

// doorOf names the door of a call for metrics from its peer.
func doorOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil && p.Addr.Network() == "unix" {
		return doorUnix
	}
	return doorGRPC
}
