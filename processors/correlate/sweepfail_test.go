package correlate

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// brokenDropRule is a copy of NICPortDrop ("BrokenDrop") appended to the
// shipped rules, so it is swept after them; broken names what of it
// throws in ClickHouse: its candidates query, its window query, or its
// cause ids only (read apart: causes = "verdicts"), which fail after the
// rule has decided its verdict.
func brokenDropRule(t *testing.T, broken string) []byte {
	t.Helper()
	b, err := os.ReadFile("../../sql/rules/nic_port_drop.sql")
	if err != nil {
		t.Fatal(err)
	}
	query := stripComments(string(b))
	candidates := `"nic_port_drop_candidates.sql"`
	causes := "value"
	const throw = "toFloat64(throwIf(count() >= 0))"
	switch broken {
	case "candidates":
		candidates = `'''SELECT '' AS cluster, '' AS node, '' AS gkey, emptyArrayString() AS entity_types, emptyArrayString() AS entity_values, ` + throw + ` AS x FROM system.one'''`
	case "query":
		query = "SELECT tid, " + throw + " AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers GROUP BY tid"
	case "causes":
		causes = "verdicts"
		query = "SELECT tid, value, arrayMap(x -> toString(throwIf(x != '')), cause_ids) AS cause_ids, last_ms FROM (" + query + "\n)"
	}
	return []byte(string(DefaultRules) + `
[[rule]]
name = "BrokenDrop"
trigger = "event.checkName == 'NoSuchCheck'"
scope = "entity"
window = "24h"
query = '''` + query + `'''
candidates = ` + candidates + `
causes = "` + causes + `"
onset = "sweep"
threshold = 1
  [rule.params]
  state_checks = ["InfiniBandStateCheck", "EthernetStateCheck"]
  counter_checks = ["InfiniBandDegradationCheck", "EthernetDegradationCheck"]
  [rule.durations]
  hold = "4m"
  grace = "15s"
`)
}

