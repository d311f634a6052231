package nic

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/faultline/faultline/agents/nic/nictest"
)

// TestDefaultRouteDevices: the IB devices behind the default-route
// interface, through bonds and VLANs (lower_<name> links).
func TestDefaultRouteDevices(t *testing.T) {
	root := t.TempDir()
	mk := func(parts ...string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(append([]string{root, "class", "net"}, parts...)...), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk("eth0", "device", "infiniband", "mlx5_0") // a port with its IB device
	mk("eth1", "device", "infiniband", "mlx5_1")
	mk("eth2", "device", "infiniband", "mlx5_2")
	mk("bond0", "lower_eth0") // bond over two ports
	mk("bond0", "lower_eth1")
	mk("bond0.100", "lower_bond0") // VLAN on the bond
	mk("ens3", "device")           // a NIC without IB backing
	mk("loopA", "lower_loopB")     // a cycle ends
	mk("loopB", "lower_loopA")
	for _, tc := range []struct {
		iface string
		want  []string
	}{
		{"eth2", []string{"mlx5_2"}},
		{"bond0", []string{"mlx5_0", "mlx5_1"}},
		{"bond0.100", []string{"mlx5_0", "mlx5_1"}},
		{"ens3", nil},
		{"loopA", nil},
		{"missing0", nil},
	} {
		route, err := nictest.WriteRoute(filepath.Join(t.TempDir(), "route"), tc.iface)
		if err != nil {
			t.Fatal(err)
		}
		iface, devs := defaultRouteDevices(route, root)
		if iface != tc.iface || !slices.Equal(devs, tc.want) {
			t.Errorf("default route via %s: got %s %v, want %v", tc.iface, iface, devs, tc.want)
		}
	}
	if iface, devs := defaultRouteDevices(filepath.Join(root, "no-route"), root); iface != "" || devs != nil {
		t.Errorf("no route file: %s %v", iface, devs)
	}
}
