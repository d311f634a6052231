// Package podrestest serves the kubelet's pod-resources List on a unix
// socket for tests of what reads it (a stand-in kubelet: the real one needs
// a node with GPUs and a device plugin).
package podrestest

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Kubelet answers List with its pods; Set changes them.
type Kubelet struct {
	podresv1.UnimplementedPodResourcesListerServer
	// Socket is the unix socket it listens on.
	Socket string

	mu    sync.Mutex
	pods  []*podresv1.PodResources
	calls int
}

// Start serves on a socket in the test's temporary directory until the
// test ends.
func Start(tb testing.TB, pods ...*podresv1.PodResources) *Kubelet {
	tb.Helper()
	k := &Kubelet{Socket: filepath.Join(tb.TempDir(), "kubelet.sock"), pods: pods}
	ln, err := net.Listen("unix", k.Socket)
	if err != nil {
		tb.Fatalf("podrestest: %v", err)
	}
	srv := grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(srv, k)
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(srv.Stop)
	return k
}

// Pod is a pod whose one container holds devices of one resource.
func Pod(namespace, name, resource string, deviceIDs ...string) *podresv1.PodResources {
	return &podresv1.PodResources{Namespace: namespace, Name: name, Containers: []*podresv1.ContainerResources{{
		Name: "main", Devices: []*podresv1.ContainerDevices{{ResourceName: resource, DeviceIds: deviceIDs}},
	}}}
}

// Set replaces the pods.
func (k *Kubelet) Set(pods ...*podresv1.PodResources) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = pods
}

// Calls is how many List calls were answered.
func (k *Kubelet) Calls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls
}

// List implements the kubelet's List.
func (k *Kubelet) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	return &podresv1.ListPodResourcesResponse{PodResources: k.pods}, nil
}