// TestSweepRuleFailureKeepsOthers: a rule whose sweep fails (here one
// added after the shipped rules) is counted and logged, and the other
// rules' sweep records are produced all the same. Before, the sweep
// returned nothing while this replica remembered the verdicts decided
// before the failure as emitted: NICPortDrop came out only at 7m30s, once
// correlate.cache_ttl (2m) had passed after the failed sweep and the rule
// had been fixed, and never while it stayed broken. A rule that fails
// after deciding its own verdict (its cause ids) does not remember it as
// emitted either: fixed, it derives the verdict at the next sweep.
func TestSweepRuleFailureKeepsOthers(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	for _, tt := range []struct {
		broken string
		fixed  bool
		// want: what the sweeps at 5m, 5m30s and 6m derive
		want [3]string
	}{
		{"candidates", false, [3]string{"NICPortDrop:fault", none, none}},
		{"query", false, [3]string{"NICPortDrop:fault", none, none}},
		{"query", true, [3]string{"NICPortDrop:fault", "BrokenDrop:fault", none}},
		{"causes", false, [3]string{"NICPortDrop:fault", none, none}},
		{"causes", true, [3]string{"NICPortDrop:fault", "BrokenDrop:fault", none}},
	} {
		name := tt.broken + " fails"
		if tt.fixed {
			name += ", then fixed"
		}
		t.Run(name, func(t *testing.T) {
			c := newCluster("sweepfail")
			hs := newHarness(t, s, brokenDropRule(t, tt.broken), nil)
			hs.cluster = c
			fixed, err := ParseRules(brokenDropRule(t, ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			if d := describe(hs.batch(evRecord(t, nicState(c, "n1", 0, false)))); d != none {
				t.Fatalf("derived %q at 0", d)
			}
			broken := hs.h.byName["BrokenDrop"]
			for i, at := range []time.Duration{5 * m, 5*m + 30*sec, 6 * m} {
				if d := describe(hs.sweep(at)); d != tt.want[i] {
					t.Errorf("sweep at %v derived %q, want %q", at, d, tt.want[i])
				}
				if i == 0 {
					if n := counterValue(t, hs.h.metrics.sweepErrors.WithLabelValues("BrokenDrop")); n != 1 {
						t.Errorf("faultline_correlate_sweep_errors_total{rule=BrokenDrop} = %v, want 1", n)
					}
					if tt.fixed {
						for _, r := range fixed {
							if r.Name == "BrokenDrop" {
								*broken = *r
							}
						}
					}
				}
			}
		})
	}
}

// TestSweepSuppressorFailureSkipsSuppressed: when the sweep of a
// suppressor (FabricIncident) fails — its candidates query, or its cause
// ids after it decided the incident, which evaluate then forgets — the
// rules it suppresses (suppressed_by: NICPortDrop, RepeatedNICLinkFlap) are
// skipped in that sweep too. Before, they found no standing incident and
// derived live verdicts: REPLACE_VM on every node behind a dead switch.
// The skipped rules are not counted as failing (their queries did not
// fail): the suppressor is.
func TestSweepSuppressorFailureSkipsSuppressed(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	const throw = "toFloat64(throwIf(count() >= 0))"
	suppressed := "NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed"
	for _, tt := range []struct {
		broken string
		// want: what the sweeps at 1m and 5m derive
		want   [2]string
		errors float64 // FabricIncident's sweep errors
	}{
		{"", [2]string{"FabricIncident:fault", suppressed}, 0}, // the control: nothing fails
		{"candidates", [2]string{none, none}, 2},
		{"causes", [2]string{none, none}, 2},
	} {
		broken := tt.broken
		name := broken + " of FabricIncident fail"
		if broken == "" {
			name = "FabricIncident works"
		}
		t.Run(name, func(t *testing.T) {
			c := newCluster("supfail")
			hs := newHarness(t, s, DefaultRules, func(rules []*Rule) {
				for _, r := range rules {
					if r.Name != "FabricIncident" {
						continue
					}
					switch broken {
					case "candidates":
						r.Candidates = `SELECT '' AS cluster, '' AS node, '' AS gkey, emptyArrayString() AS entity_types, emptyArrayString() AS entity_values, ` + throw + ` AS x FROM system.one`
					case "causes":
						r.query = "SELECT tid, value, arrayMap(x -> toString(throwIf(x != '')), cause_ids) AS cause_ids, last_ms FROM (" + r.query + "\n)"
					}
				}
			})
			hs.cluster = c
			// four nodes' ports DOWN at once, stored without a batch: only
			// the sweep finds the incident (and, at 5m, the drops); their
			// second port DOWN at 4m, so that the incident the sweep at 5m
			// decides (and forgets, its cause ids failing) is the one
			// standing over the drops.
			var in []*kgo.Record
			for i := range 4 {
				n := fmt.Sprintf("n%d", i)
				second := nicState(c, n, 4*m+time.Duration(i)*sec, false)
				second.EntitiesImpacted = portEnts("mlx5_1", 1)
				in = append(in, evRecord(t, nicState(c, n, time.Duration(i)*sec, false)), evRecord(t, second))
			}
			hs.storeDerived(in, nil)
			for i, at := range []time.Duration{1 * m, 5 * m} {
				if d := describe(hs.sweep(at)); d != tt.want[i] {
					t.Errorf("sweep at %v derived %q, want %q", at, d, tt.want[i])
				}
			}
			if n := counterValue(t, hs.h.metrics.sweepErrors.WithLabelValues("FabricIncident")); n != tt.errors {
				t.Errorf("faultline_correlate_sweep_errors_total{rule=FabricIncident} = %v, want %v", n, tt.errors)
			}
			for _, rule := range []string{"NICPortDrop", "RepeatedNICLinkFlap"} {
				if n := counterValue(t, hs.h.metrics.sweepErrors.WithLabelValues(rule)); n != 0 {
					t.Errorf("faultline_correlate_sweep_errors_total{rule=%s} = %v, want 0 (skipped, not failed)", rule, n)
				}
			}
		})
	}
}
