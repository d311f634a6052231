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
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is the kubelet's pod-resources socket.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// GPUPrefix is the resource-name prefix of NVIDIA's device plugin
// (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...).
const GPUPrefix = "nvidia.com/"

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
	// Devices maps a device id (a GPU UUID with the device plugin's
	// default deviceIDStrategy=uuid) to the pods holding it, as
	// "namespace/name", sorted.
	Devices map[string][]string
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
	out := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		pod := p.GetNamespace() + "/" + p.GetName()
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if !strings.HasPrefix(d.GetResourceName(), GPUPrefix) {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					if !slices.Contains(out[id], pod) {
						out[id] = append(out[id], pod)
					}
				}
			}
		}
	}
	for _, pods := range out {
		slices.Sort(pods)
	}
	return Allocations{At: at, Devices: out}
}

// ByUUID reports whether the device plugin names whole GPUs by UUID
// ("GPU-…"), the only naming an event's GPU entity can be matched with.
// With deviceIDStrategy=index the ids are "0", "1", …; MIG slices are
// "MIG-…" ids whose parent GPU the kubelet does not say: in both cases
// nothing can be said about which pods hold an event's GPU.
func (a Allocations) ByUUID() bool {
	for id := range a.Devices {
		if !strings.HasPrefix(id, "GPU-") {
			return false
		}
	}
	return true // also when nothing is allocated: no pod holds any GPU
}

// Pods returns the pods holding any of the GPUs, sorted, and whether that
// is known (the device plugin names devices by UUID).
func (a Allocations) Pods(gpus []string) ([]string, bool) {
	if !a.ByUUID() {
		return nil, false
	}
	var out []string
	for _, g := range gpus {
		for _, p := range a.Devices[g] {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out, true
}
