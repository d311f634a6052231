// Package gateway is faultline's only door: gRPC (NVSentinel's
// PlatformConnector and faultline's Events service) and REST through
// grpc-gateway. It authenticates the caller, stamps the caller's cluster,
// validates, assigns ids, and answers only after Kafka acknowledged.
package gateway

import (
	"flag"
	"fmt"
	"time"
)

// Config is the gateway's configuration.
type Config struct {
	// GRPCAddr is the gRPC listen address. Default 127.0.0.1:50051.
	GRPCAddr string `toml:"grpc_addr"`
	// HTTPAddr is the REST/metrics listen address. Default 127.0.0.1:8080.
	HTTPAddr string `toml:"http_addr"`
	// UnixSocket, when set, also serves gRPC on this unix socket for
	// node-local NVSentinel monitors; its events belong to UnixSocketCluster
	// (the socket's file permissions are the credential).
	UnixSocket        string `toml:"unix_socket"`
	UnixSocketCluster string `toml:"unix_socket_cluster"`
	// TLSCert and TLSKey enable TLS on both TCP doors.
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
	// ClientCA enables mTLS: a client certificate signed by it authenticates
	// its caller; the cluster is the certificate's first Organization.
	ClientCA string `toml:"client_ca"`
	// TokensFile holds "token,cluster" lines (# comments). Required unless
	// ClientCA is set.
	TokensFile string `toml:"tokens_file"`

	// MaxBatch is the most events in one request. Default 1000.
	MaxBatch int `toml:"max_batch"`
	// MaxBodyBytes bounds one REST body or gRPC message. Default 4 MiB.
	MaxBodyBytes int `toml:"max_body_bytes"`
	// MaxFutureSkew is how far in the future generatedTimestamp may be. Default 5m.
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
	}
}

// RegisterFlags adds the gateway's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.GRPCAddr, "grpc-addr", c.GRPCAddr, "gRPC listen address")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "REST, metrics and health listen address")
	fs.StringVar(&c.UnixSocket, "unix-socket", c.UnixSocket, "also serve gRPC on this unix socket (node-local monitors)")
	fs.StringVar(&c.UnixSocketCluster, "unix-socket-cluster", c.UnixSocketCluster, "cluster of events received on the unix socket")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "TLS certificate file")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "TLS key file")
	fs.StringVar(&c.ClientCA, "client-ca", c.ClientCA, "CA file for mTLS client certificates (cluster = certificate Organization)")
	fs.StringVar(&c.TokensFile, "tokens-file", c.TokensFile, "file of 'token,cluster' lines")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "most events in one request")
	fs.IntVar(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest REST body or gRPC message")
	fs.DurationVar(&c.MaxFutureSkew, "max-future-skew", c.MaxFutureSkew, "how far in the future generatedTimestamp may be")
	fs.Float64Var(&c.RatePerCaller, "rate-per-caller", c.RatePerCaller, "events/s per caller: token, client certificate or unix socket (0: unlimited)")
	fs.IntVar(&c.RateBurst, "rate-burst", c.RateBurst, "burst of events per caller")
	fs.DurationVar(&c.ProduceTimeout, "produce-timeout", c.ProduceTimeout, "longest wait for Kafka before answering 503")
	fs.IntVar(&c.MaxBufferedRecords, "max-buffered-records", c.MaxBufferedRecords, "producer buffer; requests that do not fit get 429")
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
	case c.MaxBatch < 1:
		return fmt.Errorf("gateway.max_batch: must be at least 1, got %d", c.MaxBatch)
	case c.MaxBodyBytes < 1024:
		return fmt.Errorf("gateway.max_body_bytes: must be at least 1024, got %d", c.MaxBodyBytes)
	case c.MaxFutureSkew < 0:
		return fmt.Errorf("gateway.max_future_skew: must not be negative")
	case c.RatePerCaller < 0:
		return fmt.Errorf("gateway.rate_per_caller: must not be negative")
	case c.RatePerCaller > 0 && c.RateBurst < c.MaxBatch:
		return fmt.Errorf("gateway.rate_burst: must be at least gateway.max_batch (%d), got %d", c.MaxBatch, c.RateBurst)
	case c.ProduceTimeout <= 0:
		return fmt.Errorf("gateway.produce_timeout: must be positive")
	case c.MaxBufferedRecords < c.MaxBatch:
		return fmt.Errorf("gateway.max_buffered_records: must be at least gateway.max_batch (%d)", c.MaxBatch)
	}
	return nil
}
