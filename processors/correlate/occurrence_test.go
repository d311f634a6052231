package correlate

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestOneOccurrenceCountsOnce: the rules count an occurrence by its event
// id (see "One occurrence, one id" in the README). Its resend under the
// same id counts once, even in the same batch or a later one; the same
// report under a second id counts twice — what a relayed NVSentinel resend
// was before the relay and the gateway kept its id, and what NVSentinel's
// syslog monitor adds beside the agent's own kmsg check (its copies come
// at other times, with other codes), unless the agent stores those copies
// only (STORE_ONLY). A NIC port's link-downs are its healthy → unhealthy
// transitions, so NVSentinel's NIC monitor's copy of a DOWN, unhealthy
// after unhealthy, is no second down.
func TestOneOccurrenceCountsOnce(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	// resent: the event again, same id; copied: a second report of the
	// same occurrence under its own id, at shift, with strategy ps.
	resent := func(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
		if ev.Id == "" {
			ev.Id = nextID()
		}
		return proto.Clone(ev).(*datamodels.HealthEvent)
	}
	copied := func(ev *datamodels.HealthEvent, shift time.Duration, ps datamodels.ProcessingStrategy, code string) *datamodels.HealthEvent {
		c := proto.Clone(ev).(*datamodels.HealthEvent)
		c.Id = ""
		c.GeneratedTimestamp = timestamppb.New(ev.GetGeneratedTimestamp().AsTime().Add(shift))
		c.ProcessingStrategy = ps
		if code != "" {
			c.ErrorCode = []string{code}
			c.EntitiesImpacted = c.EntitiesImpacted[:1] // NVSentinel: the PCI address
		}
		return c
	}
	live, storeOnly := datamodels.ProcessingStrategy_EXECUTE_REMEDIATION, datamodels.ProcessingStrategy_STORE_ONLY
	for _, tc := range []struct {
		name  string
		steps func(c string) [][]*datamodels.HealthEvent
		want  string
	}{
		{"one Xid 31 resent in the next batch: one occurrence", func(c string) [][]*datamodels.HealthEvent {
			a := xid(c, "n1", 0, 31, false, 1)
			return [][]*datamodels.HealthEvent{{a}, {resent(a)}}
		}, none},
		{"one Xid 31 resent in its batch: one occurrence", func(c string) [][]*datamodels.HealthEvent {
			a := xid(c, "n1", 0, 31, false, 1)
			return [][]*datamodels.HealthEvent{{a, resent(a)}}
		}, none},
		{"one Xid 31 under two ids: counted twice", func(c string) [][]*datamodels.HealthEvent {
			a := xid(c, "n1", 0, 31, false, 1)
			return [][]*datamodels.HealthEvent{{a}, {copied(a, 2*sec, live, "")}}
		}, "RepeatedXID31OnSameGPU:fault"},
		{"two flaps, each also from NVSentinel's NIC monitor: two downs (a flap is a transition)", func(c string) [][]*datamodels.HealthEvent {
			d1, u1, d2 := nicState(c, "n1", 0, false), nicState(c, "n1", 1*m, true), nicState(c, "n1", 4*m, false)
			return [][]*datamodels.HealthEvent{{d1, copied(d1, sec, live, "")}, {u1, copied(u1, sec, live, "")}, {d2, copied(d2, sec, live, "")}}
		}, none},
		{"two flaps, the monitor's copies STORE_ONLY: two downs", func(c string) [][]*datamodels.HealthEvent {
			d1, d2 := nicState(c, "n1", 0, false), nicState(c, "n1", 4*m, false)
			return [][]*datamodels.HealthEvent{{d1, copied(d1, sec, storeOnly, "")}, {nicState(c, "n1", 1*m, true)}, {d2, copied(d2, sec, storeOnly, "")}}
		}, none},
		{"three fatal Xid bursts, each also from the syslog monitor at its poll: six bursts", func(c string) [][]*datamodels.HealthEvent {
			var out [][]*datamodels.HealthEvent
			for i := range 3 {
				k := xid(c, "n1", time.Duration(i)*time.Hour, 48, true, 1)
				out = append(out, []*datamodels.HealthEvent{k}, []*datamodels.HealthEvent{copied(k, 20*m, live, "48")})
			}
			return out
			// the 5th burst is kmsg's; the 6th, the monitor's, names the
			// GPU by its PCI address alone: the same GPU, whose verdict
			// stands (TestOneVerdictPerGPU)
		}, "RepeatedXIDOnSameGPU:fault"},
		{"three fatal Xid bursts, the monitor's copies STORE_ONLY: three bursts", func(c string) [][]*datamodels.HealthEvent {
			var out [][]*datamodels.HealthEvent
			for i := range 3 {
				k := xid(c, "n1", time.Duration(i)*time.Hour, 48, true, 1)
				out = append(out, []*datamodels.HealthEvent{k}, []*datamodels.HealthEvent{copied(k, 20*m, storeOnly, "48")})
			}
			return out
		}, none},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("occ")
			hs := newHarness(t, s, DefaultRules, nil)
			if d := describe(hs.batches(tc.steps(c))); d != tc.want {
				t.Fatalf("derived %q, want %q", d, tc.want)
			}
		})
	}
}
