package nic

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/procfs/sysfs"
)

// Port is the per-poll snapshot of one port (§11.1 IBPort, plus the
// RoCE net device and the fatal counters).
type Port struct {
	Device        string `json:"device"`
	Port          uint   `json:"port"`
	State         string `json:"state"`          // raw sysfs value, "4: ACTIVE"
	PhysicalState string `json:"physical_state"` // raw sysfs value, "5: LinkUp"
	LinkLayer     string `json:"link_layer"`     // "InfiniBand" or "Ethernet"
	NetDev        string `json:"net_dev,omitempty"`
	OperState     string `json:"operstate,omitempty"`
	// Counters holds the Appendix A fatal counters that exist for the port.
	Counters map[string]uint64 `json:"counters,omitempty"`
	// ReadError is set when the port could not be read this poll.
	ReadError string `json:"read_error,omitempty"`

	// dir is the port directory with symlinks resolved at discovery, so
	// that each poll's opens do not walk the class symlinks again.
	dir, operPath string
}

// Device is a discovered InfiniBand class device (§11.1 Device, plus
// the facts classification needs).
type Device struct {
	Name       string `json:"name"`
	Vendor     string `json:"vendor"` // "mellanox" or ""
	HCAType    string `json:"hca_type"`
	FWVersion  string `json:"fw_ver"`
	BoardID    string `json:"board_id"`
	Driver     string `json:"driver,omitempty"`
	PCIAddress string `json:"pci_address,omitempty"` // "0000:3b:00.0"
	Card       string `json:"card,omitempty"`        // PCI bus:device, "0000:3b:00"
	NUMANode   int    `json:"numa_node"`
	IsVF       bool   `json:"is_vf"`
	IsPF       bool   `json:"is_pf"` // device/sriov_totalvfs present
	LinkLayer  string `json:"link_layer"`
	NetDev     string `json:"net_dev,omitempty"`
	Ports      []Port `json:"ports"`
	GIDCount   int    `json:"gid_count,omitempty"`

	// link is the target of the device's class/infiniband link when it
	// was discovered ("" if unreadable): another target is another
	// device under the same name (moved).
	link string
}

// Counter names of Appendix A.
const (
	CounterLinkDowned             = "link_downed"
	CounterExcessiveBufferOverrun = "excessive_buffer_overrun_errors"
	CounterLocalLinkIntegrity     = "local_link_integrity_errors"
	CounterRnrNakRetryErr         = "rnr_nak_retry_err"
)

// fatalCounters and the directory each lives in.
var fatalCounters = []struct{ name, dir string }{
	{CounterLinkDowned, "counters"},
	{CounterExcessiveBufferOverrun, "counters"},
	{CounterLocalLinkIntegrity, "counters"},
	{CounterRnrNakRetryErr, "hw_counters"},
}

var mlxNameRe = regexp.MustCompile(`^mlx5_\d+$`)

type sysReader struct {
	root string
	fs   sysfs.FS
	log  *slog.Logger
	buf  []byte
}

func newSysReader(root string, log *slog.Logger) (*sysReader, error) {
	fs, err := sysfs.NewFS(root)
	if err != nil {
		return nil, fmt.Errorf("sysfs root %s: %w", root, err)
	}
	return &sysReader{root: root, fs: fs, log: log, buf: make([]byte, 256)}, nil
}

func (r *sysReader) ibDir(parts ...string) string {
	return filepath.Join(append([]string{r.root, "class", "infiniband"}, parts...)...)
}

// names lists /sys/class/infiniband; a missing directory is no devices.
func (r *sysReader) names() ([]string, error) {
	ents, err := os.ReadDir(r.ibDir())
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list InfiniBand devices: %w", err)
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}

// readSmall reads a small sysfs file with raw syscalls (no *os.File, no
// finalizer) into the reader's buffer and returns the trimmed content.
func (r *sysReader) readSmall(path string) (string, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := syscall.Read(fd, r.buf)
	syscall.Close(fd)
	if err != nil {
		return "", &os.PathError{Op: "read", Path: path, Err: err}
	}
	if n < 0 {
		n = 0
	}
	return string(bytes.TrimSpace(r.buf[:n])), nil
}

