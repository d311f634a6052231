package correlate

import (
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/internal/celbound"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// step is one batch (events and/or actions) or, with sweep set, one sweep
// at that offset; want lists what it derives: "Rule:fault" or
// "Rule:recovery", with ":shadow" / ":suppressed" for those modes.
type step struct {
	evs   []*datamodels.HealthEvent
	acts  []*faultlinev1.Action
	sweep time.Duration
	want  string
}

func evs(e ...*datamodels.HealthEvent) []*datamodels.HealthEvent { return e }

// flap is a port going DOWN at at and back ACTIVE 10s later.
func flap(c, node string, at time.Duration) []*datamodels.HealthEvent {
	return evs(nicState(c, node, at, false), nicState(c, node, at+10*time.Second, true))
}

// redown is a port back ACTIVE 10s before at and DOWN again at at.
func redown(c, node string, at time.Duration) []*datamodels.HealthEvent {
	return evs(nicState(c, node, at-10*time.Second, true), nicState(c, node, at, false))
}

// threeFlapRecords is a port going DOWN at 0, 1m and 2m, back ACTIVE
// between: a flap's verdict at the third down.
func threeFlapRecords(t *testing.T, c string) []*kgo.Record {
	return records(t, append(append(flap(c, "n1", 0), flap(c, "n1", 1*time.Minute)...), nicState(c, "n1", 2*time.Minute, false)))
}

func records(t *testing.T, evs []*datamodels.HealthEvent) []*kgo.Record {
	var out []*kgo.Record
	for _, e := range evs {
		out = append(out, evRecord(t, e))
	}
	return out
}

func mustUnmarshal(t *testing.T, b []byte) *datamodels.HealthEvent {
	t.Helper()
	ev, err := events.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

const none = ""

func describe(d []*datamodels.HealthEvent) string {
	var out []string
	for _, ev := range d {
		s := ev.GetDerivedBy() + ":fault"
		if ev.GetIsHealthy() {
			s = ev.GetDerivedBy() + ":recovery"
		}
		if m := ev.GetMetadata()[MetaMode]; m != ModeLive {
			s += ":" + m
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// TestRules runs every shipped rule against a real ClickHouse: each fires
// exactly at its threshold and not one event before, across window edges;
// recovery; stabilization; STORE_ONLY; fabric suppression. Every batch is
// handed to correlate before it is stored (the race case).
func TestRules(t *testing.T) {
	s := server(t)
	m, sec, h := time.Minute, time.Second, time.Hour
	cases := []struct {
		name  string
		steps func(c string) []step
	}{
		{"flap fires at the third link-down within 10m", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false)), want: none},
				{evs: evs(nicState(c, "n1", 1*m, true)), want: none},
				{evs: evs(nicState(c, "n1", 4*m, false)), want: none},
				{evs: evs(nicState(c, "n1", 4*m+10*sec, true)), want: none},
				{evs: evs(nicState(c, "n1", 9*m+59*sec, false)), want: "RepeatedNICLinkFlap:fault"},
				// stabilization: the verdict stands, a fourth down emits nothing
				{evs: redown(c, "n1", 10*m+30*sec), want: none},
			}
		}},
		{"flap window edge: a down exactly 10m before does not count", func(c string) []step {
			return []step{
				{evs: flap(c, "n1", 0), want: none},
				{evs: flap(c, "n1", 5*m), want: none},
				{evs: evs(nicState(c, "n1", 10*m, false)), want: none},
				{evs: evs(nicState(c, "n1", 10*m+500*time.Millisecond, true), nicState(c, "n1", 10*m+1*sec, false)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"flap: state event and counter increase of one flap count once", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), linkDowned(c, "n1", 1*sec, 1)), want: none},
				{evs: evs(nicState(c, "n1", 1*m, true), nicState(c, "n1", 2*m, false), linkDowned(c, "n1", 2*m+1*sec, 1)), want: none},
				// a sub-second flap only the counter saw
				{evs: evs(linkDowned(c, "n1", 3*m, 1)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"flap recovers after the window and stabilization", func(c string) []step {
			return []step{
				{evs: append(append(flap(c, "n1", 0), flap(c, "n1", 1*m)...), flap(c, "n1", 2*m)...), want: "RepeatedNICLinkFlap:fault"},
				{sweep: 20 * m, want: none}, // window no longer holds, but stabilization (30m) has not passed
				{sweep: 32*m - 1*sec, want: none},
				{sweep: 32 * m, want: "RepeatedNICLinkFlap:recovery"},
				{sweep: 40 * m, want: none},
				// it flaps again: a new verdict
				{evs: append(append(flap(c, "n1", 50*m), flap(c, "n1", 51*m)...), flap(c, "n1", 52*m)...), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"STORE_ONLY events never trigger nor count", func(c string) []step {
			so := func(es []*datamodels.HealthEvent) []*datamodels.HealthEvent {
				for _, e := range es {
					e.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
				}
				return es
			}
			return []step{
				{evs: so(append(append(flap(c, "n1", 0), flap(c, "n1", 1*m)...), flap(c, "n1", 2*m)...)), want: none},
				{evs: append(flap(c, "n1", 3*m), flap(c, "n1", 4*m)...), want: none},
				{evs: evs(nicState(c, "n1", 5*m, false)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"port drop: DOWN 4m with no recovery attempt", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), linkDowned(c, "n1", 1*sec, 1)), want: none},
				{sweep: 4*m - 1*sec, want: none},
				{sweep: 4 * m, want: "NICPortDrop:fault"},
				{sweep: 5 * m, want: none},
				{evs: evs(nicState(c, "n1", 6*m, true)), want: "NICPortDrop:recovery"},
				{sweep: 7 * m, want: none},
			}
		}},
		{"port drop: a port still DOWN a window later stays dropped", func(c string) []step {
			// The NIC agent reports a port on a transition only: a day
			// after the DOWN the window holds no event of the port. The
			// verdict recovered there ("no longer dropped") with the port
			// still DOWN; it now stands until a state event shows it up.
			return []step{
				{evs: evs(nicState(c, "n1", 0, false)), want: none},
				{sweep: 5 * m, want: "NICPortDrop:fault"},
				{sweep: 24*h + 1*m, want: none},
				{sweep: 30 * h, want: none},
				{evs: evs(nicState(c, "n1", 31*h, true)), want: "NICPortDrop:recovery"},
				{sweep: 31*h + 1*m, want: none},
			}
		}},
		{"port drop: a recovery attempt is not a drop", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false)), want: none},
				{evs: evs(linkDowned(c, "n1", 2*m, 1)), want: none},
				{sweep: 10 * m, want: none},
			}
		}},
		{"xid: fifth burst within 24h", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 48, true, 1), xid(c, "n1", 2*m, 48, true, 1)), want: none}, // burst 1 (2m gap)
				{evs: evs(xid(c, "n1", 5*m+1*sec, 48, true, 1)), want: none},                         // burst 2 (gap > 3m)
				{evs: evs(xid(c, "n1", 1*h, 48, true, 5)), want: none},                               // burst 3 (a flood is one point)
				{evs: evs(xid(c, "n1", 2*h, 31, false, 1)), want: none},                              // not fatal: no burst
				{evs: evs(xid(c, "n1", 3*h, 48, true, 1)), want: none},                               // burst 4
				{evs: evs(xid(c, "n1", 3*h+3*m, 48, true, 1)), want: none},                           // same burst (exactly 3m)
				{evs: evs(xid(c, "n1", 4*h, 48, true, 1)), want: "RepeatedXIDOnSameGPU:fault"},       // burst 5
			}
		}},
		{"xid: sticky codes keep a burst open 3h; window edge", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 48, true, 1)), want: none},        // burst 1, at exactly 24h before the last event
				{evs: evs(xid(c, "n1", 1*h, 79, true, 1)), want: none},      // burst 2, sticky
				{evs: evs(xid(c, "n1", 1*h+30*m, 48, true, 1)), want: none}, // open
				{evs: evs(xid(c, "n1", 3*h+59*m, 48, true, 1)), want: none}, // open (79 at 1h keeps it to 4h)
				{evs: evs(xid(c, "n1", 4*h+4*m, 48, true, 1)), want: none},  // burst 3 (after 4h and 3m after 3h59)
				{evs: evs(xid(c, "n1", 10*h, 48, true, 1)), want: none},     // burst 4
				{evs: evs(xid(c, "n1", 24*h, 48, true, 1)), want: none},     // burst 5, but burst 1 left the window
				{evs: evs(xid(c, "n1", 24*h+10*m, 48, true, 1)), want: "RepeatedXIDOnSameGPU:fault"},
			}
		}},
		{"xid 31: two occurrences, flood counts", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
				{evs: evs(xid(c, "n1", 25*h, 31, false, 1)), want: none}, // the first left the 24h window
				{evs: evs(xid(c, "n2", 25*h, 31, false, 2)), want: "RepeatedXID31OnSameGPU:fault"},
				{evs: evs(xid(c, "n1", 26*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
			}
		}},
		{"remediations: fifth within 7 days", func(c string) []step {
			d := 24 * h
			return []step{
				{acts: []*faultlinev1.Action{remediation(c, "n1", 0)}, want: none}, // leaves the window at 7d
				{acts: []*faultlinev1.Action{remediation(c, "n1", 1*d), remediation(c, "n1", 2*d)}, want: none},
				{acts: []*faultlinev1.Action{remediation(c, "n1", 3*d), {Id: "q1", Cluster: c, Node: "n1", Kind: "quarantine", Outcome: "applied"}}, want: none},
				{acts: []*faultlinev1.Action{remediation(c, "n1", 7*d)}, want: none},
				{acts: []*faultlinev1.Action{remediation(c, "n1", 7*d+1*h)}, want: "MultipleRemediations:fault"},
			}
		}},
		{"remediations: a machine replaced under the node's name starts afresh", func(c string) []step {
			d := 24 * h
			acts := func(a ...*faultlinev1.Action) []*faultlinev1.Action { return a }
			rem := func(at ...time.Duration) []*faultlinev1.Action {
				var out []*faultlinev1.Action
				for _, x := range at {
					out = append(out, remediation(c, "n1", x))
				}
				return out
			}
			return []step{
				// The old machine, its Node a month old: four remediations.
				{acts: acts(quarantined(c, "n1", 0, base.Add(-30*d)), remediation(c, "n1", 1*m)), want: none},
				{acts: rem(1*d, 2*d, 3*d), want: none},
				// Replaced: a new Node under the name; the new machine's
				// first fault and remediation are the node name's fifth
				// within 7 days, the machine's first.
				{acts: acts(quarantined(c, "n1", 3*d+2*h, base.Add(3*d+1*h)), remediation(c, "n1", 3*d+3*h)), want: none},
				{acts: rem(4*d, 5*d, 6*d), want: none},
				// Its own fifth.
				{acts: rem(6*d + 1*h), want: "MultipleRemediations:fault"},
			}
		}},
		{"fabric: four nodes within 2m is one incident; per-node verdicts suppressed", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n2", 10*sec, false)), want: none},
				{evs: evs(nicState(c, "n3", 30*sec, false)), want: none},
				{evs: evs(nicState(c, "n4", 2*m+10*sec, false)), want: none}, // n1, n2 left the 2m window (n2 exactly at its edge)
				{evs: evs(nicState(c, "n5", 2*m+20*sec, false)), want: none},
				{evs: evs(nicState(c, "n6", 2*m+25*sec, false)), want: "FabricIncident:fault"},
				{evs: evs(nicState(c, "n7", 2*m+30*sec, false)), want: none},
				// n1 flaps a third time while the incident stands
				{evs: redown(c, "n1", 3*m), want: none},
				{evs: redown(c, "n1", 4*m), want: "RepeatedNICLinkFlap:fault:suppressed"},
			}
		}},
		{"fabric: an incident standing past a day still suppresses", func(c string) []step {
			// Before, the suppression read the incident's verdicts of the
			// last 24 h alone: a day into an outage, the per-node verdicts
			// went out live, REPLACE_VM on every node.
			day := 24 * h
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n2", 10*sec, false), nicState(c, "n3", 30*sec, false), nicState(c, "n4", 40*sec, false)),
					want: "FabricIncident:fault"},
				// a day on, the ports still DOWN and reported so: the
				// incident stands (a sweep moves the clock a day on)
				{evs: evs(nicState(c, "n1", day+3*m, false), nicState(c, "n2", day+3*m+10*sec, false), nicState(c, "n3", day+3*m+20*sec, false),
					nicState(c, "n4", day+3*m+30*sec, false)), want: none},
				{sweep: day + 4*m, want: none},
				{evs: evs(nicState(c, "n8", day+5*m, false)), want: none},
				{evs: redown(c, "n8", day+6*m), want: none},
				{evs: redown(c, "n8", day+7*m), want: "RepeatedNICLinkFlap:fault:suppressed"},
			}
		}},
		{"fabric: the incident and the per-node verdicts in one batch: suppressed already", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n1", 5*sec, true), nicState(c, "n1", 10*sec, false), nicState(c, "n1", 12*sec, true),
					nicState(c, "n2", 15*sec, false), nicState(c, "n3", 16*sec, false), nicState(c, "n1", 20*sec, false), nicState(c, "n4", 20*sec, false)),
					want: "FabricIncident:fault,RepeatedNICLinkFlap:fault:suppressed"},
			}
		}},
		{"fabric: sweep finds an incident across partitions", func(c string) []step {
			return []step{
				// stored without correlate seeing them (other replicas' partitions)
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n2", 1*sec, false), nicState(c, "n3", 2*sec, false), nicState(c, "n4", 3*sec, false)), sweep: -1, want: none},
				{sweep: 1 * m, want: "FabricIncident:fault"},
				// the ports stayed DOWN: NICPortDrop holds on all four, recorded
				// as suppressed while the incident stands
				{sweep: 5 * m, want: "NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed"},
				// three ports come back: their suppressed drops recover as
				// they were recorded
				{evs: evs(nicState(c, "n2", 8*m, true), nicState(c, "n3", 8*m+1*sec, true), nicState(c, "n4", 8*m+2*sec, true)),
					want: "NICPortDrop:recovery:suppressed,NICPortDrop:recovery:suppressed,NICPortDrop:recovery:suppressed"},
				// the incident's window has been empty for its stabilization:
				// it clears, and n1's port, still DOWN, is a drop of its own:
				// its suppressed verdict goes live (before, it stood
				// suppressed, and the broken node was never escalated)
				{sweep: 11 * m, want: "FabricIncident:recovery,NICPortDrop:fault"},
				{sweep: 12 * m, want: none},
			}
		}},
		{"fabric: ports all still DOWN once the incident clears: no stampede", func(c string) []step {
			// The NIC agent reports transitions only: the incident recovers
			// once its events stop, however long the ports stay DOWN.
			drop4 := "NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed"
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n2", 1*sec, false), nicState(c, "n3", 2*sec, false), nicState(c, "n4", 3*sec, false)), sweep: -1, want: none},
				{sweep: 1 * m, want: "FabricIncident:fault"},
				{sweep: 5 * m, want: drop4},
				// the incident clears with all four ports still DOWN: as many
				// nodes as its threshold still hold, so their drops stay
				// suppressed (before: four REPLACE_VM at once)
				{sweep: 11 * m, want: "FabricIncident:recovery"},
				{sweep: 12 * m, want: none},
				// three come back: the last one DOWN is a drop of its own, and
				// goes live at the next sweep
				{evs: evs(nicState(c, "n2", 20*m, true), nicState(c, "n3", 20*m+1*sec, true), nicState(c, "n4", 20*m+2*sec, true)),
					want: "NICPortDrop:recovery:suppressed,NICPortDrop:recovery:suppressed,NICPortDrop:recovery:suppressed"},
				{sweep: 21 * m, want: "NICPortDrop:fault"},
				{sweep: 22 * m, want: none},
			}
		}},
		{"fabric: a port that keeps flapping once the incident clears goes live", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n2", 10*sec, false), nicState(c, "n3", 20*sec, false), nicState(c, "n4", 30*sec, false)),
					want: "FabricIncident:fault"},
				{evs: redown(c, "n1", 1*m), want: none},
				{evs: redown(c, "n1", 2*m), want: "RepeatedNICLinkFlap:fault:suppressed"},
				{evs: evs(nicState(c, "n1", 3*m, true), nicState(c, "n2", 3*m, true), nicState(c, "n3", 3*m, true), nicState(c, "n4", 3*m, true)), want: none},
				{sweep: 11 * m, want: "FabricIncident:recovery"},
				// n1 flaps on, inside the suppressed verdict's stabilization
				// (30m): it holds with no incident standing, alone in its
				// cluster, so goes live at the next sweep (a batch sees only
				// some of the cluster's verdicts, so promotes none)
				{evs: redown(c, "n1", 12*m), want: none},
				{evs: redown(c, "n1", 13*m), want: none},
				{evs: redown(c, "n1", 14*m), want: none},
				{sweep: 15 * m, want: "RepeatedNICLinkFlap:fault"},
				{evs: redown(c, "n1", 16*m), want: none},
				{sweep: 17 * m, want: none},
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("rules")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			for i, st := range tc.steps(c) {
				var got []*datamodels.HealthEvent
				switch {
				case st.sweep < 0: // stored only
					var recs []*kgo.Record
					for _, e := range st.evs {
						recs = append(recs, evRecord(t, e))
					}
					hs.storeDerived(recs, nil)
				case st.evs != nil || st.acts != nil:
					var recs []*kgo.Record
					for _, e := range st.evs {
						recs = append(recs, evRecord(t, e))
					}
					for _, a := range st.acts {
						recs = append(recs, actRecord(t, a))
					}
					got = hs.batch(recs...)
				default:
					got = hs.sweep(st.sweep)
				}
				if d := describe(got); d != st.want {
					t.Fatalf("step %d: derived %q, want %q", i, d, st.want)
				}
			}
		})
	}
	t.Run("no loop: derived events fed back derive nothing", func(t *testing.T) {
		c := newCluster("loop")
		hs := newHarness(t, s, DefaultRules, nil)
		got := hs.batch(threeFlapRecords(t, c)...)
		if describe(got) != "RepeatedNICLinkFlap:fault" {
			t.Fatalf("derived %q", describe(got))
		}
		for range 3 {
			var recs []*kgo.Record
			for _, ev := range got {
				ev.GeneratedTimestamp = nicState(c, "n1", 3*m, false).GeneratedTimestamp
				recs = append(recs, evRecord(t, ev))
			}
			if got = hs.batch(recs...); len(got) != 0 {
				t.Fatalf("derived events derived %q", describe(got))
			}
			got = hs.derived[:1]
		}
		if n := uniqDerived(t, s, c, "RepeatedNICLinkFlap"); n != 1 {
			t.Fatalf("%d derived events stored, want 1", n)
		}
	})
	t.Run("derived events are the pipeline's; key and payload must agree", func(t *testing.T) {
		c := newCluster("pipeline")
		hs := newHarness(t, s, DefaultRules, nil)
		got := hs.batch(threeFlapRecords(t, c)...)
		if len(got) != 1 {
			t.Fatalf("derived %q", describe(got))
		}
		if sub := got[0].GetSubmitter(); sub.GetRole() != datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE || sub.GetName() != "RepeatedNICLinkFlap" {
			t.Fatalf("derived event submitter %v", sub)
		}
		// A record keyed for another cluster than its payload names is
		// dead-lettered, and counts in no window.
		c2 := newCluster("pipeline")
		var recs []*kgo.Record
		for i := range 3 {
			r := evRecord(t, nicState(c2, "n1", time.Duration(i)*m, false))
			r.Key = events.Key(c, "n1")
			recs = append(recs, r)
		}
		res, err := hs.h.Handle(ctx(t), recs)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Out) != 0 || len(res.Dead) != 3 || !errors.Is(res.Dead[0].Reason, pipeline.ErrKeyMismatch) {
			t.Fatalf("outputs %d, dead %v", len(res.Out), res.Dead)
		}
	})
	t.Run("shadow mode records verdicts as STORE_ONLY, once", func(t *testing.T) {
		c := newCluster("shadow")
		hs := newHarness(t, s, DefaultRules, func(rs []*Rule) {
			for _, r := range rs {
				r.Shadow = r.Name == "RepeatedNICLinkFlap"
			}
		})
		hs.cluster = c
		var got []*datamodels.HealthEvent
		for i := range 5 {
			got = append(got, hs.batch(records(t, flap(c, "n1", time.Duration(i)*m))...)...)
		}
		if describe(got) != "RepeatedNICLinkFlap:fault:shadow" {
			t.Fatalf("derived %q", describe(got))
		}
		if got[0].GetProcessingStrategy() != datamodels.ProcessingStrategy_STORE_ONLY {
			t.Fatalf("shadow verdict strategy %s", got[0].GetProcessingStrategy())
		}
		if d := describe(hs.sweep(40 * m)); d != "RepeatedNICLinkFlap:recovery:shadow" {
			t.Fatalf("shadow recovery %q", d)
		}
	})
	t.Run("two replicas over the same stream: each verdict once", func(t *testing.T) {
		c := newCluster("replicas")
		a := newHarness(t, s, DefaultRules, nil)
		b := newHarness(t, s, DefaultRules, nil)
		a.cluster, b.cluster = c, c
		var recs [][]*kgo.Record
		for i := range 4 {
			recs = append(recs, records(t, flap(c, "n1", time.Duration(i)*m)))
		}
		// Both replicas handle every batch before either output is stored
		// (a rebalance redelivering the same records to another replica).
		var outs []*kgo.Record
		for _, r := range recs {
			ra, err := a.h.Handle(ctx(t), r)
			if err != nil {
				t.Fatal(err)
			}
			rb, err := b.h.Handle(ctx(t), r)
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, ra.Out...)
			outs = append(outs, rb.Out...)
			a.storeDerived(r, append(ra.Out, rb.Out...))
		}
		if len(outs) != 2 {
			t.Fatalf("%d derived records, want one per replica", len(outs))
		}
		if !proto.Equal(mustUnmarshal(t, outs[0].Value), mustUnmarshal(t, outs[1].Value)) {
			t.Fatal("the replicas derived different events")
		}
		if n := uniqDerived(t, s, c, "RepeatedNICLinkFlap"); n != 1 {
			t.Fatalf("%d verdicts stored, want 1", n)
		}
		// Both sweep at the same time, before either output is stored: the
		// same recovery id.
		a.clock.Set(base.Add(40 * m))
		b.clock.Set(base.Add(40 * m))
		sa, err := a.h.Sweep(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		sb, err := b.h.Sweep(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		ra, rb := a.storeDerived(nil, sa), b.storeDerived(nil, sb)
		if describe(ra) != "RepeatedNICLinkFlap:recovery" || describe(rb) != describe(ra) || ids(ra)[0] != ids(rb)[0] {
			t.Fatalf("sweeps derived %q and %q", describe(ra), describe(rb))
		}
		// A later sweep (now stored) derives nothing.
		if d := describe(a.sweep(41 * m)); d != none {
			t.Fatalf("sweep after recovery derived %q", d)
		}
		if n := uniqDerived(t, s, c, "RepeatedNICLinkFlap"); n != 2 {
			t.Fatalf("%d derived events stored, want 2 (verdict, recovery)", n)
		}
	})
	t.Run("a retried batch re-emits the same verdict", func(t *testing.T) {
		c := newCluster("retry")
		hs := newHarness(t, s, DefaultRules, nil)
		r := threeFlapRecords(t, c)
		first, err := hs.h.Handle(ctx(t), r) // outputs lost: produce failed
		if err != nil {
			t.Fatal(err)
		}
		again := hs.batch(r...)
		if len(first.Out) != 1 || len(again) != 1 || describe(again) != "RepeatedNICLinkFlap:fault" {
			t.Fatalf("first %d, retry %q", len(first.Out), describe(again))
		}
		if !proto.Equal(mustUnmarshal(t, first.Out[0].Value), again[0]) {
			t.Fatal("the retry derived a different event")
		}
	})
}

