// Package relay serves NVIDIA NVSentinel's ingestion service,
// datamodels.PlatformConnector/HealthEventOccurredV1, on a node-local unix
// socket of the faultline agent, so that NVSentinel's health monitors
// (syslog, GPU/DCGM, CSP, Kubernetes-object, NIC) run unchanged on a
// faultline node and get the agent's delivery guarantees.
//
// An accepted call means every event of it is in the agent's spool
// (fsync'd), from which the agent's sender delivers it to the gateway with
// the agent's own credential: nothing is lost while the gateway is down,
// events are resent in order, and each is stored once (it carries the
// idempotency key the gateway stores it under). Before accepting, the
// relay checks, as the gateway does, the shape of the call before decoding
// it (internal/protoshape) and each event (schemas/validate), and that it
// is for the agent's own node, and refuses the whole call otherwise,
// so that a monitor learns at once what can never be delivered. It stamps
// nothing the gateway owns (cluster, submitter, receivedTimestamp, the
// stored id): it only replaces a monitor's id with its own key — a hash
// of the event as the monitor sent it (events.OccurrenceID), so a
// monitor's resend of a call whose answer was lost is one event
// downstream (NVSentinel's monitors resend a call unchanged,
// commons/pkg/healthpub: up to 5 attempts on Unavailable,
// DeadlineExceeded, EOF or a reset connection) — and
// gives an event without generatedTimestamp the time the agent received
// it (and a new key), so an event that waits out a gateway outage keeps
// the time it happened. Each event is then given faultline's vocabulary
// where it reports what faultline's own checks do (nvsentinel.Normalize:
// the syslog monitor's Xid "31" is the kmsg check's "XID-31"), so the
// correlation rules count it.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/connlimit"
	"github.com/faultline/faultline/internal/protoshape"
	"github.com/faultline/faultline/internal/unixsock"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/nvsentinel"
	"github.com/faultline/faultline/schemas/validate"
)

// Config is where the relay listens.
type Config struct {
	// Socket is the unix socket's path (the agent's nvsentinel_socket;
	// "" is off). NVSentinel's monitors dial /var/run/nvsentinel.sock in
	// their containers.
	Socket string
	// Group is the group (name or numeric id) given the socket, created
	// mode 0660 (the agent's nvsentinel_socket_group; default the agent's
	// group). Membership of it is the credential of a monitor.
	Group string
	// Own maps the checkNames the agent's own enabled checks report to the
	// check ("SysLogsXIDError": "kmsg"). A monitor's event of one of them
	// is spooled STORE_ONLY: stored, neither counted by correlation nor
	// acted on. Both read the same facts (NVSentinel's syslog monitor and
	// the kmsg check the same kernel lines, its NIC monitor and the nic
	// check the same ports), each with its own time — the syslog monitor
	// stamps the time it polled the journal (every 30 min by default) —
	// so no key tells their two reports of one occurrence apart, and the
	// rules would count each occurrence twice (an Xid as two bursts, a
	// link-down as two downs). Nil: none.
	Own map[string]string
	// SystemUUID is the machine's, stamped on every relayed event
	// (events.MetaSystemUUID; "": none), as on the agent's own.
	SystemUUID string
}

// Keys are the agent's configuration keys of Config, named in errors.
var Keys = unixsock.Keys{Path: "nvsentinel_socket", Group: "nvsentinel_socket_group"}

// Spool is where accepted events go: all of a call's events, in order, or
// none (the agent's Spool.AppendAll).
type Spool interface {
	AppendAll(evs []*datamodels.HealthEvent) error
}

