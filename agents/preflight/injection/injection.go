// Package injection is the pod mutation of ADR-026: it detects a pod's
// GPUs (extended resources, or DRA claims whose device class is a GPU
// class), and prepends one init container per enabled check, each given
// the largest GPU (and, for NCCL checks, network) extended-resource counts
// of the pod's containers or the pod's GPU/network claim references, the
// NCCL environment variables of the pod's containers that match the
// configured globs, the volume mount behind a pod-provided NCCL_TOPO_FILE,
// and for gang-wide checks the gang's ConfigMap and a pod-local emptyDir
// (checks' gang.marker_dir: a failed run's marker for its reruns). With a
// relay socket (Config.RelaySocket), the checks get the node agent's
// socket directory instead of the spool's and the token's volumes, and the
// pod the socket's group (Config.RelayGroup) as a supplemental group: the
// checks send through the agent, whose credential is its node's alone.
// Pods without GPUs are
// left untouched, except that a gang pod that runs no gang-wide check
// (none configured aside) is marked gang.LabelExcluded.
//
// Mutate is idempotent: what an earlier invocation injected (recorded in
// AnnotationInjected) is removed before the pod is examined again, so a
// reinvocation — after another webhook changed the pod — recomputes the
// injection from the pod as it is now and yields no patch when nothing
// changed. The patch adds and removes single init containers, volumes,
// supplemental groups, labels and annotations: fields of the pod newer
// than this build's API types (a newer Kubernetes) stay as they were.
package injection

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/gang"
)

// Annotations the injection sets on the pod.
const (
	// AnnotationInjected lists the init containers it injected.
	AnnotationInjected = "preflight.faultline.io/injected"
	// AnnotationSkipped says which enabled checks were left out and why.
	AnnotationSkipped = "preflight.faultline.io/skipped"
	// AnnotationRelayGroup records the supplemental group the injection
	// added to the pod (Config.RelayGroup), for a reinvocation to remove.
	AnnotationRelayGroup = "preflight.faultline.io/relay-group"
)

// Names of what the injection adds.
const (
	ContainerPrefix = "preflight-"
	VolumeState     = "preflight-state"
	VolumeToken     = "preflight-token"
	VolumeGang      = "preflight-gang"
	// VolumeGangMarker is the pod-local emptyDir mounted at the checks'
	// gang.marker_dir.
	VolumeGangMarker = "preflight-gang-marker"
	// StateMountPath holds the spool (checks' default spool.dir is below it).
	StateMountPath = "/var/lib/faultline-preflight"
	// TokenMountPath holds the gateway token (checks' default token file).
	TokenMountPath = "/var/run/secrets/faultline-preflight"
	// VolumeRelay is the node agent's relay socket directory (hostPath).
	VolumeRelay = "preflight-relay"
	// RelayMountPath is where the checks find that directory (read-only:
	// connecting to a socket writes nothing).
	RelayMountPath = "/run/faultline-agent"
)

// Detection lists what counts as a GPU (or a network device).
type Detection struct {
	// ResourceNames are extended resources ("nvidia.com/gpu").
	ResourceNames []string `toml:"resource_names"`
	// DeviceClasses are DRA DeviceClass names.
	DeviceClasses []string `toml:"device_classes"`
}

// CheckSpec is one check to inject.
type CheckSpec struct {
	// Name is the check ("dcgm-diag", "nccl-loopback", "nccl-allreduce", or
	// a third-party name); the init container is "preflight-<name>".
	Name string `toml:"name"`
	// Image runs the check (default: inject.image).
	Image string `toml:"image"`
	// Command and Args: built-in checks default to `faultline-preflight
	// check <name>` plus the rendered runner flags; a third-party check
	// gives its own.
	Command []string `toml:"command"`
	Args    []string `toml:"args"`
	// Env adds variables.
	Env map[string]string `toml:"env"`
	// Network gives the check the pod's network devices, NCCL variables
	// and topology (default: true for the NCCL checks).
	Network *bool `toml:"network"`
	// RequiresNetwork skips the check for pods without network devices
	// (default: true for the NCCL checks, ADR-026).
	RequiresNetwork *bool `toml:"requires_network"`
	// Gang mounts the gang ConfigMap and skips singletons (default: true
	// for nccl-allreduce).
	Gang *bool `toml:"gang"`
}

