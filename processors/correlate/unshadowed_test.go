package correlate

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestShadowedRuleRecoversLiveVerdicts: a rule put in shadow mode (the
// documented way to stop a noisy rule) still recovers its standing live
// verdicts, live, in the sweep; before, the sweep read only its shadow
// records, and the live verdict's node stayed cordoned for good. A rule no
// longer in the file leaves its live verdicts counted in
// faultline_correlate_orphan_verdicts.
func TestShadowedRuleRecoversLiveVerdicts(t *testing.T) {
	s := server(t)
	m, h := time.Minute, time.Hour
	c := newCluster("unshadow")
	hs := newHarness(t, s, DefaultRules, nil)
	hs.cluster = c
	got := hs.batches([][]*datamodels.HealthEvent{{xid(c, "n1", 0, 31, false, 1)}, {xid(c, "n1", 10*m, 31, false, 1)}})
	if d := describe(got); d != "RepeatedXID31OnSameGPU:fault" {
		t.Fatalf("derived %q, want the live verdict", d)
	}

	// the operator removes the rule: its live verdict is an orphan
	removed := newHarness(t, s, DefaultRules, nil)
	var kept []*Rule
	for _, r := range removed.rules {
		if r.Name != "RepeatedXID31OnSameGPU" {
			kept = append(kept, r)
		}
	}
	removed.h = New(s.Conn, kept, removed.clock.Now, 2*time.Minute, removed.h.log, nil)
	removed.cluster = c
	if d := describe(removed.sweep(27 * h)); d != none {
		t.Fatalf("rule removed: derived %q, want none", d)
	}
	if n := testutil.ToFloat64(removed.h.metrics.orphans); n < 1 {
		t.Errorf("orphan verdicts %v, want at least 1", n)
	}

	// the operator shadows it: the live verdict recovers, live
	shadowed := newHarness(t, s, DefaultRules, func(rs []*Rule) {
		for _, r := range rs {
			r.Shadow = r.Name == "RepeatedXID31OnSameGPU"
		}
	})
	shadowed.cluster = c
	got = shadowed.sweep(27 * h)
	if d := describe(got); d != "RepeatedXID31OnSameGPU:recovery" {
		t.Fatalf("rule shadowed: derived %q, want the live verdict's recovery", d)
	}
	if got[0].GetMetadata()[MetaMode] != ModeLive || got[0].GetProcessingStrategy() == datamodels.ProcessingStrategy_STORE_ONLY {
		t.Errorf("recovery mode %q strategy %s, want live", got[0].GetMetadata()[MetaMode], got[0].GetProcessingStrategy())
	}
	if d := describe(shadowed.sweep(28 * h)); d != none {
		t.Fatalf("next sweep: derived %q, want none", d)
	}
}