// TestParseRulesErrors: config errors name the rule and the field.
func TestParseRulesErrors(t *testing.T) {
	ok := `
[[rule]]
name = "R"
trigger = "event.isFatal"
window = "10m"
query = "SELECT 1"
threshold = 2
`
	if _, err := ParseRules([]byte(ok), nil); err != nil {
		t.Fatalf("valid rule: %v", err)
	}
	cases := []struct{ name, edit, field string }{
		{"window", `window = "10m"|window = "soon"`, "window"},
		{"threshold", `threshold = 2|threshold = 0`, "threshold"},
		// NaN compares false with every bound; a NaN threshold never holds.
		{"threshold nan", `threshold = 2|threshold = nan`, "threshold"},
		{"threshold inf", `threshold = 2|threshold = inf`, "threshold"},
		{"trigger", `trigger = "event.isFatal"|trigger = "event.isFatal &&"`, "trigger"},
		{"trigger type", `trigger = "event.isFatal"|trigger = "1 + 1"`, "trigger"},
		{"query file", `query = "SELECT 1"|query = "missing.sql"`, "query"},
		{"unbound param", `query = "SELECT 1"|query = "SELECT @nope"`, "query"},
		{"scope", `threshold = 2|threshold = 2
scope = "rack"`, "scope"},
		{"action", `threshold = 2|threshold = 2
emit.recommended_action = "REBOOT"`, "emit.recommended_action"},
		{"template", `threshold = 2|threshold = 2
emit.message = "{{.Nope}}"`, "emit.message"},
		{"suppressed_by", `threshold = 2|threshold = 2
suppressed_by = ["Other"]`, "suppressed_by"},
		{"onset", `threshold = 2|threshold = 2
onset = "later"`, "onset"},
		{"sweep onset without candidates", `threshold = 2|threshold = 2
onset = "sweep"`, "onset"},
		{"recovery", `threshold = 2|threshold = 2
recovery = "later"`, "recovery"},
		{"sweep recovery of a rule that does not recover", `threshold = 2|threshold = 2
recovery = "sweep"
recover = false`, "recovery"},
		{"causes", `threshold = 2|threshold = 2
causes = "apart"`, "causes"},
		{"unknown key", `threshold = 2|threshold = 2
treshold = 3`, "rule.treshold"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			from, to, _ := strings.Cut(tc.edit, "|")
			_, err := ParseRules([]byte(strings.Replace(ok, from, to, 1)), nil)
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a ConfigError", err)
			}
			if ce.Field != tc.field || (tc.name != "unknown key" && ce.Rule != "R") {
				t.Fatalf("err names rule %q field %q, want R / %s: %v", ce.Rule, ce.Field, tc.field, err)
			}
		})
	}
	if _, err := LoadRules(""); err != nil {
		t.Fatalf("shipped rules: %v", err)
	}
}

