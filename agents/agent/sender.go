package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/internal/certfile"
	"github.com/faultline/faultline/internal/tlsclient"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// Sender drains the spool to the gateway's SubmitEvents, oldest first, in
// batches of at most GatewayConfig.BatchSize events and maxBatchBytes,
// committing a batch only after the gateway returned one id per event.
// Failures back off exponentially (200ms doubling to MaxBackoff, with
// jitter) and retry the same batch, so order is kept. An InvalidArgument
// answer for a batch is retried one event at a time until an event the
// gateway rejects as invalid is dropped from the spool, logged and counted
// (faultline_agent_rejected_events_total), since resending it can never
// succeed, or until all the batch's events were sent; then whole batches
// again. A refusal that the message was larger than the gateway's
// gateway.max_body_bytes (possibly set below maxBatchBytes), or a proxy's
// body limit in front of it (tooLarge), halves the bytes of the next call, at once and until the spool is empty; a single
// event larger alone can never be accepted and is dropped like an invalid
// one (logged, counted in faultline_agent_rejected_events_total). A
// PermissionDenied answer naming an event of a node other than this one
// (spooled under a name the node had before; see otherNode) sends the
// events before it, and drops it and the other node's events after it
// the same way.
//
// An event the gateway refuses only because its generatedTimestamp is
// more than gateway.max_future_skew ahead of the gateway's clock (this
// node's clock ahead: a wrong RTC at boot before chrony corrects it,
// broken NTP) is resent at once without it: the gateway stamps its
// receive time, and the node's time is kept in the event's metadata
// (events.MetaAgentGeneratedAt). Such events are counted
// (faultline_agent_clock_ahead_events_total) and warned of at most every
// clockWarnEvery. Before, each was dropped as invalid: a node booting
// with its clock ahead lost its boot events and fatal Xids. A refusal of
// a call as more events than the gateway's gateway.max_batch caps the
// calls at that many for the sender's lifetime (logged once).
type Sender struct {
	cfg    GatewayConfig
	node   string // this node's name ("": not known; another node's events then wait like the rest)
	spool  *Spool
	log    *slog.Logger
	m      *Metrics
	conn   *grpc.ClientConn
	client faultlinev1.EventsClient
	budget int64 // bytes of one call's events: maxBatchBytes, halved by each too-large refusal
	// maxBatch is the gateway's gateway.max_batch once it refused a call
	// as more events than that (0: not known).
	maxBatch  int
	lastClock time.Time // when the last clock-ahead warning was logged
}

// clockWarnEvery is how often at most the sender warns that the gateway
// refused events as generated in its future.
const clockWarnEvery = 10 * time.Minute

// maxBatchBytes bounds the encoded events of one SubmitEvents call, half
// the gateway's default gateway.max_body_bytes (4 MiB): a batch of large
// events (kmsg details, GPU pods, an 8 KiB message) over the gateway's
// bound was refused (ResourceExhausted) at every try, and the node's
// spool, behind it, stopped draining for good.
const maxBatchBytes = 2 << 20

// NewSender dials (lazily) the gateway: with TLS unless cfg.Insecure, in
// which case it warns that the token and events travel in clear.
func NewSender(cfg GatewayConfig, spool *Spool, log *slog.Logger, m *Metrics, opts ...grpc.DialOption) (*Sender, error) {
	creds := insecure.NewCredentials()
	var cas *certfile.Pool
	if cfg.Insecure {
		log.Warn("gateway.insecure = true: the bearer token and every event go to the gateway IN CLEAR (no TLS); use it only for a gateway on this host or in a test",
			"gateway", cfg.Addr)
		m.gatewayInsecure.Set(1)
	} else {
		var err error
		if creds, cas, err = cfg.tlsCredentials(log); err != nil {
			return nil, err
		}
		m.gatewayInsecure.Set(0)
		m.gatewayCert.Store(cfg.tls().ClientCert("gateway."))
		m.gatewayCAs.Store(cas)
	}
	conn, err := grpc.NewClient(cfg.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("gateway.addr: %w", err)
	}
	return &Sender{cfg: cfg, spool: spool, log: log, m: m, conn: conn, client: faultlinev1.NewEventsClient(conn), budget: maxBatchBytes}, nil
}

