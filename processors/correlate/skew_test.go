package correlate

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestVerdictStandsItsStabilizationOnTheReceivedClock: a node whose clock
// runs hours behind (NTP unreachable; the gateway refuses only future
// timestamps) stamps its flaps, and so RepeatedNICLinkFlap's verdict,
// hours in the past. The sweep runs on the correlator's clock: the
// verdict looked older than its stabilization at once and recovered at
// the next sweep, 30 s after the cordon. The stabilization is measured
// on the received clock as well: the verdict stands through it, and
// recovers after it once the flaps stop; with no skew nothing changes,
// and the received time is read back from the store after a restart.
func TestVerdictStandsItsStabilizationOnTheReceivedClock(t *testing.T) {
	s := server(t)
	m := time.Minute
	for _, tc := range []struct {
		name    string
		skew    time.Duration // how far the node's clock runs behind the gateway's
		restart bool          // the correlator restarts after the verdict
	}{
		{"clock 3h behind", 3 * time.Hour, false},
		{"clock 3h behind, restarted", 3 * time.Hour, true},
		{"no skew", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("skew")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			// three link_downed increases at the node's 0, 1m and 2m,
			// received skew later
			var flaps []*datamodels.HealthEvent
			for _, at := range []time.Duration{0, 1 * m, 2 * m} {
				ev := linkDowned(c, "n1", at, 1)
				ev.ReceivedTimestamp = timestamppb.New(base.Add(at + tc.skew))
				flaps = append(flaps, ev)
			}
			runSteps(t, hs, []step{{evs: flaps, want: "RepeatedNICLinkFlap:fault"}})
			if tc.restart {
				hs.h = New(s.Conn, hs.rules, hs.clock.Now, 2*time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			}
			runSteps(t, hs, []step{
				{sweep: tc.skew + 2*m + 30*time.Second, want: none},
				{sweep: tc.skew + 31*m, want: none}, // 29m since the last flap was received
				{sweep: tc.skew + 33*m, want: "RepeatedNICLinkFlap:recovery"},
			})
		})
	}
}
