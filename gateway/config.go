// Package gateway is faultline's only door: gRPC (NVSentinel's
// PlatformConnector and faultline's Events service) and REST through
// grpc-gateway. It authenticates the caller before reading any request
// message, stamps the caller's cluster and submitter (credential, role,
// bound node), validates, assigns ids, and answers only after Kafka
// acknowledged. What any caller can make it hold is bounded: connections
// per address and in total, streams per connection, request bytes in
// flight per connection and in total, the elements of a request counted
// before it is decoded, and every wait (SECURITY.md).
package gateway

import (
	"flag"
	"fmt"
	"math"
	"time"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/validate"
)

// Config is the gateway's configuration.
type Config struct {
	// GRPCAddr is the gRPC listen address. Default 127.0.0.1:50051.
	GRPCAddr string `toml:"grpc_addr"`
	// HTTPAddr is the REST/metrics listen address. Default 127.0.0.1:8080.
	HTTPAddr string `toml:"http_addr"`
	// UnixSocket, when set, also serves gRPC on this unix socket for
	// node-local NVSentinel monitors: ingest only (history reads are
	// refused there); its events belong to UnixSocketCluster and are
	// stamped as an agent's. The socket is created mode 0660 (owner and
	// UnixSocketGroup): its file permissions are the credential.
	UnixSocket        string `toml:"unix_socket"`
	UnixSocketCluster string `toml:"unix_socket_cluster"`
	// UnixSocketGroup is the group (name or numeric id) given the socket;
	// default the gateway's own group.
	UnixSocketGroup string `toml:"unix_socket_group"`
	// UnixSocketNode, when set, binds the socket to one node: events for
	// any other node are refused (PermissionDenied).
	UnixSocketNode string `toml:"unix_socket_node"`
	// TLSCert and TLSKey enable TLS on both TCP doors (TLS 1.2 with ECDHE
	// and AEAD cipher suites only, or TLS 1.3).
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
	// ClientCA enables mTLS: a client certificate signed by it authenticates
	// its caller; the cluster is the certificate's first Organization, and
	// it is an operator credential when an OrganizationalUnit is
	// "faultline:operator" (OperatorOU), an agent credential otherwise.
	ClientCA string `toml:"client_ca"`
	// ClientCertBindsNode binds every agent client certificate to the node
	// its CommonName names: it may report events for that node only.
	ClientCertBindsNode bool `toml:"client_cert_binds_node"`
	// TokensFile holds "token,cluster[,role[,node]]" lines (# comments; see
	// ParseTokens). Required unless ClientCA is set. The file must not be
	// open to every user (mode 0600, 0640 or 0440).
	TokensFile string `toml:"tokens_file"`

	// MaxBatch is the most events in one request. Default 1000.
	MaxBatch int `toml:"max_batch"`
	// MaxBodyBytes bounds one REST body or gRPC message. Default 4 MiB.
	MaxBodyBytes int `toml:"max_body_bytes"`
	// MaxFutureSkew is how far in the future generatedTimestamp may be
	// (minFutureSkew to 24h). Default 5m.
	MaxFutureSkew time.Duration `toml:"max_future_skew"`
	// RatePerCaller is the events/s each caller (one token line, one client
	// certificate name, the unix socket) may submit (0: unlimited).
	// Default 20000.
	RatePerCaller float64 `toml:"rate_per_caller"`
	// RateBurst is the token bucket size per caller. Default 40000.
	RateBurst int `toml:"rate_burst"`
	// ProduceTimeout bounds how long a request waits for Kafka before 503.
	// Default 5s.
	ProduceTimeout time.Duration `toml:"produce_timeout"`
	// MaxBufferedRecords bounds the producer buffer; a request that does not
	// fit gets 429. Default 100000.
	MaxBufferedRecords int `toml:"max_buffered_records"`
	// MaxBufferedBytes bounds the encoded bytes (keys and values) of the
	// records the producer holds; a request that does not fit gets 429.
	// A call answered 503 after ProduceTimeout gives back its other
	// budgets, but its records stay buffered while a broker hangs, and
	// each retry adds them again: this bounds what they hold. At least
	// what the largest request MaxBatch and MaxBodyBytes allow encodes
	// into. Default 256 MiB.
	MaxBufferedBytes int64 `toml:"max_buffered_bytes"`
	// ProducerLinger is how long the producer waits for more records
	// before it sends a batch. Every call waits for its events'
	// acknowledgement, so at moderate concurrency the linger is most of a
	// call's time: 2ms answers REST single events at 1.3-1.8x the rate
	// of the Java producer's 5ms (Kafka 4.0's default) with 64-128
	// callers, and no less at 256 or with gRPC batches
	// (loadtest/RESULTS.md, "The producer's linger at moderate
	// concurrency"). Default 2ms.
	ProducerLinger time.Duration `toml:"producer_linger"`

	// MaxInflightBytes bounds the request bytes held at once by the whole
	// gateway; past it requests are refused with 429/RESOURCE_EXHAUSTED. A
	// gRPC call holds its stream's flow-control window (64 KiB) from its
	// headers, MaxBodyBytes while its message is read and decoded, then
	// its size until it is answered. Decoding costs up to
	// ~5 times a message's size (measured with the densest events the shape
	// check lets through), so the gateway's peak memory is about its idle
	// size plus 6 times this. Default 32 MiB.
	MaxInflightBytes int64 `toml:"max_inflight_bytes"`
	// MaxInflightBytesPerConn is the same bound per connection. Default 8 MiB.
	MaxInflightBytesPerConn int64 `toml:"max_inflight_bytes_per_conn"`
	// MaxDecodedBytes bounds what the decoded events of the submissions
	// being answered hold at once (estimated per event, its strings
	// counted twice: decoded, and in its Kafka record), besides their
	// request bytes; a submission that does not fit is refused with
	// 429/RESOURCE_EXHAUSTED. Decoded, a message takes up to 15 times its
	// wire size, so MaxInflightBytes alone did not bound what calls held
	// by a slow Kafka keep. At least what the largest request MaxBatch and
	// MaxBodyBytes allow may decode into (~29 MiB at their defaults), so
	// that any request can be. Default 128 MiB.
	MaxDecodedBytes int64 `toml:"max_decoded_bytes"`
	// MaxReadBytesPerCaller bounds the bytes one credential's requests
	// (a credential not bound to a node: from one client address, an IP
	// or an IPv6 /64) hold at once for messages being read: a gRPC call
	// holds MaxBodyBytes from just before its message is read until it is
	// decoded, a REST body the length it declares (MaxBodyBytes when
	// chunked) while it is read, however long the client takes to send
	// it, and the credential's other requests wait their turn (up to a
	// second, then RESOURCE_EXHAUSTED, 429). A credential whose messages
	// never come then refuses its own requests (a shared one, those from
	// its own address), not everyone's. Default 8 MiB.
	MaxReadBytesPerCaller int64 `toml:"max_read_bytes_per_caller"`
	// MaxStreamsPerConn bounds the concurrent calls of one HTTP/2
	// connection (gRPC, and REST over TLS). Default 64.
	MaxStreamsPerConn int `toml:"max_streams_per_conn"`
	// MaxConns bounds the open connections of each TCP door (0: no limit).
	// Default 4096.
	MaxConns int `toml:"max_conns"`
	// MaxConnsPerAddress bounds the open connections from one client IP on
	// each TCP door (0: no limit). Behind a NAT or a load balancer that
	// hides client addresses, raise it or set 0. Default 256.
	MaxConnsPerAddress int `toml:"max_conns_per_address"`
	// ReadHeaderTimeout bounds the arrival of a REST request's headers, and
	// of a gRPC connection's TLS and HTTP/2 handshake. Default 10s.
	ReadHeaderTimeout time.Duration `toml:"read_header_timeout"`
	// ReadTimeout bounds the arrival of a whole REST request, body included.
	// Default 30s.
	ReadTimeout time.Duration `toml:"read_timeout"`
	// CallTimeout bounds a request from its headers to its answer: the
	// deadline of every gRPC call (its message must arrive within it too)
	// and of every REST handler. Default 60s.
	CallTimeout time.Duration `toml:"call_timeout"`
	// IdleTimeout closes a connection with no request in progress after
	// this long. Default 5m.
	IdleTimeout time.Duration `toml:"idle_timeout"`
	// MaxConnectionAge closes a gRPC connection this long after it opened
	// (gracefully: calls in progress get CallTimeout to finish), which also
	// rebalances clients across gateway replicas. Default 30m.
	MaxConnectionAge time.Duration `toml:"max_connection_age"`

	// ReadRatePerCaller is the history reads (GET /v1/events, /v1/actions,
	// and the fleet page's GET /v1/fleet/...) per second each caller may
	// make (0: unlimited). Default 10.
	ReadRatePerCaller float64 `toml:"read_rate_per_caller"`
	// ReadBurst is the read bucket size per caller. Default 20.
	ReadBurst int `toml:"read_burst"`
	// MaxConcurrentReads bounds the history reads in progress; past it a
	// read is refused with 429. Default 4.
	MaxConcurrentReads int `toml:"max_concurrent_reads"`
	// HistoryTimeout bounds one history read (the ClickHouse query is
	// cancelled then). Default 10s.
	HistoryTimeout time.Duration `toml:"history_timeout"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		GRPCAddr:           "127.0.0.1:50051",
		HTTPAddr:           "127.0.0.1:8080",
		MaxBatch:           1000,
		MaxBodyBytes:       4 << 20,
		MaxFutureSkew:      5 * time.Minute,
		RatePerCaller:      20000,
		RateBurst:          40000,
		ProduceTimeout:     5 * time.Second,
		MaxBufferedRecords: 100000,
		MaxBufferedBytes:   256 << 20,
		ProducerLinger:     2 * time.Millisecond,

		MaxInflightBytes:        32 << 20,
		MaxInflightBytesPerConn: 8 << 20,
		MaxDecodedBytes:         128 << 20,
		MaxReadBytesPerCaller:   8 << 20,
		MaxStreamsPerConn:       64,
		MaxConns:                4096,
		MaxConnsPerAddress:      256,
		ReadHeaderTimeout:       10 * time.Second,
		ReadTimeout:             30 * time.Second,
		CallTimeout:             60 * time.Second,
		IdleTimeout:             5 * time.Minute,
		MaxConnectionAge:        30 * time.Minute,

		ReadRatePerCaller:  10,
		ReadBurst:          20,
		MaxConcurrentReads: 4,
		HistoryTimeout:     10 * time.Second,
	}
}

// RegisterFlags adds the gateway's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.GRPCAddr, "grpc-addr", c.GRPCAddr, "gRPC listen address")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "REST, metrics and health listen address")
	fs.StringVar(&c.UnixSocket, "unix-socket", c.UnixSocket, "also serve gRPC on this unix socket (node-local monitors)")
	fs.StringVar(&c.UnixSocketCluster, "unix-socket-cluster", c.UnixSocketCluster, "cluster of events received on the unix socket")
	fs.StringVar(&c.UnixSocketGroup, "unix-socket-group", c.UnixSocketGroup, "group (name or id) of the unix socket, created mode 0660 (default: the gateway's group)")
	fs.StringVar(&c.UnixSocketNode, "unix-socket-node", c.UnixSocketNode, "bind the unix socket to this node: events for other nodes are refused")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "TLS certificate file")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "TLS key file")
	fs.StringVar(&c.ClientCA, "client-ca", c.ClientCA, "CA file for mTLS client certificates (cluster = certificate Organization; OU faultline:operator = operator)")
	fs.BoolVar(&c.ClientCertBindsNode, "client-cert-binds-node", c.ClientCertBindsNode, "bind each agent client certificate to the node its CommonName names")
	fs.StringVar(&c.TokensFile, "tokens-file", c.TokensFile, "file of 'token,cluster[,role[,node]]' lines (mode 0600, 0640 or 0440)")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "most events in one request")
	fs.IntVar(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest REST body or gRPC message")
	fs.DurationVar(&c.MaxFutureSkew, "max-future-skew", c.MaxFutureSkew, "how far in the future generatedTimestamp may be")
	fs.Float64Var(&c.RatePerCaller, "rate-per-caller", c.RatePerCaller, "events/s per caller: token, client certificate or unix socket (0: unlimited)")
	fs.IntVar(&c.RateBurst, "rate-burst", c.RateBurst, "burst of events per caller")
	fs.DurationVar(&c.ProduceTimeout, "produce-timeout", c.ProduceTimeout, "longest wait for Kafka before answering 503")
	fs.IntVar(&c.MaxBufferedRecords, "max-buffered-records", c.MaxBufferedRecords, "producer buffer; requests that do not fit get 429")
	fs.Int64Var(&c.MaxBufferedBytes, "max-buffered-bytes", c.MaxBufferedBytes, "encoded bytes the producer buffer holds; requests that do not fit get 429")
	fs.DurationVar(&c.ProducerLinger, "producer-linger", c.ProducerLinger, "how long the producer waits for more records before sending a batch")
	fs.Int64Var(&c.MaxInflightBytes, "max-inflight-bytes", c.MaxInflightBytes, "request bytes held at once by the gateway; past it 429/RESOURCE_EXHAUSTED")
	fs.Int64Var(&c.MaxInflightBytesPerConn, "max-inflight-bytes-per-conn", c.MaxInflightBytesPerConn, "request bytes held at once per connection")
	fs.Int64Var(&c.MaxDecodedBytes, "max-decoded-bytes", c.MaxDecodedBytes, "decoded events held at once by the gateway's submissions; past it 429/RESOURCE_EXHAUSTED")
	fs.Int64Var(&c.MaxReadBytesPerCaller, "max-read-bytes-per-caller", c.MaxReadBytesPerCaller, "bytes one credential's gRPC calls and REST bodies hold at once for messages being read")
	fs.IntVar(&c.MaxStreamsPerConn, "max-streams-per-conn", c.MaxStreamsPerConn, "concurrent calls per HTTP/2 connection")
	fs.IntVar(&c.MaxConns, "max-conns", c.MaxConns, "open connections per TCP door (0: no limit)")
	fs.IntVar(&c.MaxConnsPerAddress, "max-conns-per-address", c.MaxConnsPerAddress, "open connections per client IP per TCP door (0: no limit)")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", c.ReadHeaderTimeout, "longest wait for a REST request's headers or a gRPC connection's handshake")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", c.ReadTimeout, "longest wait for a whole REST request, body included")
	fs.DurationVar(&c.CallTimeout, "call-timeout", c.CallTimeout, "longest a gRPC call or REST request may take, from its headers to its answer")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "close connections idle this long")
	fs.DurationVar(&c.MaxConnectionAge, "max-connection-age", c.MaxConnectionAge, "close gRPC connections (gracefully) this long after they opened")
	fs.Float64Var(&c.ReadRatePerCaller, "read-rate-per-caller", c.ReadRatePerCaller, "history reads/s per caller (0: unlimited)")
	fs.IntVar(&c.ReadBurst, "read-burst", c.ReadBurst, "burst of history reads per caller")
	fs.IntVar(&c.MaxConcurrentReads, "max-concurrent-reads", c.MaxConcurrentReads, "history reads in progress at once; past it 429")
	fs.DurationVar(&c.HistoryTimeout, "history-timeout", c.HistoryTimeout, "longest one history read may take")
}

// minFutureSkew is the least gateway.max_future_skew: an agent stamps
// generatedTimestamp with its own clock, and one a little ahead of the
// gateway's (NTP keeps them within milliseconds, not exactly) would have
// its events refused as invalid, which the agent drops for good.
const minFutureSkew = time.Minute

// maxRecordOverhead bounds what a Kafka record of an event holds beyond
// the event's bytes in its request: its key (cluster, node: at most 63 +
// 1 + 253 bytes) and what the gateway stamps (id, cluster, submitter,
// timestamps, strategy: under 600 bytes).
const maxRecordOverhead = 1 << 10

// encodedCeiling is the most the records of one request of at most
// maxBatch events and maxBody bytes encode into: an event encodes into no
// more than its bytes in the request (unknown fields are dropped, JSON
// spends more than protobuf on every field) plus maxRecordOverhead.
func encodedCeiling(maxBatch, maxBody int) int64 {
	return int64(maxBody) + int64(maxBatch)*maxRecordOverhead
}

// Validate names the first bad key.
func (c Config) Validate() error {
	switch {
	case c.GRPCAddr == "":
		return fmt.Errorf("gateway.grpc_addr: required")
	case c.HTTPAddr == "":
		return fmt.Errorf("gateway.http_addr: required")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("gateway.tls_cert and gateway.tls_key: set both or neither")
	case c.ClientCA != "" && c.TLSCert == "":
		return fmt.Errorf("gateway.client_ca: mTLS needs gateway.tls_cert and gateway.tls_key")
	case c.TokensFile == "" && c.ClientCA == "":
		return fmt.Errorf("gateway.tokens_file: required unless gateway.client_ca is set")
	case c.UnixSocket != "" && c.UnixSocketCluster == "":
		return fmt.Errorf("gateway.unix_socket_cluster: required with gateway.unix_socket")
	case c.UnixSocketCluster != "" && !events.IsClusterName(c.UnixSocketCluster):
		return fmt.Errorf("gateway.unix_socket_cluster: %q is not a lowercase DNS label", c.UnixSocketCluster)
	case c.UnixSocketNode != "" && (len(c.UnixSocketNode) > maxNodeNameLen || !nodeNamePattern.MatchString(c.UnixSocketNode)):
		return fmt.Errorf("gateway.unix_socket_node: %q is not a Kubernetes node name", truncate(c.UnixSocketNode))
	case c.ClientCertBindsNode && c.ClientCA == "":
		return fmt.Errorf("gateway.client_cert_binds_node: needs gateway.client_ca")
	case c.MaxBatch < 1:
		return fmt.Errorf("gateway.max_batch: must be at least 1, got %d", c.MaxBatch)
	case c.MaxBodyBytes < 1024:
		return fmt.Errorf("gateway.max_body_bytes: must be at least 1024, got %d", c.MaxBodyBytes)
	case c.MaxFutureSkew < minFutureSkew || c.MaxFutureSkew > validate.MaxFutureSkewLimit:
		return fmt.Errorf("gateway.max_future_skew: must be between %s and %s, got %s", minFutureSkew, validate.MaxFutureSkewLimit, c.MaxFutureSkew)
	case math.IsNaN(c.RatePerCaller) || math.IsInf(c.RatePerCaller, 0) || c.RatePerCaller < 0:
		return fmt.Errorf("gateway.rate_per_caller: must be a finite number not below 0 (0: unlimited), got %v", c.RatePerCaller)
	case c.RatePerCaller > 0 && c.RateBurst < c.MaxBatch:
		return fmt.Errorf("gateway.rate_burst: must be at least gateway.max_batch (%d), got %d", c.MaxBatch, c.RateBurst)
	case c.ProduceTimeout <= 0:
		return fmt.Errorf("gateway.produce_timeout: must be positive")
	case c.MaxBufferedRecords < c.MaxBatch:
		return fmt.Errorf("gateway.max_buffered_records: must be at least gateway.max_batch (%d)", c.MaxBatch)
	case c.MaxBufferedBytes < encodedCeiling(c.MaxBatch, c.MaxBodyBytes):
		return fmt.Errorf("gateway.max_buffered_bytes: must be at least %d (what the largest request gateway.max_batch and gateway.max_body_bytes allow encodes into), got %d", encodedCeiling(c.MaxBatch, c.MaxBodyBytes), c.MaxBufferedBytes)
	case c.ProducerLinger < 0 || c.ProducerLinger >= c.ProduceTimeout:
		return fmt.Errorf("gateway.producer_linger: must be 0 or more and shorter than gateway.produce_timeout (%s), got %s", c.ProduceTimeout, c.ProducerLinger)
	case c.MaxInflightBytesPerConn < int64(c.MaxBodyBytes):
		return fmt.Errorf("gateway.max_inflight_bytes_per_conn: must be at least gateway.max_body_bytes (%d), got %d", c.MaxBodyBytes, c.MaxInflightBytesPerConn)
	case c.MaxInflightBytes < c.MaxInflightBytesPerConn:
		return fmt.Errorf("gateway.max_inflight_bytes: must be at least gateway.max_inflight_bytes_per_conn (%d), got %d", c.MaxInflightBytesPerConn, c.MaxInflightBytes)
	case c.MaxDecodedBytes < decodedCeiling(c.MaxBatch, c.MaxBodyBytes):
		return fmt.Errorf("gateway.max_decoded_bytes: must be at least %d (what the largest request gateway.max_batch and gateway.max_body_bytes allow may decode into), got %d", decodedCeiling(c.MaxBatch, c.MaxBodyBytes), c.MaxDecodedBytes)
	case c.MaxReadBytesPerCaller < int64(c.MaxBodyBytes) || c.MaxReadBytesPerCaller > c.MaxInflightBytes:
		return fmt.Errorf("gateway.max_read_bytes_per_caller: must be at least gateway.max_body_bytes (%d) and at most gateway.max_inflight_bytes (%d), got %d", c.MaxBodyBytes, c.MaxInflightBytes, c.MaxReadBytesPerCaller)
	case c.MaxStreamsPerConn < 1:
		return fmt.Errorf("gateway.max_streams_per_conn: must be at least 1, got %d", c.MaxStreamsPerConn)
	case c.MaxConns < 0:
		return fmt.Errorf("gateway.max_conns: must not be negative")
	case c.MaxConnsPerAddress < 0:
		return fmt.Errorf("gateway.max_conns_per_address: must not be negative")
	case c.ReadHeaderTimeout <= 0:
		return fmt.Errorf("gateway.read_header_timeout: must be positive")
	case c.ReadTimeout < c.ReadHeaderTimeout:
		return fmt.Errorf("gateway.read_timeout: must be at least gateway.read_header_timeout (%s), got %s", c.ReadHeaderTimeout, c.ReadTimeout)
	case c.CallTimeout <= c.ProduceTimeout || c.CallTimeout <= c.HistoryTimeout:
		return fmt.Errorf("gateway.call_timeout: must be longer than gateway.produce_timeout (%s) and gateway.history_timeout (%s), got %s", c.ProduceTimeout, c.HistoryTimeout, c.CallTimeout)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("gateway.idle_timeout: must be positive")
	case c.MaxConnectionAge <= 0:
		return fmt.Errorf("gateway.max_connection_age: must be positive")
	case math.IsNaN(c.ReadRatePerCaller) || math.IsInf(c.ReadRatePerCaller, 0) || c.ReadRatePerCaller < 0:
		return fmt.Errorf("gateway.read_rate_per_caller: must be a finite number not below 0 (0: unlimited), got %v", c.ReadRatePerCaller)
	case c.ReadRatePerCaller > 0 && c.ReadBurst < 1:
		return fmt.Errorf("gateway.read_burst: must be at least 1, got %d", c.ReadBurst)
	case c.MaxConcurrentReads < 1:
		return fmt.Errorf("gateway.max_concurrent_reads: must be at least 1, got %d", c.MaxConcurrentReads)
	case c.HistoryTimeout <= 0:
		return fmt.Errorf("gateway.history_timeout: must be positive")
	}
	return nil
}
