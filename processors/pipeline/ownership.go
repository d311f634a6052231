package pipeline

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Ownership is the partitions of one topic this replica consumes, kept up
// to date as a PartitionObserver (embed it in a Handler). It shares work
// that happens outside Handle between replicas by key — the correlate
// sweep, quarantine's watch for manual uncordons: a key is this replica's
// when its records land on a partition it consumes (the Kafka-compatible
// murmur2 hash every faultline producer uses). Until the group assigns
// anything, or when the topic's partition count is unknown, every key is
// (the work is idempotent; overlaps, as during a rebalance, are harmless).
type Ownership struct {
	// Topic is the topic whose partitions count.
	Topic string

	mu    sync.Mutex
	known bool
	total int
	parts map[int32]bool
}

var keyPartitioner = kgo.StickyKeyPartitioner(nil).ForTopic("")

// PartitionsAssigned implements PartitionObserver.
func (o *Ownership) PartitionsAssigned(topic string, partitions []int32, total int) {
	if topic != o.Topic {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.parts == nil {
		o.parts = map[int32]bool{}
	}
	for _, p := range partitions {
		o.parts[p] = true
	}
	if total > 0 { // 0: not read (a broker restarting); the last count stands
		o.total, o.known = total, true
	}
}

// PartitionsRevoked implements PartitionObserver.
func (o *Ownership) PartitionsRevoked(topic string, partitions []int32) {
	if topic != o.Topic {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range partitions {
		delete(o.parts, p)
	}
}

// Owns reports whether records keyed key are this replica's.
func (o *Ownership) Owns(key []byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.known {
		return true
	}
	return o.parts[int32(keyPartitioner.Partition(&kgo.Record{Key: key}, o.total))]
}
