package janitor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/schemas/events"
)

// TestNodeOwnKeys: a node's kubelet may write its own annotations and its
// labels outside node-restriction.kubernetes.io/, so a compromised node
// may choose its reboot provider (faultline.io/janitor-provider) and,
// through Redfish, its BMC (faultline.io/bmc-address). An administrator's
// node-restriction.kubernetes.io/faultline-janitor-provider label wins
// over the node's own key; with redfish.labels_only the node's own key is
// not followed (one naming another provider than the rest would pick is
// refused NoProvider, nothing sent); a signal that did follow a key of
// the node's own says so in its action's details (nodeNamed) and in
// faultline_janitor_node_named_total. Before, the node's annotation won
// over every label, was followed with labels_only, and a reboot following
// it said nothing.
func TestNodeOwnKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	for i, tc := range []struct {
		name       string
		labelsOnly bool
		labels     map[string]string
		ann        map[string]string
		want       string // the provider called; "" none
		wantSignal string // SignalSent
		wantNamed  string // the signal action's nodeNamed detail
	}{
		{name: "the administrator's label wins over the node's annotation",
			labels: map[string]string{LabelProvider: ProviderLocal}, ann: map[string]string{AnnotationProvider: ProviderRedfish},
			want: ProviderLocal, wantSignal: "True/Succeeded"},
		{name: "the node's own annotation is followed and said",
			ann:  map[string]string{AnnotationProvider: ProviderLocal},
			want: ProviderLocal, wantSignal: "True/Succeeded", wantNamed: AnnotationProvider},
		{name: "the node's own label is followed and said",
			labels: map[string]string{AnnotationProvider: ProviderLocal},
			want:   ProviderLocal, wantSignal: "True/Succeeded", wantNamed: AnnotationProvider},
		{name: "labels_only: the node's own pick of another provider is refused", labelsOnly: true,
			ann:        map[string]string{AnnotationProvider: ProviderLocal},
			wantSignal: "False/" + ReasonNoProvider},
		{name: "labels_only: the node's own key naming its provider anyway", labelsOnly: true,
			ann:  map[string]string{AnnotationProvider: ProviderAWS},
			want: ProviderAWS, wantSignal: "True/Succeeded"},
		{name: "labels_only: the administrator's label", labelsOnly: true,
			labels: map[string]string{LabelProvider: ProviderLocal}, ann: map[string]string{AnnotationProvider: ProviderRedfish},
			want: ProviderLocal, wantSignal: "True/Succeeded"},
		{name: "a BMC from the node's annotation is said",
			labels: map[string]string{LabelProvider: ProviderRedfish}, ann: map[string]string{AnnotationBMC: "https://10.0.0.9"},
			want: ProviderRedfish, wantSignal: "True/Succeeded", wantNamed: AnnotationBMC},
		{name: "both the provider and the BMC from the node's annotations",
			ann:  map[string]string{AnnotationProvider: ProviderRedfish, AnnotationBMC: "https://10.0.0.9"},
			want: ProviderRedfish, wantSignal: "True/Succeeded", wantNamed: AnnotationProvider + "," + AnnotationBMC},
		{name: "a BMC from the administrator's labels",
			labels: map[string]string{LabelProvider: ProviderRedfish, LabelBMCHost: "10.0.0.9"}, ann: map[string]string{AnnotationBMC: "https://10.0.0.8"},
			want: ProviderRedfish, wantSignal: "True/Succeeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := "own-" + string(rune('a'+i))
			labels := map[string]string{events.LabelQuarantined: "true", labelDrain: "succeeded"}
			for k, v := range tc.labels {
				labels[k] = v
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: labels, Annotations: tc.ann}}
			if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(n), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.PollInterval, cfg.Cooldown, cfg.RebootTimeout = 200*time.Millisecond, 0, time.Hour
			cfg.DefaultProvider, cfg.Redfish.LabelsOnly = ProviderAWS, tc.labelsOnly
			prov := map[string]Provider{ProviderAWS: &perNode{}, ProviderLocal: &perNode{}, ProviderRedfish: &perNode{}}
			j, rec := e.janitor(cfg, false, prov)
			stop := run(t, j)
			defer stop()
			e.create(kindReboot, "reboot-"+node, node, false)
			var got string
			var o *unstructured.Unstructured
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				var err error
				o, err = e.dyn.Resource(kindReboot.GVR).Get(ctx, "reboot-"+node, metav1.GetOptions{})
				if err == nil {
					if got = condOf(o, CondSignalSent); got != "none" {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no SignalSent within 30s: %v", err)
				}
			}
			var called []string
			for name, p := range prov {
				if p.(*perNode).of(node) > 0 {
					called = append(called, name)
				}
			}
			if got != tc.wantSignal || strings.Join(called, ",") != tc.want {
				t.Fatalf("SignalSent %s, providers called [%s]; want %s, [%s]", got, strings.Join(called, ","), tc.wantSignal, tc.want)
			}
			if tc.want == "" {
				return
			}
			var named string
			var found bool
			for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				rec.mu.Lock()
				for _, a := range rec.acts {
					if a.Node == node && a.Outcome == events.OutcomeApplied && a.Details[events.DetailStep] == "signal" {
						named, found = a.Details[events.DetailNodeNamed], true
					}
				}
				rec.mu.Unlock()
			}
			if !found || named != tc.wantNamed {
				t.Fatalf("the signal's action (found %v) says nodeNamed %q, want %q", found, named, tc.wantNamed)
			}
			// Said on the node as a Warning, and on the resource, where kubectl shows them.
			want := "Normal/RebootNodeApplied"
			if tc.wantNamed != "" {
				want = "Warning/RebootNodeApplied"
			}
			if msgs := nodeEvents(t, e.kube, node, want); !strings.Contains(msgs[0], tc.wantNamed) {
				t.Errorf("node Event %q, want it to name the node's own keys %q", msgs[0], tc.wantNamed)
			}
			msg := fmt.Sprint(condition(o, CondSignalSent)["message"])
			if said := strings.Contains(msg, "the node's own "); said != (tc.wantNamed != "") || !strings.Contains(msg, tc.wantNamed) {
				t.Errorf("SignalSent message %q, want it to name the node's own keys %q", msg, tc.wantNamed)
			}
			for _, k := range []string{AnnotationProvider, AnnotationBMC} {
				want := 0.0
				if strings.Contains(tc.wantNamed, k) {
					want = 1
				}
				var m dto.Metric
				if err := j.m.nodeNamed.WithLabelValues(cluster, k).Write(&m); err != nil || m.GetCounter().GetValue() != want {
					t.Errorf("faultline_janitor_node_named_total{key=%q} %v (%v), want %v", k, m.GetCounter().GetValue(), err, want)
				}
			}
		})
	}
}
