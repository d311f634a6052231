package quarantine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// The actions kept on a node stay within their bounds: each detail cut,
// the newest kept by count and by bytes, the caller's action untouched.
func TestAddUnsaidBounded(t *testing.T) {
	act := func(i, keys, detail int) *faultlinev1.Action {
		a := &faultlinev1.Action{Id: fmt.Sprint("a", i), Cluster: "c1", Node: "n", Role: Role, Kind: events.KindUnquarantine,
			Outcome: events.OutcomeApplied, Details: map[string]string{events.DetailEntities: strings.Repeat("x", detail)}}
		for k := 1; k < keys; k++ {
			a.Details[fmt.Sprint("k", k)] = strings.Repeat("y", detail)
		}
		return a
	}
	for _, tc := range []struct {
		name          string
		n, keys       int
		detail        int
		wantN, maxN   int
		wantNewest    string
		wantDetailLen int
	}{
		{name: "small", n: 3, keys: 1, detail: 10, wantN: 3, maxN: 3, wantNewest: "a2", wantDetailLen: 10},
		{name: "more than maxUnsaid", n: maxUnsaid + 5, keys: 1, detail: 10, wantN: maxUnsaid, maxN: maxUnsaid, wantNewest: fmt.Sprint("a", maxUnsaid+4), wantDetailLen: 10},
		{name: "large details", n: maxUnsaid, keys: 1, detail: 64 << 10, wantN: maxUnsaid, maxN: maxUnsaid, wantNewest: fmt.Sprint("a", maxUnsaid-1), wantDetailLen: maxUnsaidDetail},
		// 20 details of 256 bytes: about 5.4 KiB each, three fit in 16 KiB.
		{name: "over maxUnsaidBytes", n: 5, keys: 20, detail: 1 << 10, wantN: 3, maxN: 3, wantNewest: "a4", wantDetailLen: maxUnsaidDetail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{}
			for i := range tc.n {
				a := act(i, tc.keys, tc.detail)
				st.addUnsaid(a)
				if len(a.Details[events.DetailEntities]) != tc.detail {
					t.Fatal("the caller's action was cut")
				}
			}
			size := 0
			for _, raw := range st.Unsaid {
				size += len(raw)
			}
			acts, bad := st.unsaid("c1", "n")
			if bad > 0 || len(acts) < tc.wantN || len(acts) > tc.maxN || size > maxUnsaidBytes {
				t.Fatalf("%d kept (%d bad), %d bytes; want %d to %d, at most %d bytes", len(acts), bad, size, tc.wantN, tc.maxN, maxUnsaidBytes)
			}
			newest := acts[len(acts)-1]
			if newest.Id != tc.wantNewest || len(newest.Details[events.DetailEntities]) != tc.wantDetailLen {
				b, _ := protojson.Marshal(newest)
				t.Fatalf("newest kept: %s", b)
			}
		})
	}
}

// A person uncordons a node faultline cordoned for two faults, one of
// which recovered (its action still on the node), and the loop that
// removes produced actions writes the node before the watch's notice of
// the uncordon is handled: the uncordon is acknowledged there and then,
// the node is not cordoned again, and its manual_uncordon action is kept
// on the node for resay.
func TestForgetUnsaidKeepsAManualUncordon(t *testing.T) {
	h, k, advance := fakeHandler(t, testConfig("forget"), "forget", "forget-1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	handle(t, h, record("c1", fatal("forget-1", "XID_ERROR_48", "GPU-1")), record("c1", fatal("forget-1", "XID_ERROR_48", "GPU-2")))
	if acts, _ := handle(t, h, record("c1", healthy("forget-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "unquarantine/in_progress" {
		t.Fatalf("recovery of one fault: %s", kinds(acts))
	}
	n := getNode(t, k, "forget-1")
	st, _ := ReadState(n)
	own, _ := st.unsaid("c1", "forget-1")
	if !n.Spec.Unschedulable || len(own) != 1 {
		t.Fatalf("before the uncordon: unschedulable %v, unsaid %v", n.Spec.Unschedulable, own)
	}
	uncordonSeen(t, h, k, n)

	if err := h.forgetUnsaid(ctx, "c1", "forget-1", []string{own[0].GetId()}); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, k, "forget-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" ||
		n.Annotations[AnnotationManualUncordon] == "" {
		t.Fatalf("the person's uncordon undone: unschedulable %v, taints %v, labels %v, annotations %v",
			n.Spec.Unschedulable, n.Spec.Taints, n.Labels, n.Annotations)
	}
	if a, err := h.AcknowledgeUncordon(ctx, "c1", "forget-1"); a != nil || err != nil {
		t.Fatalf("acknowledged twice: %v, %v", a, err)
	}
	// The acknowledgement's action is resaid (the fake keeps no
	// resourceVersions: the watch's copy is trusted after RecentWrite).
	advance(recentWrite)
	waitWatchedUnsaid(t, h, "forget-1", func(u string) bool { return strings.Contains(u, events.KindManualUncordon) }, "the acknowledgement on the watched node")
	var said actionSink
	if err := h.resay(ctx, &said); err != nil || kinds(said.snapshot()) != "manual_uncordon/decided" {
		t.Fatalf("resay: %s, %v", kinds(said.snapshot()), err)
	}
	if n := getNode(t, k, "forget-1"); n.Spec.Unschedulable || n.Annotations[AnnotationUnsaid] != "" {
		t.Fatalf("after resay: unschedulable %v, unsaid %s", n.Spec.Unschedulable, n.Annotations[AnnotationUnsaid])
	}
}