// Limits of one call.
const (
	// MaxBatch is the most events in one call (the gateway's default).
	MaxBatch = 1000
	// MaxMessageBytes is the largest call (the gateway's default
	// gateway.max_body_bytes).
	MaxMessageBytes = 4 << 20
	// maxStreams bounds the calls in progress on one connection.
	maxStreams = 16
	// maxFutureSkew is how far ahead of the agent's clock
	// generatedTimestamp may be (the gateway's default
	// gateway.max_future_skew). The relay cannot know the gateway's
	// setting or clock: an event it takes that the gateway then refuses
	// as in its future (a lower gateway.max_future_skew, the node's clock
	// ahead) is not lost, the agent's sender resends it with the
	// gateway's receive time, the monitor's kept in its metadata
	// (events.MetaAgentGeneratedAt).
	maxFutureSkew = 5 * time.Minute
	// MinSpoolBytes is the least agent spool (spool.max_bytes) that can
	// hold the largest call the relay takes, non-fatal, when empty: below
	// the 90% of it that non-fatal events may fill, MaxMessageBytes and,
	// for each of up to MaxBatch events, the spool's record header and
	// what the relay stamps (the id, the system UUID). A call larger than
	// a smaller spool holds would be refused as Unavailable ("resend
	// later") at every resend.
	MinSpoolBytes = 5 << 20
)

// Bounds on what the relay's clients can make it hold, whatever they send
// (a member of the socket's group may send anything): without them a
// client that opened every call a connection allows, each announcing a
// message of MaxMessageBytes, and sent all of each but its last byte, had
// the relay hold 64 MiB per connection for as long as it liked, and two
// such connections were past the agent's memory limit (128 MiB). Now a
// call holds its stream's window (streamWindow) until its handler reads
// the message, which it does only within the read budget (readBudget),
// waiting for it at most readWait, and every call ends after callTimeout:
// at most maxCalls × streamWindow + readBudget (12 MiB) of messages being
// read at once. A message read keeps its share of the budget, about its
// size decoded, until its call ends: complete 4 MiB calls sent faster
// than a slow spool (one call at a time) keeps them wait for the budget
// or are refused, not pile up. A call refused for these bounds is refused Unavailable, which
// NVSentinel's monitors and the preflight checks resend (ResourceExhausted
// they take as final, and would drop the events).
const (
	// MaxConns is the most connections the relay serves at once; one past
	// it is closed as soon as it is accepted (the client sees the
	// connection closed, and resends). NVSentinel's monitors hold one
	// each, a preflight check one while it reports.
	MaxConns = 32
	// maxCalls is the most calls in progress at once, on all connections.
	maxCalls = 64
	// streamWindow is each call's HTTP/2 flow-control window, fixed: all a
	// client can send on a call before its handler reads the message.
	// grpc-go opens it to the message's announced length once the
	// handler reads, within readBudget.
	streamWindow = 64 << 10
	// readBudget is what the messages being read, and those decoded
	// waiting for the spool (beyond a stream's window each), may hold at
	// once: two of the largest. A read takes milliseconds on the node's
	// socket; a decoded call holds its share until it ends (callTimeout).
	readBudget = 2 * MaxMessageBytes
	// readWait is how long a call waits for room in readBudget before it
	// is refused Unavailable.
	readWait = time.Second
	// callTimeout ends a call, its message read or not: a client that
	// never sends its message's last byte holds its share of readBudget
	// this long at most.
	callTimeout = 30 * time.Second
	// handshakeTimeout is how long a connection may take to start HTTP/2.
	handshakeTimeout = 10 * time.Second
	// maxIdle closes a connection with no call for this long, maxAge any
	// connection (after the calls in progress end, callTimeout and a
	// margin): a client reconnects when it next calls.
	maxIdle = 5 * time.Minute
	maxAge  = 30 * time.Minute
	// maxHeaderBytes bounds a call's headers (grpc-go's default is 16 MiB).
	maxHeaderBytes = 32 << 10
)

// Server is the relay: the PlatformConnector service on the socket.
type Server struct {
	datamodels.UnimplementedPlatformConnectorServer

	node  string
	spool Spool
	log   *slog.Logger
	now   func() time.Time
	v     validate.Validator
	m     metrics
	ln    net.Listener
	srv   *grpc.Server
	path  string

	own map[string]string
	// machine is Config.SystemUUID.
	machine string

	// calls are the calls in progress (maxCalls); reads holds the bytes
	// of the messages being read (readBudget).
	calls atomic.Int64
	reads *semaphore.Weighted

	mu      sync.Mutex
	lastLog map[string]time.Time
	ownSeen map[string]bool // checkNames of Own already logged
}

