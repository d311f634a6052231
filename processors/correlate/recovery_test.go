package correlate

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSweepRecoveryRulesCountTheirTrigger: a rule with recovery = "sweep"
// skips the triggers of a standing verdict, which is lossless only if a
// trigger always counts in its own window (its window's last counted
// event is the trigger, so the stabilization since it has not passed and
// the trigger cannot recover the verdict). For every shipped rule that
// says so, each trigger of a varied batch (codes, flood summaries, GPUs
// named by PCI or UUID, machines named or not, several checks) finds
// itself in its window.
func TestSweepRecoveryRulesCountTheirTrigger(t *testing.T) {
	s := server(t)
	c := newCluster("recovery")
	sec := time.Second
	var evs []*datamodels.HealthEvent
	for i, code := range []int{31, 48, 79, 13, 74, 95, 119} {
		at := time.Duration(i) * 7 * sec
		evs = append(evs, xid(c, "n1", at, code, true, 1), xid(c, "n2", at, code, code != 13, 40),
			xidOn(c, "n3", at, code, "", "0000:3b:00"), on("machine-b", xidOn(c, "n3", at+sec, code, "GPU-7", "0000:3b:00")))
	}
	evs = append(evs, nicState(c, "n4", 0, false), on("machine-c", nicState(c, "n5", sec, false)), linkDowned(c, "n6", 2*sec, 1),
		sxidEv(c, "n7", "SysLogsSXIDError", 3*sec, 12028, true, "GPU-1", ""), sxidEv(c, "n8", "FabricManagerNVSwitchError", 4*sec, 20034, true, "", "0000:17:00"))
	var recs []*kgo.Record
	for _, ev := range evs {
		recs = append(recs, evRecord(t, ev))
	}
	hs := newHarness(t, s, DefaultRules, nil)
	bt, err := newBatchTables(recs)
	if err != nil {
		t.Fatal(err)
	}
	items, _, err := decode(recs, hs.h.log)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, r := range hs.rules {
		if !r.SweepRecovery {
			continue
		}
		declared++
		trigs := hs.h.triggers(r, items)
		if len(trigs) == 0 {
			t.Fatalf("%s: the batch triggers it nowhere", r.Name)
		}
		res, err := hs.h.runRule(ctx(t), r, trigs, bt, passValue)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range trigs {
			if got, ok := res[tr.tid]; !ok || got.lastMS < tr.atMS {
				t.Errorf("%s: trigger %s/%s at %d: window's last counted event at %d (found %v), want the trigger itself", r.Name, tr.node, tr.gkey, tr.atMS, got.lastMS, ok)
			}
		}
	}
	if declared == 0 {
		t.Fatal("no shipped rule recovers in the sweep only")
	}
}

// TestSweepRecoverySkipsStandingTriggers: the triggers of a standing
// FabricIncident (recovery = "sweep") past its stabilization are not
// evaluated; the sweep recovers it once its window is empty.
func TestSweepRecoverySkipsStandingTriggers(t *testing.T) {
	s := server(t)
	c := newCluster("recovery")
	hs := newHarness(t, s, DefaultRules, nil)
	hs.cluster = c
	m := time.Minute
	downs := func(at time.Duration, from int) []*datamodels.HealthEvent {
		var out []*datamodels.HealthEvent
		for i := range 4 {
			out = append(out, nicState(c, fmt.Sprintf("n%d", from+i), at+time.Duration(i)*time.Second, false))
		}
		return out
	}
	if got := only("FabricIncident", hs.batches([][]*datamodels.HealthEvent{downs(0, 1)})); len(got) != 1 || got[0].GetIsHealthy() {
		t.Fatalf("four nodes down: %s, want the incident", describe(got))
	}
	skipped := hs.h.metrics.triggers.WithLabelValues("FabricIncident", "skipped")
	before := counterValue(t, skipped)
	// past the 10m stabilization, the incident goes on
	if got := only("FabricIncident", hs.batches([][]*datamodels.HealthEvent{downs(12*m, 5)})); len(got) != 0 {
		t.Fatalf("more downs while it stands: %s, want nothing", describe(got))
	}
	if n := counterValue(t, skipped) - before; n != 4 {
		t.Fatalf("%v triggers of the standing incident skipped, want 4", n)
	}
	if got := only("FabricIncident", hs.sweep(13*m)); len(got) != 0 {
		t.Fatalf("sweep with the downs in the 2m window: %s, want nothing", describe(got))
	}
	if got := only("FabricIncident", hs.sweep(15*m)); len(got) != 1 || !got[0].GetIsHealthy() {
		t.Fatalf("sweep with the window empty: %s, want the recovery", describe(got))
	}
}