// TestDerivedID: deterministic, distinct per polarity and predecessor.
func TestDerivedID(t *testing.T) {
	a := DerivedID("R", "c", "n", "NIC=mlx5_0,NICPort=1", "", false)
	if a != DerivedID("R", "c", "n", "NIC=mlx5_0,NICPort=1", "", false) {
		t.Fatal("not deterministic")
	}
	if a == DerivedID("R", "c", "n", "NIC=mlx5_0,NICPort=1", "", true) || a == DerivedID("R", "c", "n", "NIC=mlx5_0,NICPort=1", "x", false) {
		t.Fatal("collides")
	}
}

// TestTriggerCostLimit: a trigger that would run for seconds on a large
// event (one the gateway accepts) stops at TriggerCostLimit with an error,
// which the handler counts as a non-match; the shipped triggers are proven
// within the limit, so they run without the cost tracker.
func TestTriggerCostLimit(t *testing.T) {
	prg, err := compileTrigger(SourceEvents, "event.entitiesImpacted.map(a, event.entitiesImpacted.map(b, "+
		"event.entitiesImpacted.map(c, a.entityValue + b.entityValue + c.entityValue))).size() == 0")
	if err != nil {
		t.Fatal(err)
	}
	ev := &datamodels.HealthEvent{CheckName: "c"}
	for i := range 64 {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: "GPU", EntityValue: strings.Repeat("v", 500) + string(rune('a'+i%26))})
	}
	r := &Rule{Name: "costly", trigger: prg}
	vars := map[string]any{"event": events.Vars(ev)}
	if !celbound.Fits(vars) {
		t.Fatal("the event does not fit the gateway's limits")
	}
	began := time.Now()
	ok, err := r.matches(vars, true)
	if ok || err == nil || !strings.Contains(err.Error(), "cost limit") || time.Since(began) > 5*time.Second {
		t.Fatalf("matches = %v, %v after %v", ok, err, time.Since(began))
	}
	h := New(nil, []*Rule{r}, time.Now, time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if h.matches(r, &item{vars: vars, fits: true}) {
		t.Fatal("a failed trigger matched")
	}
	var m dto.Metric
	if err := h.metrics.triggerErrors.WithLabelValues("costly").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("trigger errors %v", m.GetCounter().GetValue())
	}
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.trigger.Bound == 0 || r.trigger.Bound > TriggerCostLimit {
			t.Errorf("%s: trigger's estimated cost %d, want within the limit", r.Name, r.trigger.Bound)
		}
	}
}

