package correlate

import (
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// pciOnly names the GPU of an Xid event by its PCI address alone, as the
// kmsg agent does until it knows the GPU's UUID (and NVSentinel's syslog
// monitor always does).
func pciOnly(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
	ev.EntitiesImpacted = ev.EntitiesImpacted[:1]
	return ev
}

// TestOneVerdictPerGPU: the Xid rules' windows count "PCI=…" and
// "PCI=…,GPU=…" as one GPU (TestXidGPUKnownByPCIOnly), and so does the
// standing verdict: a trigger under the other spelling finds the GPU's
// verdict standing (no second fault verdict, one recovery), whichever
// spelling came first, in later batches or in one.
func TestOneVerdictPerGPU(t *testing.T) {
	s := server(t)
	m, h := time.Minute, time.Hour
	for _, tc := range []struct {
		name  string
		steps func(c string) []step
	}{
		{"xid 31 PCI-only, then full name", func(c string) []step {
			return []step{
				{evs: evs(pciOnly(xid(c, "n1", 0, 31, false, 1))), want: none},
				{evs: evs(pciOnly(xid(c, "n1", 1*h, 31, false, 1))), want: "RepeatedXID31OnSameGPU:fault"},
				{evs: evs(xid(c, "n1", 3*h, 31, false, 1)), want: none},
				{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
				{sweep: 28 * h, want: none},
			}
		}},
		{"xid 31 full name, then PCI-only (agent restarted)", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
				{evs: evs(xid(c, "n1", 1*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
				{evs: evs(pciOnly(xid(c, "n1", 3*h, 31, false, 1))), want: none},
				{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
			}
		}},
		{"xid 31 both spellings in one batch", func(c string) []step {
			return []step{
				{evs: evs(pciOnly(xid(c, "n1", 0, 31, false, 1))), want: none},
				{evs: evs(pciOnly(xid(c, "n1", 1*h, 31, false, 1)), xid(c, "n1", 1*h+m, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
				{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
			}
		}},
		{"xid bursts PCI-only, then full name", func(c string) []step {
			var st []step
			for i := range 5 {
				want := none
				if i == 4 {
					want = "RepeatedXIDOnSameGPU:fault"
				}
				st = append(st, step{evs: evs(pciOnly(xid(c, "n1", time.Duration(i)*10*m, 48, true, 1))), want: want})
			}
			return append(st,
				step{evs: evs(xid(c, "n1", 3*h, 48, true, 1)), want: none},
				step{sweep: 28 * h, want: "RepeatedXIDOnSameGPU:recovery"})
		}},
		{"another board at the same PCI address is another GPU", func(c string) []step {
			other := func(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
				ev.EntitiesImpacted[1].EntityValue = "GPU-2"
				return ev
			}
			return []step{
				{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
				{evs: evs(xid(c, "n1", 1*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
				{evs: evs(other(xid(c, "n1", 2*h, 31, false, 1))), want: none},
				{evs: evs(other(xid(c, "n1", 3*h, 31, false, 1))), want: "RepeatedXID31OnSameGPU:fault"},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("onegpu")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
}

// TestOneVerdictPerGPUNotYetStored: the GPU's verdict under the other
// spelling that the store has not written yet (this replica's memory of
// what it emitted) stands as well.
func TestOneVerdictPerGPUNotYetStored(t *testing.T) {
	s := server(t)
	h := time.Hour
	c := newCluster("onegpu")
	hs := newHarness(t, s, DefaultRules, nil)
	hs.cluster = c
	if got := describe(hs.batch(records(t, evs(pciOnly(xid(c, "n1", 0, 31, false, 1))))...)); got != none {
		t.Fatalf("first Xid 31: derived %q", got)
	}
	recs := records(t, evs(pciOnly(xid(c, "n1", 1*h, 31, false, 1))))
	out := hs.handle(recs)
	hs.storeDerived(recs, nil) // the verdict not written yet
	if len(out) != 1 {
		t.Fatalf("second Xid 31: %d derived, want the verdict", len(out))
	}
	if got := describe(hs.batch(records(t, evs(xid(c, "n1", 2*h, 31, false, 1)))...)); got != none {
		t.Fatalf("third Xid 31, full name, the verdict not stored: derived %q, want nothing", got)
	}
	hs.storeDerived(nil, out)
	if got := describe(hs.sweep(26 * h)); got != "RepeatedXID31OnSameGPU:recovery" {
		t.Fatalf("sweep: derived %q, want one recovery", got)
	}
}

func TestGPUOf(t *testing.T) {
	for _, tc := range []struct {
		key, pci, gpu string
		ok            bool
	}{
		{"PCI=0000:17:00", "0000:17:00", "", true},
		{"PCI=0000:17:00,GPU=GPU-1", "0000:17:00", "GPU-1", true},
		{"GPU=GPU-1", "", "", false},
		{"PCI=", "", "", false},
		{"PCI=0000:17:00,GPU=", "", "", false},
		{"PCI=0000:17:00,NICPort=mlx5_0/1", "", "", false},
		{"PCI=0000:17:00,GPU=GPU-1,NODE=n1", "", "", false},
		{"NICPort=mlx5_0/1", "", "", false},
	} {
		pci, gpu, ok := gpuOf(tc.key)
		if pci != tc.pci || gpu != tc.gpu || ok != tc.ok {
			t.Errorf("gpuOf(%q) = %q, %q, %v; want %q, %q, %v", tc.key, pci, gpu, ok, tc.pci, tc.gpu, tc.ok)
		}
	}
}

// TestSameGPURecoveredOtherSpelling: a GPU's verdict once stood under
// "PCI=…" alone and has recovered; a later Xid named "PCI=…,GPU=…" with no
// verdict of its own keeps its own spelling (its derived events name the
// GPU's UUID). Only a trigger late against that recovery (generated at or
// before it) takes its spelling, to be judged after it (prepare).
func TestSameGPURecoveredOtherSpelling(t *testing.T) {
	const (
		pci  = "PCI=0000:01:00.0"
		full = pci + ",GPU=GPU-A"
		day  = int64(24 * time.Hour / time.Millisecond)
	)
	r := &Rule{Scope: ScopeEntity}
	for _, tc := range []struct {
		name string
		atMS int64
		want string
	}{
		{"a month after the recovery", 30 * day, full},
		{"just after the recovery", 1001, full},
		{"late: at the recovery", 1000, pci},
		{"late: before the recovery", 500, pci},
	} {
		t.Run(tc.name, func(t *testing.T) {
			priors := map[string]prior{"c\x00n1\x00" + pci: {id: "r", healthy: true, tMS: 1000, mode: ModeLive}}
			trigs := []trigger{{cluster: "c", dnode: "n1", dentity: full, atMS: tc.atMS, entities: gpuEntities(full)}}
			sameGPU(r, priors, trigs)
			if got := trigs[0].dentity; got != tc.want {
				t.Fatalf("dentity %q, want %q", got, tc.want)
			}
			if got := events.EntityKey(&datamodels.HealthEvent{EntitiesImpacted: trigs[0].entities}); got != tc.want {
				t.Fatalf("entities %q, want %q (the derived event's entities are its group's)", got, tc.want)
			}
		})
	}
	// The mirror: a "PCI=…" alone after the full name's recovery takes
	// the full name (its UUID), late or not, the newest UUID at the
	// address; past MaxStanding (the GPU may have been replaced since) it
	// keeps its own.
	other := pci + ",GPU=GPU-B"
	for _, tc := range []struct {
		atMS  int64
		known map[string]int64 // spelling -> its recovery
		want  string
	}{
		{500, map[string]int64{full: 1000}, full},
		{1001, map[string]int64{full: 1000}, full},
		{20 * day, map[string]int64{full: 1000}, full},
		{31 * day, map[string]int64{full: 1000}, pci},
		{1001, map[string]int64{full: 1000, other: 900}, full},
		{1001, map[string]int64{full: 800, other: 900}, other},
	} {
		priors := map[string]prior{}
		for k, at := range tc.known {
			priors["c\x00n1\x00"+k] = prior{id: "r", healthy: true, tMS: at, mode: ModeLive}
		}
		trigs := []trigger{{cluster: "c", dnode: "n1", dentity: pci, atMS: tc.atMS, entities: gpuEntities(pci)}}
		sameGPU(r, priors, trigs)
		if got := trigs[0].dentity; got != tc.want {
			t.Errorf("PCI-only trigger at %d after the recovery of %v: dentity %q, want %q", tc.atMS, tc.known, got, tc.want)
		}
	}
}