func (s CheckSpec) builtin() bool { return slices.Contains(checks.Names(), s.Name) }

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

func (s CheckSpec) network() bool {
	return boolOr(s.Network, s.Name == checks.NCCLLoopback || s.Name == checks.NCCLAllreduce)
}
func (s CheckSpec) requiresNetwork() bool {
	return boolOr(s.RequiresNetwork, s.Name == checks.NCCLLoopback || s.Name == checks.NCCLAllreduce)
}
func (s CheckSpec) gang() bool { return boolOr(s.Gang, s.Name == checks.NCCLAllreduce) }

// Config is what the injection needs.
type Config struct {
	Checks  []CheckSpec
	GPU     Detection
	Network Detection
	// EnvPatterns are the globs (path.Match) of variables copied from the
	// pod's containers into network checks ("NCCL_*", "UCX_*", "OMPI_*").
	EnvPatterns []string
	// Image is the default image of the checks.
	Image string
	// ImagePullPolicy of the injected containers (default IfNotPresent).
	ImagePullPolicy corev1.PullPolicy
	// StateHostPath is the node directory holding the checks' spool.
	StateHostPath string
	// TokenSecret is the Secret (in the pod's namespace) holding the
	// gateway token under key "token" ("" mounts none). Legacy: every
	// node's checks share that token, so it is a cluster-wide credential.
	TokenSecret string
	// RelaySocket is the node agent's relay socket on the node (the
	// agent's nvsentinel_socket; "": off). Its directory is mounted at
	// RelayMountPath, the checks are given the socket there
	// (checks.Config.RelaySocket), and neither the spool's nor the token's
	// volume is mounted.
	RelaySocket string
	// RelayGroup is the socket's group (the agent's
	// nvsentinel_socket_group; 0: none added), added to the pod's
	// supplemental groups so that checks of any UID may connect.
	RelayGroup int64
	// GangMountPath is where the gang ConfigMap goes (default
	// "/etc/preflight").
	GangMountPath string
	// Runner is the configuration rendered as flags for built-in checks.
	Runner checks.Config
}

// ClaimResolver returns the device classes a pod's resource claim asks
// for, reading the ResourceClaim or ResourceClaimTemplate it names.
type ClaimResolver interface {
	DeviceClasses(ctx context.Context, namespace string, c corev1.PodResourceClaim) ([]string, error)
}

// Injector mutates pods.
type Injector struct {
	cfg    Config
	claims ClaimResolver
	gangs  *gang.Discovery
	// runnerFlags is cfg.Runner rendered as flags, once (rendering walks a
	// FlagSet: a third of an admission's time if done per pod).
	runnerFlags []string
}

