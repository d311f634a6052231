package janitor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

// TestCRDInstalledLaterIsWatched: a kind whose CRD is not installed when
// the cluster's watch starts is listed again (every minute; here 50 ms)
// and, once its CRD is there, watched: the cluster's watch restarts with
// it, and its TerminateNode is carried out; a reboot sent
// before the restart is not sent again. faultline_janitor_kind_watched
// says 0 for the kind until then, 1 after. Before, the kind was left out
// for the watch's life: its resources were silently ignored until the
// janitor restarted, and the remediate role escalated their nodes after
// its queue_timeout.
func TestCRDInstalledLaterIsWatched(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n-reboot", "r1", "boot-a"), fakeNode("n-term", "r2", "boot-b"))
	var installed atomic.Bool
	f.dyn.PrependReactor("list", kindTerminate.GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		if installed.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewNotFound(kindTerminate.GVR.GroupResource(), "")
	})
	prov := &tally{}
	j, _ := f.janitor(fakeConfig(), false, prov)
	reg := prometheus.NewRegistry()
	j.m = newMetrics(reg)
	j.kindRecheck = 50 * time.Millisecond
	// Created before the watches start (the fake's watch misses what is
	// created between its list and its watch).
	f.create(kindReboot, "reboot", "n-reboot", nil)
	f.run(j)
	f.waitFor(kindReboot, "reboot", 10*time.Second, "signal sent", func(o *unstructured.Unstructured) bool { return condIs(o, CondSignalSent, "True") })
	watched := func(k kind) float64 { return testutil.ToFloat64(j.m.kindWatched.WithLabelValues(cluster, k.Name)) }
	if w, r := watched(kindTerminate), watched(kindReboot); w != 0 || r != 1 {
		t.Fatalf("faultline_janitor_kind_watched: TerminateNode %v, RebootNode %v; want 0 and 1", w, r)
	}
	f.create(kindTerminate, "term", "n-term", nil)
	time.Sleep(300 * time.Millisecond) // several rechecks
	if c := prov.calls(); c["terminate n-term"] != 0 {
		t.Fatalf("a TerminateNode of a kind not watched was carried out: %v", c)
	}
	installed.Store(true)
	f.waitFor(kindTerminate, "term", 10*time.Second, "signal sent", func(o *unstructured.Unstructured) bool { return condIs(o, CondSignalSent, "True") })
	if w := watched(kindTerminate); w != 1 {
		t.Fatalf("faultline_janitor_kind_watched of TerminateNode %v once watched, want 1", w)
	}
	if c := prov.calls(); c["terminate n-term"] != 1 || c["reboot/graceful n-reboot"] != 1 {
		t.Fatalf("calls %v: want one terminate of n-term and one reboot of n-reboot", c)
	}
}

// slowReboot is a provider whose reboot takes a while (a BMC over
// Redfish), and is not sent if its context ends first.
type slowReboot struct {
	*tally
	started chan struct{}
}

func (p *slowReboot) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	close(p.started)
	select {
	case <-time.After(400 * time.Millisecond):
		return p.tally.Reboot(ctx, t, mode)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestCRDInstalledDuringASignal: a CRD installed while a reboot's signal
// is on its way restarts the cluster's watch without cutting the signal:
// the reboot is sent. The restart cancelled it: recorded, never sent,
// followed as if sent until reboot_timeout.
func TestCRDInstalledDuringASignal(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n-reboot", "r1", "boot-a"))
	var installed atomic.Bool
	f.dyn.PrependReactor("list", kindTerminate.GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		if installed.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewNotFound(kindTerminate.GVR.GroupResource(), "")
	})
	prov := &slowReboot{tally: &tally{}, started: make(chan struct{})}
	j, _ := f.janitor(fakeConfig(), false, prov)
	j.kindRecheck = 50 * time.Millisecond
	f.create(kindReboot, "reboot", "n-reboot", nil)
	f.run(j)
	select {
	case <-prov.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the reboot's signal was not started")
	}
	installed.Store(true)
	f.waitFor(kindReboot, "reboot", 10*time.Second, "signal sent", func(o *unstructured.Unstructured) bool { return condIs(o, CondSignalSent, "True") })
	time.Sleep(600 * time.Millisecond) // the signal's time, and the restart's
	if c := prov.calls(); c["reboot/graceful n-reboot"] != 1 {
		t.Fatalf("calls %v: want the reboot of n-reboot sent once", c)
	}
}