// TestWindowWithinRecentRetention: a rule whose queries read recent_events
// (kept clickhouse.RecentRetention, 8 days) may not have a window longer
// than it keeps, less a day's margin: a window of "720h" over
// xid_count.sql was accepted and counted 8 days of 30. Its durations (a
// burst's sticky gap) do not reach back past the window. Rules over
// actions, or over the events history, are not bounded by it.
func TestWindowWithinRecentRetention(t *testing.T) {
	var f RulesFile
	if _, err := toml.Decode(string(DefaultRules), &f); err != nil {
		t.Fatal(err)
	}
	shipped := func(name, window string) RuleSpec {
		for _, s := range f.Rules {
			if s.Name == name {
				s.Window = window
				return s
			}
		}
		t.Fatalf("no shipped rule %s", name)
		return RuleSpec{}
	}
	inline := func(query, candidates, window string, durations map[string]string) RuleSpec {
		return RuleSpec{Name: "R", Trigger: "event.isFatal", Window: window, Query: query, Candidates: candidates, Threshold: 1, Durations: durations}
	}
	const recent = "SELECT tid, 1.0 AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers, recent_events WHERE ts >= @since"
	const history = "SELECT tid, 1.0 AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers, events WHERE ts >= @since"
	for _, tc := range []struct {
		name    string
		spec    RuleSpec
		refused bool
	}{
		{"xid_count.sql, 24h", shipped("RepeatedXID31OnSameGPU", "24h"), false},
		{"xid_count.sql, 720h", shipped("RepeatedXID31OnSameGPU", "720h"), true},
		{"xid_bursts.sql, 168h", shipped("RepeatedXIDOnSameGPU", "168h"), false},
		{"nic_port_drop.sql, 168h", shipped("NICPortDrop", "168h"), false},
		{"xid_bursts.sql, 169h", shipped("RepeatedXIDOnSameGPU", "169h"), true},
		{"remediations.sql over actions, 720h", shipped("MultipleRemediations", "720h"), false},
		{"recent_events, 168h", inline(recent, "", "168h", nil), false},
		{"recent_events, 169h", inline(recent, "", "169h", nil), true},
		{"recent_events in candidates only, 720h", inline(history, recent, "720h", nil), true},
		{"events history, 720h", inline(history, "", "720h", nil), false},
		{"recent_events named in a comment only, 720h", inline(history+"\n-- unlike recent_events", "", "720h", nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compileRule(tc.spec, nil)
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != "window" || ce.Rule != tc.spec.Name {
				t.Fatalf("err = %v, want a ConfigError naming rule %s, field window", err, tc.spec.Name)
			}
		})
	}
}