// tlsConfig is the TLS of the connection to the gateway: TLS 1.2 or later,
// the CA bundle (else the system roots), and the client certificate,
// re-read when its files change — tlsclient's, under the gateway's keys —
// and the CA bundle it read (nil without gateway.ca_file).
func (g GatewayConfig) tlsConfig() (*tls.Config, *certfile.Pool, error) {
	return g.tls().BuildWithCAs("gateway.")
}

// tls is the gateway's TLS keys as tlsclient's.
func (g GatewayConfig) tls() tlsclient.Config {
	return tlsclient.Config{Enabled: true, CAFile: g.CAFile, CertFile: g.CertFile, KeyFile: g.KeyFile, ServerName: g.ServerName}
}

// tlsCredentials are the TLS credentials of tlsConfig, with the CA bundle
// re-read when it changes: a CA rotated in place (the chart's cert-manager
// CA renewed, its Secret updated under the agent) is trusted from the next
// connection on. Before, an agent refused a gateway whose certificate the
// new CA signed until it restarted, its spool growing. And a CA removed
// from the file is trusted by no connection: the open one is verified
// again every tlsclient.ReverifyEvery and closed once the file no longer
// verifies the gateway (warned to log). The bundle is returned too (nil
// without gateway.ca_file), for its expiry gauge.
func (g GatewayConfig) tlsCredentials(log *slog.Logger) (credentials.TransportCredentials, *certfile.Pool, error) {
	tc, cas, err := g.tlsConfig()
	if err != nil {
		return nil, nil, err
	}
	if cas == nil {
		return credentials.NewTLS(tc), nil, nil
	}
	return &followCA{tc: tc, cas: cas, info: credentials.NewTLS(tc).Info(), reverify: tlsclient.NewReverifier(cas, "gateway.ca_file", log)}, cas, nil
}

// followCA are TLS credentials whose root CAs are the bundle as it is at
// each handshake: the TLS credentials of tc with that pool, made once per
// change of the file.
type followCA struct {
	tc       *tls.Config
	cas      *certfile.Pool
	info     credentials.ProtocolInfo
	reverify *tlsclient.Reverifier

	mu    sync.Mutex
	pool  *x509.CertPool
	creds credentials.TransportCredentials
}

func (f *followCA) current() (credentials.TransportCredentials, error) {
	pool, err := f.cas.Get()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if pool != f.pool {
		tc := f.tc.Clone()
		tc.RootCAs = pool
		f.pool, f.creds = pool, credentials.NewTLS(tc)
	}
	return f.creds, nil
}

func (f *followCA) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, err := f.current()
	if err != nil {
		return nil, nil, err
	}
	conn, info, err := c.ClientHandshake(ctx, authority, conn)
	ti, ok := info.(credentials.TLSInfo)
	if err != nil || !ok {
		return conn, info, err
	}
	name := f.tc.ServerName // as credentials.NewTLS verifies it
	if name == "" {
		name = authority
		if host, _, err := net.SplitHostPort(authority); err == nil {
			name = host
		}
	}
	return f.reverify.Track(conn, ti.State, name), info, nil
}

func (f *followCA) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("gateway credentials are a client's")
}

func (f *followCA) Info() credentials.ProtocolInfo { return f.info }

func (f *followCA) Clone() credentials.TransportCredentials {
	return &followCA{tc: f.tc.Clone(), cas: f.cas, info: f.info, reverify: f.reverify}
}

// OverrideServerName is deprecated in grpc-go and not used here.
func (f *followCA) OverrideServerName(string) error {
	return errors.New("gateway credentials: OverrideServerName is not supported; set gateway.server_name")
}

// Submit sends evs in one SubmitEvents call, outside the spool (for a
// caller that could not spool them); nil once the gateway returned their
// ids. An event refused as generated in the gateway's future is resent
// with the gateway's time, as Run does.
func (s *Sender) Submit(ctx context.Context, evs []*datamodels.HealthEvent) error {
	return s.sendAhead(ctx, evs)
}

// Close closes the connection.
func (s *Sender) Close() error { return s.conn.Close() }

