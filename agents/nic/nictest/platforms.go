package nictest

import (
	"fmt"

	"github.com/faultline/faultline/agents/topology"
)

// Platform is a node of one of the field-validation tables of NVSentinel's
// NIC link-state design (docs/designs/047-link-state-detection.md in
// github.com/NVIDIA/NVSentinel; §N below are its sections): its
// devices, its GPU metadata, the interface of its default route, and the
// classification the design expects (device → role).
type Platform struct {
	Name         string
	Devices      []Device
	Metadata     *topology.Metadata
	DefaultRoute string
	Want         map[string]string
}

func gpus(numa ...int) []topology.GPU {
	out := make([]topology.GPU, len(numa))
	for i, n := range numa {
		out[i] = topology.GPU{GPUID: i, NUMANode: n, PCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x10+i*8)}
	}
	return out
}

func row(n int, fill string, at map[int]string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fill
		if v, ok := at[i]; ok {
			out[i] = v
		}
	}
	return out
}

// A100OCI: 4-socket AMD, 8 GPUs on NUMA 1,3,5,7, 18 RoCE PFs: mlx5_0 (NUMA 0)
// and mlx5_13 (NUMA 6) are management, the 16 others PXB to paired GPUs on
// 8 dual-port cards. §4.2.4: 2 management + 16 compute + 0 storage.
func A100OCI() Platform {
	p := Platform{Name: "A100-OCI", Want: map[string]string{},
		Metadata: &topology.Metadata{Version: "1.0", GPUs: gpus(1, 1, 3, 3, 5, 5, 7, 7), NICTopology: map[string][]string{}}}
	compute := 0
	for i := 0; i < 18; i++ {
		name := fmt.Sprintf("mlx5_%d", i)
		d := Device{Name: name, HCA: "MT4123", TotalVFs: 16, Ports: []Port{{LinkLayer: Eth, NetDev: fmt.Sprintf("rdma%d", i)}}}
		if i == 0 || i == 13 {
			d.NUMA = map[int]int{0: 0, 13: 6}[i]
			d.PCI = fmt.Sprintf("0000:%02x:00.0", 0x01+i)
			p.Metadata.NICTopology[name] = row(8, "SYS", nil)
			p.Want[name] = "management"
		} else {
			gpu := compute / 2
			d.NUMA = p.Metadata.GPUs[gpu].NUMANode
			d.PCI = fmt.Sprintf("0000:%02x:00.%d", 0x40+gpu*0x10, compute%2)
			p.Metadata.NICTopology[name] = row(8, "SYS", map[int]string{gpu: "PXB"})
			p.Want[name] = "compute"
			compute++
		}
		p.Devices = append(p.Devices, d)
	}
	return p
}

// H100OCI: 2-socket Intel, 8 GPUs, 18 PFs: mlx5_2 and mlx5_11 NODE to all
// GPUs (storage, single-port cards), 16 others PXB to one paired GPU on 8
// dual-port cards. The design: 0 management + 16 compute + 2 storage.
func H100OCI() Platform {
	p := Platform{Name: "H100-OCI", Want: map[string]string{},
		Metadata: &topology.Metadata{Version: "1.0", GPUs: gpus(0, 0, 0, 0, 1, 1, 1, 1), NICTopology: map[string][]string{}}}
	compute := 0
	for i := 0; i < 18; i++ {
		name := fmt.Sprintf("mlx5_%d", i)
		d := Device{Name: name, HCA: "MT4129", TotalVFs: 16, Ports: []Port{{LinkLayer: Eth, NetDev: fmt.Sprintf("rdma%d", i)}}}
		if i == 2 || i == 11 {
			d.NUMA = map[int]int{2: 0, 11: 1}[i]
			d.PCI = fmt.Sprintf("0000:%02x:00.0", 0x20+i)
			p.Metadata.NICTopology[name] = row(8, "NODE", nil)
			p.Want[name] = "storage"
		} else {
			gpu := compute / 2
			d.NUMA = p.Metadata.GPUs[gpu].NUMANode
			d.PCI = fmt.Sprintf("0000:%02x:00.%d", 0x40+gpu*0x10, compute%2)
			p.Metadata.NICTopology[name] = row(8, "SYS", map[int]string{gpu: "PXB"})
			p.Want[name] = "compute"
			compute++
		}
		p.Devices = append(p.Devices, d)
	}
	return p
}