// New returns an Injector. claims may be nil when no device classes are
// configured.
func New(cfg Config, claims ClaimResolver, gangs *gang.Discovery) *Injector {
	if cfg.ImagePullPolicy == "" {
		cfg.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if cfg.GangMountPath == "" {
		cfg.GangMountPath = "/etc/preflight"
	}
	if cfg.RelaySocket != "" {
		cfg.Runner.RelaySocket = RelaySocketPath(cfg.RelaySocket)
	}
	return &Injector{cfg: cfg, claims: claims, gangs: gangs, runnerFlags: checks.RenderFlags(cfg.Runner)}
}

// RelaySocketPath is where the checks find the agent's socket at host path
// socket: in its directory, mounted at RelayMountPath.
func RelaySocketPath(socket string) string {
	return path.Join(RelayMountPath, path.Base(socket))
}

// Result is the outcome of Mutate.
type Result struct {
	// Patch is the JSON patch; nil when the pod stays as it is.
	Patch []byte
	// Outcome is "injected", "unchanged" (already injected, nothing to
	// change), "no_gpu", or "removed" (an earlier injection no longer
	// applies).
	Outcome string
	// Injected are the init container names; Gang is the pod's gang ID.
	Injected []string
	Gang     string
	Skipped  []string
}

// Mutate computes the patch for a pod.
func (inj *Injector) Mutate(ctx context.Context, p gang.Pod) (Result, error) {
	orig := p.Pod
	base, rm := strip(orig)
	gpus, nets := maxResources(base, inj.cfg.GPU.ResourceNames), maxResources(base, inj.cfg.Network.ResourceNames)
	gpuClaims, netClaims, err := inj.dra(ctx, base)
	if err != nil {
		return Result{}, err
	}
	hasGPU := len(gpus) > 0 || len(gpuClaims) > 0
	hasNet := len(nets) > 0 || len(netClaims) > 0
	want := base.DeepCopy()
	res := Result{}
	g, inGang := inj.gangs.Identify(gang.Pod{Pod: base, WorkloadRef: p.WorkloadRef, SchedulingGroup: p.SchedulingGroup})
	// exclude marks a gang pod that runs no gang-wide check while one is
	// configured (a launcher without GPUs, a pod without network devices):
	// the scheduler counts it in the gang's size, the controller subtracts
	// it, so that the others do not wait for it.
	exclude := func(why string) {
		if !inGang || !slices.ContainsFunc(inj.cfg.Checks, CheckSpec.gang) {
			return
		}
		if want.Labels == nil {
			want.Labels = map[string]string{}
		}
		if want.Annotations == nil {
			want.Annotations = map[string]string{}
		}
		want.Labels[gang.LabelExcluded] = g.ID
		want.Annotations[gang.AnnotationExcluded] = why
	}
	if !hasGPU {
		exclude("no GPUs")
		if _, had := orig.Annotations[AnnotationInjected]; !had {
			res.Outcome = "no_gpu"
		} else {
			res.Outcome = "removed"
		}
	} else {
		var inits []corev1.Container
		var needGang bool
		for _, spec := range inj.cfg.Checks {
			why := clash(base, ContainerPrefix+spec.Name)
			switch {
			case why != "":
				res.Skipped = append(res.Skipped, spec.Name+": "+why)
				continue
			case spec.requiresNetwork() && !hasNet:
				res.Skipped = append(res.Skipped, spec.Name+": no network devices")
				continue
			case spec.gang() && !inGang:
				res.Skipped = append(res.Skipped, spec.Name+": not in a gang")
				continue
			}
			c := inj.container(spec, base, gpus, nets, gpuClaims, netClaims)
			if spec.gang() {
				needGang = true
				// The emptyDir outlives the container's restarts: a failed
				// run's marker tells its rerun, long before the ConfigMap
				// lists the pod as rerun, not to pass on a finished peer.
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeGang, MountPath: inj.cfg.GangMountPath, ReadOnly: true},
					corev1.VolumeMount{Name: VolumeGangMarker, MountPath: inj.cfg.Runner.Gang.MarkerDir})
			}
			inits = append(inits, c)
			res.Injected = append(res.Injected, c.Name)
		}
		if len(inits) == 0 {
			res.Outcome = "no_check"
		} else {
			res.Outcome = "injected"
			want.Spec.InitContainers = append(inits, want.Spec.InitContainers...)
			want.Spec.Volumes = append(want.Spec.Volumes, inj.volumes(needGang, g)...)
			if want.Annotations == nil {
				want.Annotations = map[string]string{}
			}
			inj.addRelayGroup(want)
			want.Annotations[AnnotationInjected] = strings.Join(res.Injected, ",")
			// Only a pod that runs the gang-wide check is a peer: the
			// controller lists every labelled pod as one.
			if needGang {
				if want.Labels == nil {
					want.Labels = map[string]string{}
				}
				want.Labels[gang.LabelGang] = g.ID
				want.Annotations[gang.AnnotationMethod] = g.Method
				want.Annotations[gang.AnnotationName] = g.Name
				res.Gang = g.ID
			}
			if len(res.Skipped) > 0 {
				want.Annotations[AnnotationSkipped] = strings.Join(res.Skipped, "; ")
			}
		}
		if !needGang {
			exclude(strings.Join(res.Skipped, "; "))
		}
	}
	patch, changed, err := diff(orig, base, want, rm)
	if err != nil {
		return Result{}, err
	}
	if !changed {
		if res.Outcome == "no_gpu" {
			return Result{Outcome: "no_gpu"}, nil
		}
		if res.Outcome == "injected" {
			res.Outcome = "unchanged"
		}
		return res, nil
	}
	res.Patch = patch
	return res, nil
}

