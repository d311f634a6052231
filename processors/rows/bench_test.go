package rows

import (
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/processors/rows/rowstest"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// BenchmarkDecode measures turning records into columns (no ClickHouse).
func BenchmarkDecode(b *testing.B) {
	recs := benchRecords(b)
	b.ResetTimer()
	for range b.N {
		var blk Events
		for _, r := range recs {
			if err := blk.Add(r); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkInsertColumns measures the store's CPU for a batch before it is
// sent: records decoded into a grown Events, then appended to clickhouse-go's
// columns of the events table (what batch.Send encodes).
func BenchmarkInsertColumns(b *testing.B) {
	recs := benchRecords(b)
	b.ResetTimer()
	for range b.N {
		var blk Events
		blk.Grow(len(recs))
		for _, r := range recs {
			if err := blk.Add(r); err != nil {
				b.Fatal(err)
			}
		}
		values := blk.Columns()
		for i, c := range EventTable {
			col, err := column.Type(c.Type).Column(c.Name, &column.ServerContext{Timezone: time.UTC})
			if err != nil {
				b.Fatal(err)
			}
			if err := AppendColumn(Appender{col}, values[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "events/s")
}

func benchRecords(b *testing.B) []*kgo.Record {
	recs := make([]*kgo.Record, 10000)
	now := time.Now()
	for i := range recs {
		ts := timestamppb.New(now.Add(-time.Duration(i) * time.Second))
		ev := &datamodels.HealthEvent{
			Version: 1, Agent: "faultline-agent", ComponentClass: "NIC", CheckName: "InfiniBandStateCheck",
			Message:            fmt.Sprintf("port mlx5_%d:1 state DOWN (phys_state LinkDown)", i%8),
			EntitiesImpacted:   []*datamodels.Entity{{EntityType: "NIC", EntityValue: fmt.Sprintf("mlx5_%d", i%8)}, {EntityType: "NICPort", EntityValue: "1"}},
			Metadata:           map[string]string{"link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)", "role": "compute"},
			GeneratedTimestamp: ts, ReceivedTimestamp: ts, NodeName: fmt.Sprintf("gpu-node-%04d", i%2000), Cluster: "bench",
			Id: events.NewID(),
		}
		recs[i] = rowstest.EventRecord(b, ev)
	}
	return recs
}
