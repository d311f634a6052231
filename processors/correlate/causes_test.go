package correlate

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestCausesWithValuesOrApart: a rule's verdicts carry the same cause ids
// whether its value query returns them (causes = "value", the default:
// one query a batch) or a second query reads them for the new verdicts
// (causes = "verdicts"). The same batches run in two clusters, one with
// the shipped rules, one with every rule reading its causes apart; every
// rule's verdict has the same causes (as positions in the scenario) in
// both, and only the rules that read them apart run the causes pass.
func TestCausesWithValuesOrApart(t *testing.T) {
	s := server(t)
	minute := time.Minute
	scenario := func(c string) ([][]*kgo.Record, map[string]int) {
		b1 := []*datamodels.HealthEvent{
			xid(c, "n1", 0, 31, false, 1),
			xid(c, "n2", 0, 48, true, 1), xid(c, "n2", 4*minute, 48, true, 1), xid(c, "n2", 8*minute, 48, true, 1),
			nicState(c, "n3", 0, false), nicState(c, "n3", 20*time.Second, true), nicState(c, "n3", 40*time.Second, false),
			sxidEv(c, "n4", "SysLogsSXIDError", 0, 12028, true, "GPU-1", ""),
		}
		b2 := []*datamodels.HealthEvent{
			xid(c, "n1", 10*minute, 31, false, 3),
			xid(c, "n2", 12*minute, 48, true, 1), xid(c, "n2", 16*minute, 48, true, 1),
			nicState(c, "n3", minute, true), nicState(c, "n3", 70*time.Second, false),
			xidOn(c, "n4", 10*time.Second, 74, "GPU-1", "0000:17:00"),
			nicState(c, "n5", 80*time.Second, false), nicState(c, "n6", 85*time.Second, false), nicState(c, "n7", 90*time.Second, false),
		}
		pos := map[string]int{}
		var out [][]*kgo.Record
		for _, b := range [][]*datamodels.HealthEvent{b1, b2} {
			var recs []*kgo.Record
			for _, ev := range b {
				r := evRecord(t, ev)
				pos[ev.GetId()] = len(pos)
				recs = append(recs, r)
			}
			out = append(out, recs)
		}
		var acts []*kgo.Record
		for i := range 5 {
			a := remediation(c, "n8", time.Duration(i)*minute)
			pos[a.GetId()] = len(pos)
			acts = append(acts, actRecord(t, a))
		}
		out[1] = append(out[1], acts...)
		return out, pos
	}
	// verdicts maps "rule node entity" to the verdict's cause ids as
	// positions in the scenario.
	verdicts := func(hs *harness, c string) map[string][]int {
		hs.cluster = c
		batches, pos := scenario(c)
		var derived []*datamodels.HealthEvent
		for _, b := range batches {
			derived = append(derived, hs.batch(b...)...)
		}
		derived = append(derived, hs.sweep(10*minute)...) // NICPortDrop's verdicts start in the sweep
		out := map[string][]int{}
		for _, ev := range derived {
			if ev.GetIsHealthy() {
				continue
			}
			var ps []int
			for _, id := range ev.GetCauseIds() {
				p, ok := pos[id]
				if !ok {
					t.Fatalf("%s: cause id %s is no event of the scenario", ev.GetDerivedBy(), id)
				}
				ps = append(ps, p)
			}
			slices.Sort(ps)
			out[fmt.Sprintf("%s %s %s", ev.GetDerivedBy(), ev.GetNodeName(), ev.GetMetadata()[MetaGroup])] = ps
		}
		return out
	}
	causesQueries := func(hs *harness, rule string) uint64 {
		var m dto.Metric
		if err := hs.h.metrics.query.WithLabelValues(rule, passCauses).(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}

	shipped := newHarness(t, s, DefaultRules, nil)
	apart := newHarness(t, s, DefaultRules, func(rs []*Rule) {
		for _, r := range rs {
			r.CausesApart = true
		}
	})
	want := verdicts(shipped, newCluster("causes-value"))
	got := verdicts(apart, newCluster("causes-apart"))

	for _, r := range shipped.rules {
		found := false
		for k, causes := range want {
			if strings.HasPrefix(k, r.Name+" ") {
				found = true
				if len(causes) == 0 {
					t.Errorf("%s: verdict without causes", k)
				}
			}
		}
		if !found {
			t.Errorf("%s: no verdict in the scenario", r.Name)
		}
		if n := causesQueries(shipped, r.Name); (n > 0) != r.CausesApart {
			t.Errorf("%s (causes apart %v): %d causes queries with the shipped rules", r.Name, r.CausesApart, n)
		}
		if n := causesQueries(apart, r.Name); n == 0 {
			t.Errorf("%s: no causes query with causes read apart", r.Name)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d verdicts with causes apart, %d with the shipped rules:\n%v\n%v", len(got), len(want), got, want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || !slices.Equal(g, w) {
			t.Errorf("%s: causes %v read apart, %v with the values", k, g, w)
		}
	}
}