// addRelayGroup adds the relay socket's group to the pod's supplemental
// groups (pod-wide: a container has none of its own), recording it in
// AnnotationRelayGroup unless the pod had it already.
func (inj *Injector) addRelayGroup(p *corev1.Pod) {
	if inj.cfg.RelaySocket == "" || inj.cfg.RelayGroup == 0 {
		return
	}
	if p.Spec.SecurityContext == nil {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if slices.Contains(p.Spec.SecurityContext.SupplementalGroups, inj.cfg.RelayGroup) {
		return
	}
	p.Spec.SecurityContext.SupplementalGroups = append(p.Spec.SecurityContext.SupplementalGroups, inj.cfg.RelayGroup)
	p.Annotations[AnnotationRelayGroup] = strconv.FormatInt(inj.cfg.RelayGroup, 10)
}

// clash says why a check's container cannot go into p ("" if it can): p
// itself (an earlier injection is stripped first) already has a container
// of its name or one of the volumes the checks mount, say a pod spec
// copied from an injected pod, or one of its containers mounts a node
// volume of the checks (the relay socket's, the spool's) that only they
// may have. The API server refuses a pod with two containers or volumes
// of one name, or a mount of a volume it lacks, so injecting would fail
// the pod; a pod that asks for the checks' node volumes is left to fail.
func clash(p *corev1.Pod, container string) string {
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers, ephemeral(p)) {
		for _, m := range c.VolumeMounts {
			if m.Name == VolumeRelay || m.Name == VolumeState {
				return "container " + c.Name + " mounts " + m.Name + ", which only the injected checks may"
			}
		}
	}
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if c.Name == container {
			return "the pod already has a container named " + container
		}
	}
	for _, v := range p.Spec.Volumes {
		if ours(v) {
			return "the pod already has a volume named " + v.Name
		}
	}
	return ""
}

// ours says whether v has the name of a volume the checks mount.
func ours(v corev1.Volume) bool {
	return v.Name == VolumeState || v.Name == VolumeToken || v.Name == VolumeGang || v.Name == VolumeGangMarker || v.Name == VolumeRelay
}

// ephemeral returns p's ephemeral containers as containers (their mounts).
func ephemeral(p *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	for _, e := range p.Spec.EphemeralContainers {
		out = append(out, corev1.Container{Name: e.Name, VolumeMounts: e.VolumeMounts})
	}
	return out
}

// removal is where strip took an earlier injection out of a pod: indices
// into the pod's lists, ascending.
type removal struct {
	inits, volumes, groups []int
}

// strip removes what an earlier invocation injected, and says from where.
func strip(p *corev1.Pod) (*corev1.Pod, removal) {
	out := p.DeepCopy()
	var rm removal
	if _, ok := p.Labels[gang.LabelExcluded]; ok {
		delete(out.Labels, gang.LabelExcluded)
		delete(out.Annotations, gang.AnnotationExcluded)
	}
	injected := strings.Split(p.Annotations[AnnotationInjected], ",")
	if p.Annotations[AnnotationInjected] != "" {
		for i, c := range p.Spec.InitContainers {
			if slices.Contains(injected, c.Name) {
				rm.inits = append(rm.inits, i)
			}
		}
		for i, v := range p.Spec.Volumes {
			if ours(v) {
				rm.volumes = append(rm.volumes, i)
			}
		}
		out.Spec.InitContainers = slices.DeleteFunc(out.Spec.InitContainers, func(c corev1.Container) bool {
			return slices.Contains(injected, c.Name)
		})
		out.Spec.Volumes = slices.DeleteFunc(out.Spec.Volumes, ours)
		delete(out.Annotations, AnnotationInjected)
		delete(out.Annotations, AnnotationSkipped)
		delete(out.Annotations, gang.AnnotationMethod)
		delete(out.Annotations, gang.AnnotationName)
		delete(out.Labels, gang.LabelGang)
		if len(out.Annotations) == 0 && p.Annotations != nil && len(p.Annotations) == 0 {
			out.Annotations = map[string]string{}
		}
	}
	if g, ok := p.Annotations[AnnotationRelayGroup]; ok {
		if gid, err := strconv.ParseInt(g, 10, 64); err == nil && out.Spec.SecurityContext != nil {
			sc := out.Spec.SecurityContext
			if i := slices.Index(sc.SupplementalGroups, gid); i >= 0 {
				sc.SupplementalGroups = slices.Delete(sc.SupplementalGroups, i, i+1)
				rm.groups = []int{i}
			}
			if len(sc.SupplementalGroups) == 0 {
				sc.SupplementalGroups = nil
			}
		}
		delete(out.Annotations, AnnotationRelayGroup)
	}
	return out, rm
}