// L40SOCI: 2-socket Intel, 4 PCIe GPUs, 6 RoCE PFs, NODE to the local GPUs
// and SYS to the others. The design: 0 + 0 + 6 storage.
func L40SOCI() Platform {
	p := Platform{Name: "L40S-OCI", Want: map[string]string{},
		Metadata: &topology.Metadata{Version: "1.0", GPUs: gpus(0, 0, 1, 1), NICTopology: map[string][]string{}}}
	for i := 0; i < 6; i++ {
		name := fmt.Sprintf("mlx5_%d", i)
		numa := i / 3
		p.Devices = append(p.Devices, Device{Name: name, NUMA: numa, PCI: fmt.Sprintf("0000:%02x:00.0", 0x30+i*0x10), HCA: "MT4129",
			Ports: []Port{{LinkLayer: Eth, NetDev: fmt.Sprintf("ens%d", i)}}})
		at := map[int]string{}
		for g := 0; g < 4; g++ {
			if g/2 == numa {
				at[g] = "NODE"
			}
		}
		p.Metadata.NICTopology[name] = row(4, "SYS", at)
		p.Want[name] = "storage"
	}
	return p
}

// OnPremL40S: 8 PCIe GPUs, mlx5_0 Ethernet (eth0, the default route) and
// mlx5_1..4 InfiniBand, all NODE to local GPUs. The design: with the default
// route 1 management + 4 compute; without it mlx5_0 is storage.
func OnPremL40S(withRoute bool) Platform {
	p := Platform{Name: "OnPrem-L40S", Want: map[string]string{},
		Metadata: &topology.Metadata{Version: "1.0", GPUs: gpus(0, 0, 0, 0, 1, 1, 1, 1), NICTopology: map[string][]string{}}}
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("mlx5_%d", i)
		numa := 0
		if i >= 3 {
			numa = 1
		}
		d := Device{Name: name, NUMA: numa, PCI: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x20), HCA: "MT4129", Ports: []Port{{LinkLayer: IB}}}
		p.Want[name] = "compute"
		if i == 0 {
			d.Ports = []Port{{LinkLayer: Eth, NetDev: "eth0"}}
			d.HCA = "MT4125"
			p.Want[name] = "storage"
			if withRoute {
				p.Want[name] = "management"
				p.DefaultRoute = "eth0"
			}
		}
		at := map[int]string{}
		for g := 0; g < 8; g++ {
			if g/4 == numa {
				at[g] = "NODE"
			}
		}
		p.Metadata.NICTopology[name] = row(8, "SYS", at)
		p.Devices = append(p.Devices, d)
	}
	if withRoute {
		p.Name += "-default-route"
	}
	return p
}

// GB200: Grace, 4 GPUs on NVLink-C2C (all SYS), 4 ConnectX-7 IB and 2
// BlueField-3 DPUs (MT41692, Ethernet). The design: 2 management + 4 compute.
func GB200() Platform {
	p := Platform{Name: "GB200-NVL4", Want: map[string]string{},
		Metadata: &topology.Metadata{Version: "1.0", GPUs: gpus(0, 0, 1, 1), NICTopology: map[string][]string{}}}
	names := []string{"ibp3s0", "ibP2p3s0", "ibP16p3s0", "ibP18p3s0", "roceP6p3s0", "roceP22p3s0"}
	doms := []int{0, 2, 16, 18, 6, 22}
	for i, name := range names {
		d := Device{Name: name, NUMA: i % 2, PCI: fmt.Sprintf("%04x:03:00.0", doms[i]), HCA: "MT4129", Ports: []Port{{LinkLayer: IB}}}
		p.Want[name] = "compute"
		if i >= 4 {
			d.HCA = "MT41692"
			d.Ports = []Port{{LinkLayer: Eth, NetDev: fmt.Sprintf("enP%dp3s0f0np0", doms[i])}}
			p.Want[name] = "management"
		}
		p.Metadata.NICTopology[name] = row(4, "SYS", nil)
		p.Devices = append(p.Devices, d)
	}
	return p
}

// System34 is the design's 34-device system (§8.6): the 18 PFs of H100OCI
// (ACTIVE) plus 16 unassigned VFs mlx5_18..mlx5_33 (DOWN, device/physfn).
func System34() Platform {
	p := H100OCI()
	p.Name = "34-device-SR-IOV"
	for i := 0; i < 16; i++ {
		pf := p.Devices[i%18]
		name := fmt.Sprintf("mlx5_%d", 18+i)
		p.Devices = append(p.Devices, Device{Name: name, NUMA: pf.NUMA, PCI: fmt.Sprintf("0000:%02x:01.%d", 0x40+(i/8)*0x10, i%8),
			HCA: "MT4130", PhysFn: pf.PCI, Ports: []Port{{State: Down, PhysState: Disabled, LinkLayer: Eth}}})
		p.Want[name] = "vf"
	}
	return p
}

// Build writes the platform's devices into t.
func (p Platform) Build(t *Tree) error {
	for _, d := range p.Devices {
		if err := t.Add(d); err != nil {
			return fmt.Errorf("%s: %w", d.Name, err)
		}
	}
	return nil
}
