// Package nictest builds synthetic sysfs trees of InfiniBand/RoCE devices,
// laid out as the kernel does (class symlinks into /sys/devices, PCI
// function directories with numa_node, uevent, driver, physfn or
// sriov_totalvfs, net devices), for the NIC check's tests, benchmark and
// the agent's CPU/RSS measurement.
package nictest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Port states as the kernel writes them.
const (
	Down     = "1: DOWN"
	Init     = "2: INIT"
	Armed    = "3: ARMED"
	Active   = "4: ACTIVE"
	Polling  = "2: Polling"
	Disabled = "3: Disabled"
	LinkUp   = "5: LinkUp"
	LinkErr  = "6: LinkErrorRecovery"
)

// Link layers.
const (
	IB  = "InfiniBand"
	Eth = "Ethernet"
)

// Port describes one port of a device.
type Port struct {
	State     string // default Active
	PhysState string // default LinkUp
	LinkLayer string // default IB
	// NetDev names the port's net device (RoCE); its operstate is
	// OperState (default "up" when the port is ACTIVE, else "down").
	NetDev    string
	OperState string
}

// Device describes one InfiniBand class device.
type Device struct {
	Name   string
	PCI    string // "0000:3b:00.0"
	NUMA   int
	HCA    string // default MT4129
	FW     string // default 28.39.1002
	Board  string // default MT_0000000838
	Driver string // default mlx5_core; "-" for no driver link
	// PF of a VF ("0000:3b:00.0"): writes device/physfn.
	PhysFn string
	// TotalVFs > 0 writes device/sriov_totalvfs (the PF indicator).
	TotalVFs int
	Ports    []Port
}

// Tree is a synthetic sysfs rooted at Root (what --sysfs points at).
type Tree struct {
	Root string
	// FullCounters writes every counter a ConnectX exposes (about 50 files
	// per port) instead of only the fatal counters of the link-state
	// design's Appendix A: realistic for the benchmark and the
	// measurement, slow for tests.
	FullCounters bool
}

// New creates an empty tree under dir.
func New(dir string) (*Tree, error) {
	t := &Tree{Root: dir}
	for _, d := range []string{"class/infiniband", "class/net", "devices/pci0000:00", "devices/virtual/net", "bus/pci/devices", "bus/pci/drivers/mlx5_core"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *Tree) pciDir(pci string) string { return filepath.Join(t.Root, "devices/pci0000:00", pci) }

// PortDir is the directory of a port under class/infiniband.
func (t *Tree) PortDir(dev string, port int) string {
	return filepath.Join(t.Root, "class/infiniband", dev, "ports", strconv.Itoa(port))
}

func write(path, v string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(v+"\n"), 0o644)
}

// CounterNames are the port counters a ConnectX exposes under counters/.
var CounterNames = []string{"excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
	"local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
	"port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
	"port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_constraint_errors",
	"port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
	"unicast_rcv_packets", "unicast_xmit_packets", "VL15_dropped"}

// HwCounterNames are the mlx5 counters under hw_counters/.
var HwCounterNames = []string{"duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
	"np_cnp_sent", "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err",
	"req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request",
	"resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors",
	"rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
	"roce_slow_restart_cnps", "roce_slow_restart_trans", "rp_cnp_handled", "rp_cnp_ignored",
	"rx_atomic_requests", "rx_dct_connect", "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests"}