// maxResources returns, for each name, the largest count any container
// (or init container) asks for — limits, else requests.
func maxResources(p *corev1.Pod, names []string) map[corev1.ResourceName]resource.Quantity {
	out := map[corev1.ResourceName]resource.Quantity{}
	all := slices.Concat(p.Spec.Containers, p.Spec.InitContainers)
	for _, n := range names {
		rn := corev1.ResourceName(n)
		for _, c := range all {
			q, ok := c.Resources.Limits[rn]
			if !ok {
				q, ok = c.Resources.Requests[rn]
			}
			if !ok || q.IsZero() {
				continue
			}
			if cur, seen := out[rn]; !seen || q.Cmp(cur) > 0 {
				out[rn] = q.DeepCopy()
			}
		}
	}
	return out
}

// dra returns the pod claims whose device class is a GPU (network) class.
func (inj *Injector) dra(ctx context.Context, p *corev1.Pod) (gpu, net []string, err error) {
	if len(p.Spec.ResourceClaims) == 0 || (len(inj.cfg.GPU.DeviceClasses) == 0 && len(inj.cfg.Network.DeviceClasses) == 0) {
		return nil, nil, nil
	}
	if inj.claims == nil {
		return nil, nil, fmt.Errorf("device classes are configured but there is no claim resolver")
	}
	for _, c := range p.Spec.ResourceClaims {
		classes, err := inj.claims.DeviceClasses(ctx, p.Namespace, c)
		if err != nil {
			return nil, nil, fmt.Errorf("resource claim %q: %w", c.Name, err)
		}
		for _, cl := range classes {
			if slices.Contains(inj.cfg.GPU.DeviceClasses, cl) && !slices.Contains(gpu, c.Name) {
				gpu = append(gpu, c.Name)
			}
			if slices.Contains(inj.cfg.Network.DeviceClasses, cl) && !slices.Contains(net, c.Name) {
				net = append(net, c.Name)
			}
		}
	}
	return gpu, net, nil
}

// container builds one check's init container.
func (inj *Injector) container(spec CheckSpec, p *corev1.Pod, gpus, nets map[corev1.ResourceName]resource.Quantity, gpuClaims, netClaims []string) corev1.Container {
	c := corev1.Container{
		Name:            ContainerPrefix + spec.Name,
		Image:           spec.Image,
		ImagePullPolicy: inj.cfg.ImagePullPolicy,
		Command:         spec.Command,
		Args:            spec.Args,
		SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(bool)},
		// Set what the API server would default, so that the pod read back
		// on reinvocation compares equal.
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	if c.Image == "" {
		c.Image = inj.cfg.Image
	}
	if spec.builtin() {
		if len(c.Command) == 0 {
			c.Command = []string{"faultline-preflight"}
		}
		if len(c.Args) == 0 {
			c.Args = append([]string{"check", spec.Name}, inj.runnerFlags...)
		}
	}
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
	}
	c.Env = []corev1.EnvVar{field("NODE_NAME", "spec.nodeName"), field("POD_NAME", "metadata.name"),
		field("POD_NAMESPACE", "metadata.namespace"), field("POD_UID", "metadata.uid")}
	if !spec.builtin() {
		// The check contract for third-party checks: where to report.
		c.Env = append(c.Env, corev1.EnvVar{Name: "PREFLIGHT_CHECK", Value: spec.Name})
		c.Env = append(c.Env, inj.reportEnv()...)
		c.Env = append(c.Env, corev1.EnvVar{Name: "PREFLIGHT_TIMEOUT", Value: inj.cfg.Runner.Timeout.String()})
	}
	for _, k := range sortedKeys(spec.Env) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
	}
	limits := corev1.ResourceList{}
	for n, q := range gpus {
		limits[n] = q
	}
	claims := slices.Clone(gpuClaims)
	if spec.network() {
		for n, q := range nets {
			limits[n] = q
		}
		for _, cl := range netClaims {
			if !slices.Contains(claims, cl) {
				claims = append(claims, cl)
			}
		}
		c.Env = append(c.Env, inj.ncclEnv(p, &c)...)
	}
	if len(limits) > 0 {
		c.Resources.Limits = limits
		c.Resources.Requests = limits.DeepCopy()
	}
	for _, cl := range claims {
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: cl})
	}
	if inj.cfg.RelaySocket != "" {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeRelay, MountPath: RelayMountPath, ReadOnly: true})
	} else {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeState, MountPath: StateMountPath})
		if inj.cfg.TokenSecret != "" {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeToken, MountPath: TokenMountPath, ReadOnly: true})
		}
	}
	return c
}

