package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSpoolAppendAll: a batch goes in whole, in order, each event given an
// id, or not at all: a batch with one event the capacity policy refuses
// writes none of its events and counts none as dropped.
func TestSpoolAppendAll(t *testing.T) {
	m := NewMetrics()
	sp, err := OpenSpool(t.TempDir(), 64<<10, quiet(), m)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	batch := []*datamodels.HealthEvent{ev("a", false), ev("b", true), ev("c", false)}
	batch[1].Id = "kept"
	if err := sp.AppendAll(batch); err != nil {
		t.Fatal(err)
	}
	got, next, _ := sp.Peek(10)
	if strings.Join(msgs(got), ",") != "a,b,c" || got[0].GetId() == "" || got[1].GetId() != "kept" || got[2].GetId() == got[0].GetId() {
		t.Fatalf("spooled %v", got)
	}
	if err := sp.Commit(next); err != nil {
		t.Fatal(err)
	}

	big := strings.Repeat("y", 1000)
	for range 100 {
		sp.Append([]*datamodels.HealthEvent{ev(big, false)}) // up to 90%
	}
	before, dropped := sp.Pending(), val(m.spoolDropped.WithLabelValues("reserved_for_fatal"))+val(m.spoolDropped.WithLabelValues("full"))
	// A fatal event would fit in the reserve, the non-fatal one after it
	// not: neither is written.
	err = sp.AppendAll([]*datamodels.HealthEvent{ev(big, true), ev(big, false)})
	if !errors.Is(err, ErrSpoolFull) || !strings.Contains(err.Error(), "events[1] of these 2 does not fit") {
		t.Fatalf("over the policy: %v", err)
	}
	if sp.Pending() != before {
		t.Fatalf("a refused batch wrote %d bytes", sp.Pending()-before)
	}
	if v := val(m.spoolDropped.WithLabelValues("reserved_for_fatal")) + val(m.spoolDropped.WithLabelValues("full")); v != dropped {
		t.Fatalf("refused batch counted as %v dropped events", v-dropped)
	}
	if val(m.spoolFull) != 1 {
		t.Fatal("spool_full not set")
	}
	if err := sp.AppendAll([]*datamodels.HealthEvent{ev(big, true)}); err != nil {
		t.Fatalf("fatal event in the reserve: %v", err)
	}
	if sp.Pending() <= before {
		t.Fatal("fatal event not written")
	}
	sp.Close()
	if err := sp.AppendAll([]*datamodels.HealthEvent{ev("late", true)}); !errors.Is(err, ErrSpoolClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
