package correlate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// memoryCapped runs every query with ClickHouse's max_memory_usage set
// to limit bytes.
type memoryCapped struct {
	clickhouse.Conn
	limit int
}

func (c memoryCapped) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	return c.Conn.Query(ch.Context(ctx, ch.WithSettings(ch.Settings{"max_memory_usage": c.limit})), q, args...)
}

// TestMemoryLimitSplitsTheQuery: a rule query ClickHouse refuses for its
// memory limit runs again for each half of its triggers, and the values
// and cause ids are those of the whole query; a single trigger over the
// limit is the batch's error. FabricIncident's cause pass copies its
// group's events (here 1,500 nodes' port downs) to each of its 1,500
// triggers: ~150 MB in one block, over a 40 MB limit; an eighth of the
// triggers fits.
func TestMemoryLimitSplitsTheQuery(t *testing.T) {
	s := server(t)
	c := newCluster("split")
	rules, err := ParseRules(DefaultRules, nil)
	if err != nil {
		t.Fatal(err)
	}
	var fabric *Rule
	for _, r := range rules {
		if r.Name == "FabricIncident" {
			fabric = r
		}
	}
	var recs []*kgo.Record
	for i := range 1500 {
		recs = append(recs, evRecord(t, nicState(c, fmt.Sprintf("n%04d", i), time.Duration(i)*time.Millisecond, false)))
	}
	bt, err := newBatchTables(recs)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	handler := func(conn clickhouse.Conn) *Handler {
		return New(conn, rules, func() time.Time { return base.Add(time.Minute) }, time.Minute, log, nil)
	}
	whole := handler(s.Conn)
	items, _, err := decode(recs, log)
	if err != nil {
		t.Fatal(err)
	}
	trigs := whole.triggers(fabric, items)
	if len(trigs) != len(recs) {
		t.Fatalf("%d triggers, want %d", len(trigs), len(recs))
	}
	want, err := whole.runRule(ctx(t), fabric, trigs, bt, passCauses)
	if err != nil {
		t.Fatal(err)
	}
	if last := want[trigs[len(trigs)-1].tid]; len(want) != len(trigs) || last.value != 1500 || len(last.causes) != 100 {
		t.Fatalf("unlimited: %d results, the last trigger's value %v with %d cause ids; want %d, 1500, 100", len(want), last.value, len(last.causes), len(trigs))
	}
	if _, err := handler(memoryCapped{s.Conn, 40 << 20}).runRuleOnce(ctx(t), fabric, trigs, bt, passCauses); !memoryLimited(err) {
		t.Fatalf("one query under a 40 MB limit: %v, want the memory limit", err)
	}

	split := handler(memoryCapped{s.Conn, 40 << 20})
	got, err := split.runRule(ctx(t), fabric, trigs, bt, passCauses)
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if !maps.EqualFunc(got, want, func(a, b result) bool {
		return a.value == b.value && a.lastMS == b.lastMS && slices.Equal(a.causes, b.causes)
	}) {
		t.Fatalf("split results differ from the whole query's (%d against %d results)", len(got), len(want))
	}
	if n := counterValue(t, split.metrics.splits.WithLabelValues(fabric.Name)); n < 1 {
		t.Fatalf("splits counted: %v, want at least 1", n)
	}

	if _, err := handler(memoryCapped{s.Conn, 1 << 20}).runRule(ctx(t), fabric, trigs, bt, passCauses); !memoryLimited(err) {
		t.Fatalf("a limit no trigger fits: %v, want the memory limit's error", err)
	}
}

// TestXidStormIsOneBurst: a GPU in an Xid storm (2,000 fatal Xids 20 s
// apart, one batch, every one a trigger) is one burst, counted in one
// query: xid_bursts.sql sorts a GPU's events once per trigger (n log n),
// where a running maximum over every prefix (n² per trigger, 10 GB here)
// ran over ClickHouse's memory limit and was split. Four later bursts
// make five, the threshold.
func TestXidStormIsOneBurst(t *testing.T) {
	s := server(t)
	c := newCluster("storm")
	hs := newHarness(t, s, DefaultRules, nil)
	hs.cluster = c
	var storm []*datamodels.HealthEvent
	for i := range 2000 {
		storm = append(storm, xid(c, "n1", time.Duration(i)*20*time.Second, 48, true, 1))
	}
	if got := hs.batches([][]*datamodels.HealthEvent{storm}); len(got) != 0 {
		t.Fatalf("the storm derived %s, want nothing (one burst)", describe(got))
	}
	if n := counterValue(t, hs.h.metrics.splits.WithLabelValues("RepeatedXIDOnSameGPU")); n != 0 {
		t.Errorf("the storm's query was split %v times over the memory limit, want one query", n)
	}
	end := 2000 * 20 * time.Second
	var later [][]*datamodels.HealthEvent
	for i := 1; i <= 4; i++ {
		later = append(later, []*datamodels.HealthEvent{xid(c, "n1", end+time.Duration(i)*10*time.Minute, 48, true, 1)})
	}
	got := hs.batches(later)
	if len(got) != 1 || got[0].GetDerivedBy() != "RepeatedXIDOnSameGPU" || got[0].GetMetadata()[MetaValue] != "5" {
		t.Fatalf("four bursts after the storm derived %s, want one RepeatedXIDOnSameGPU verdict of 5 bursts", describe(got))
	}
}
