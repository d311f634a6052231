// Package podres tells which pods hold which GPUs on this node, from the
// kubelet's pod-resources API (the gRPC service on
// /var/lib/kubelet/pod-resources/kubelet.sock, k8s.io/kubelet
// podresources/v1). The agent attaches the pods of an event's GPUs to the
// event (metadata events.MetaGPUPods), so the drain of a GPU reset evicts
// exactly the pods on that GPU — the pod spec never says which GPU the
// device plugin gave a pod — and the history says which workloads a fault
// hit.
package podres

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/faultline/faultline/schemas/events"
)

// DefaultSocket is the kubelet's pod-resources socket.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// GPUPrefix is the resource-name prefix of NVIDIA's device plugin
// (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...).
const GPUPrefix = "nvidia.com/"

// DRADriver is the driver name of NVIDIA's DRA driver for GPUs (the GPUs
// of a ResourceClaim, in a container's dynamic resources).
const DRADriver = "gpu.nvidia.com"

// Lister lists the node's GPU allocations, at most once per TTL.
type Lister struct {
	conn    *grpc.ClientConn
	client  podresv1.PodResourcesListerClient
	ttl     time.Duration
	timeout time.Duration

	mu    sync.Mutex
	alloc Allocations
	err   error
}

// Allocations is one listing of the node's GPU allocations.
type Allocations struct {
	// At is when the kubelet was asked.
	At time.Time
	// Devices maps a GPU's UUID (events.CanonicalGPUUUID: lower-case hex)
	// to the pods holding it (the whole GPU or a time-sliced or MPS share
	// of it), as "namespace/name", sorted.
	Devices map[string][]string
	// Unnamed: some pod holds a GPU by a name that is not its UUID (see
	// gpuDevice), so which pods hold a given GPU is not known.
	Unnamed bool
}

// New connects to the kubelet's socket (lazily: a kubelet that is not up
// yet fails the first List, not New).
func New(socket string, ttl time.Duration) (*Lister, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod resources %s: %w", socket, err)
	}
	return &Lister{conn: conn, client: podresv1.NewPodResourcesListerClient(conn), ttl: ttl, timeout: 2 * time.Second}, nil
}

// Close closes the connection.
func (l *Lister) Close() error { return l.conn.Close() }

// Allocations returns the GPU allocations, from a List at most TTL old.
func (l *Lister) Allocations(ctx context.Context, now time.Time) (Allocations, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.alloc.At.IsZero() && now.Sub(l.alloc.At) < l.ttl {
		return l.alloc, l.err
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	resp, err := l.client.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		l.alloc, l.err = Allocations{At: now}, fmt.Errorf("kubelet pod resources: %w", err)
		return Allocations{}, l.err
	}
	l.alloc, l.err = FromList(resp, now), nil
	return l.alloc, nil
}

// FromList builds the allocations of a List answer given at.
func FromList(resp *podresv1.ListPodResourcesResponse, at time.Time) Allocations {
	a := Allocations{At: at, Devices: map[string][]string{}}
	for _, p := range resp.GetPodResources() {
		pod := p.GetNamespace() + "/" + p.GetName()
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					uuid, gpu := gpuDevice(d.GetResourceName(), id)
					switch {
					case !gpu:
					case uuid == "":
						a.Unnamed = true
					default:
						uuid = events.CanonicalGPUUUID(uuid)
						if !slices.Contains(a.Devices[uuid], pod) {
							a.Devices[uuid] = append(a.Devices[uuid], pod)
						}
					}
				}
			}
			for _, r := range c.GetDynamicResources() {
				for _, cr := range r.GetClaimResources() {
					if cr.GetDriverName() == DRADriver {
						a.Unnamed = true // "gpu-0": a name the driver gives, not the UUID
					}
				}
			}
		}
	}
	for _, pods := range a.Devices {
		slices.Sort(pods)
	}
	return a
}

// gpuDevice tells whether a device of a device plugin's resource is a GPU,
// and its UUID where its id names it. NVIDIA's device plugin names a whole
// GPU by its UUID ("GPU-…", its default deviceIDStrategy=uuid) and each
// replica of a time-sliced or MPS-shared GPU by the UUID and the replica
// ("GPU-…::0", "GPU-…::1": its AnnotatedID); a MIG slice "MIG-…" (whose
// parent GPU the kubelet does not say) and, with deviceIDStrategy=index,
// every GPU ("0", "1") have no UUID. Its resources are nvidia.com/gpu,
// nvidia.com/gpu.shared (a share renamed), nvidia.com/mig-<profile>[.shared]
// and, for a GPU passed through to a VM, nvidia.com/pgpu. Other
// nvidia.com/ resources are GPUs where their ids say so; those whose ids
// are PCI addresses are the network operator's NICs (SR-IOV VFs, host
// devices: nvidia.com/hostdev), not GPUs; any other id of an nvidia.com/
// resource is taken for a GPU without its UUID (a GPU resource renamed,
// with index ids), so that no pod on it is taken for none.
func gpuDevice(resource, id string) (uuid string, gpu bool) {
	name, ok := strings.CutPrefix(resource, GPUPrefix)
	if !ok {
		return "", false
	}
	if strings.HasPrefix(id, "GPU-") {
		uuid, _, _ = strings.Cut(id, "::")
		return uuid, true
	}
	if name == "gpu" || name == "pgpu" || strings.HasPrefix(name, "gpu.") || strings.HasPrefix(name, "mig-") || strings.HasPrefix(id, "MIG-") {
		return "", true
	}
	return "", !pciAddress.MatchString(id)
}

// pciAddress is a PCI address as a device plugin names a device by it
// (domain:bus:device.function, lspci -D).
var pciAddress = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)

// ByUUID reports whether every GPU a pod holds is named by its UUID, the
// only naming an event's GPU entity can be matched with (gpuDevice): where
// one is not, nothing can be said about which pods hold an event's GPU.
func (a Allocations) ByUUID() bool {
	return !a.Unnamed // also when nothing is allocated: no pod holds any GPU
}

// Pods returns the pods holding any of the GPUs, sorted, and whether that
// is known (the device plugin names devices by UUID). UUIDs compare
// whatever the case of their hex digits: before, a GPUReset naming
// "GPU-ABCDEF…" found no pod on the device plugin's "GPU-abcdef…", and
// the GPU was reset under them.
func (a Allocations) Pods(gpus []string) ([]string, bool) {
	if !a.ByUUID() {
		return nil, false
	}
	var out []string
	for _, g := range gpus {
		for _, p := range a.Devices[events.CanonicalGPUUUID(g)] {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out, true
}
