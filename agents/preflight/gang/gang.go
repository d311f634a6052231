// Package gang finds the gang a pod belongs to — the pods that must start
// together and run the gang-wide NCCL check as one communicator — behind
// one interface (Method), with ADR-026's implementations: Kubernetes'
// native workload reference (spec.workloadRef in 1.35, its successor
// spec.schedulingGroup in 1.36), Volcano's pod-group annotation, Kueue's
// workload label, and operator-configured labels. A pod none of them
// recognises is a singleton and skips gang-wide checks.
//
// The webhook identifies the gang at admission and records it on the pod
// (label LabelGang, annotations AnnotationMethod and AnnotationName); the
// gang controller (package coordination) lists the gang's pods by that
// label and asks the method for the gang's expected size.
package gang

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	sigsjson "sigs.k8s.io/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations the webhook puts on a gang pod.
const (
	// LabelGang carries the gang ID; the controller watches pods with it.
	LabelGang = "preflight.faultline.io/gang"
	// AnnotationMethod and AnnotationName say how the gang was found and
	// the scheduler object's name (workload, pod group, ...).
	AnnotationMethod = "preflight.faultline.io/gang-method"
	AnnotationName   = "preflight.faultline.io/gang-name"
	// LabelExcluded carries the gang ID on a gang pod that runs no
	// gang-wide check (no GPUs, no network devices, ...), and
	// AnnotationExcluded why: the scheduler counts it in the gang's size,
	// the controller does not wait for it.
	LabelExcluded      = "preflight.faultline.io/gang-excluded"
	AnnotationExcluded = "preflight.faultline.io/gang-excluded-reason"
)

// AllreduceContainer is the init container of the gang-wide check
// (injection.ContainerPrefix + checks.NCCLAllreduce; injection's tests keep
// them equal): the controller counts a gang pod as a peer once it runs.
const AllreduceContainer = "preflight-nccl-allreduce"

// ConfigMapPrefix starts every ConfigMap the controller keeps:
// "preflight-<gangID>".
const ConfigMapPrefix = "preflight-"

// Gang is a pod's gang.
type Gang struct {
	// Method is the Method that found it.
	Method string
	// Namespace is the gang's (and its pods') namespace.
	Namespace string
	// Name is the scheduler object's name within the namespace.
	Name string
	// ID is the gang's identifier: safe as a label value and, after
	// ConfigMapPrefix, as a ConfigMap name; unique per method and name.
	ID string
	// Expected is the gang's size when the pod itself says it (a size
	// label, Kueue's total-count annotation); 0 when the scheduler object
	// must be asked (Method.Expected).
	Expected int
}

// ConfigMapName is "preflight-<ID>".
func (g Gang) ConfigMapName() string { return ConfigMapPrefix + g.ID }

// PeerInfo is one member of a gang (ADR-026's interface).
type PeerInfo struct {
	PodName  string
	PodIP    string
	NodeName string
}

// Pod is a pod as gang discovery sees it: the typed pod plus the
// scheduling fields newer than this build's API types, decoded from the
// pod's JSON.
type Pod struct {
	*corev1.Pod
	// WorkloadRef is spec.workloadRef (Kubernetes 1.35).
	WorkloadRef *WorkloadRef
	// SchedulingGroup is spec.schedulingGroup.podGroupName (1.36+).
	SchedulingGroup string
}

// WorkloadRef is Kubernetes 1.35's spec.workloadRef.
type WorkloadRef struct {
	Name               string `json:"name"`
	PodGroup           string `json:"podGroup"`
	PodGroupReplicaKey string `json:"podGroupReplicaKey"`
}

