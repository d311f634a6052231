package drain

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/schemas/events"
)

// Why a pod is left alone; these are the keys of State.Skipped.
const (
	SkipSystem     = "system_namespace"
	SkipDaemonSet  = "daemonset"
	SkipMirror     = "mirror"
	SkipEmptyDir   = "empty_dir"
	SkipOutOfScope = "other_gpu"
	SkipFinished   = "finished"
)

// mirrorAnnotation marks static pods' mirror objects.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// GPU extended resources: the NVIDIA device plugin's nvidia.com/gpu, its
// time-sliced or MPS-shared GPUs renamed (renameByDefault:
// nvidia.com/gpu.shared) and its MIG devices under the mixed strategy
// (nvidia.com/mig-1g.10gb, and .shared). The network operator's NIC
// resources (nvidia.com/rdma_shared_device_a, nvidia.com/hostdev, ...)
// are none of them.
const (
	resourceGPU       = "nvidia.com/gpu"
	resourceGPUPrefix = "nvidia.com/gpu."
	resourceMIGPrefix = "nvidia.com/mig-"
)

// listingSlack is how long before the kubelet's listing a pod must have
// started to be judged by it: the pod's StartTime is in whole seconds
// (truncated) and the listing's time is the node's clock, so a pod that
// started just after the listing can read as started before it.
const listingSlack = 2 * time.Second

// plan is what the drain does with one pod.
type plan struct {
	skip    string
	mode    Mode
	timeout time.Duration
}

// classify decides whether a pod is drained and how, within sc; force
// makes every pod Immediate.
func (c *Config) classify(p *corev1.Pod, sc Scope, force bool) plan {
	switch {
	case c.sys.MatchString(p.Namespace):
		return plan{skip: SkipSystem}
	case p.Annotations[mirrorAnnotation] != "":
		return plan{skip: SkipMirror}
	case ownedByDaemonSet(p):
		return plan{skip: SkipDaemonSet}
	case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
		return plan{skip: SkipFinished}
	}
	if len(sc.GPUs) > 0 && !c.usesGPU(p, sc) {
		return plan{skip: SkipOutOfScope}
	}
	if c.EmptyDir == EmptyDirSkip && hasEmptyDir(p) {
		return plan{skip: SkipEmptyDir}
	}
	if force {
		return plan{mode: ModeImmediate, timeout: c.EvictionTimeout}
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if r.ns.MatchString(p.Namespace) && r.sel.Matches(labels.Set(p.Labels)) {
			return plan{mode: r.Mode, timeout: c.timeout(r.Mode, r)}
		}
	}
	return plan{mode: c.Mode, timeout: c.timeout(c.Mode, nil)}
}

func ownedByDaemonSet(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

func hasEmptyDir(p *corev1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil {
			return true
		}
	}
	return false
}

// usesGPU reports whether the pod may use one of the scope's GPUs:
//   - when a GPU of the scope is not named by its UUID (a PCI address,
//     index:N: byUUID), whether it uses any GPU (names one or "all", or
//     requests one): neither its names nor a listing can say which;
//   - it names one of them (or "all") in Config.GPUAnnotations or in its
//     containers' NVIDIA_VISIBLE_DEVICES;
//   - else, when the kubelet listed the pods holding them (sc.GPUPods) and
//     the pod had started on the node then (its StartTime listingSlack
//     before the listing), whether it is listed (the device plugin's
//     allocation, which the pod spec never shows);
//   - else, whether it may hold a GPU its names do not say (unnamedGPU):
//     a GPU reset with a process still on the GPU fails, so a guess errs
//     towards evicting.
//
// A pod that requests no GPU and names none uses none.
func (c *Config) usesGPU(p *corev1.Pod, sc Scope) bool {
	ids := c.podGPUs(p)
	if !byUUID(sc.GPUs) {
		return !noGPU(ids) || requestsGPU(p)
	}
	for _, id := range ids {
		// UUIDs compared in one case: NVML writes lower-case hex, an
		// event or a pod's value may not.
		if id == "all" || slices.ContainsFunc(sc.GPUs, func(g string) bool { return strings.EqualFold(g, id) }) {
			return true
		}
	}
	if l := sc.GPUPods; l != nil && p.Status.StartTime != nil && p.Status.StartTime.Time.Before(l.At.Add(-listingSlack)) {
		return slices.Contains(l.Pods, p.Namespace+"/"+p.Name)
	}
	return c.unnamedGPU(p)
}

