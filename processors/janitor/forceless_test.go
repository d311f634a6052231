package janitor

import (
	"context"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/events"
)

// noForce is a provider without a forced reboot, as AWS and Local are:
// Force is ErrUnsupported, nothing sent.
type noForce struct{ tally }

func (p *noForce) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if mode == Force {
		return ErrUnsupported
	}
	return p.tally.Reboot(ctx, t, mode)
}
func (*noForce) forceless() {}

// TestForceResumedOnlyWhereForced: a janitor that starts on a reboot
// whose state records a forced reboot audits it (force-resumed) only when
// its provider has a forced reboot; through one that has none (AWS,
// local) no force was sent, and none is said to be. Before, every restart
// produced "a forced reboot was recorded … not sent again" for a force
// the provider had refused as unsupported.
func TestForceResumedOnlyWhereForced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		prov Provider
		want []string
	}{
		{"forceless", &noForce{}, []string{"reboot/" + events.OutcomeSucceeded}},
		{"forces", &tally{}, []string{"reboot/" + events.OutcomeInProgress, "reboot/" + events.OutcomeSucceeded}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Back with a new boot ID: the follow that would audit the
			// force completes the reboot right after.
			f := newFakeCluster(t, fakeNode("n-up", "r1", "boot-new"))
			now := time.Now().UTC()
			st := &opState{Step: "force", At: now.Add(-15 * time.Minute), BootID: "boot-old", Provider: ProviderRedfish,
				By: "another-janitor", ForcedAt: now.Add(-5 * time.Minute)}
			f.create(kindReboot, "up", "n-up", st, cond{CondSignalSent, "True", ReasonSucceeded, "signal sent via redfish"},
				cond{CondNodeReady, "Unknown", ReasonInitializing, "waiting"})
			j, rec := f.janitor(fakeConfig(), false, tc.prov)
			f.run(j)
			f.waitFor(kindReboot, "up", 10*time.Second, "finished", finished)
			rec.expect(t, "n-up", tc.want)
		})
	}
}

// The providers whose Reboot with Force is ErrUnsupported.
var (
	_ forceless = (*AWS)(nil)
	_ forceless = (*Local)(nil)
)
