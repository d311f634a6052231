package correlate

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/schemas/events"
)

// ownership is the partitions of the events topic this replica consumes,
// so that replicas share the sweep instead of each sweeping the whole
// fleet: a group is swept by the replica that consumes the partition its
// derived events are keyed to (cluster/node, the gateway's key). Until the
// group assigns anything, or when the topic's partition count is unknown,
// the replica sweeps everything (idempotent: replicas emit the same ids).
type ownership struct {
	mu    sync.Mutex
	known bool
	total int
	parts map[int32]bool
}

// keyPartition is the partition a record keyed key lands on: the
// Kafka-compatible murmur2 hash every faultline producer uses.
var keyPartition = kgo.StickyKeyPartitioner(nil).ForTopic(events.TopicEvents)

// PartitionsAssigned implements pipeline.PartitionObserver.
func (h *Handler) PartitionsAssigned(topic string, partitions []int32, total int) {
	if topic != events.TopicEvents {
		return
	}
	o := &h.owned
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.parts == nil {
		o.parts = map[int32]bool{}
	}
	for _, p := range partitions {
		o.parts[p] = true
	}
	o.total, o.known = total, total > 0
}

// PartitionsRevoked implements pipeline.PartitionObserver.
func (h *Handler) PartitionsRevoked(topic string, partitions []int32) {
	if topic != events.TopicEvents {
		return
	}
	o := &h.owned
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range partitions {
		delete(o.parts, p)
	}
}

// sweeps reports whether this replica sweeps the group of cluster/node.
func (o *ownership) sweeps(cluster, node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.known {
		return true
	}
	return o.parts[int32(keyPartition.Partition(&kgo.Record{Key: events.Key(cluster, node)}, o.total))]
}