// discover reads everything about one device.
func (r *sysReader) discover(name string) (*Device, error) {
	d := &Device{Name: name, NUMANode: -1}
	d.link, _ = os.Readlink(r.ibDir(name))
	ib, err := r.fs.InfiniBandDevice(name)
	if err == nil {
		d.HCAType, d.FWVersion, d.BoardID = ib.HCAType, ib.FirmwareVersion, ib.BoardID
		nums := make([]uint, 0, len(ib.Ports))
		for n := range ib.Ports {
			nums = append(nums, n)
		}
		sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
		for _, n := range nums {
			p := ib.Ports[n]
			d.Ports = append(d.Ports, Port{Device: name, Port: n, LinkLayer: p.LinkLayer,
				State:         fmt.Sprintf("%d: %s", p.StateID, p.State),
				PhysicalState: fmt.Sprintf("%d: %s", p.PhysStateID, p.PhysState)})
		}
	} else {
		// procfs needs every file it knows (rate, fw_ver ...); fall back to
		// the few files §5 needs.
		r.log.Debug("procfs could not parse device, reading the files it needs", "device", name, "err", err)
		d.HCAType, _ = r.readSmall(r.ibDir(name, "hca_type"))
		d.FWVersion, _ = r.readSmall(r.ibDir(name, "fw_ver"))
		d.BoardID, _ = r.readSmall(r.ibDir(name, "board_id"))
		ents, perr := os.ReadDir(r.ibDir(name, "ports"))
		if perr != nil {
			return nil, fmt.Errorf("device %s: %w", name, perr)
		}
		for _, e := range ents {
			n, err := strconv.ParseUint(e.Name(), 10, 32)
			if err != nil {
				continue
			}
			ll, _ := r.readSmall(r.ibDir(name, "ports", e.Name(), "link_layer"))
			d.Ports = append(d.Ports, Port{Device: name, Port: uint(n), LinkLayer: ll})
		}
		sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Port < d.Ports[j].Port })
		for i := range d.Ports {
			r.readState(&d.Ports[i])
		}
	}
	if len(d.Ports) == 0 {
		// Caught between its class link and its ports (the IB core adds
		// ports/ after the device): read it again next poll rather than
		// cache it portless until the agent restarts.
		return nil, fmt.Errorf("device %s: no ports yet", name)
	}
	for _, p := range d.Ports {
		if d.LinkLayer == "" || p.LinkLayer == "InfiniBand" {
			d.LinkLayer = p.LinkLayer
		}
	}

	dev := r.ibDir(name, "device")
	if v, err := r.readSmall(filepath.Join(dev, "numa_node")); err == nil {
		if n, err := strconv.Atoi(v); err == nil {
			d.NUMANode = n
		}
	}
	d.PCIAddress = pciSlot(filepath.Join(dev, "uevent"))
	if d.PCIAddress == "" {
		if target, err := filepath.EvalSymlinks(dev); err == nil {
			d.PCIAddress = filepath.Base(target)
		}
	}
	d.Card = cardOf(d.PCIAddress)
	if _, err := os.Lstat(filepath.Join(dev, "physfn")); err == nil {
		d.IsVF = true
	}
	if _, err := os.Stat(filepath.Join(dev, "sriov_totalvfs")); err == nil {
		d.IsPF = true
	}
	if target, err := os.Readlink(filepath.Join(dev, "driver")); err == nil {
		d.Driver = filepath.Base(target)
	}
	if mlxNameRe.MatchString(name) || d.Driver == "mlx5_core" {
		d.Vendor = "mellanox"
	}

	// Net devices (RoCE): device/net/<iface>, matched to ports by dev_port.
	if ents, err := os.ReadDir(filepath.Join(dev, "net")); err == nil {
		byPort := map[uint]string{}
		for _, e := range ents {
			iface := e.Name()
			if d.NetDev == "" {
				d.NetDev = iface
			}
			dp := uint(0)
			if v, err := r.readSmall(filepath.Join(dev, "net", iface, "dev_port")); err == nil {
				if n, err := strconv.ParseUint(v, 0, 32); err == nil {
					dp = uint(n)
				}
			}
			if _, ok := byPort[dp+1]; !ok {
				byPort[dp+1] = iface
			}
		}
		for i := range d.Ports {
			d.Ports[i].NetDev = byPort[d.Ports[i].Port]
			if d.Ports[i].NetDev == "" && len(d.Ports) == 1 {
				d.Ports[i].NetDev = d.NetDev
			}
		}
	}
	for _, p := range d.Ports {
		if ents, err := os.ReadDir(r.ibDir(name, "ports", strconv.FormatUint(uint64(p.Port), 10), "gids")); err == nil {
			d.GIDCount += len(ents)
		}
	}
	return d, nil
}

// moved reports whether a discovered device's class link no longer points
// where it did: after a driver restart the name may be another PCI
// function's, and its cached port paths are gone.
func (r *sysReader) moved(d *Device) bool {
	if d.link == "" {
		return false
	}
	link, err := os.Readlink(r.ibDir(d.Name))
	return err != nil || link != d.link
}