// unnamedGPU reports whether the pod may hold a GPU that its names do not
// say: only GPU UUIDs (or "all") name GPUs — "void" and "none" (NVIDIA's
// advice for sidecars), indexes, MIG ids and empty values say nothing of
// which GPU a container holds. A GPU annotation naming one settles it for
// the pod (no); else the pod holds resource claims (DRA), or a container
// requests a GPU resource and its NVIDIA_VISIBLE_DEVICES names none.
// Before, any value of either (a sidecar's "void") took the pod for
// naming its GPUs, and a job requesting 8 GPUs stayed on the one reset.
func (c *Config) unnamedGPU(p *corev1.Pod) bool {
	for _, k := range c.GPUAnnotations {
		if v, ok := p.Annotations[k]; ok && namesGPU(splitIDs(v)) {
			return false
		}
	}
	if len(p.Spec.ResourceClaims) > 0 {
		return true
	}
	for _, ct := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if !containerRequestsGPU(&ct) {
			continue
		}
		var ids []string
		for _, e := range ct.Env {
			if e.Name == "NVIDIA_VISIBLE_DEVICES" {
				ids = append(ids, splitIDs(e.Value)...)
			}
		}
		if !namesGPU(ids) {
			return true
		}
	}
	return false
}

// namesGPU reports whether ids name a GPU: a GPU UUID, or "all".
func namesGPU(ids []string) bool {
	return slices.ContainsFunc(ids, func(id string) bool { return id == "all" || events.IsGPUUUID(id) })
}

// noGPU reports whether NVIDIA_VISIBLE_DEVICES-style ids name no GPU
// ("none" and "void" give a container none; so does no id at all).
func noGPU(ids []string) bool {
	for _, id := range ids {
		if id != "none" && id != "void" {
			return false
		}
	}
	return true
}

// podGPUs returns the GPU ids a pod names: its first GPU annotation
// present, else its containers' NVIDIA_VISIBLE_DEVICES.
func (c *Config) podGPUs(p *corev1.Pod) []string {
	for _, k := range c.GPUAnnotations {
		if v, ok := p.Annotations[k]; ok {
			return splitIDs(v)
		}
	}
	var ids []string
	for _, ct := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, e := range ct.Env {
			if e.Name == "NVIDIA_VISIBLE_DEVICES" {
				ids = append(ids, splitIDs(e.Value)...)
			}
		}
	}
	return ids
}

func splitIDs(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == ';' || r == '\n' })
}

// requestsGPU reports whether a container of the pod requests (or is
// limited to) a GPU resource (isGPUResource), or the pod holds resource
// claims: a GPU allocated through DRA (gpu.nvidia.com) shows in no
// container's resources, and a guess errs towards evicting.
func requestsGPU(p *corev1.Pod) bool {
	if len(p.Spec.ResourceClaims) > 0 {
		return true
	}
	for _, ct := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if containerRequestsGPU(&ct) {
			return true
		}
	}
	return false
}

// containerRequestsGPU reports whether the container requests (or is
// limited to) a GPU resource (isGPUResource).
func containerRequestsGPU(ct *corev1.Container) bool {
	for _, l := range []corev1.ResourceList{ct.Resources.Limits, ct.Resources.Requests} {
		for name, q := range l {
			if isGPUResource(name) && !q.IsZero() {
				return true
			}
		}
	}
	return false
}

func isGPUResource(name corev1.ResourceName) bool {
	n := string(name)
	return n == resourceGPU || strings.HasPrefix(n, resourceGPUPrefix) || strings.HasPrefix(n, resourceMIGPrefix)
}