// ncclEnv copies the variables of the pod's containers matching the globs
// (first definition wins), and the volume mount behind NCCL_TOPO_FILE;
// without such a mount the file lives in the user's image, not in the
// check's, so NCCL_TOPO_FILE is not copied and the check picks a topology
// by instance type.
func (inj *Injector) ncclEnv(p *corev1.Pod, c *corev1.Container) []corev1.EnvVar {
	var out []corev1.EnvVar
	seen := map[string]bool{"NODE_NAME": true, "POD_NAME": true, "POD_NAMESPACE": true, "POD_UID": true}
	for _, e := range c.Env {
		seen[e.Name] = true
	}
	for _, src := range slices.Concat(p.Spec.Containers, p.Spec.InitContainers) {
		for _, e := range src.Env {
			if seen[e.Name] || !matchAny(inj.cfg.EnvPatterns, e.Name) {
				continue
			}
			if e.Name == "NCCL_TOPO_FILE" {
				m, ok := topoMount(src, e.Value)
				if !ok {
					continue
				}
				if !slices.ContainsFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == m.MountPath }) {
					c.VolumeMounts = append(c.VolumeMounts, m)
				}
			}
			seen[e.Name] = true
			out = append(out, e)
		}
	}
	return out
}

// topoMount finds the container's volume mount that holds file.
func topoMount(c corev1.Container, file string) (corev1.VolumeMount, bool) {
	if file == "" {
		return corev1.VolumeMount{}, false
	}
	best := corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if file == mp || strings.HasPrefix(file, mp+"/") {
			if len(m.MountPath) > len(best.MountPath) {
				best = m
			}
		}
	}
	if best.Name == "" {
		return best, false
	}
	best.ReadOnly = true
	return best, true
}

func matchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// reportEnv tells a third-party check where to report: the agent's relay
// socket as mounted (FAULTLINE_RELAY_SOCKET; no token is mounted then), or,
// legacy, the gateway and the token file.
func (inj *Injector) reportEnv() []corev1.EnvVar {
	r := inj.cfg.Runner
	if r.RelaySocket != "" {
		return []corev1.EnvVar{{Name: "FAULTLINE_RELAY_SOCKET", Value: r.RelaySocket}}
	}
	return []corev1.EnvVar{{Name: "FAULTLINE_GATEWAY_ADDR", Value: r.Gateway.Addr}, {Name: "FAULTLINE_TOKEN_FILE", Value: r.Gateway.TokenFile}}
}