// metrics are the relay's Prometheus metrics.
type metrics struct {
	events *prometheus.CounterVec
}

// Results of an event, as faultline_agent_relay_events_total labels them.
const (
	resultAccepted  = "accepted"
	resultInvalid   = "invalid"
	resultOtherNode = "other_node"
	resultNotSpool  = "not_spooled"
)

// New creates the socket (see unixsock.Listen: 0660, cfg.Group, never over
// a file that is not a socket) and the server for node's events, spooled
// into spool. Metrics are registered on reg; now is the clock (nil:
// time.Now).
func New(cfg Config, node string, spool Spool, log *slog.Logger, reg prometheus.Registerer, now func() time.Time) (*Server, error) {
	if cfg.Socket == "" {
		return nil, fmt.Errorf("%s: must be set", Keys.Path)
	}
	if now == nil {
		now = time.Now
	}
	s := &Server{node: node, spool: spool, log: log.With("component", "nvsentinel-relay"), now: now, path: cfg.Socket,
		v:       validate.Validator{MaxBatch: MaxBatch, MaxFutureSkew: maxFutureSkew},
		lastLog: map[string]time.Time{}, own: cfg.Own, ownSeen: map[string]bool{}, machine: cfg.SystemUUID,
		reads: semaphore.NewWeighted(readBudget),
		m: metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_agent_relay_events_total",
			Help: "Events NVSentinel monitors sent to the agent's relay socket, by result (accepted: spooled; invalid, other_node, not_spooled: the call was refused and nothing of it spooled)."},
			[]string{"result"})},
	}
	if err := reg.Register(s.m.events); err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	for _, r := range []string{resultAccepted, resultInvalid, resultOtherNode, resultNotSpool} {
		s.m.events.WithLabelValues(r) // every series from the start, at 0
	}
	// The socket stays when the agent stops (refusing connections): the
	// preflight checks take a missing socket for a node without an agent
	// (they report nothing and exit on their own result) and a refusing
	// one for an agent restarting (they wait, then exit for the kubelet to
	// rerun them), so an agent's upgrade or crash loop loses no check's
	// events. NVSentinel's monitors retry either.
	ln, err := unixsock.ListenKept(cfg.Socket, cfg.Group, Keys)
	if err != nil {
		reg.Unregister(s.m.events)
		return nil, err
	}
	s.ln = ln
	s.srv = grpc.NewServer(grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxConcurrentStreams(maxStreams),
		grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(maxStreams*streamWindow),
		grpc.MaxHeaderListSize(maxHeaderBytes), grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: maxIdle, MaxConnectionAge: maxAge, MaxConnectionAgeGrace: callTimeout + 5*time.Second,
			Time: 2 * time.Minute, Timeout: 20 * time.Second, // ping a silent client, and drop it when it does not answer
		}),
		grpc.InTapHandle(s.tap),
		grpc.ForceServerCodec(codec{limits: protoshape.Limits{MaxEvents: MaxBatch}}))
	s.srv.RegisterService(s.shapeChecked(&datamodels.PlatformConnector_ServiceDesc), s)
	return s, nil
}

// Serve serves until ctx ends, then lets calls in progress finish (a few
// seconds at most); the socket file stays, refusing connections.
func (s *Server) Serve(ctx context.Context) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		stopped := make(chan struct{})
		go func() { s.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(3 * time.Second):
			s.srv.Stop()
		}
	}()
	s.log.Info("serving NVSentinel's PlatformConnector", "socket", s.path, "node", s.node)
	err := s.srv.Serve(connlimit.Listener(s.ln, MaxConns, 0, func(string, bool) { s.connRefused() }))
	if errors.Is(err, grpc.ErrServerStopped) || ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("%s: %w", Keys.Path, err)
}

// Close stops serving at once (the socket file stays, refusing); for a relay whose
// Serve never ran or has returned (it is then a no-op).
func (s *Server) Close() {
	s.srv.Stop()
	s.ln.Close()
}

