// Package kafka builds franz-go clients the same way for every faultline
// binary: one typed config (brokers, TLS, SASL), the shared slog logger,
// and the topics the pipeline needs. Every faultline client of Kafka is made
// by NewClient, so TLS and authentication apply to all of them.
package kafka

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/faultline/faultline/schemas/events"
)

// Config is how a binary reaches Kafka.
type Config struct {
	// Brokers is the comma-separated seed broker list. Default 127.0.0.1:9092.
	Brokers string `toml:"brokers"`
	// Partitions of the topics faultline creates when they are missing. Default 12.
	Partitions int `toml:"partitions"`
	// ReplicationFactor of created topics; -1 uses the broker default. Default -1.
	ReplicationFactor int `toml:"replication_factor"`
	// MinInsyncReplicas is min.insync.replicas of created topics: how many
	// replicas must have a record before an acks=all write (every faultline
	// producer's) succeeds, so an acknowledged event survives the loss of
	// the others. 0 is the fleet default: 2 (with replication factor 3, one
	// broker may fail and writes go on, two and they stop), capped at the
	// topic's replication factor. Default 0.
	MinInsyncReplicas int `toml:"min_insync_replicas"`
	// SessionTimeout is how long a processor role's consumer group waits
	// for a member that stopped heartbeating (crashed, SIGKILLed, its host
	// lost) before the member's partitions go to the others; their events
	// wait that long. A member that stops cleanly leaves at once. The
	// heartbeat is a fifth of it. Kafka's and franz-go's default is 45s
	// (KIP-735 raised it from 10s against spurious rebalances on slow
	// networks); faultline's is 15s: a failed node's events should not
	// wait most of a minute behind a dead processor. The broker bounds it
	// (group.min.session.timeout.ms 6s, group.max.session.timeout.ms 30m
	// by default). Default 15s.
	SessionTimeout time.Duration `toml:"session_timeout"`
	// TLS to the brokers. Default off.
	TLS TLSConfig `toml:"tls"`
	// SASL authentication to the brokers. Default none.
	SASL SASLConfig `toml:"sasl"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Brokers: "127.0.0.1:9092", Partitions: 12, ReplicationFactor: -1, SessionTimeout: 15 * time.Second}
}

// RegisterFlags adds the config's flags with the given prefix ("kafka.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Brokers, prefix+"brokers", c.Brokers, "comma-separated Kafka seed brokers")
	fs.IntVar(&c.Partitions, prefix+"partitions", c.Partitions, "partitions of topics created at start")
	fs.IntVar(&c.ReplicationFactor, prefix+"replication-factor", c.ReplicationFactor, "replication factor of topics created at start (-1: broker default)")
	fs.IntVar(&c.MinInsyncReplicas, prefix+"min-insync-replicas", c.MinInsyncReplicas, "min.insync.replicas of topics created at start (0: 2, capped at the replication factor)")
	fs.DurationVar(&c.SessionTimeout, prefix+"session-timeout", c.SessionTimeout, "consumer group session timeout: how long a dead processor's partitions wait before others take them")
	c.RegisterSecurityFlags(fs, prefix)
}

// RegisterSecurityFlags adds only the TLS and SASL flags (prefix+"tls.…",
// prefix+"sasl.…"), for tools that name their brokers otherwise.
func (c *Config) RegisterSecurityFlags(fs *flag.FlagSet, prefix string) {
	c.TLS.RegisterFlags(fs, prefix+"tls.", "the Kafka brokers")
	c.SASL.registerFlags(fs, prefix+"sasl.")
}

// Validate names the first bad key.
func (c Config) Validate(prefix string) error {
	if len(c.SeedBrokers()) == 0 {
		return fmt.Errorf("%sbrokers: at least one broker is required", prefix)
	}
	if c.Partitions < 1 {
		return fmt.Errorf("%spartitions: must be at least 1, got %d", prefix, c.Partitions)
	}
	if c.ReplicationFactor == 0 || c.ReplicationFactor < -1 {
		return fmt.Errorf("%sreplication_factor: must be -1 or at least 1, got %d", prefix, c.ReplicationFactor)
	}
	if c.MinInsyncReplicas < 0 {
		return fmt.Errorf("%smin_insync_replicas: must be 0 (the default, 2) or at least 1, got %d", prefix, c.MinInsyncReplicas)
	}
	if c.ReplicationFactor > 0 && c.MinInsyncReplicas > c.ReplicationFactor {
		return fmt.Errorf("%smin_insync_replicas: %d is more than %sreplication_factor %d: no write could succeed", prefix, c.MinInsyncReplicas, prefix, c.ReplicationFactor)
	}
	if c.SessionTimeout != 0 && (c.SessionTimeout < 6*time.Second || c.SessionTimeout > 30*time.Minute) {
		return fmt.Errorf("%ssession_timeout: must be between 6s and 30m (the broker's default group.min/max.session.timeout.ms), got %v", prefix, c.SessionTimeout)
	}
	if err := c.TLS.Validate(prefix + "tls."); err != nil {
		return err
	}
	return c.SASL.validate(prefix+"sasl.", c.TLS.Enabled, prefix+"tls.enabled")
}

// SeedBrokers splits Brokers.
func (c Config) SeedBrokers() []string {
	var out []string
	for _, b := range strings.Split(c.Brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// NewClient returns a client for the config's brokers with the shared
// logger, TLS and SASL as configured, plus any extra options (producer or
// consumer settings). TLS files are read here (a client certificate again
// at every handshake), the SASL password or token at every authentication,
// so rotated credentials are picked up by new connections. Errors name the
// config key ("kafka.tls.ca_file: ...") and never contain a secret.
func NewClient(c Config, log *slog.Logger, opts ...kgo.Opt) (*kgo.Client, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(c.SeedBrokers()...),
		kgo.WithLogger(kslog.New(log.With("component", "kafka"))),
		kgo.MetadataMinAge(metadataMinAge),
		kgo.RetryBackoffFn(retryBackoff),
		kgo.RequestRetries(requestRetries),
	}
	sec, err := c.securityOpts(keyPrefix, log)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(slices.Concat(base, sec, opts)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client for %s: %w", c.Brokers, err)
	}
	return cl, nil
}

// NewBoundedProducer returns a client for records that the caller keeps
// elsewhere until they are produced, and produces again with the same ids
// when a try fails (the janitor's actions kept on their resource,
// quarantine's on their node): each acknowledged by every in-sync replica,
// sent at once, and each try bounded by its context. franz-go's idempotent
// producer holds a record it has put in a produce request until it knows
// whether the broker stored it — with the broker gone, until it is back —
// whatever the context says; AllowIdempotentProduceCancellation lets the
// context end the try (within one retry backoff). The price is a copy the
// broker may have stored beside the one produced again: the same id, which
// the store reads once.
func NewBoundedProducer(c Config, log *slog.Logger, opts ...kgo.Opt) (*kgo.Client, error) {
	return NewClient(c, log, append([]kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0),
		kgo.AllowIdempotentProduceCancellation()}, opts...)...)
}

// metadataMinAge is the least time between two metadata requests of a
// client (franz-go's default is 5 s). A record or fetch whose partition
// lost its leader (a broker killed, or back after an outage) waits for the
// next metadata request to find the new one, so franz-go's default let
// events stall up to 5 s after Kafka had already moved the leader. With
// 1 s a client asks at most once a second, and only while something fails:
// negligible for brokers serving a fleet's few faultline clients.
const metadataMinAge = time.Second

// retryBackoff is how long a client waits before its fails-th retry:
// Kafka's own client defaults (KIP-580: retry.backoff.ms 100 doubling up
// to retry.backoff.max.ms 1000, ±20 % jitter) instead of franz-go's 250 ms
// doubling up to 5 s. A consumer group that lost its broker for a few
// seconds had reached a 5 s backoff, and waited it out after the broker
// was back before it joined again: its events waited with it.
func retryBackoff(fails int) time.Duration {
	const least, most = 100 * time.Millisecond, time.Second
	d := most
	if fails < 5 { // 100 ms << 4 is already past most
		d = least << max(0, fails-1)
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// requestRetries is how many times a client sends a request again: enough
// that, as with franz-go's longer backoff, a request gives up after its
// retry timeout (30 s; a group's join, sync and heartbeat: the session
// timeout), not after franz-go's 20 tries, ≈ 18 s at retryBackoff.
const requestRetries = 40

// keyPrefix is the TOML section of Config in every faultline binary; the
// errors NewClient returns name keys under it.
const keyPrefix = "kafka."

// PipelineTopics are the topics every faultline pipeline needs.
var PipelineTopics = []string{events.TopicEvents, events.TopicActions, events.TopicDeadLetter}

// DefaultMinInsyncReplicas is the fleet's min.insync.replicas, used when
// Config.MinInsyncReplicas is 0 (capped at a topic's replication factor).
const DefaultMinInsyncReplicas = 2

// minInsync is the min.insync.replicas of a topic with rf replicas.
func (c Config) minInsync(rf int) (int, error) {
	if c.MinInsyncReplicas == 0 {
		return min(DefaultMinInsyncReplicas, rf), nil
	}
	if c.MinInsyncReplicas > rf {
		return 0, configError{fmt.Errorf("%smin_insync_replicas: %d is more than the %d replicas the topics get (%sreplication_factor %d): no write could succeed",
			keyPrefix, c.MinInsyncReplicas, rf, keyPrefix, c.ReplicationFactor)}
	}
	return c.MinInsyncReplicas, nil
}

// configError is a configuration that cannot work: retrying cannot help.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// topicConfigs returns the configs of created topics: min.insync.replicas
// for the replication factor they get. With replication_factor -1 the
// broker's default is learnt from a validate-only request first, so the
// topics are created with it in one request.
func (c Config) topicConfigs(ctx context.Context, adm *kadm.Client, topics []string) (map[string]*string, error) {
	rf := c.ReplicationFactor
	if rf <= 0 {
		resp, err := adm.ValidateCreateTopics(ctx, int32(c.Partitions), int16(c.ReplicationFactor), nil, topics...)
		if err != nil {
			return nil, err
		}
		for _, t := range resp.Sorted() {
			if t.Err == nil && t.ReplicationFactor > 0 {
				rf = int(t.ReplicationFactor)
				break
			}
		}
		if rf <= 0 { // all exist, or an old broker that does not say
			return nil, nil
		}
	}
	mi, err := c.minInsync(rf)
	if err != nil {
		return nil, err
	}
	v := fmt.Sprint(mi)
	return map[string]*string{"min.insync.replicas": &v}, nil
}

// EnsureTopics creates the missing topics with Partitions,
// ReplicationFactor and min.insync.replicas (MinInsyncReplicas), leaving
// existing ones as they are. It retries until ctx ends while the brokers
// are not reachable yet.
func EnsureTopics(ctx context.Context, cl *kgo.Client, c Config, topics ...string) error {
	adm := kadm.NewClient(cl)
	eofs := 0 // consecutive attempts the broker closed at once
	for {
		configs, err := c.topicConfigs(ctx, adm, topics)
		var resp kadm.CreateTopicResponses
		if err == nil {
			resp, err = adm.CreateTopics(ctx, int32(c.Partitions), int16(c.ReplicationFactor), configs, topics...)
		}
		if _, bad := errors.AsType[configError](err); bad {
			return err
		}
		if err == nil {
			var created, denied []string
			for _, t := range resp.Sorted() {
				switch {
				case t.Err == nil:
					created = append(created, t.Topic)
				case errors.Is(t.Err, kerr.TopicAlreadyExists):
				case errors.Is(t.Err, kerr.TopicAuthorizationFailed), errors.Is(t.Err, kerr.ClusterAuthorizationFailed):
					denied = append(denied, t.Topic)
				default:
					return fmt.Errorf("create topic %s: %w", t.Topic, Explain(t.Err))
				}
			}
			if err := awaitLeaders(ctx, adm, created); err != nil {
				return err
			}
			if len(denied) == 0 {
				return nil
			}
			// With ACLs, a principal that may not create topics finds the
			// ones an operator created: that is enough.
			return topicsExist(ctx, adm, denied)
		}
		if _, ok := errors.AsType[*kgo.ErrFirstReadEOF](err); ok {
			eofs++
		} else {
			eofs = 0
		}
		// Wrong credentials or an untrusted certificate: retrying cannot
		// help, and the minute of retries would hide why. A broker that
		// closes every new connection at once is (after a few tries, as
		// one restarting could too) a TLS or SASL mismatch.
		if Permanent(err) || eofs >= maxFirstReadEOFs {
			return fmt.Errorf("create topics %v on %s: %w", topics, c.Brokers, Explain(err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create topics %v on %s: %w", topics, c.Brokers, Explain(err))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// awaitLeaders returns once every partition of the topics, just created,
// answers on its leader. The controller acknowledges a new topic before
// its leaders have loaded their partitions, and a produce that arrives in
// between fails with NOT_LEADER_OR_FOLLOWER; franz-go then retries after
// its next metadata refresh, which comes at least metadataMinAge (1 s;
// franz-go's default 5 s) after the previous one: a gateway's first
// events, and their cordons, would wait that long.
func awaitLeaders(ctx context.Context, adm *kadm.Client, topics []string) error {
	if len(topics) == 0 {
		return nil
	}
	for {
		offs, err := adm.ListEndOffsets(ctx, topics...)
		if err == nil {
			offs.Each(func(o kadm.ListedOffset) {
				if o.Err != nil && err == nil {
					err = fmt.Errorf("partition %s/%d: %w", o.Topic, o.Partition, o.Err)
				}
			})
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("created topics %v, but their leaders did not answer: %w", topics, Explain(err))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// topicsExist checks that topics this principal may not create exist
// already.
func topicsExist(ctx context.Context, adm *kadm.Client, topics []string) error {
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list topics %v: %w", topics, Explain(err))
	}
	for _, t := range topics {
		d, ok := td[t]
		if !ok || d.Err != nil {
			var err error = kerr.TopicAuthorizationFailed
			if ok && d.Err != nil {
				err = d.Err
			}
			return fmt.Errorf("create topic %s: not allowed to create it, and it does not exist: create it, or allow this principal to: %w", t, Explain(err))
		}
	}
	return nil
}

// maxFirstReadEOFs is how many consecutive attempts (500 ms apart)
// EnsureTopics lets the broker close the connection at once before it
// reports a TLS or SASL mismatch.
const maxFirstReadEOFs = 5

// CreateTopics connects, creates the missing topics and disconnects: what
// every binary and role does at start. It gives up after a minute or when
// ctx ends.
func CreateTopics(ctx context.Context, c Config, log *slog.Logger, topics ...string) error {
	cl, err := NewClient(c, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return EnsureTopics(ctx, cl, c, topics...)
}

// CreatePipelineTopics is CreateTopics of PipelineTopics.
func CreatePipelineTopics(ctx context.Context, c Config, log *slog.Logger) error {
	return CreateTopics(ctx, c, log, PipelineTopics...)
}

// GroupOpts are the consumer group options the config sets: the session
// timeout and a heartbeat a fifth of it (none when SessionTimeout is 0:
// franz-go's defaults).
func (c Config) GroupOpts() []kgo.Opt {
	if c.SessionTimeout == 0 {
		return nil
	}
	return []kgo.Opt{kgo.SessionTimeout(c.SessionTimeout), kgo.HeartbeatInterval(c.SessionTimeout / 5)}
}
