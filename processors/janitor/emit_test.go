package janitor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// downBroker is a producer whose broker is down: like franz-go without a
// record delivery timeout, it answers only when the context ends.
type downBroker struct{ tries atomic.Int32 }

func (d *downBroker) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	d.tries.Add(1)
	<-ctx.Done()
	return kgo.ProduceResults{{Record: rs[0], Err: ctx.Err()}}
}

// TestEmitBoundedWhileKafkaIsDown: an action that cannot be produced
// takes five bounded tries, then is counted and logged, and the worker
// goes on (it used to wait for the broker for ever, and with it the
// reboots it follows).
func TestEmitBoundedWhileKafkaIsDown(t *testing.T) {
	prod := &downBroker{}
	j, err := New(DefaultConfig(), clusters.Config{}, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Producer: prod})
	if err != nil {
		t.Fatal(err)
	}
	j.emitTry = 50 * time.Millisecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.emit(context.Background(), &faultlinev1.Action{Id: "a1", Cluster: "c1", Node: "n1", Role: Role, Kind: events.KindReboot, Outcome: events.OutcomeApplied})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("emit still waiting for the broker after 10s")
	}
	var m dto.Metric
	if err := j.m.auditErrors.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := prod.tries.Load(); n != 5 || m.GetCounter().GetValue() != 1 {
		t.Fatalf("%d tries, %v audit errors; want 5 and 1", n, m.GetCounter().GetValue())
	}
}