// HealthEventOccurredV1 spools the call's events, all or none.
func (s *Server) HealthEventOccurredV1(_ context.Context, req *datamodels.HealthEvents) (*emptypb.Empty, error) {
	evs := req.GetEvents()
	now := s.now()
	received := timestamppb.New(now)
	for _, ev := range evs {
		if ev == nil {
			continue // the validator names it
		}
		if ev.GeneratedTimestamp == nil {
			ev.Id = "" // the spool gives it a new key
			ev.GeneratedTimestamp = received
		} else {
			ev.Id = events.OccurrenceID(ev)
		}
		// After the id (derived from the event as sent), before the
		// checks (which then see what is spooled).
		nvsentinel.Normalize(ev)
		events.SetSystemUUID(ev, s.machine, validate.MaxMetadata)
	}
	if err := s.v.ValidateBatch(evs, now); err != nil {
		return nil, s.refuse(resultInvalid, len(evs), codes.InvalidArgument, err.Error())
	}
	for i, ev := range evs {
		if ev.GetNodeName() != s.node {
			return nil, s.refuse(resultOtherNode, len(evs), codes.PermissionDenied,
				fmt.Sprintf("events[%d].nodeName: %q is not this node: the faultline agent on node %q relays events for its own node only",
					i, validate.Short(ev.GetNodeName()), s.node))
		}
	}
	for _, ev := range evs {
		if check, ok := s.own[ev.GetCheckName()]; ok {
			ev.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
			s.logOwn(ev.GetCheckName(), check)
		}
	}
	if err := s.spool.AppendAll(evs); err != nil {
		return nil, s.refuse(resultNotSpool, len(evs), codes.Unavailable,
			"the faultline agent could not keep these events, resend them later: "+err.Error())
	}
	s.m.events.WithLabelValues(resultAccepted).Add(float64(len(evs)))
	return &emptypb.Empty{}, nil
}

// logOwn logs, once per checkName, that a monitor reports what the
// agent's own check does.
func (s *Server) logOwn(checkName, check string) {
	s.mu.Lock()
	seen := s.ownSeen[checkName]
	s.ownSeen[checkName] = true
	s.mu.Unlock()
	if !seen {
		s.log.Info("an NVSentinel monitor reports what the agent's own check reports: its events are stored only (STORE_ONLY), the check's are counted and acted on",
			"checkName", checkName, "check", check)
	}
}

// refuse counts and logs (at most once per result every 10 seconds) a
// refused call.
func (s *Server) refuse(result string, n int, code codes.Code, msg string) error {
	s.m.events.WithLabelValues(result).Add(float64(n))
	if s.logDue(result) {
		s.log.Warn("refused events from an NVSentinel monitor", "result", result, "events", n, "code", code.String(), "err", msg)
	}
	return status.Error(code, msg)
}

// logDue says whether what key names was not logged in the last 10
// seconds, and if so notes it logged now.
func (s *Server) logDue(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Sub(s.lastLog[key]) < 10*time.Second {
		return false
	}
	s.lastLog[key] = now
	return true
}

// busy is the refusal of a call past the relay's bounds (maxCalls,
// readBudget): Unavailable, which the relay's clients resend. Logged under
// its own key: sharing the spool's, it took the 10-second slot of the
// warning that events could not be kept.
func (s *Server) busy(what string) error {
	msg := "the faultline agent's relay is busy (" + what + "), resend later"
	if s.logDue("busy") {
		s.log.Warn("refused a call from an NVSentinel monitor", "code", codes.Unavailable.String(), "err", msg)
	}
	return status.Error(codes.Unavailable, msg)
}

// tap admits a call when its headers arrive, before its message is read,
// if fewer than maxCalls are in progress, and gives it callTimeout. It
// runs on the connection's reader goroutine: a counter only.
func (s *Server) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	if s.calls.Add(1) > maxCalls {
		s.calls.Add(-1)
		return nil, s.busy(fmt.Sprintf("%d calls in progress", maxCalls))
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	context.AfterFunc(ctx, func() { cancel(); s.calls.Add(-1) })
	return ctx, nil
}

// connRefused logs (at most once every 10 seconds) a connection closed
// past MaxConns.
func (s *Server) connRefused() {
	if s.logDue("connections") {
		s.log.Warn("closed a connection to the relay socket: as many are open as the relay serves", "max", MaxConns)
	}
}
