package agent

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
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

// TestSpoolReopensDamage: a cursor with a negative offset (damaged on
// disk) starts from the spool's start — its reads failed for ever, the
// sender wedged — and a zero-filled tail (a file extended but not written
// before a power cut) is torn, not read as empty events (CRC-32C of
// nothing is 0: 4 KiB of zeros were 512 empty events).
func TestSpoolReopensDamage(t *testing.T) {
	dir := t.TempDir()
	sp, err := OpenSpool(dir, 64<<10, quiet(), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.AppendAll([]*datamodels.HealthEvent{ev("a", false)}); err != nil {
		t.Fatal(err)
	}
	sp.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) != 1 {
		t.Fatalf("segments %v", segs)
	}
	f, err := os.OpenFile(segs[0], os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	seq := strings.TrimLeft(strings.TrimSuffix(filepath.Base(segs[0]), ".seg"), "0")
	if err := os.WriteFile(filepath.Join(dir, "cursor"), []byte(cmp.Or(seq, "0")+" -8\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err = OpenSpool(dir, 64<<10, quiet(), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	got, _, err := sp.Peek(1000)
	if err != nil || strings.Join(msgs(got), ",") != "a" {
		t.Fatalf("reopened: %d events %v, %v; want the one event", len(got), msgs(got), err)
	}
}

// TestSpoolOversizeDoesNotLatchFull: a refusal of more than the room left
// in a spool holding little (a relay call of ten 7 KB non-fatal events, an
// own check's event over 90% of a 64 KiB spool) latched "full" with
// nothing unsent: no send, so no Commit ever cleared it, and every later
// non-fatal event was refused. The refusal must stand alone.
func TestSpoolOversizeDoesNotLatchFull(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse func(*Spool) error
	}{
		{"AppendAll of ten 7 KB events", func(sp *Spool) error {
			var evs []*datamodels.HealthEvent
			for range 10 {
				evs = append(evs, ev(strings.Repeat("x", 7000), false))
			}
			return sp.AppendAll(evs)
		}},
		{"Append of one 60 KB event", func(sp *Spool) error {
			n, err := sp.Append([]*datamodels.HealthEvent{ev(strings.Repeat("x", 60000), false)})
			if err == nil && n == 0 {
				err = ErrSpoolFull
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics()
			sp, err := OpenSpool(t.TempDir(), 64<<10, quiet(), m)
			if err != nil {
				t.Fatal(err)
			}
			defer sp.Close()
			if err := tc.refuse(sp); !errors.Is(err, ErrSpoolFull) {
				t.Fatalf("oversized append: %v, want ErrSpoolFull", err)
			}
			if sp.Pending() != 0 || val(m.spoolFull) != 0 {
				t.Errorf("after the refusal: pending %d bytes, spool_full %v; want 0, 0", sp.Pending(), val(m.spoolFull))
			}
			if n, err := sp.Append([]*datamodels.HealthEvent{ev(strings.Repeat("s", 100), false)}); n != 1 || err != nil {
				t.Errorf("a 100-byte non-fatal event after it: accepted %d, %v; want 1", n, err)
			}
			if err := sp.AppendAll([]*datamodels.HealthEvent{ev("small", false)}); err != nil {
				t.Errorf("a small AppendAll after it: %v", err)
			}
		})
	}
}