// DecodePod decodes a pod's JSON, keeping the newer scheduling fields.
// Field names match case-sensitively, as the API server decodes them
// (encoding/json would read "speC" as spec, which the API server drops):
// the patch is written against the object as the API server holds it.
func DecodePod(raw []byte) (Pod, error) {
	var p corev1.Pod
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &p); err != nil {
		return Pod{}, err
	}
	var extra struct {
		Spec struct {
			WorkloadRef     *WorkloadRef `json:"workloadRef"`
			SchedulingGroup *struct {
				PodGroupName string `json:"podGroupName"`
			} `json:"schedulingGroup"`
		} `json:"spec"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &extra); err != nil {
		return Pod{}, err
	}
	out := Pod{Pod: &p, WorkloadRef: extra.Spec.WorkloadRef}
	if extra.Spec.SchedulingGroup != nil {
		out.SchedulingGroup = extra.Spec.SchedulingGroup.PodGroupName
	}
	return out, nil
}

// Method is one way of finding a pod's gang.
type Method interface {
	// Name is the method's configuration name.
	Name() string
	// Identify returns the pod's gang; ok is false when the pod carries no
	// marker of this method.
	Identify(p Pod) (g Gang, ok bool)
	// Expected returns how many pods the gang has, from its scheduler
	// object; 0 when unknown (yet). member is one of its pods.
	Expected(ctx context.Context, g Gang, member *corev1.Pod) (int, error)
}

// Discovery tries the configured methods in order.
type Discovery struct {
	methods []Method
}

// NewDiscovery returns a Discovery over methods, in order.
func NewDiscovery(methods ...Method) *Discovery { return &Discovery{methods: methods} }

// Identify returns the pod's gang by the first method that recognises it;
// ok false means a singleton.
func (d *Discovery) Identify(p Pod) (Gang, bool) {
	for _, m := range d.methods {
		if g, ok := m.Identify(p); ok {
			return g, true
		}
	}
	return Gang{}, false
}

// Method returns the method of that name.
func (d *Discovery) Method(name string) (Method, bool) {
	for _, m := range d.methods {
		if m.Name() == name {
			return m, true
		}
	}
	return nil, false
}

// PodLister lists the pods with a label value (the controller's informer).
type PodLister interface {
	GangPods(namespace, id string) ([]*corev1.Pod, error)
}

// DiscoverGang is ADR-026's interface: given one pod, all pods of its gang
// (those the webhook labelled with the same gang ID), sorted by name; a
// singleton is its own gang.
func (d *Discovery) DiscoverGang(lister PodLister, pod *corev1.Pod) ([]PeerInfo, error) {
	id := pod.Labels[LabelGang]
	if id == "" {
		return []PeerInfo{{PodName: pod.Name, PodIP: pod.Status.PodIP, NodeName: pod.Spec.NodeName}}, nil
	}
	pods, err := lister.GangPods(pod.Namespace, id)
	if err != nil {
		return nil, err
	}
	out := make([]PeerInfo, 0, len(pods))
	for _, p := range pods {
		out = append(out, PeerInfo{PodName: p.Name, PodIP: p.Status.PodIP, NodeName: p.Spec.NodeName})
	}
	slices.SortFunc(out, func(a, b PeerInfo) int { return strings.Compare(a.PodName, b.PodName) })
	return out, nil
}

// MakeID builds a gang ID from its parts (the first names the method):
// lower-case, characters outside [a-z0-9-.] turned into '-', parts joined
// by '-', at most 52 characters, so that "preflight-"+ID is a valid
// ConfigMap name and ID a valid label value. The join is kept as it is
// when nothing was folded (every part non-empty, of [a-z0-9-.] alone):
// the IDs of earlier versions, which pods admitted before an upgrade carry
// (a gang whose pods carried two IDs would wait for ever, in two halves).
// A long one keeps a prefix and a hash of the join, as before. Any other
// ID ("Job_1" and "job-1" fold into one) ends in a hash of the exact parts
// (a label value with folded characters gets another ID than before). Two parts whose dashes
// fall differently ("train-a"+"workers", "train"+"a-workers") still join
// into one ID: two gangs named so in one namespace share it.
func MakeID(parts ...string) string {
	var b strings.Builder
	plain := len(parts) > 0
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('-')
		}
		plain = plain && p != ""
		for _, r := range p {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-':
				b.WriteRune(r)
			case r >= 'A' && r <= 'Z':
				plain = false
				b.WriteRune(r + 'a' - 'A')
			default:
				plain = false
				b.WriteByte('-')
			}
		}
	}
	id := b.String()
	if plain && len(validation.IsDNS1123Subdomain(ConfigMapPrefix+id)) == 0 {
		if len(id) <= 52 {
			return id
		}
		// Long and clean: earlier versions' ID (a prefix and a hash of
		// the join), which pods admitted before an upgrade carry.
		sum := sha256.Sum256([]byte(id))
		return strings.Trim(id[:43], "-.") + "-" + hex.EncodeToString(sum[:])[:8]
	}
	h := sha256.New()
	for _, p := range parts { // length-prefixed: the exact parts, unambiguously
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:8]
	// Hashed, the prefix is only for people: dots go too ("a.-b" is no
	// valid ConfigMap name).
	id = strings.ReplaceAll(id, ".", "-")
	if len(id) > 43 {
		id = id[:43]
	}
	if id = strings.Trim(id, "-"); id == "" {
		return "g-" + sum
	}
	return id + "-" + sum
}

// getSpec reads a scheduler object through the dynamic client.
func getObject(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, name string) (*unstructured.Unstructured, error) {
	if dyn == nil {
		return nil, fmt.Errorf("no Kubernetes client")
	}
	return dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
}

// WorkloadMethod is Kubernetes' native gang: spec.workloadRef (1.35:
// Workload scheduling.k8s.io/v1alpha1, spec.podGroups[].policy.gang.minCount)
// or spec.schedulingGroup.podGroupName (1.36+: PodGroup
// scheduling.k8s.io/v1alpha2, spec.schedulingPolicy.gang.minCount).
type WorkloadMethod struct{ Dyn dynamic.Interface }

// Name is "workloadRef".
func (WorkloadMethod) Name() string { return "workloadRef" }

// Identify reads spec.workloadRef or spec.schedulingGroup.
func (WorkloadMethod) Identify(p Pod) (Gang, bool) {
	switch {
	case p.WorkloadRef != nil && p.WorkloadRef.Name != "":
		name := p.WorkloadRef.Name + "/" + p.WorkloadRef.PodGroup
		parts := []string{"wl", p.WorkloadRef.Name, p.WorkloadRef.PodGroup}
		if p.WorkloadRef.PodGroupReplicaKey != "" {
			name += "/" + p.WorkloadRef.PodGroupReplicaKey
			parts = append(parts, p.WorkloadRef.PodGroupReplicaKey)
		}
		return Gang{Method: "workloadRef", Namespace: p.Namespace, Name: name, ID: MakeID(parts...)}, true
	case p.SchedulingGroup != "":
		return Gang{Method: "workloadRef", Namespace: p.Namespace, Name: "podgroup/" + p.SchedulingGroup, ID: MakeID("pg", p.SchedulingGroup)}, true
	}
	return Gang{}, false
}

// Expected reads the gang policy's minCount.
func (m WorkloadMethod) Expected(ctx context.Context, g Gang, _ *corev1.Pod) (int, error) {
	if pg, ok := strings.CutPrefix(g.Name, "podgroup/"); ok {
		o, err := getObject(ctx, m.Dyn, schema.GroupVersionResource{Group: "scheduling.k8s.io", Version: "v1alpha2", Resource: "podgroups"}, g.Namespace, pg)
		if err != nil {
			return 0, err
		}
		n, _, err := unstructured.NestedInt64(o.Object, "spec", "schedulingPolicy", "gang", "minCount")
		return int(n), err
	}
	wl, group, _ := strings.Cut(g.Name, "/")
	group, _, _ = strings.Cut(group, "/")
	o, err := getObject(ctx, m.Dyn, schema.GroupVersionResource{Group: "scheduling.k8s.io", Version: "v1alpha1", Resource: "workloads"}, g.Namespace, wl)
	if err != nil {
		return 0, err
	}
	groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "podGroups")
	for _, x := range groups {
		pgm, _ := x.(map[string]any)
		if pgm["name"] == group {
			n, _, err := unstructured.NestedInt64(pgm, "policy", "gang", "minCount")
			return int(n), err
		}
	}
	return 0, fmt.Errorf("workload %s/%s has no pod group %q", g.Namespace, wl, group)
}

// VolcanoMethod is Volcano's PodGroup: the pod's group annotation, the
// PodGroup's spec.minMember (scheduling.volcano.sh/v1beta1).
type VolcanoMethod struct {
	Dyn dynamic.Interface
	// Annotations are the keys tried in order (default
	// "scheduling.k8s.io/group-name", which Volcano sets, and
	// "volcano.sh/pod-group", ADR-026's name).
	Annotations []string
}

// DefaultVolcanoAnnotations are the keys VolcanoMethod reads by default.
var DefaultVolcanoAnnotations = []string{"scheduling.k8s.io/group-name", "volcano.sh/pod-group"}

// Name is "volcano".
func (VolcanoMethod) Name() string { return "volcano" }

// Identify reads the pod-group annotation.
func (m VolcanoMethod) Identify(p Pod) (Gang, bool) {
	keys := m.Annotations
	if len(keys) == 0 {
		keys = DefaultVolcanoAnnotations
	}
	for _, k := range keys {
		if v := p.Annotations[k]; v != "" {
			return Gang{Method: "volcano", Namespace: p.Namespace, Name: v, ID: MakeID("volcano", v)}, true
		}
	}
	return Gang{}, false
}

// Expected reads the PodGroup's spec.minMember.
func (m VolcanoMethod) Expected(ctx context.Context, g Gang, _ *corev1.Pod) (int, error) {
	o, err := getObject(ctx, m.Dyn, schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}, g.Namespace, g.Name)
	if err != nil {
		return 0, err
	}
	n, _, err := unstructured.NestedInt64(o.Object, "spec", "minMember")
	return int(n), err
}

// Kueue's pod labels and annotation.
const (
	KueueWorkloadLabel   = "kueue.x-k8s.io/workload-name"
	KueuePodGroupLabel   = "kueue.x-k8s.io/pod-group-name"
	KueueTotalCountAnnot = "kueue.x-k8s.io/pod-group-total-count"
)

// KueueMethod is Kueue: the pod's workload label (ADR-026) or pod-group
// label; the size from the pod-group total-count annotation, else the
// Workload's spec.podSets[].count (kueue.x-k8s.io/v1beta1).
type KueueMethod struct{ Dyn dynamic.Interface }

// Name is "kueue".
func (KueueMethod) Name() string { return "kueue" }

// Identify reads the Kueue labels.
func (KueueMethod) Identify(p Pod) (Gang, bool) {
	for _, k := range []string{KueueWorkloadLabel, KueuePodGroupLabel} {
		if v := p.Labels[k]; v != "" {
			g := Gang{Method: "kueue", Namespace: p.Namespace, Name: v, ID: MakeID("kueue", v)}
			if n, err := strconv.Atoi(p.Annotations[KueueTotalCountAnnot]); err == nil && n > 0 {
				g.Expected = n
			}
			return g, true
		}
	}
	return Gang{}, false
}

// Expected reads the total-count annotation of a member, else the
// Workload's pod sets.
func (m KueueMethod) Expected(ctx context.Context, g Gang, member *corev1.Pod) (int, error) {
	if member != nil {
		if n, err := strconv.Atoi(member.Annotations[KueueTotalCountAnnot]); err == nil && n > 0 {
			return n, nil
		}
	}
	o, err := getObject(ctx, m.Dyn, schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "workloads"}, g.Namespace, g.Name)
	if err != nil {
		return 0, err
	}
	sets, _, _ := unstructured.NestedSlice(o.Object, "spec", "podSets")
	total := 0
	for _, s := range sets {
		sm, _ := s.(map[string]any)
		n, _, _ := unstructured.NestedInt64(sm, "count")
		total += int(n)
	}
	return total, nil
}

// LabelsMethod is an operator's own labels: IDLabel names the gang,
// SizeLabel its size.
type LabelsMethod struct {
	IDLabel   string
	SizeLabel string
}

// Name is "labels".
func (LabelsMethod) Name() string { return "labels" }

// Identify reads the configured labels.
func (m LabelsMethod) Identify(p Pod) (Gang, bool) {
	v := p.Labels[m.IDLabel]
	if m.IDLabel == "" || v == "" {
		return Gang{}, false
	}
	g := Gang{Method: "labels", Namespace: p.Namespace, Name: v, ID: MakeID("lbl", v)}
	if n, err := strconv.Atoi(p.Labels[m.SizeLabel]); err == nil && n > 0 {
		g.Expected = n
	}
	return g, true
}

// Expected reads the size label of a member.
func (m LabelsMethod) Expected(_ context.Context, g Gang, member *corev1.Pod) (int, error) {
	if member == nil {
		return 0, nil
	}
	n, err := strconv.Atoi(member.Labels[m.SizeLabel])
	if err != nil || n < 1 {
		return 0, fmt.Errorf("pod %s/%s: label %s=%q is not a gang size", member.Namespace, member.Name, m.SizeLabel, member.Labels[m.SizeLabel])
	}
	return n, nil
}
