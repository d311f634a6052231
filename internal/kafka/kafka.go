// Package kafka builds franz-go clients the same way for every faultline
// binary: one typed config, the shared slog logger, and the topics the
// pipeline needs.
package kafka

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Brokers: "127.0.0.1:9092", Partitions: 12, ReplicationFactor: -1}
}

// RegisterFlags adds the config's flags with the given prefix ("kafka.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Brokers, prefix+"brokers", c.Brokers, "comma-separated Kafka seed brokers")
	fs.IntVar(&c.Partitions, prefix+"partitions", c.Partitions, "partitions of topics created at start")
	fs.IntVar(&c.ReplicationFactor, prefix+"replication-factor", c.ReplicationFactor, "replication factor of topics created at start (-1: broker default)")
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
	return nil
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
// logger, plus any extra options (producer or consumer settings).
func NewClient(c Config, log *slog.Logger, opts ...kgo.Opt) (*kgo.Client, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(c.SeedBrokers()...),
		kgo.WithLogger(kslog.New(log.With("component", "kafka"))),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client for %s: %w", c.Brokers, err)
	}
	return cl, nil
}

// PipelineTopics are the topics every faultline pipeline needs.
var PipelineTopics = []string{events.TopicEvents, events.TopicActions, events.TopicDeadLetter}

// EnsureTopics creates the missing topics, leaving existing ones as they are.
// It retries until ctx ends while the brokers are not reachable yet.
func EnsureTopics(ctx context.Context, cl *kgo.Client, c Config, topics ...string) error {
	adm := kadm.NewClient(cl)
	for {
		resp, err := adm.CreateTopics(ctx, int32(c.Partitions), int16(c.ReplicationFactor), nil, topics...)
		if err == nil {
			for _, t := range resp.Sorted() {
				if t.Err != nil && !errors.Is(t.Err, kerr.TopicAlreadyExists) {
					return fmt.Errorf("create topic %s: %w", t.Topic, t.Err)
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create topics %v: %w", topics, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

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
