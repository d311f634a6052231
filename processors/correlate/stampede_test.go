package correlate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestNoStampedeAcrossReplicas: once a fabric incident clears with as many
// of its cluster's nodes as its threshold (4) still holding suppressed
// verdicts, none goes live, however the nodes are shared between the
// replicas' sweeps and whichever of the suppressed rules holds on each
// node. Before, each replica counted the nodes it swept, each rule its
// own verdicts: two replicas with two nodes each, or two nodes' flaps and
// two nodes' drops, each stayed under 4, and every node's verdict went
// live at once (REPLACE_VM on four nodes).
func TestNoStampedeAcrossReplicas(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	drop4 := "NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed"
	for _, tt := range []struct {
		name     string
		replicas int
		// flaps: the nodes (of four) whose ports flap at 9m (a link_downed
		// increase of 3): their drops recover, their flaps stand suppressed
		flaps int
	}{
		{"two replicas, two nodes each", 2, 0},
		{"one replica, two nodes' flaps and two nodes' drops", 1, 2},
		{"two replicas, flaps and drops", 2, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster("stampede")
			hs := make([]*harness, tt.replicas)
			for i := range hs {
				hs[i] = newHarness(t, s, DefaultRules, nil)
				hs[i].cluster = c
				if tt.replicas > 1 {
					hs[i].h.PartitionsAssigned(events.TopicEvents, []int32{int32(i)}, tt.replicas)
				}
			}
			owner := func(node string) *harness {
				for _, h := range hs {
					if h.h.Owns(events.Key(c, node)) {
						return h
					}
				}
				t.Fatalf("no replica owns %s", node)
				return nil
			}
			// four nodes, shared evenly between the replicas
			var nodes []string
			per := map[*harness]int{}
			for i := 0; len(nodes) < 4; i++ {
				n := fmt.Sprintf("n%d", i)
				if o := owner(n); per[o] < 4/tt.replicas {
					per[o]++
					nodes = append(nodes, n)
				}
			}
			sweep := func(at time.Duration) string {
				var got []*datamodels.HealthEvent
				for _, h := range hs {
					got = append(got, h.sweep(at)...)
				}
				return describe(got)
			}
			batch := func(evs ...*datamodels.HealthEvent) string {
				var got []*datamodels.HealthEvent
				for _, e := range evs {
					got = append(got, owner(e.GetNodeName()).batch(evRecord(t, e))...)
				}
				return describe(got)
			}
			var down []*kgo.Record
			for i, n := range nodes {
				down = append(down, evRecord(t, nicState(c, n, time.Duration(i)*sec, false)))
			}
			hs[0].storeDerived(down, nil) // stored without correlate seeing them
			steps := []struct {
				at   time.Duration
				do   func() string
				want string
			}{
				{1 * m, func() string { return sweep(1 * m) }, "FabricIncident:fault"},
				{5 * m, func() string { return sweep(5 * m) }, drop4},
				{9 * m, func() string {
					var flaps []*datamodels.HealthEvent
					for _, n := range nodes[:tt.flaps] {
						flaps = append(flaps, linkDowned(c, n, 9*m, 3))
					}
					return batch(flaps...)
				}, strings.Repeat(",NICPortDrop:recovery:suppressed", tt.flaps) + strings.Repeat(",RepeatedNICLinkFlap:fault:suppressed", tt.flaps)},
				// the incident clears with four nodes still holding: none
				// goes live
				{11 * m, func() string { return sweep(11 * m) }, "FabricIncident:recovery"},
				{12 * m, func() string { return sweep(12 * m) }, none},
			}
			for _, st := range steps {
				if got := st.do(); got != strings.TrimPrefix(st.want, ",") {
					t.Fatalf("at %v: derived %q, want %q", st.at, got, strings.TrimPrefix(st.want, ","))
				}
			}
			if tt.flaps > 0 {
				return
			}
			// Three ports come back: the last one still DOWN is a drop of
			// its own, live at the next sweep, whichever replica sweeps it.
			var back []*datamodels.HealthEvent
			for i, n := range nodes[1:] {
				back = append(back, nicState(c, n, 20*m+time.Duration(i)*sec, true))
			}
			if got := batch(back...); got != "NICPortDrop:recovery:suppressed,NICPortDrop:recovery:suppressed,NICPortDrop:recovery:suppressed" {
				t.Fatalf("at 20m: derived %q", got)
			}
			if got := sweep(21 * m); got != "NICPortDrop:fault" {
				t.Fatalf("at 21m: derived %q, want NICPortDrop:fault", got)
			}
			if got := sweep(22 * m); got != none {
				t.Fatalf("at 22m: derived %q, want none", got)
			}
		})
	}
}