// portDir resolves a port's directory once.
func (r *sysReader) portDir(p *Port) string {
	if p.dir == "" {
		d := r.ibDir(p.Device, "ports", strconv.FormatUint(uint64(p.Port), 10))
		if real, err := filepath.EvalSymlinks(d); err == nil {
			d = real
		}
		p.dir = d
		if p.NetDev != "" {
			op := filepath.Join(r.root, "class", "net", p.NetDev, "operstate")
			if real, err := filepath.EvalSymlinks(op); err == nil {
				op = real
			}
			p.operPath = op
		}
	}
	return p.dir
}

// readState refreshes state, phys_state and operstate of a port (the hot
// path of every poll).
func (r *sysReader) readState(p *Port) {
	pd := r.portDir(p)
	p.ReadError = ""
	var err error
	if p.State, err = r.readSmall(pd + "/state"); err != nil {
		p.ReadError = err.Error()
	}
	if p.PhysicalState, err = r.readSmall(pd + "/phys_state"); err != nil && p.ReadError == "" {
		p.ReadError = err.Error()
	}
	// An empty or truncated value (a read racing a reset) says nothing
	// about the port: unreadable, not unhealthy.
	for _, f := range []struct{ name, v string }{{"state", p.State}, {"phys_state", p.PhysicalState}} {
		if id, _ := stateName(f.v); id < 0 && p.ReadError == "" {
			p.ReadError = fmt.Sprintf("%s/%s: %q is not \"<id>: <name>\"", pd, f.name, f.v)
		}
	}
	if p.operPath != "" {
		p.OperState, _ = r.readSmall(p.operPath)
	}
}

// readCounters refreshes the Appendix A counters of a port.
func (r *sysReader) readCounters(p *Port) {
	pd := r.portDir(p)
	if p.Counters == nil {
		p.Counters = make(map[string]uint64, len(fatalCounters))
	}
	for _, c := range fatalCounters {
		v, err := r.readSmall(pd + "/" + c.dir + "/" + c.name)
		if err != nil {
			delete(p.Counters, c.name)
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			delete(p.Counters, c.name)
			continue
		}
		p.Counters[c.name] = n
	}
}

// masterOf returns the upper device (a bond) that a net device of the PCI
// function pci is enslaved to (its net/<iface>/master link), "" when none
// is, or when the function is not on the bus.
func (r *sysReader) masterOf(pci string) string {
	dir := filepath.Join(r.root, "bus", "pci", "devices", pci, "net")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(dir, e.Name(), "master")); err == nil {
			return filepath.Base(target)
		}
	}
	return ""
}

func pciSlot(uevent string) string {
	f, err := os.Open(uevent)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PCI_SLOT_NAME="); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// cardOf returns the PCI bus:device of an address ("0000:47:00.1" →
// "0000:47:00"): the functions of one physical card.
func cardOf(pci string) string {
	if i := strings.LastIndexByte(pci, '.'); i > 0 {
		return pci[:i]
	}
	return pci
}

// defaultRouteDevices returns the interface carrying the host's default
// route (lowest metric in /proc/net/route) and the IB devices behind it
// (§4.2): its own (/sys/class/net/<iface>/device/infiniband), or, for
// a bond, VLAN or other stacked interface, those of the interfaces below
// it — sysfs links every upper device to its lower ones as lower_<name> —
// so a bonded or VLAN-tagged management network on ConnectX ports is
// Management too. No readable route, or no IB device below: none.
func defaultRouteDevices(procNetRoute, sysRoot string) (iface string, devs []string) {
	b, err := os.ReadFile(procNetRoute)
	if err != nil {
		return "", nil
	}
	best := -1
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 8 {
			continue
		}
		if f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		metric, _ := strconv.Atoi(f[6])
		if best < 0 || metric < best {
			best, iface = metric, f[0]
		}
	}
	if iface == "" {
		return "", nil
	}
	return iface, ibDevicesBelow(sysRoot, iface, 0)
}

// maxStack bounds how deep ibDevicesBelow follows lower_ links (a VLAN on
// a bond on ports is 2), which also ends any cycle.
const maxStack = 4

// ibDevicesBelow returns the IB devices of iface, or else of the
// interfaces below it, sorted.
func ibDevicesBelow(sysRoot, iface string, depth int) []string {
	dir := filepath.Join(sysRoot, "class", "net", iface)
	var out []string
	if ents, err := os.ReadDir(filepath.Join(dir, "device", "infiniband")); err == nil && len(ents) > 0 {
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if depth >= maxStack {
		return nil
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if lower, ok := strings.CutPrefix(e.Name(), "lower_"); ok {
			for _, d := range ibDevicesBelow(sysRoot, lower, depth+1) {
				if !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
