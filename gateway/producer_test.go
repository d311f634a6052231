package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestRecords checks the batch encoding the producer writes: each record
// is its event's key and its event, whole, and no record's bytes reach
// into the next one's (they share one buffer).
func TestRecords(t *testing.T) {
	evs := []*datamodels.HealthEvent{
		{Cluster: "alpha", NodeName: "gpu-node-1", CheckName: "XidCheck", ErrorCode: []string{"XID-79"},
			Metadata: map[string]string{"a": "1", "b": "2"}, ReceivedTimestamp: timestamppb.Now()},
		{Cluster: "alpha", NodeName: "n"}, // the smallest event
		{Cluster: "beta.example", NodeName: "gpu-node-2", Message: string(bytes.Repeat([]byte("x"), 5000)),
			EntitiesImpacted: []*datamodels.Entity{{EntityType: "GPU", EntityValue: "0"}}},
	}
	recs, size, err := records(evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(evs) {
		t.Fatalf("%d records for %d events", len(recs), len(evs))
	}
	sum := 0
	for i, ev := range evs {
		sum += len(recs[i].Key) + len(recs[i].Value)
		if want := events.Key(ev.GetCluster(), ev.GetNodeName()); !bytes.Equal(recs[i].Key, want) {
			t.Errorf("record %d: key %q, want %q", i, recs[i].Key, want)
		}
		got, err := events.Unmarshal(recs[i].Value)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !proto.Equal(got, ev) {
			t.Errorf("record %d decodes to %v, want %v", i, got, ev)
		}
		if cap(recs[i].Key) != len(recs[i].Key) || cap(recs[i].Value) != len(recs[i].Value) {
			t.Errorf("record %d: key or value can grow into the next record's bytes", i)
		}
	}
	if sum != size {
		t.Errorf("records of %d bytes, size says %d", sum, size)
	}
}

// TestProducerBufferedBytes: while a broker takes produce requests and
// never answers, calls answered 503 leave their records buffered (the
// idempotent producer fails none it may have sent) and their retries add
// them again. gateway.max_buffered_bytes refuses the call that would pass
// it (429) instead of letting the buffer grow to max_buffered_records of
// any size (30 such calls of 20 fat events held 84 MiB outside every
// budget); once the broker answers, the bytes are given back.
func TestProducerBufferedBytes(t *testing.T) {
	wake := make(chan struct{})
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, events.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { <-wake }) // then handled as usual
		return nil, nil, false
	})

	cfg := DefaultConfig()
	cfg.ProduceTimeout, cfg.MaxBufferedBytes = time.Second, 1<<20
	p, err := NewProducer(kafka.Config{Brokers: strings.Join(c.ListenAddrs(), ",")}, cfg,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Wake the broker first: Close flushes.
		select {
		case <-wake:
		default:
			close(wake)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Close(ctx)
	}()
	batch := func() []*datamodels.HealthEvent {
		md := make(map[string]string, 8)
		for i := range 8 {
			md[fmt.Sprint("k", i)] = strings.Repeat("v", 2048)
		}
		evs := make([]*datamodels.HealthEvent, 20)
		for i := range evs {
			evs[i] = &datamodels.HealthEvent{Cluster: "alpha", NodeName: fmt.Sprint("gpu-node-", i),
				Message: strings.Repeat("m", 8<<10), Metadata: md}
		}
		return evs
	}

	ctx := context.Background()
	overloaded := 0
	for range 8 {
		err := p.Produce(ctx, batch())
		switch {
		case errors.Is(err, ErrOverloaded):
			overloaded++
		case !errors.Is(err, ErrUnavailable):
			t.Fatalf("broker hanging: %v, want ErrUnavailable or ErrOverloaded", err)
		}
	}
	if held := p.cl.BufferedProduceBytes(); held > cfg.MaxBufferedBytes || p.BufferedBytes() > cfg.MaxBufferedBytes {
		t.Errorf("the client holds %d bytes (the producer counts %d), past gateway.max_buffered_bytes %d",
			held, p.BufferedBytes(), cfg.MaxBufferedBytes)
	}
	if overloaded == 0 {
		t.Fatalf("no call refused ErrOverloaded; the client holds %d bytes", p.cl.BufferedProduceBytes())
	}

	close(wake)
	deadline := time.Now().Add(10 * time.Second)
	for p.BufferedBytes() != 0 || p.cl.BufferedProduceBytes() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("broker answering: still %d bytes counted, %d buffered", p.BufferedBytes(), p.cl.BufferedProduceBytes())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Produce(ctx, batch()); err != nil {
		t.Fatalf("broker answering: %v", err)
	}
}
