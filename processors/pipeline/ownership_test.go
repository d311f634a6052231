package pipeline

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/events"
)

// TestOwnershipMatchesProducers checks that the partition Ownership
// attributes a key to is the one faultline's producers (the gateway and
// the processors use kafka.NewClient's defaults) put its records on, and
// that assignments and revocations decide what a replica owns.
func TestOwnershipMatchesProducers(t *testing.T) {
	const parts = 4
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, events.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = strings.Join(kc.ListenAddrs(), ",")
	cl, err := kafka.NewClient(kcfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	h := Ownership{Topic: events.TopicEvents}
	landed := map[string]int32{} // node -> partition
	for i := range 40 {
		node := "node-" + strconv.Itoa(i)
		if !h.Owns(events.Key("c1", node)) {
			t.Fatalf("%s not owned before any assignment", node)
		}
		r := &kgo.Record{Topic: events.TopicEvents, Key: events.Key("c1", node), Value: []byte("x")}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		landed[node] = r.Partition
	}
	h.PartitionsAssigned(events.TopicActions, []int32{0, 1, 2, 3}, parts) // other topics do not count
	h.PartitionsAssigned(events.TopicEvents, []int32{1, 3}, parts)
	check := func(owned ...int32) {
		t.Helper()
		for node, p := range landed {
			want := false
			for _, o := range owned {
				want = want || o == p
			}
			if got := h.Owns(events.Key("c1", node)); got != want {
				t.Errorf("owning %v: owns %s (records on partition %d) = %v, want %v", owned, node, p, got, want)
			}
		}
	}
	check(1, 3)
	h.PartitionsRevoked(events.TopicEvents, []int32{3})
	h.PartitionsAssigned(events.TopicEvents, []int32{0}, parts)
	check(0, 1)
	h.PartitionsRevoked(events.TopicEvents, []int32{0, 1})
	check()
	// An assignment whose partition count could not be read (0: a broker
	// restarting) keeps the last count: every key owned would have every
	// replica sweep every node.
	h.PartitionsAssigned(events.TopicEvents, []int32{0}, 0)
	check(0)
}