// Add writes a device.
func (t *Tree) Add(d Device) error {
	if d.HCA == "" {
		d.HCA = "MT4129"
	}
	if d.FW == "" {
		d.FW = "28.39.1002"
	}
	if d.Board == "" {
		d.Board = "MT_0000000838"
	}
	if d.Driver == "" {
		d.Driver = "mlx5_core"
	}
	pdir := t.pciDir(d.PCI)
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return err
	}
	if bus := filepath.Join(t.Root, "bus/pci/devices", d.PCI); !exists(bus) {
		if err := os.Symlink("../../../devices/pci0000:00/"+d.PCI, bus); err != nil {
			return err
		}
	}
	files := map[string]string{
		"uevent":    "DRIVER=" + d.Driver + "\nPCI_CLASS=20000\nPCI_ID=15B3:1021\nPCI_SLOT_NAME=" + d.PCI + "\nMODALIAS=pci:v000015B3d00001021",
		"numa_node": strconv.Itoa(d.NUMA),
		"vendor":    "0x15b3",
	}
	if d.TotalVFs > 0 {
		files["sriov_totalvfs"] = strconv.Itoa(d.TotalVFs)
	}
	for f, v := range files {
		if err := write(filepath.Join(pdir, f), v); err != nil {
			return err
		}
	}
	if d.Driver != "-" && !exists(filepath.Join(pdir, "driver")) {
		if err := os.MkdirAll(filepath.Join(t.Root, "bus/pci/drivers", d.Driver), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("../../../bus/pci/drivers/"+d.Driver, filepath.Join(pdir, "driver")); err != nil {
			return err
		}
	}
	if d.PhysFn != "" {
		if err := os.Symlink("../"+d.PhysFn, filepath.Join(pdir, "physfn")); err != nil {
			return err
		}
	}
	ib := filepath.Join(pdir, "infiniband", d.Name)
	for f, v := range map[string]string{"hca_type": d.HCA, "fw_ver": d.FW, "board_id": d.Board,
		"node_guid": "b83f:d203:00c3:65c4", "node_type": "1: CA"} {
		if err := write(filepath.Join(ib, f), v); err != nil {
			return err
		}
	}
	if err := os.Symlink("../../../"+d.PCI, filepath.Join(ib, "device")); err != nil {
		return err
	}
	if err := os.Symlink("../../devices/pci0000:00/"+d.PCI+"/infiniband/"+d.Name, filepath.Join(t.Root, "class/infiniband", d.Name)); err != nil {
		return err
	}
	for i, p := range d.Ports {
		n := i + 1
		if p.State == "" {
			p.State = Active
		}
		if p.PhysState == "" {
			p.PhysState = LinkUp
		}
		if p.LinkLayer == "" {
			p.LinkLayer = IB
		}
		pd := filepath.Join(ib, "ports", strconv.Itoa(n))
		for f, v := range map[string]string{"state": p.State, "phys_state": p.PhysState, "link_layer": p.LinkLayer,
			"rate": "400 Gb/sec (4X NDR)", "lid": "0x1", "sm_lid": "0x1", "cap_mask": "0xa751e848"} {
			if err := write(filepath.Join(pd, f), v); err != nil {
				return err
			}
		}
		counters, hw := CounterNames, HwCounterNames
		if !t.FullCounters {
			counters = []string{"excessive_buffer_overrun_errors", "link_downed", "local_link_integrity_errors", "symbol_error"}
			hw = []string{"rnr_nak_retry_err"}
		}
		for _, c := range counters {
			if err := write(filepath.Join(pd, "counters", c), "0"); err != nil {
				return err
			}
		}
		for _, c := range hw {
			if err := write(filepath.Join(pd, "hw_counters", c), "0"); err != nil {
				return err
			}
		}
		if p.LinkLayer == Eth {
			if err := write(filepath.Join(pd, "gids/0"), "fe80:0000:0000:0000:ba3f:d2ff:fec3:65c4"); err != nil {
				return err
			}
		}
		if p.NetDev != "" && !exists(filepath.Join(pdir, "net", p.NetDev)) {
			if p.OperState == "" {
				p.OperState = "down"
				if p.State == Active {
					p.OperState = "up"
				}
			}
			nd := filepath.Join(pdir, "net", p.NetDev)
			if err := write(filepath.Join(nd, "operstate"), p.OperState); err != nil {
				return err
			}
			if err := write(filepath.Join(nd, "dev_port"), strconv.Itoa(i)); err != nil {
				return err
			}
			if err := os.Symlink("../../../"+d.PCI, filepath.Join(nd, "device")); err != nil {
				return err
			}
			if err := os.Symlink("../../devices/pci0000:00/"+d.PCI+"/net/"+p.NetDev, filepath.Join(t.Root, "class/net", p.NetDev)); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetPort rewrites a port's state and phys_state ("" leaves one as is).
func (t *Tree) SetPort(dev string, port int, state, phys string) error {
	if state != "" {
		if err := write(filepath.Join(t.PortDir(dev, port), "state"), state); err != nil {
			return err
		}
	}
	if phys != "" {
		return write(filepath.Join(t.PortDir(dev, port), "phys_state"), phys)
	}
	return nil
}

// SetOperState rewrites a net device's operstate.
func (t *Tree) SetOperState(netdev, v string) error {
	return write(filepath.Join(t.Root, "class/net", netdev, "operstate"), v)
}

// SetCounter writes a counter; names from HwCounterNames go to hw_counters/.
func (t *Tree) SetCounter(dev string, port int, name string, v uint64) error {
	dir := "counters"
	for _, h := range HwCounterNames {
		if h == name {
			dir = "hw_counters"
		}
	}
	return write(filepath.Join(t.PortDir(dev, port), dir, name), strconv.FormatUint(v, 10))
}

// Remove takes a device off the bus: its class link, its net devices and
// its PCI function directory disappear.
func (t *Tree) Remove(dev string) error {
	link := filepath.Join(t.Root, "class/infiniband", dev)
	pci, err := filepath.EvalSymlinks(filepath.Join(link, "device"))
	if err != nil {
		return err
	}
	if err := os.Remove(link); err != nil {
		return err
	}
	if ents, err := os.ReadDir(filepath.Join(pci, "net")); err == nil {
		for _, e := range ents {
			os.Remove(filepath.Join(t.Root, "class/net", e.Name()))
		}
	}
	if err := os.Remove(filepath.Join(t.Root, "bus/pci/devices", filepath.Base(pci))); err != nil {
		return err
	}
	return os.RemoveAll(pci)
}

// Enslave makes master (a bond) the upper device of the net devices of
// the PCI functions pcis, as `ip link set <dev> master <master>` does:
// each gets a master link.
func (t *Tree) Enslave(master string, pcis ...string) error {
	if err := write(filepath.Join(t.Root, "devices/virtual/net", master, "operstate"), "up"); err != nil {
		return err
	}
	if link := filepath.Join(t.Root, "class/net", master); !exists(link) {
		if err := os.Symlink("../../devices/virtual/net/"+master, link); err != nil {
			return err
		}
	}
	for _, pci := range pcis {
		ents, err := os.ReadDir(filepath.Join(t.pciDir(pci), "net"))
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := os.Symlink("../../../../virtual/net/"+master, filepath.Join(t.pciDir(pci), "net", e.Name(), "master")); err != nil {
				return err
			}
		}
	}
	return nil
}

// Bond does what mlx5's RoCE LAG does once both PFs of a dual-port card
// are enslaved to one bond (Enslave): their RDMA devices go and one, name
// (the kernel's mlx5_bond_N), is registered on the first PF's function
// with its ports; the PCI functions and their net devices stay.
func (t *Tree) Bond(master, name string, pfs ...Device) error {
	pcis := make([]string, len(pfs))
	for i, d := range pfs {
		pcis[i] = d.PCI
	}
	if err := t.Enslave(master, pcis...); err != nil {
		return err
	}
	for _, d := range pfs {
		if err := os.Remove(filepath.Join(t.Root, "class/infiniband", d.Name)); err != nil {
			return err
		}
		if err := os.RemoveAll(filepath.Join(t.pciDir(d.PCI), "infiniband", d.Name)); err != nil {
			return err
		}
	}
	b := pfs[0]
	b.Name = name
	return t.Add(b)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// WriteRoute writes a /proc/net/route file at path whose default route
// goes out of iface ("" for none) and returns path.
func WriteRoute(path, iface string) (string, error) {
	var b strings.Builder
	b.WriteString("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n")
	if iface != "" {
		fmt.Fprintf(&b, "%s\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n", iface)
		fmt.Fprintf(&b, "%s\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", iface)
	}
	b.WriteString("docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}
