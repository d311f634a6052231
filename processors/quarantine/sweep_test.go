package quarantine

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// A person uncordons a node held by a stabilizing (flapping) fault and a
// standing one, and the sweep lifts the first before the watch's notice
// of the uncordon is handled: the sweep acknowledges the uncordon with
// its lift and does not cordon the node again for the fault still
// standing.
func TestSweepKeepsAManualUncordon(t *testing.T) {
	cfg := testConfig("sweepack")
	cfg.FlapThreshold, cfg.FlapWindow, cfg.StabilizationWindow = 3, 10*time.Minute, time.Minute
	h, k, advance := fakeHandler(t, cfg, "sweepack", "sweepack-1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Each event generated a second after the last, on the handler's
	// clock (the onsets are the events' times, the deadline the clock's).
	now := func(ev *datamodels.HealthEvent) *kgo.Record {
		ev.GeneratedTimestamp = timestamppb.New(advance(time.Second))
		return record("c1", ev)
	}
	for range 3 {
		handle(t, h, now(fatal("sweepack-1", "XID_ERROR_79", "GPU-1")))
		handle(t, h, now(healthy("sweepack-1", "XID_ERROR_79", "GPU-1")))
	}
	if acts, _ := handle(t, h, now(fatal("sweepack-1", "XID_ERROR_48", "GPU-2"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("second fault: %s", kinds(acts))
	}
	n := getNode(t, k, "sweepack-1")
	st, _ := ReadState(n)
	if f := st.Faults[FaultKey("XID_ERROR_79", "GPU=GPU-1")]; f == nil || !f.Stabilizing() || !n.Spec.Unschedulable {
		t.Fatalf("before the uncordon: unschedulable %v, faults %v", n.Spec.Unschedulable, st.Faults)
	}
	uncordonSeen(t, h, k, n)

	advance(2 * time.Minute)
	acts, err := h.SweepStabilized(ctx, []string{"c1"})
	if err != nil || kinds(acts) != "manual_uncordon/decided,unquarantine/in_progress" {
		t.Fatalf("sweep: %s, %v", kinds(acts), err)
	}
	n = getNode(t, k, "sweepack-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" ||
		n.Annotations[AnnotationManualUncordon] == "" {
		t.Fatalf("the person's uncordon undone: unschedulable %v, taints %v, labels %v, annotations %v",
			n.Spec.Unschedulable, n.Spec.Taints, n.Labels, n.Annotations)
	}
	if a, err := h.AcknowledgeUncordon(ctx, "c1", "sweepack-1"); a != nil || err != nil {
		t.Fatalf("acknowledged twice: %v, %v", a, err)
	}
}