// volumes are the agent's relay socket directory (DirectoryOrCreate: on a
// node the agent never ran on, or before it did, a Directory would keep
// the pod in ContainerCreating; the check waits for the socket, then exits
// on its result, and the agent's relay-owner init takes a directory the
// kubelet made first) or else the node state directory and
// the token Secret, the gang ConfigMap (optional: a pod starts before the
// controller wrote it, and the check waits for it) and the gang check's
// pod-local marker directory.
func (inj *Injector) volumes(needGang bool, g gang.Gang) []corev1.Volume {
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	optional := true
	mode := corev1.SecretVolumeSourceDefaultMode
	var vs []corev1.Volume
	if inj.cfg.RelaySocket != "" {
		vs = append(vs, corev1.Volume{Name: VolumeRelay, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path.Dir(inj.cfg.RelaySocket), Type: &dirOrCreate}}})
	} else {
		vs = append(vs, corev1.Volume{Name: VolumeState, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: inj.cfg.StateHostPath, Type: &dirOrCreate}}})
		if inj.cfg.TokenSecret != "" {
			vs = append(vs, corev1.Volume{Name: VolumeToken, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: inj.cfg.TokenSecret, Optional: &optional, DefaultMode: &mode}}})
		}
	}
	if needGang {
		vs = append(vs, corev1.Volume{Name: VolumeGang, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: g.ConfigMapName()}, Optional: &optional, DefaultMode: &mode}}},
			corev1.Volume{Name: VolumeGangMarker, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return vs
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// op is one JSON patch operation.
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// diff returns the JSON patch turning orig into want, where base is orig
// stripped (rm says of what) and want is base with the checks' init
// containers prepended, their volumes and supplemental group appended
// and labels and annotations set. The patch applies to the pod's JSON as
// the API server sent it, which holds fields this build's API types do
// not know: it removes and adds single list elements and map keys, never
// a whole list or map the pod had, so those fields of the pod's own init
// containers, volumes, security context, labels and annotations stay.
func diff(orig, base, want *corev1.Pod, rm removal) ([]byte, bool, error) {
	var ops []op
	if !equality.Semantic.DeepEqual(orig.Spec.InitContainers, want.Spec.InitContainers) {
		ops = append(ops, removeAt("/spec/initContainers", rm.inits)...)
		head := want.Spec.InitContainers[:len(want.Spec.InitContainers)-len(base.Spec.InitContainers)]
		if len(base.Spec.InitContainers) == 0 && len(head) > 0 {
			ops = append(ops, op{Op: "add", Path: "/spec/initContainers", Value: head})
		} else {
			for i, c := range head {
				ops = append(ops, op{Op: "add", Path: "/spec/initContainers/" + strconv.Itoa(i), Value: c})
			}
		}
	}
	if !equality.Semantic.DeepEqual(orig.Spec.Volumes, want.Spec.Volumes) {
		ops = append(ops, removeAt("/spec/volumes", rm.volumes)...)
		ops = append(ops, appendTo("/spec/volumes", len(base.Spec.Volumes), want.Spec.Volumes[len(base.Spec.Volumes):])...)
	}
	if groups := func(p *corev1.Pod) []int64 {
		if p.Spec.SecurityContext == nil {
			return nil
		}
		return p.Spec.SecurityContext.SupplementalGroups
	}; !equality.Semantic.DeepEqual(groups(orig), groups(want)) {
		ops = append(ops, removeAt("/spec/securityContext/supplementalGroups", rm.groups)...)
		tail := groups(want)[len(groups(base)):]
		if orig.Spec.SecurityContext == nil && len(tail) > 0 {
			ops = append(ops, op{Op: "add", Path: "/spec/securityContext", Value: corev1.PodSecurityContext{SupplementalGroups: tail}})
		} else {
			ops = append(ops, appendTo("/spec/securityContext/supplementalGroups", len(groups(base)), tail)...)
		}
	}
	ops = append(ops, mapOps("/metadata/labels", orig.Labels, want.Labels)...)
	ops = append(ops, mapOps("/metadata/annotations", orig.Annotations, want.Annotations)...)
	if len(ops) == 0 {
		return nil, false, nil
	}
	b, err := json.Marshal(ops)
	return b, true, err
}

// removeAt removes the elements at indices (ascending) of the list at
// path, the highest first so that each index still names its element.
func removeAt(path string, indices []int) []op {
	var ops []op
	for _, i := range slices.Backward(indices) {
		ops = append(ops, op{Op: "remove", Path: path + "/" + strconv.Itoa(i)})
	}
	return ops
}

// appendTo appends elems to the list at path, which has n elements then:
// it is created (or an empty one replaced) when n is 0.
func appendTo[T any](path string, n int, elems []T) []op {
	if len(elems) == 0 {
		return nil
	}
	if n == 0 {
		return []op{{Op: "add", Path: path, Value: elems}}
	}
	ops := make([]op, 0, len(elems))
	for _, e := range elems {
		ops = append(ops, op{Op: "add", Path: path + "/-", Value: e})
	}
	return ops
}

// mapOps sets and removes the keys of the map at path that differ between
// orig and want (the whole map when orig has none: it may be absent).
func mapOps(path string, orig, want map[string]string) []op {
	if len(orig) == 0 {
		if len(want) == 0 {
			return nil
		}
		return []op{{Op: "add", Path: path, Value: want}}
	}
	var ops []op
	for _, k := range sortedKeys(orig) {
		if _, ok := want[k]; !ok {
			ops = append(ops, op{Op: "remove", Path: path + "/" + pointerEscape(k)})
		}
	}
	for _, k := range sortedKeys(want) {
		if v, ok := orig[k]; !ok || v != want[k] {
			ops = append(ops, op{Op: "add", Path: path + "/" + pointerEscape(k), Value: want[k]})
		}
	}
	return ops
}

// pointerEscape escapes a key as a JSON pointer's reference token (RFC
// 6901): "~" as "~0", "/" as "~1".
func pointerEscape(k string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
}