func (s *Sender) token() (string, error) {
	if s.cfg.TokenFile == "" {
		return "", nil // a client certificate authenticates
	}
	b, err := os.ReadFile(s.cfg.TokenFile)
	if err != nil {
		return "", fmt.Errorf("gateway.token_file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", errors.New("gateway.token_file: empty")
	}
	return t, nil
}

// Run sends until ctx ends.
func (s *Sender) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	// single is, after a batch was refused as invalid, how many of its
	// events are still to be sent one per call: until the invalid one is
	// dropped, or all were sent (0: whole batches).
	single := 0
	limit := 0 // after another node's event was refused: the events before it, this node's (0: none)
	for {
		if backoff > 0 {
			d := backoff/2 + rand.N(backoff/2+1)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
		n := s.cfg.BatchSize
		if s.maxBatch > 0 {
			n = min(n, s.maxBatch)
		}
		if single > 0 {
			n = 1
		}
		if limit > 0 {
			n = min(n, limit)
		}
		evs, next, err := s.spool.PeekBytes(n, s.budget)
		if err != nil {
			s.log.Error("spool read failed", "err", err)
			backoff = s.nextBackoff(backoff)
			continue
		}
		if len(evs) == 0 {
			single, s.budget = 0, maxBatchBytes // a gateway whose limit was raised gets whole batches again
			select {
			case <-ctx.Done():
				return nil
			case <-s.spool.Notify():
			}
			continue
		}
		err = s.sendAhead(ctx, evs)
		if ctx.Err() != nil {
			return nil
		}
		before, other := s.otherNode(err, evs)
		maxBatch, overBatch := batchLimit(err)
		switch code := status.Code(err); {
		case err == nil:
			if err := s.spool.Commit(next); err != nil {
				s.log.Error("spool commit failed", "err", err)
			}
			if backoff > 0 {
				s.log.Info("gateway reachable again", "sent", len(evs))
			}
			backoff, limit = 0, 0
			if single > 0 {
				single-- // one event of the refused batch sent: the invalid one is still ahead
			}
		case other && before > 0:
			limit = before // this node's events first
		case other:
			k := 0 // the other nodes' events leading the spool
			for k < len(evs) && evs[k].GetNodeName() != s.node {
				k++
			}
			_, past, perr := s.spool.Peek(k)
			if perr == nil {
				perr = s.spool.Commit(past)
			}
			if perr != nil {
				s.log.Error("spool commit failed", "err", perr)
				backoff = s.nextBackoff(backoff)
				continue
			}
			s.log.Error("gateway refused events of another node than this one, the only node its credential may report for (spooled under an earlier node name); dropped from the spool",
				"events", k, "event_node", evs[0].GetNodeName(), "node", s.node, "err", err)
			s.m.rejected.Add(float64(k))
			limit = 0
		case overBatch && maxBatch < len(evs):
			s.maxBatch = maxBatch
			s.log.Warn("gateway takes fewer events a call (its gateway.max_batch) than gateway.batch_size; sending at most that many from now on",
				"batch_size", s.cfg.BatchSize, "max_batch", maxBatch)
		case code == codes.InvalidArgument && len(evs) > 1:
			s.log.Warn("gateway rejected a batch as invalid; retrying one event at a time", "events", len(evs), "err", err)
			single = len(evs)
		case tooLarge(err) && len(evs) > 1:
			s.m.sendErrors.WithLabelValues(code.String()).Inc()
			size := encodedSize(evs)
			s.budget = max(min(s.budget, size)/2, 1)
			s.log.Warn("gateway (or a proxy in front of it) refused a call as too large; sending smaller calls", "events", len(evs), "bytes", size, "next_bytes", s.budget, "err", err)
		case Undeliverable(err):
			s.log.Error("gateway rejected an event as invalid or larger than it (or a proxy in front of it) takes; dropped from the spool",
				"check", evs[0].GetCheckName(), "message", evs[0].GetMessage(), "bytes", encodedSize(evs), "err", err)
			s.m.rejected.Inc()
			if err := s.spool.Commit(next); err != nil {
				s.log.Error("spool commit failed", "err", err)
			}
			single = 0 // the refused batch's invalid event resolved: whole batches again
		default:
			s.m.sendErrors.WithLabelValues(code.String()).Inc()
			if backoff == 0 || code == codes.Unauthenticated || code == codes.PermissionDenied {
				s.log.Warn("sending to the gateway failed; events stay spooled", "code", code.String(), "err", err, "pending_bytes", s.spool.Pending())
			}
			backoff = s.nextBackoff(backoff)
		}
	}
}

// tooLarge reports whether err refuses a call as larger than the gateway,
// or a proxy in front of it, takes:
//   - the gateway's own limit (gateway.max_body_bytes, gRPC's
//     MaxRecvMsgSize): ResourceExhausted "grpc: received message larger
//     than max (N vs. M)" and its after-decompression forms (grpc-go's
//     rpc_util.go);
//   - a proxy's HTTP 413 (nginx's client_max_body_size, ingress-nginx's
//     proxy-body-size of 1m by default, an L7 load balancer), which grpc-go
//     (internal/transport/http2_client.go) reads as "unexpected HTTP status
//     code received from server: 413 (Request Entity Too Large)", code
//     Unknown (413 is not in its HTTPStatusConvTab);
//   - envoy's local reply to a gRPC call over its buffer limit (the buffer
//     filter's max_request_bytes, per_connection_buffer_limit_bytes):
//     grpc-status Unknown (its httpToGrpcStatus of 413), grpc-message
//     "Payload Too Large" (its CodeUtility::toString of 413).
//
// The gateway's other ResourceExhausted answers (rate, in-flight bytes:
// "retry later") and a proxy's rate limit are not: those back off with the
// batch kept whole.
func tooLarge(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	msg := st.Message()
	return st.Code() == codes.ResourceExhausted && strings.Contains(msg, "larger than max") ||
		strings.Contains(msg, "HTTP status code received from server: 413") || // whatever code a grpc-go release maps 413 to
		st.Code() == codes.Unknown && msg == "Payload Too Large"
}

// Undeliverable reports whether err is the gateway's (or a proxy's) answer
// to a call of one event that no resend can change: the event refused as
// invalid (InvalidArgument), or larger alone than the gateway or a proxy
// in front of it takes (tooLarge). For a call of several events both may
// be one event's or the call's size, and are resolved by smaller calls.
func Undeliverable(err error) bool {
	return status.Code(err) == codes.InvalidArgument || tooLarge(err)
}

// wrongNode is the gateway's refusal of an event for a node other than the
// one the caller's credential is bound to (gateway/service.go ingest):
// the event's index, its node name, the credential's node.
var wrongNode = regexp.MustCompile(`^events\[(\d+)\]\.nodeName: ("(?:[^"\\]|\\.)*") is not ("(?:[^"\\]|\\.)*"), the only node credential `)

// otherNode reports whether err refuses events[i] of evs as another node's
// than the one the credential is bound to, where that node is this one
// and the event names another: an event spooled before the node was
// renamed (or NODE_NAME changed), which no resend can deliver; before is
// i, the events ahead of it, this node's. A credential bound to another
// node than this one (a wrong token or certificate: the operator fixes
// it), any other PermissionDenied, or a sender that does not know its
// node is not: those events wait.
func (s *Sender) otherNode(err error, evs []*datamodels.HealthEvent) (before int, ok bool) {
	st, isStatus := status.FromError(err)
	if err == nil || !isStatus || st.Code() != codes.PermissionDenied || s.node == "" {
		return 0, false
	}
	m := wrongNode.FindStringSubmatch(st.Message())
	if m == nil {
		return 0, false
	}
	i, err1 := strconv.Atoi(m[1])
	evNode, err2 := strconv.Unquote(m[2])
	bound, err3 := strconv.Unquote(m[3])
	if err1 != nil || err2 != nil || err3 != nil || i >= len(evs) || bound != s.node ||
		evNode == s.node || evs[i].GetNodeName() != evNode {
		return 0, false
	}
	return i, true
}

// sendAhead is send, where the gateway refusing an event of evs as
// generated in its future (futureRefused) resends evs at once with that
// event's generatedTimestamp, and that of each event after it as late or
// later, moved to its metadata (moveAhead): the gateway then stamps its
// receive time. Each resend clears the refused event's, so there are at
// most len(evs) of them; their count is added to
// faultline_agent_clock_ahead_events_total once the gateway took them.
func (s *Sender) sendAhead(ctx context.Context, evs []*datamodels.HealthEvent) error {
	err := s.send(ctx, evs)
	moved := 0
	for range evs {
		i, ok := futureRefused(err, evs)
		if !ok || ctx.Err() != nil {
			break
		}
		t := evs[i].GetGeneratedTimestamp().AsTime()
		for _, ev := range evs[i:] {
			if ts := ev.GetGeneratedTimestamp(); ts != nil && !ts.AsTime().Before(t) {
				moveAhead(ev)
				moved++
			}
		}
		if now := time.Now(); now.Sub(s.lastClock) >= clockWarnEvery {
			s.lastClock = now
			s.log.Warn("gateway refused events as generated in its future: this node's clock is ahead of the gateway's (check chrony/NTP); resending them with the gateway's receive time, the node's time kept in their metadata",
				"node_time", t.Format(time.RFC3339Nano), "metadata_key", events.MetaAgentGeneratedAt, "err", err)
		}
		err = s.send(ctx, evs)
	}
	if err == nil && moved > 0 {
		s.m.clockAhead.Add(float64(moved))
	}
	return err
}

// moveAhead clears ev's generatedTimestamp, kept (RFC 3339) in its
// metadata events.MetaAgentGeneratedAt where it has room for one more
// key (the gateway takes validate.MaxMetadata).
func moveAhead(ev *datamodels.HealthEvent) {
	t := ev.GetGeneratedTimestamp().AsTime()
	ev.GeneratedTimestamp = nil
	if _, ok := ev.Metadata[events.MetaAgentGeneratedAt]; !ok && len(ev.Metadata) >= validate.MaxMetadata {
		return
	}
	if ev.Metadata == nil {
		ev.Metadata = map[string]string{}
	}
	ev.Metadata[events.MetaAgentGeneratedAt] = t.Format(time.RFC3339Nano)
}

// futureRefused reports whether err is the gateway's refusal of evs[i]
// only because its generatedTimestamp is in the gateway's future: an
// InvalidArgument whose ErrorInfo (validate.Refusal) says
// ReasonFutureTimestamp, or, without one, whose message is the
// validator's words for it. The validator checks generatedTimestamp last
// of an event, and the events before it passed.
func futureRefused(err error, evs []*datamodels.HealthEvent) (i int, ok bool) {
	i, ok = refusalNumber(err, validate.ReasonFutureTimestamp, validate.InfoIndex, futureText)
	if !ok || i < 0 || i >= len(evs) || evs[i].GetGeneratedTimestamp() == nil {
		return 0, false
	}
	return i, true
}

// batchLimit reports whether err refuses a call as more events than the
// gateway takes, and how many it takes (at least 1).
func batchLimit(err error) (int, bool) {
	n, ok := refusalNumber(err, validate.ReasonBatchLimit, validate.InfoMaxBatch, batchLimitText)
	return n, ok && n >= 1
}

// The gateway's refusals in validate's words, for a gateway that does not
// give them as a detail (validate.Refusal; before it did): an event's
// generatedTimestamp too far in its future, a call of more events than
// its gateway.max_batch. The submatch is the number refusalNumber reads.
var (
	futureText     = regexp.MustCompile(`^events\[(\d+)\]\.generatedTimestamp: \S+ is more than \S+ in the future$`)
	batchLimitText = regexp.MustCompile(`^events: \d+ events exceed the batch limit of (\d+)$`)
)

// refusalNumber reads the number an InvalidArgument refusal of the given
// reason carries: from its ErrorInfo's metadata key, or, without an
// ErrorInfo, from its message's text submatch.
func refusalNumber(err error, reason, key string, text *regexp.Regexp) (int, bool) {
	if status.Code(err) != codes.InvalidArgument {
		return 0, false
	}
	v := ""
	if r, info := validate.Refusal(err); r != "" {
		if r != reason {
			return 0, false
		}
		v = info[key]
	} else if m := text.FindStringSubmatch(status.Convert(err).Message()); m != nil {
		v = m[1]
	}
	n, perr := strconv.Atoi(v)
	return n, perr == nil
}

// encodedSize is the bytes of evs in a SubmitEventsRequest.
func encodedSize(evs []*datamodels.HealthEvent) int64 {
	return int64((&faultlinev1.SubmitEventsRequest{Events: evs}).SizeVT())
}

func (s *Sender) nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return 200 * time.Millisecond
	}
	return min(b*2, s.cfg.MaxBackoff)
}

func (s *Sender) send(ctx context.Context, evs []*datamodels.HealthEvent) error {
	tok, err := s.token()
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.client.SubmitEvents(cctx, &faultlinev1.SubmitEventsRequest{Events: evs})
	if err != nil {
		return err
	}
	if len(resp.GetIds()) != len(evs) {
		return status.Errorf(codes.Internal, "gateway returned %d ids for %d events", len(resp.GetIds()), len(evs))
	}
	s.m.sent.Add(float64(len(evs)))
	return nil
}
