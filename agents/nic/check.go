package nic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Agent is the agent name stamped on NIC events (NVSentinel's name).
const Agent = "nic-health-monitor"

// ComponentClass of NIC events.
const ComponentClass = "NIC"

// NIC is a discovered device with its classification.
type NIC struct {
	Device
	Role      Role   `json:"role"`
	Monitored bool   `json:"monitored"`
	Reason    string `json:"reason"`
}

// Check is the NIC check. It is not safe for concurrent use: the runner
// calls Check from one goroutine.
type Check struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	r       *sysReader
	cls     *classifier
	enabled map[string]bool
	bootID  string

	st    *persisted
	fresh bool // no usable persisted state: the next poll is a first poll
	// resumed: the next poll is this process's first, over state an
	// earlier process of this boot persisted (retireDisabled).
	resumed bool
	// downedRead are the ports whose link_downed this process has read:
	// a port's first reading compares with an earlier process's snapshot
	// (counterEvents' across), whichever poll it comes on — a port
	// unreadable on the first poll is first read on a later one.
	downedRead map[string]bool
	// expected is how many devices the GPU metadata's nic_topology names
	// (0 with nic_inclusion_regex_override): with some expected and none
	// ever known, no InfiniBand device at all is a poll error (nothing
	// monitored, not silently); with known devices it is their loss.
	expected int
	// unreadable is when each known device listed but not discoverable
	// was first seen so: past cardHoldDown it is reported lost.
	unreadable map[string]time.Time
	// missing is when each known device not listed, not reported yet,
	// was first seen missing: past deviceHoldDown it is reported
	// disappeared.
	missing map[string]time.Time
	// portUnreadable is when each monitored port whose state cannot be
	// read was first seen so (keyed "device/port"): past cardHoldDown it
	// is reported fatal and counted inactive for its card.
	portUnreadable map[string]time.Time
	// noDevices is when class/infiniband was first seen empty or missing
	// while known devices were not reported lost (zero: it lists some):
	// past cardHoldDown each is reported lost.
	noDevices time.Time
	lastSaved []byte
	nics      map[string]*NIC
	names     []string
	// below is when each card below its peer mode, not yet reported, was
	// first seen below (cardHoldDown).
	below map[string]time.Time
}

// cardHoldDown is how long a card stays below its role's peer mode before
// it is reported, except on a first poll without usable state when the
// card is short of a port hard down or missing (reported at once; ports
// still waiting for the subnet manager or training are held down). It keeps a port passing through INIT, ARMED, Polling or
// LinkErrorRecovery — a link training, a subnet manager failing over and
// activating a large fabric's ports one by one — from reporting its card:
// the card fault is fatal, REPLACE_VM. §3.1 calls INIT problematic when
// stuck over 30 s; a port DOWN says so itself at once (its own fatal), so
// the card's report can wait as long as NICPortDrop's hold (4 min).
const cardHoldDown = 5 * time.Minute

// deviceHoldDown is how long a known device stays unlisted, while others
// are listed, before it is reported disappeared. An openibd unload/reload
// unregisters and registers the devices one at a time over seconds: a
// poll sees some missing, and each was reported disappeared (REPLACE_VM)
// and present again a second later. 30 s separates a device re-registering
// from one fallen off the bus, whose disappearance stays fatal, reported
// 30 s later.
const deviceHoldDown = 30 * time.Second

// ErrNoDevices is a poll's error when sysfs lists no InfiniBand device
// (class/infiniband missing or empty) while the GPU metadata names some
// and the check has never known one (the mlx5 driver not loaded, or the
// host /sys not mounted): nothing is monitored. Once devices are known,
// it is the error for up to cardHoldDown (a MOFED/openibd restart unloads
// ib_core for seconds; a host /sys mount gone wrong); no device listed
// still then is their loss (driver crash, card or PCIe switch failure),
// each reported disappeared.
var ErrNoDevices = errors.New("no InfiniBand device in class/infiniband")

// Options are the collaborators of a Check.
type Options struct {
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// New builds the check: it loads the GPU metadata (a hard dependency: a
// missing file, an empty nic_topology or no GPU NUMA information is an
// error wrapping ErrMetadata), refuses a sysfs root without class/,
// resolves the default route, reads the boot id (unreadable or empty is an
// error when a state file is configured) and loads the state file.
func New(cfg Config, opt Options) (*Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("check", "nic")
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	var md *topology.Metadata
	if cfg.InclusionRegexOverride == "" {
		var err error
		if md, err = loadMetadata(cfg.MetadataPath); err != nil {
			return nil, err
		}
	}
	// A sysfs_root without class/ is no sysfs (a path below one, such as
	// <root>/class/infiniband, or the host /sys not mounted): every poll
	// would find no device, and every known one "disappeared".
	if fi, err := os.Stat(filepath.Join(cfg.SysfsRoot, "class")); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("nic.sysfs_root: %s has no class/ directory: not a sysfs mount (want the directory holding class/infiniband, e.g. /sys)", cfg.SysfsRoot)
	}
	r, err := newSysReader(cfg.SysfsRoot, log)
	if err != nil {
		return nil, err
	}
	iface, routeDevs := defaultRouteDevices(cfg.ProcNetRoute, cfg.SysfsRoot)
	if iface != "" {
		log.Info("default route", "iface", iface, "ib_devices", routeDevs)
	}
	cls, err := newClassifier(&cfg, md, routeDevs)
	if err != nil {
		return nil, err
	}
	c := &Check{cfg: cfg, log: log, now: now, r: r, cls: cls, enabled: map[string]bool{}, nics: map[string]*NIC{}, below: map[string]time.Time{},
		downedRead: map[string]bool{}, unreadable: map[string]time.Time{}, missing: map[string]time.Time{}, portUnreadable: map[string]time.Time{}}
	if md != nil {
		c.expected = len(md.NICTopology)
	}
	for _, n := range cfg.Checks {
		if !slices.Contains(AllChecks, n) {
			log.Warn("unknown NIC sub-check skipped", "name", n)
			continue
		}
		c.enabled[n] = true
	}
	// With a state file, the boot id is what tells a reboot (state
	// discarded, baselines sent) from a restart (state reused): without
	// it a reboot would reuse the last boot's state — stale faults never
	// cleared, no baselines, card flags carried over. Refused, naming the
	// key, rather than run on state that cannot be trusted.
	if c.bootID, err = readBootID(cfg.BootIDPath); err != nil && cfg.StateFile != "" {
		return nil, fmt.Errorf("nic.boot_id_path: %w (needed with nic.state_file to tell a reboot from a restart; set state_file to \"\" to run without persisted state)", err)
	}
	var (
		reason string
		bad    bool
	)
	c.st, reason, bad = loadState(cfg.StateFile, c.bootID)
	c.fresh = reason != ""
	c.resumed = !c.fresh
	switch {
	case bad:
		log.Warn("NIC state file not used: state starts fresh, healthy baselines will be emitted", "path", cfg.StateFile, "reason", reason)
	case c.fresh:
		log.Info("NIC state starts fresh: healthy baselines will be emitted", "reason", reason)
	default:
		log.Info("NIC state restored", "ports", len(c.st.Ports), "known_devices", len(c.st.KnownDevices))
	}
	return c, nil
}

// Name implements check.Check.
func (c *Check) Name() string { return "nic" }

// Interval is the configured polling interval.
func (c *Check) Interval() time.Duration { return c.cfg.PollInterval }

// Check implements check.Check: one poll.
func (c *Check) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	_, evs, err := c.Poll(ctx)
	return evs, err
}

// NICs returns the devices as of the last poll, sorted by name.
func (c *Check) NICs() []NIC {
	out := make([]NIC, 0, len(c.nics))
	for _, n := range slices.Sorted(maps.Keys(c.nics)) {
		out = append(out, *c.nics[n])
	}
	return out
}

// Poll reads sysfs once, updates and persists the state, and returns the
// devices and the events of this poll.
func (c *Check) Poll(ctx context.Context) ([]NIC, []*datamodels.HealthEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	names, err := c.r.names()
	if err != nil {
		return nil, nil, err
	}
	if len(names) == 0 && c.expected > 0 && len(c.st.KnownDevices) == 0 {
		// No device ever seen (driver not loaded, host /sys not mounted):
		// nothing is monitored, which must not pass for healthy.
		return nil, nil, fmt.Errorf("%w: nic_topology names %d devices (check nic.sysfs_root and the host /sys mount)", ErrNoDevices, c.expected)
	}
	lost := 0 // known devices not reported lost yet
	for name := range c.st.KnownDevices {
		if !slices.Contains(c.st.Disappeared, name) {
			lost++
		}
	}
	if len(names) > 0 || lost == 0 {
		c.noDevices = time.Time{}
	} else {
		// Every known device gone at once: a MOFED/openibd restart
		// (ib_core unloaded for seconds) or a host /sys mount gone wrong
		// as much as a driver crash or a one-HCA node's card or PCIe
		// switch failed. A poll error, the state kept, for up to
		// cardHoldDown; none listed still then, each is lost (below).
		if c.noDevices.IsZero() {
			c.noDevices = c.now()
		}
		// The devices that come back are discovered again: a driver
		// restart registers them in probe order, names swapped between
		// PCI functions (mlx5_0 ↔ mlx5_1), and a cached device would read
		// its old function's port paths, which no longer exist.
		clear(c.nics)
		if held := c.now().Sub(c.noDevices); held < cardHoldDown {
			return nil, nil, fmt.Errorf("%w: %d known devices not listed for %s: reported lost once past the hold-down (%s) (a driver restart; else check nic.sysfs_root and the host /sys mount)", ErrNoDevices, lost, held.Round(time.Second), cardHoldDown)
		}
		c.log.Warn("no InfiniBand device past the hold-down: known devices reported lost", "since", c.noDevices, "hold_down", cardHoldDown)
	}
	// Discovery only for devices not seen before, or whose class link now
	// points elsewhere (a driver restart between two polls registered the
	// names in another order); the rest read the hot path.
	present := make(map[string]bool, len(names))
	moved := map[string]bool{}
	for _, n := range names {
		present[n] = true
		if cached, ok := c.nics[n]; ok {
			if !c.r.moved(&cached.Device) {
				continue
			}
			c.log.Info("NIC now on another PCI function: discovered again", "device", n, "pci", cached.PCIAddress)
			delete(c.nics, n)
		}
		d, err := c.r.discover(n)
		if err != nil {
			c.log.Warn("device unreadable", "device", n, "err", err)
			continue
		}
		if old := c.st.KnownPCI[n]; old != "" && d.PCIAddress != "" && old != d.PCIAddress {
			// Its port snapshots are another function's (a driver
			// restart registered the names in another order): they go
			// with their function (portMoves).
			moved[n] = true
		}
		role, why := c.cls.classify(d)
		c.nics[n] = &NIC{Device: *d, Role: role, Monitored: role.Monitored(), Reason: why}
		c.log.Info("NIC discovered", "device", n, "role", role, "reason", why, "pci", d.PCIAddress, "numa", d.NUMANode, "link_layer", d.LinkLayer)
	}
	for n := range c.nics {
		if !present[n] {
			delete(c.nics, n)
		}
	}
	moves := c.portMoves(moved)
	for _, n := range c.nics {
		if !n.Monitored {
			continue
		}
		for i := range n.Ports {
			p := &n.Ports[i]
			c.r.readState(p)
			if c.degrOn(p.LinkLayer) {
				c.r.readCounters(p)
			}
			if p.ReadError != "" {
				if key := portKey(p.Device, p.Port); c.portUnreadable[key].IsZero() {
					c.portUnreadable[key] = c.now()
				}
			} else if len(c.portUnreadable) > 0 {
				delete(c.portUnreadable, portKey(p.Device, p.Port))
			}
		}
	}
	for key := range c.portUnreadable {
		if n := c.nics[key[:strings.LastIndexByte(key, '/')]]; n == nil || !n.Monitored {
			delete(c.portUnreadable, key)
		}
	}

	now := timestamppb.New(c.now())
	var out []*datamodels.HealthEvent
	emit := func(ev *datamodels.HealthEvent) {
		ev.GeneratedTimestamp = now
		out = append(out, ev)
	}

	if c.resumed {
		c.retireDisabled(emit)
	}

	// inherited are the ports of a device under its new name (renamed,
	// bonded, its name now on another PCI function) that were last
	// reported unhealthy under the old one.
	inherited := map[string]bool{}
	if len(moves) > 0 {
		c.movePorts(moves, emit, inherited)
	}

	// Device disappearance and reappearance (§7).
	for _, name := range slices.Sorted(maps.Keys(c.st.KnownDevices)) {
		ll := c.st.KnownDevices[name]
		gone := slices.Contains(c.st.Disappeared, name)
		nic, ok := c.nics[name]
		if !ok && present[name] {
			// Listed but not readable yet (ports/ not there: a driver
			// reload or hot-plug window): unreadable, not gone — as a
			// port that cannot be read is no transition — for up to
			// cardHoldDown; still unreadable then (EIO on a half-dead
			// HCA), it is lost.
			since, seen := c.unreadable[name]
			if !seen {
				since = c.now()
				c.unreadable[name] = since
			}
			if c.now().Sub(since) < cardHoldDown {
				c.log.Debug("known NIC listed but not readable yet", "device", name)
				continue
			}
			c.log.Warn("known NIC listed but unreadable past the hold-down: reported lost", "device", name, "since", since, "hold_down", cardHoldDown)
		} else {
			delete(c.unreadable, name)
		}
		to, how, why := "", "", ""
		if !ok {
			if to = c.renamedTo(name); to != "" {
				how = "as " + to
				why = "device renamed to " + to + " (its ports are reported under that name now)"
			} else if to = c.bondedInto(name); to != "" {
				how = "in " + to + " (RoCE LAG: its PF bonded with " + to + "'s)"
				why = "device bonded into " + to + " (RoCE LAG: its ports are reported as that device's now)"
			}
		}
		if to != "" {
			// Same PCI function, another name (udev's rdma_rename, `rdma dev
			// set name`), or its PF bonded into another's RDMA device (mlx5
			// RoCE LAG): configuration, not a hardware loss. A fatal sent
			// for the old name is cleared, as nothing will ever come back
			// under it.
			c.log.Info("NIC renamed or bonded", "device", name, "now", to)
			delete(c.missing, name)
			delete(c.st.KnownDevices, name)
			delete(c.st.KnownPCI, name)
			for _, port := range c.retirePorts(name, why, emit) {
				inherited[portKey(to, port)] = true
			}
			if gone {
				c.st.Disappeared = slices.DeleteFunc(c.st.Disappeared, func(s string) bool { return s == name })
				if c.stateOn(ll) {
					ev := deviceEvent(name, ll, true)
					ev.Message = fmt.Sprintf("NIC %s present again in /sys/class/infiniband/ %s", name, how)
					emit(ev)
				}
			}
			continue
		}
		if ok {
			delete(c.missing, name)
		}
		switch {
		case !ok && !gone:
			// Not listed while others are: held down for
			// deviceHoldDown (a driver reload registers them one by
			// one); none listed, or listed but unreadable, the
			// hold-down was cardHoldDown's, already past. The first
			// poll of an agent restarted on its state reports at once,
			// as before the hold-down: the time missing is not saved,
			// and an agent restarting faster than deviceHoldDown never
			// reported a device gone for good.
			since, seen := c.missing[name]
			if present[name] || c.resumed {
				since, seen = time.Time{}, true
			}
			if !seen {
				since = c.now()
				if !c.noDevices.IsZero() && c.noDevices.Before(since) {
					since = c.noDevices
				}
				c.missing[name] = since
			}
			if c.now().Sub(since) < deviceHoldDown {
				c.log.Debug("known NIC not listed, held down", "device", name, "since", since, "hold_down", deviceHoldDown)
				continue
			}
			delete(c.missing, name)
			c.st.Disappeared = append(c.st.Disappeared, name)
			c.log.Error("NIC disappeared", "device", name)
			if c.stateOn(ll) {
				emit(deviceEvent(name, ll, false))
			}
		case ok && !nic.Monitored:
			// There, but no longer monitored (excluded by the config the
			// agent restarted with, or classified management): no longer
			// known, so its loss is not reported, and a fatal sent when it
			// disappeared is cleared — nothing would ever clear it, and
			// the node stayed quarantined for a device it does not watch.
			delete(c.st.KnownDevices, name)
			delete(c.st.KnownPCI, name)
			why := fmt.Sprintf("device no longer monitored (%s: %s)", nic.Role, nic.Reason)
			c.retirePorts(name, why, emit)
			c.retireCards(name, why, emit)
			if gone {
				c.st.Disappeared = slices.DeleteFunc(c.st.Disappeared, func(s string) bool { return s == name })
				c.log.Info("NIC present again, no longer monitored", "device", name, "role", nic.Role, "reason", nic.Reason)
				if c.stateOn(ll) {
					ev := deviceEvent(name, ll, true)
					ev.Message = fmt.Sprintf("NIC %s present again in /sys/class/infiniband/, no longer monitored (%s: %s)", name, nic.Role, nic.Reason)
					emit(ev)
				}
			}
		case ok && gone:
			c.st.Disappeared = slices.DeleteFunc(c.st.Disappeared, func(s string) bool { return s == name })
			c.log.Info("NIC present again", "device", name)
			if c.stateOn(ll) {
				emit(deviceEvent(name, ll, true))
			}
		}
	}
	if c.fresh {
		// A first poll without usable state (reboot, no or corrupt state
		// file) does not know which devices an earlier boot reported
		// disappeared: each monitored device present gets the healthy
		// event of its device-level fault ([NIC=<name>]), which nothing
		// else would ever send (§3.4: the baseline clears stale fatals).
		for _, name := range slices.Sorted(maps.Keys(c.nics)) {
			if n := c.nics[name]; n.Monitored && c.stateOn(n.LinkLayer) {
				ev := deviceEvent(name, n.LinkLayer, true)
				ev.Message = fmt.Sprintf("NIC %s present in /sys/class/infiniband/ (healthy baseline of a first poll)", name)
				ev.Metadata = map[string]string{"baseline": "first_poll"}
				emit(ev)
			}
		}
		c.unmonitoredBaselines(emit)
	}
	for _, name := range slices.Sorted(maps.Keys(c.nics)) {
		if n := c.nics[name]; n.Monitored {
			if _, known := c.st.KnownDevices[n.Name]; !known && !c.fresh && c.stateOn(n.LinkLayer) {
				// A device first seen after the first poll (one reported
				// disappeared when the state was lost, or replaced and
				// registered after it) gets the baseline of its
				// device-level fault too: nothing else would lift an
				// earlier "disappeared". Idempotent on the platform.
				ev := deviceEvent(name, n.LinkLayer, true)
				ev.Message = fmt.Sprintf("NIC %s present in /sys/class/infiniband/ (healthy baseline of a device first seen)", name)
				ev.Metadata = map[string]string{"baseline": "first_seen"}
				emit(ev)
			}
			c.st.KnownDevices[n.Name] = n.LinkLayer
			if n.PCIAddress != "" {
				c.st.KnownPCI[n.Name] = n.PCIAddress
			}
		}
	}

	// Card homogeneity per role (§4.3), on every poll: a card below its
	// role's peer mode is reported at once on a first poll without usable
	// state when it is short of a port hard down or missing (§7.2 Case 3),
	// which its ports waiting for the SM or training (INIT, ARMED,
	// Polling, LinkErrorRecovery: normal after a boot, §3.2; RoCE ports
	// DOWN/Disabled, their net devices not up yet) could not make up as
	// they do for its peers at the mode, and otherwise once it has
	// stayed below for cardHoldDown (a port stuck in INIT, ARMED, Polling or
	// LinkErrorRecovery while its peers are ACTIVE; a port dead at boot
	// on a card that looked normal while its peers still waited for the
	// SM). A reported card is cleared once it is back at the expected
	// count. A first poll also sends the healthy event of each card at or above its
	// peer mode: an earlier boot's card fault is known only to its state,
	// which a reboot or a lost state file discards. A card's events name
	// the card and all its monitored devices ([PCI=<card>, NIC=<each>]),
	// whichever ports are down; a fault raised while some of them were
	// missing named fewer, so the baseline names each subset of the
	// devices it holds (cardBaselineSets).
	cards := c.cards()
	anomalous := map[string]bool{}
	peers := map[Role]*peerSlots{}
	for _, grp := range groupByRole(cards) {
		mode := modeActive(grp)
		peers[grp[0].role] = c.peerSlotsAt(grp, mode)
		// peersUp: the fewest ports active or on their way up of a card
		// at peer mode. A card below it even counting its own ports on
		// their way up as active is short of a port hard down (DOWN and
		// Disabled, or in no state on the way up) or missing, beyond what
		// its peers lack (uncabled ports: Polling on IB, Disabled on RoCE).
		peersUp := -1
		for _, cd := range grp {
			if cd.active >= mode && (peersUp < 0 || cd.active+cd.waiting < peersUp) {
				peersUp = cd.active + cd.waiting
			}
		}
		for _, cd := range grp {
			if cd.active >= mode && (c.fresh || c.st.firstHeld(cd.addr)) && c.stateOn(cd.linkLayer) {
				c.st.setFirstHeld(cd.addr, false)
				for _, devs := range cardBaselineSets(cd.devices) {
					b := *cd
					b.devices = devs
					ev := cardEvent(&b, mode, true)
					ev.Message = fmt.Sprintf("Card %s (%s) has %d active ports, at or above peer mode %d (healthy baseline of a first poll)", cd.addr, cd.role, cd.active, mode)
					ev.Metadata["baseline"] = "first_poll"
					emit(ev)
				}
			}
			if cd.active >= mode {
				continue
			}
			// A first poll holding the card down reports none of its
			// unhealthy ports either (first observations, which would be
			// fatal at once for a link still training): it is reported
			// past the hold-down if still short.
			anomalous[cd.addr] = !c.fresh || cd.active+cd.waiting < peersUp
			if !c.stateOn(cd.linkLayer) || c.st.AnomalousCards[cd.addr] != nil {
				continue
			}
			// Held down unless a first poll finds it short of a port hard
			// down or missing: one waiting for the SM or training after a
			// boot is normal (§3.2).
			hold := !c.fresh || cd.active+cd.waiting >= peersUp
			if c.fresh && hold {
				c.st.setFirstHeld(cd.addr, true)
			}
			since, ok := c.below[cd.addr]
			if !ok {
				since = c.now()
				c.below[cd.addr] = since
				if hold {
					c.log.Warn("card below peer mode, held down", "card", cd.addr, "role", cd.role, "active", cd.active, "waiting", cd.waiting, "expected", mode, "hold_down", cardHoldDown)
				}
			}
			if hold && c.now().Sub(since) < cardHoldDown {
				continue
			}
			c.st.AnomalousCards[cd.addr] = &cardFlag{Role: cd.role, Expected: mode, Devices: cd.devices, LinkLayer: cd.linkLayer}
			c.st.setFirstHeld(cd.addr, false)
			c.log.Error("card below peer mode", "card", cd.addr, "role", cd.role, "active", cd.active, "expected", mode)
			emit(cardEvent(cd, mode, false))
		}
	}
	for addr := range c.below {
		if _, below := anomalous[addr]; !below || c.st.AnomalousCards[addr] != nil {
			delete(c.below, addr)
		}
	}
	if !c.fresh {
		for _, addr := range slices.Sorted(maps.Keys(c.st.AnomalousCards)) {
			f := c.st.AnomalousCards[addr]
			cd, ok := cards[addr]
			if ok && cd.active >= f.Expected {
				delete(c.st.AnomalousCards, addr)
				// The recovery names what the fault named: the devices
				// seen when the card was reported, not those it holds
				// now (a device missing then is back, one was renamed or
				// bonded). The quarantine lifts only the same entities.
				back := *cd
				if len(f.Devices) > 0 {
					back.devices = f.Devices
				}
				if f.LinkLayer != "" {
					back.linkLayer = f.LinkLayer
				}
				emit(cardEvent(&back, f.Expected, true))
				c.clearUncabled(cd, peers[cd.role], emit)
			}
		}
	}

	// Per-port boundary crossings (§3.4) and counters (Appendix A).
	for _, name := range slices.Sorted(maps.Keys(c.nics)) {
		n := c.nics[name]
		if !n.Monitored {
			continue
		}
		for i := range n.Ports {
			p := &n.Ports[i]
			key := portKey(p.Device, p.Port)
			prev := c.st.Ports[key]
			if p.ReadError != "" {
				// Unreadable says nothing about the port for up to
				// cardHoldDown (a read racing a reset, firmware busy);
				// still so then (a hung HCA answering EIO or ETIMEDOUT
				// every poll, its device still listed), it is fatal.
				if !c.unreadablePast(p) {
					c.log.Warn("port unreadable", "device", p.Device, "port", p.Port, "err", p.ReadError)
					continue
				}
				if prev != nil && prev.Level == levelFatal {
					continue // reported (unreadable, or down before)
				}
				if c.stateOn(p.LinkLayer) {
					// WithCard, for a port with no reported state of its
					// own: the card's failure to read, not a link fault
					// the port saw; uncabled as on its peers once readable
					// again, it is cleared with its card (clearUncabled).
					next := &portState{LinkLayer: p.LinkLayer, Level: levelFatal, WithCard: !prev.reported()}
					if prev != nil {
						next.Counters, next.Breached = prev.Counters, prev.Breached
					}
					c.st.Ports[key] = next
					c.log.Error("port unreadable past the hold-down: reported", "device", p.Device, "port", p.Port, "since", c.portUnreadable[key], "err", p.ReadError)
					emit(unreadableEvent(n, p))
				}
				continue
			}
			if c.stateOn(p.LinkLayer) {
				// A port held with its card by a first poll is reported
				// with the card, once it is reported; on a first poll,
				// and after one while its card is still held down, it
				// stays held. One down as the same port is on most of
				// the peers at mode (uncabled there too) is no fault of
				// its card: once the card is reported it is saved as an
				// uncabled port, as on a card at mode, and not reported
				// (nothing would lift that fault when the card is back).
				_, below := anomalous[cardKey(n)]
				withCard := anomalous[cardKey(n)]
				if prev != nil && prev.Held {
					withCard = c.st.AnomalousCards[cardKey(n)] != nil
					if withCard && !inherited[key] && !peers[n.Role].active(n, p) {
						withCard, below = false, false
					}
				}
				report := withCard || inherited[key]
				hold := below && !report && (c.fresh || prev != nil && prev.Held)
				if ev := c.transition(n, p, prev, report, withCard, hold); ev != nil {
					emit(ev)
				}
			}
			ps := c.st.Ports[key]
			if ps == nil {
				ps = &portState{LinkLayer: p.LinkLayer}
			}
			if c.degrOn(p.LinkLayer) {
				up, _, _ := evaluate(p)
				for _, ev := range counterEvents(p, ps, up == levelHealthy, len(ps.Counters) == 0, !c.downedRead[key]) {
					emit(ev)
				}
				if _, ok := p.Counters[CounterLinkDowned]; ok {
					c.downedRead[key] = true
				}
				// A counter unreadable this poll keeps its last reading, so
				// that an increase across the failed read is still seen.
				if ps.Counters == nil {
					ps.Counters = make(map[string]uint64, len(p.Counters))
				}
				maps.Copy(ps.Counters, p.Counters)
			}
			if ps.Level != "" || ps.Held || len(ps.Counters) > 0 {
				c.st.Ports[key] = ps
			}
		}
	}

	c.fresh, c.resumed = false, false
	return c.NICs(), out, nil
}

// Commit implements check.Committer: the state file is written once the
// last poll's events are spooled (only when it changed).
func (c *Check) Commit() error {
	if err := c.st.save(c.cfg.StateFile, &c.lastSaved); err != nil {
		return fmt.Errorf("NIC state not persisted: %w", err)
	}
	return nil
}

// portMoves returns the monitored devices whose port history is another
// name's after a driver restart registered the names in another order
// (mlx5_0 ↔ mlx5_1 on a dual-PF card), each with the known name that was
// on its PCI function ("" if none): a device now on another function
// (moved), or one on the function of a known name that moved. Keyed by
// name, the uncabled PF1 took PF0's healthy history and was reported
// fatal, never cleared. The hold-down timers of unreadable ports and what
// link_downed this process has read go with their function now; the
// snapshots move with movePorts, once the poll can emit.
func (c *Check) portMoves(moved map[string]bool) map[string]string {
	if len(moved) == 0 {
		return nil
	}
	moves := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(c.nics)) {
		n := c.nics[name]
		if !n.Monitored || n.PCIAddress == "" || c.st.KnownPCI[name] == n.PCIAddress {
			continue
		}
		src := ""
		for _, k := range slices.Sorted(maps.Keys(c.st.KnownPCI)) {
			if k != name && c.st.KnownPCI[k] == n.PCIAddress {
				src = k
				break
			}
		}
		if moved[name] || moved[src] {
			moves[name] = src
		}
	}
	moveByDevice(c.portUnreadable, moves)
	moveByDevice(c.downedRead, moves)
	return moves
}

// moveByDevice moves the entries of m keyed "device/port" of each device
// of moves to it from the device it names ("" : none, dropped).
func moveByDevice[V any](m map[string]V, moves map[string]string) {
	old := maps.Clone(m)
	for key := range old {
		if _, ok := moves[key[:strings.LastIndexByte(key, '/')]]; ok {
			delete(m, key)
		}
	}
	for dev, src := range moves {
		if src == "" {
			continue
		}
		for key, v := range old {
			if port, ok := strings.CutPrefix(key, src+"/"); ok {
				m[dev+"/"+port] = v
			}
		}
	}
}

// movePorts gives each device of moves (portMoves) the port snapshots of
// the known name that was on its PCI function (level, uncabled, held
// flags, counters), or none (its ports first observations, judged against
// their peers). A fault reported under the device's own name is lifted
// there first (retirePorts): its port is another function's now, and
// nothing would ever lift it. A fault the snapshot's function reported
// under its former name (lifted there, by this or the rename path) is
// reported again under the new one if still there: the port starts as a
// first observation reported unhealthy (inherited), a threshold counter
// above 0 as not reported yet; one reported with its card (WithCard)
// starts as a plain first observation, reported only with its card. The
// source keeps its snapshots until it is moved itself: a name gone is
// judged on them (renamed, disappeared).
func (c *Check) movePorts(moves map[string]string, emit func(*datamodels.HealthEvent), inherited map[string]bool) {
	old := maps.Clone(c.st.Ports)
	for _, dev := range slices.Sorted(maps.Keys(moves)) {
		why := fmt.Sprintf("device name now on PCI function %s (a driver restart registered the names in another order)", c.nics[dev].PCIAddress)
		if to := c.renamedTo(dev); to != "" {
			why += ": its ports are reported under " + to + " now"
		}
		c.log.Info("NIC name on another PCI function: port snapshots moved with their function", "device", dev, "pci", c.nics[dev].PCIAddress, "from", moves[dev])
		c.retirePorts(dev, why, emit)
	}
	for _, dev := range slices.Sorted(maps.Keys(moves)) {
		src := moves[dev]
		if src == "" {
			continue
		}
		for key, ps := range old {
			port, ok := strings.CutPrefix(key, src+"/")
			if !ok {
				continue
			}
			cp := *ps
			cp.Counters, cp.Breached = maps.Clone(ps.Counters), nil
			if ps.reported() && ps.Level != levelHealthy {
				cp.State, cp.PhysState, cp.Level, cp.WithCard = "", "", "", false
				// A fault reported with its card is judged with it again:
				// reported with the card if still below its peer mode,
				// else taken for an uncabled port (its card back at mode
				// this poll, clearUncabled would have lifted it).
				if !ps.WithCard {
					inherited[dev+"/"+port] = true
				}
			}
			c.st.Ports[dev+"/"+port] = &cp
		}
	}
}

// renamedTo returns the present device, under another name, on the PCI
// function a known device was on ("" if none).
func (c *Check) renamedTo(name string) string {
	pci := c.st.KnownPCI[name]
	if pci == "" {
		return ""
	}
	for _, other := range slices.Sorted(maps.Keys(c.nics)) {
		if other != name && c.nics[other].PCIAddress == pci {
			return other
		}
	}
	return ""
}

// bondedInto returns the present device that a known device's PF was
// bonded into ("" if none). Once both PFs of a dual-port card have their
// net devices enslaved to one bond, mlx5 activates RoCE LAG: the kernel
// removes both RDMA devices and registers one (mlx5_bond_N) on the first
// PF's function. The first PF's device looks renamed (renamedTo); the
// second's vanishes while its PCI function is still there, its net device
// enslaved to the same master as a present device's on the same card —
// that is the LAG, configuration. A function gone from the bus, or not
// enslaved with a present sibling, is not. (Both PFs enslaved without a
// LAG — SR-IOV legacy mode — and the second PF's RDMA device lost reads as
// a LAG too: telling them apart needs the bond's RDMA netdev
// (gid_attrs/ndevs); a check on the survivor's name broke persistent
// names, rdma_rename NAME_PCI, whose LAG device keeps PF0's name.)
func (c *Check) bondedInto(name string) string {
	pci := c.st.KnownPCI[name]
	if pci == "" {
		return ""
	}
	master := c.r.masterOf(pci)
	if master == "" {
		return ""
	}
	for _, other := range slices.Sorted(maps.Keys(c.nics)) {
		n := c.nics[other]
		if other != name && n.PCIAddress != "" && n.PCIAddress != pci && cardOf(n.PCIAddress) == cardOf(pci) && c.r.masterOf(n.PCIAddress) == master {
			return other
		}
	}
	return ""
}

// retireCards clears the card faults naming a device that will never be
// reported again (no longer monitored): the card's recovery is checked
// only over monitored devices, so nothing else would ever lift it. The
// healthy event names what the fault named.
func (c *Check) retireCards(dev, why string, emit func(*datamodels.HealthEvent)) {
	for _, addr := range slices.Sorted(maps.Keys(c.st.AnomalousCards)) {
		f := c.st.AnomalousCards[addr]
		if !slices.Contains(f.Devices, dev) {
			continue
		}
		delete(c.st.AnomalousCards, addr)
		c.log.Info("card fault cleared", "card", addr, "device", dev, "reason", why)
		emit(retiredCardEvent(addr, f, fmt.Sprintf("%s %s", dev, why)))
	}
}

// unmonitoredBaselines sends, on a first poll without usable state, the
// healthy events of the faults an earlier boot may have raised for a
// device no longer monitored (excluded or reclassified since): its
// [NIC=<name>], its ports' (both checks) and its card's, each subset of
// the card's devices that holds it (cardBaselineSets). Its state is gone
// with the reboot, and nothing else would ever lift them. VFs are skipped:
// never monitored, so never reported.
func (c *Check) unmonitoredBaselines(emit func(*datamodels.HealthEvent)) {
	byCard := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(c.nics)) {
		if n := c.nics[name]; n.Role != RoleVF && n.Card != "" {
			byCard[n.Card] = append(byCard[n.Card], name)
		}
	}
	baseline := func(ev *datamodels.HealthEvent) {
		if ev.Metadata == nil {
			ev.Metadata = map[string]string{}
		}
		ev.Metadata["baseline"] = "first_poll"
		emit(ev)
	}
	cardsDone := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(c.nics)) {
		n := c.nics[name]
		if n.Monitored || n.Role == RoleVF {
			continue
		}
		why := fmt.Sprintf("device not monitored (%s: %s)", n.Role, n.Reason)
		if c.stateOn(n.LinkLayer) {
			ev := deviceEvent(name, n.LinkLayer, true)
			ev.Message = fmt.Sprintf("NIC %s present in /sys/class/infiniband/, %s (healthy baseline of a first poll)", name, why)
			baseline(ev)
		}
		for _, p := range n.Ports {
			if c.stateOn(p.LinkLayer) {
				baseline(retiredEvent(name, p.Port, p.LinkLayer, why, false))
			}
			if c.degrOn(p.LinkLayer) {
				baseline(retiredEvent(name, p.Port, p.LinkLayer, why, true))
			}
		}
		if n.Card == "" || cardsDone[n.Card] || !c.stateOn(n.LinkLayer) {
			continue
		}
		cardsDone[n.Card] = true
		for _, devs := range cardBaselineSets(byCard[n.Card]) {
			if !slices.ContainsFunc(devs, func(d string) bool { return !c.nics[d].Monitored }) {
				continue // a monitored card's own baseline
			}
			f := &cardFlag{Role: n.Role, Devices: devs, LinkLayer: n.LinkLayer}
			baseline(retiredCardEvent(n.Card, f, why+" (healthy baseline of a first poll)"))
		}
	}
}

// retireDisabled clears, on a process's first poll over persisted state,
// the faults of sub-checks the agent no longer runs (removed from
// nic.checks): nothing of that check will ever come again to lift them.
// Each gets a healthy event of its check and entities; the state forgets
// them, so a check enabled again starts from a first observation.
func (c *Check) retireDisabled(emit func(*datamodels.HealthEvent)) {
	for _, key := range slices.Sorted(maps.Keys(c.st.Ports)) {
		ps := c.st.Ports[key]
		i := strings.LastIndexByte(key, '/')
		port, err := strconv.ParseUint(key[i+1:], 10, 32)
		if i < 0 || err != nil {
			continue
		}
		dev := key[:i]
		if !c.stateOn(ps.LinkLayer) && ps.Level != "" {
			if ps.Level != levelHealthy {
				emit(retiredEvent(dev, uint(port), ps.LinkLayer, checkName(ps.LinkLayer, false)+" disabled", false))
			}
			ps.State, ps.PhysState, ps.Level, ps.Held, ps.Unreported, ps.WithCard = "", "", "", false, false, false
		}
		if !c.degrOn(ps.LinkLayer) && len(ps.Counters)+len(ps.Breached) > 0 {
			if len(ps.Breached) > 0 {
				emit(retiredEvent(dev, uint(port), ps.LinkLayer, checkName(ps.LinkLayer, true)+" disabled", true))
			}
			ps.Counters, ps.Breached = nil, nil
		}
		ps.Held = ps.Held && c.stateOn(ps.LinkLayer) // held, never reported: nothing to clear
		if ps.Level == "" && !ps.Held && len(ps.Counters) == 0 {
			delete(c.st.Ports, key)
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(c.st.AnomalousCards)) {
		if f := c.st.AnomalousCards[addr]; !c.stateOn(f.LinkLayer) {
			delete(c.st.AnomalousCards, addr)
			emit(retiredCardEvent(addr, f, checkName(f.LinkLayer, false)+" disabled"))
		}
	}
	c.st.Disappeared = slices.DeleteFunc(c.st.Disappeared, func(name string) bool {
		ll := c.st.KnownDevices[name]
		if c.stateOn(ll) {
			return false
		}
		ev := deviceEvent(name, ll, true)
		ev.Message = fmt.Sprintf("NIC %s: disappearance cleared, %s disabled", name, checkName(ll, false))
		emit(ev)
		return true
	})
}

// stateOn reports whether the state check of a link layer is enabled.
func (c *Check) stateOn(linkLayer string) bool {
	if linkLayer == "Ethernet" {
		return c.enabled[EthernetStateCheck]
	}
	return c.enabled[InfiniBandStateCheck]
}

// degrOn reports whether the degradation check of a link layer is enabled.
func (c *Check) degrOn(linkLayer string) bool {
	if linkLayer == "Ethernet" {
		return c.enabled[EthernetDegradationCheck]
	}
	return c.enabled[InfiniBandDegradationCheck]
}

// retirePorts forgets the port snapshots of a known device that will never
// be reported under its name again (renamed, bonded into a RoCE LAG, no
// longer monitored). A port last seen unhealthy gets a healthy event under
// its old entities saying why: the quarantine lifts a fault only on the
// same check and entities, and nothing would ever come under them again.
// It returns the ports retired unhealthy: under a new name, such a port
// still unhealthy is reported, not taken for an uncabled one. A device
// that merely vanished keeps its snapshots: §7.3 makes that a fault of its
// own, and its ports' faults stand until it is back.
func (c *Check) retirePorts(dev, why string, emit func(*datamodels.HealthEvent)) []uint {
	prefix := dev + "/"
	var unhealthy []uint
	for _, key := range slices.Sorted(maps.Keys(c.st.Ports)) {
		rest, ok := strings.CutPrefix(key, prefix)
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(rest, 10, 32)
		if err != nil {
			continue
		}
		ps := c.st.Ports[key]
		delete(c.st.Ports, key)
		if len(ps.Breached) > 0 {
			// A degradation fatal stands under the old name too; a counter
			// still above 0 is reported again under the new one (a first
			// reading there).
			c.log.Info("port degradation fault cleared under its old device name", "device", dev, "port", port, "reason", why)
			if c.degrOn(ps.LinkLayer) {
				emit(retiredEvent(dev, uint(port), ps.LinkLayer, why, true))
			}
		}
		if !ps.reported() || ps.Level == levelHealthy {
			// An unhealthy port never reported (uncabled as on its
			// peers, held with its card) is not a fault to carry over.
			continue
		}
		unhealthy = append(unhealthy, uint(port))
		c.log.Info("port fault cleared under its old device name", "device", dev, "port", port, "reason", why)
		if c.stateOn(ps.LinkLayer) {
			emit(retiredEvent(dev, uint(port), ps.LinkLayer, why, false))
		}
	}
	return unhealthy
}

// transition applies §3.4 to one port, updates its snapshot and returns the
// event to emit, if any. reportUnhealthy: a first observation unhealthy
// is reported (its card is below its peer mode, or the port was reported
// unhealthy under its device's former name), not taken for an uncabled
// port. withCard: it is reported because of its card, its fault saved
// as one lifted with the card's (WithCard, clearUncabled). hold: a first
// observation unhealthy is neither reported nor taken for an uncabled
// port: its card is held down (a first poll's port training or waiting
// for the SM), and the port is reported with it.
func (c *Check) transition(n *NIC, p *Port, prev *portState, reportUnhealthy, withCard, hold bool) *datamodels.HealthEvent {
	level, stName, phName := evaluate(p)
	key := portKey(p.Device, p.Port)
	if level == "" { // Ethernet INIT/ARMED: transient, not reported, snapshot kept
		c.log.Debug("RoCE port transient state not reported", "device", p.Device, "port", p.Port, "state", stName, "phys_state", phName)
		return nil
	}
	next := &portState{State: p.State, PhysState: p.PhysicalState, LinkLayer: p.LinkLayer, Level: level}
	if prev != nil {
		next.Counters, next.Breached = prev.Counters, prev.Breached
	}
	c.st.Ports[key] = next
	if prev == nil || prev.Level == "" {
		// First observation: a first poll (fresh node, reboot, corrupt
		// state) or a port that appeared since. Healthy → baseline;
		// unhealthy → reported only on a card below its peer mode or
		// after a rename (otherwise an uncabled port, suppressed).
		if level == levelHealthy {
			return portEvent(n, p, level, stName, phName)
		}
		if reportUnhealthy {
			next.WithCard = withCard
			return portEvent(n, p, level, stName, phName)
		}
		if hold {
			next.Level, next.Held = "", true
			c.log.Info("unhealthy port on a card held down: reported with its card", "device", p.Device, "port", p.Port, "state", stName, "phys_state", phName)
			return nil
		}
		c.log.Info("unhealthy port on a card at peer mode: uncabled, not reported", "device", p.Device, "port", p.Port, "state", stName, "phys_state", phName)
		next.Unreported = true
		return nil
	}
	var ev *datamodels.HealthEvent
	switch {
	case prev.Level == level:
	case level == levelHealthy:
		ev = portEvent(n, p, level, stName, phName)
	case prev.Level == levelHealthy:
		ev = portEvent(n, p, level, stName, phName)
	case prev.Level == levelNonFatal && level == levelFatal:
		// Escalation within unhealthy: reported so a port that went
		// INIT → DOWN is known fatal (§3.4's "unhealthy → unhealthy,
		// no event" is kept for same-severity and de-escalating changes).
		ev = portEvent(n, p, level, stName, phName)
	}
	next.Unreported = prev.Unreported && ev == nil
	next.WithCard = prev.WithCard && prev.Level == level
	return ev
}

// unreadablePast reports whether a port read this poll has stayed
// unreadable for cardHoldDown.
func (c *Check) unreadablePast(p *Port) bool {
	if p.ReadError == "" {
		return false
	}
	since, ok := c.portUnreadable[portKey(p.Device, p.Port)]
	return ok && c.now().Sub(since) >= cardHoldDown
}

// stateName strips the numeric id: "4: ACTIVE" → "ACTIVE".
func stateName(raw string) (int, string) {
	id, name, ok := strings.Cut(raw, ":")
	if !ok {
		return -1, strings.TrimSpace(raw)
	}
	n, err := strconv.Atoi(strings.TrimSpace(id))
	if err != nil {
		n = -1
	}
	return n, strings.TrimSpace(name)
}

// Kernel ids of the states that decide health.
const (
	stateDown         = 1
	stateInit         = 2
	stateArmed        = 3
	stateActive       = 4
	physSleep         = 1
	physPolling       = 2
	physDisabled      = 3
	physTraining      = 4 // PortConfigurationTraining
	physLinkUp        = 5
	physLinkErrorRecv = 6
)

// waitingForSM reports whether a port not active is on its way up: INIT or
// ARMED (waiting for the subnet manager; RoCE's brief transients), or its
// link training (Sleep, Polling, PortConfigurationTraining,
// LinkErrorRecovery). A port Disabled is not.
func waitingForSM(p *Port) bool {
	sid, _ := stateName(p.State)
	pid, _ := stateName(p.PhysicalState)
	switch {
	case pid == physDisabled:
		return false
	case sid == stateInit || sid == stateArmed:
		return true
	default:
		return pid == physSleep || pid == physPolling || pid == physTraining || pid == physLinkErrorRecv
	}
}

// roceNotUpYet reports whether a port is a RoCE port DOWN/Disabled: right
// after a boot, its net device not up yet. A first poll counts it as on
// its way up, as a port waiting for the SM (its card held down, not
// reported fatal at once with the port, and baselined once at peer mode:
// FirstHeld); still so past the hold-down, it is reported with its card.
func roceNotUpYet(p *Port) bool {
	sid, _ := stateName(p.State)
	pid, _ := stateName(p.PhysicalState)
	return p.LinkLayer == "Ethernet" && sid == stateDown && pid == physDisabled
}

// evaluate returns the health level of a port ("" for a RoCE INIT/ARMED
// transient that is not reported).
func evaluate(p *Port) (level, st, ph string) {
	sid, st := stateName(p.State)
	pid, ph := stateName(p.PhysicalState)
	switch {
	case sid == stateActive && pid == physLinkUp:
		return levelHealthy, st, ph
	case sid == stateDown || pid == physDisabled:
		return levelFatal, st, ph
	case p.LinkLayer == "Ethernet" && (sid == stateInit || sid == stateArmed):
		return "", st, ph
	default:
		return levelNonFatal, st, ph
	}
}

func checkName(linkLayer string, degradation bool) string {
	switch {
	case linkLayer == "Ethernet" && degradation:
		return EthernetDegradationCheck
	case linkLayer == "Ethernet":
		return EthernetStateCheck
	case degradation:
		return InfiniBandDegradationCheck
	default:
		return InfiniBandStateCheck
	}
}

func portEntities(dev string, port uint) []*datamodels.Entity {
	return []*datamodels.Entity{
		{EntityType: events.EntityNIC, EntityValue: dev},
		{EntityType: events.EntityNICPort, EntityValue: strconv.FormatUint(uint64(port), 10)},
	}
}

func newEvent(check, msg string, fatal, healthy bool, ents []*datamodels.Entity, md map[string]string) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{
		Version:           1,
		Agent:             Agent,
		ComponentClass:    ComponentClass,
		CheckName:         check,
		IsFatal:           fatal,
		IsHealthy:         healthy,
		Message:           msg,
		RecommendedAction: datamodels.RecommendedAction_NONE,
		EntitiesImpacted:  ents,
		Metadata:          md,
	}
	if fatal {
		ev.RecommendedAction = datamodels.RecommendedAction_REPLACE_VM
	}
	return ev
}

// portEvent builds the consolidated event of §3.4 / §13.1.
func portEvent(n *NIC, p *Port, level, st, ph string) *datamodels.HealthEvent {
	prefix := "Port"
	detail := fmt.Sprintf("state %s, phys_state %s", st, ph)
	healthy := fmt.Sprintf("healthy (%s, %s)", st, ph)
	if p.LinkLayer == "Ethernet" {
		prefix = "RoCE port"
		op := p.OperState
		if op == "" {
			op = "unknown"
		}
		detail += ", operstate " + op
		healthy = fmt.Sprintf("healthy (%s, %s, operstate %s)", st, ph, op)
	}
	msg := fmt.Sprintf("%s %s port %d: ", prefix, p.Device, p.Port)
	if level == levelHealthy {
		msg += healthy
	} else {
		msg += detail
	}
	md := map[string]string{
		"state": p.State, "phys_state": p.PhysicalState, "link_layer": p.LinkLayer,
		"role": string(n.Role), "pci_address": n.PCIAddress, "hca_type": n.HCAType, "fw_ver": n.FWVersion,
	}
	if p.NetDev != "" {
		md["net_dev"], md["operstate"] = p.NetDev, p.OperState
	}
	return newEvent(checkName(p.LinkLayer, false), msg, level == levelFatal, level == levelHealthy, portEntities(p.Device, p.Port), md)
}

// unreadableEvent is the fatal of a port whose state has stayed
// unreadable past the hold-down; its recovery is the port's healthy
// event once it reads ACTIVE/LinkUp again.
func unreadableEvent(n *NIC, p *Port) *datamodels.HealthEvent {
	prefix := "Port"
	if p.LinkLayer == "Ethernet" {
		prefix = "RoCE port"
	}
	msg := fmt.Sprintf("%s %s port %d: state unreadable: %s", prefix, p.Device, p.Port, p.ReadError)
	md := map[string]string{"link_layer": p.LinkLayer, "read_error": p.ReadError,
		"role": string(n.Role), "pci_address": n.PCIAddress, "hca_type": n.HCAType, "fw_ver": n.FWVersion}
	return newEvent(checkName(p.LinkLayer, false), msg, true, false, portEntities(p.Device, p.Port), md)
}

// retiredEvent clears a port fault (of the state or the degradation
// check) under a device name no longer reported (retirePorts), or of a
// port uncabled as on its peers once its card is back (clearUncabled).
func retiredEvent(dev string, port uint, linkLayer, why string, degradation bool) *datamodels.HealthEvent {
	prefix := "Port"
	if linkLayer == "Ethernet" && !degradation {
		prefix = "RoCE port"
	}
	msg := fmt.Sprintf("%s %s port %d: cleared, %s", prefix, dev, port, why)
	return newEvent(checkName(linkLayer, degradation), msg, false, true, portEntities(dev, port), map[string]string{"link_layer": linkLayer})
}

func deviceEvent(name, linkLayer string, back bool) *datamodels.HealthEvent {
	ents := []*datamodels.Entity{{EntityType: events.EntityNIC, EntityValue: name}}
	if back {
		return newEvent(checkName(linkLayer, false), fmt.Sprintf("NIC %s present again in /sys/class/infiniband/", name), false, true, ents, nil)
	}
	return newEvent(checkName(linkLayer, false), fmt.Sprintf("NIC %s disappeared from /sys/class/infiniband/ - hardware failure", name), true, false, ents, nil)
}

// card is one physical card (PCI bus:device) of monitored NICs. A card
// with a port unreadable this poll is left out of the homogeneity check:
// counting that port as inactive would report a healthy card below its
// peer mode (a false REPLACE_VM, which §4.1.2 ranks worse than a missed
// failure) — until the port has stayed unreadable for cardHoldDown
// (reported fatal itself then): from then on it counts as inactive.
type card struct {
	addr      string
	role      Role
	linkLayer string
	devices   []string
	active    int
	ports     int
	// waiting are its ports on their way up (waitingForSM), and on a
	// first poll its RoCE ports DOWN/Disabled (roceNotUpYet).
	waiting int
}

// cardKey is the card a NIC is counted in: its PCI bus:device, or its
// name when its PCI address is unknown (a card of its own).
func cardKey(n *NIC) string {
	if n.Card == "" {
		return n.Name
	}
	return n.Card
}

func (c *Check) cards() map[string]*card {
	out := map[string]*card{}
	unreadable := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(c.nics)) {
		n := c.nics[name]
		if !n.Monitored {
			continue
		}
		addr := cardKey(n)
		cd := out[addr]
		if cd == nil {
			cd = &card{addr: addr, role: n.Role, linkLayer: n.LinkLayer}
			out[addr] = cd
		}
		cd.devices = append(cd.devices, n.Name)
		for i := range n.Ports {
			cd.ports++
			if c.unreadablePast(&n.Ports[i]) {
				continue
			}
			if n.Ports[i].ReadError != "" {
				unreadable[addr] = true
			} else if lvl, _, _ := evaluate(&n.Ports[i]); lvl == levelHealthy {
				cd.active++
			} else if waitingForSM(&n.Ports[i]) || c.fresh && roceNotUpYet(&n.Ports[i]) {
				cd.waiting++
			}
		}
	}
	for addr := range unreadable {
		delete(out, addr)
	}
	return out
}

// peerSlots are the cards of a role group at its peer mode: how many, and
// per port slot (portSlot), how many of them have that port active.
type peerSlots struct {
	mode  int
	cards int
	up    map[string]int
}

// peerSlotsAt counts the port slots active on the cards of grp at mode.
func (c *Check) peerSlotsAt(grp []*card, mode int) *peerSlots {
	ps := &peerSlots{mode: mode, up: map[string]int{}}
	for _, cd := range grp {
		if cd.active < mode {
			continue
		}
		ps.cards++
		for _, name := range cd.devices {
			n := c.nics[name]
			for i := range n.Ports {
				if p := &n.Ports[i]; p.ReadError == "" {
					if lvl, _, _ := evaluate(p); lvl == levelHealthy {
						ps.up[portSlot(n, p.Port)]++
					}
				}
			}
		}
	}
	return ps
}

// active reports whether port p of n is active on most cards at peer
// mode (false: down there too, an uncabled port of every card).
func (ps *peerSlots) active(n *NIC, p *Port) bool {
	return ps != nil && 2*ps.up[portSlot(n, p.Port)] > ps.cards
}

// without returns ps less card cd, counted when at mode: a card is not
// its own peer.
func (ps *peerSlots) without(c *Check, cd *card) *peerSlots {
	if ps == nil || cd.active < ps.mode {
		return ps
	}
	out := &peerSlots{mode: ps.mode, cards: ps.cards - 1, up: maps.Clone(ps.up)}
	for _, name := range cd.devices {
		n := c.nics[name]
		for i := range n.Ports {
			if p := &n.Ports[i]; p.ReadError == "" {
				if lvl, _, _ := evaluate(p); lvl == levelHealthy {
					out.up[portSlot(n, p.Port)]--
				}
			}
		}
	}
	return out
}

// clearUncabled lifts, once card cd is back at its peer mode, the fault
// of each of its ports reported with it (§3.4, WithCard: not a port that
// reported its own fault before) and still down as the same port is on
// most of the other cards at mode (at least one): uncabled on every card,
// it crosses no boundary when the card is fixed, and its fatal would
// stand for ever. It gets a healthy event and is saved as an
// uncabled port on a card at mode is (its state, no event).
func (c *Check) clearUncabled(cd *card, peers *peerSlots, emit func(*datamodels.HealthEvent)) {
	others := peers.without(c, cd)
	if others == nil || others.cards == 0 {
		return // no peer to compare with: the fault stands
	}
	for _, name := range cd.devices {
		n := c.nics[name]
		for i := range n.Ports {
			p := &n.Ports[i]
			key := portKey(p.Device, p.Port)
			prev := c.st.Ports[key]
			if prev == nil || prev.Level != levelFatal || !prev.WithCard || p.ReadError != "" || !c.stateOn(p.LinkLayer) {
				continue
			}
			level, st, ph := evaluate(p)
			if level == levelHealthy || level == "" || others.active(n, p) {
				continue
			}
			c.st.Ports[key] = &portState{State: p.State, PhysState: p.PhysicalState, LinkLayer: p.LinkLayer, Level: level,
				Counters: prev.Counters, Breached: prev.Breached, Unreported: true}
			c.log.Info("port reported with its card down as on its peer cards: uncabled, fault cleared", "device", p.Device, "port", p.Port, "card", cd.addr, "state", st, "phys_state", ph)
			emit(retiredEvent(p.Device, p.Port, p.LinkLayer, "uncabled as on its peer cards: not a fault", false))
		}
	}
}

// portSlot names a port by its place on its card, the same on each card
// of a kind: its PCI function ("0" when unknown: a card of its own) and
// port number.
func portSlot(n *NIC, port uint) string {
	fn := "0"
	if i := strings.LastIndexByte(n.PCIAddress, '.'); i >= 0 {
		fn = n.PCIAddress[i+1:]
	}
	return fn + "/" + strconv.FormatUint(uint64(port), 10)
}

func groupByRole(cards map[string]*card) [][]*card {
	by := map[Role][]*card{}
	for _, addr := range slices.Sorted(maps.Keys(cards)) {
		cd := cards[addr]
		by[cd.role] = append(by[cd.role], cd)
	}
	var out [][]*card
	for _, r := range slices.Sorted(maps.Keys(by)) {
		out = append(out, by[r])
	}
	return out
}

// modeActive is the most common active-port count of a role group; a tie
// goes to the higher count (a tie means as many cards lost ports as kept
// them, and the design prefers reporting to masking).
func modeActive(grp []*card) int {
	count := map[int]int{}
	for _, cd := range grp {
		count[cd.active]++
	}
	best, bestN := 0, -1
	for v, n := range count {
		if n > bestN || (n == bestN && v > best) {
			best, bestN = v, n
		}
	}
	return best
}

// cardBaselineSets are the device sets a card's first-poll baseline names,
// the card's whole set first: a card fault names the devices present when
// it was raised (TestCardRecoveryNamesItsFault), fewer than the card holds
// if one was missing then, and the quarantine lifts only the same
// entities. So every non-empty subset, in the devices' order, for a card of
// up to 4 devices (at most 15 events; dual-PF cards: 3); for a larger one
// the whole set and each set missing one device.
func cardBaselineSets(devs []string) [][]string {
	out := [][]string{devs}
	if len(devs) > 4 {
		for i := range devs {
			out = append(out, slices.Delete(slices.Clone(devs), i, i+1))
		}
		return out
	}
	full := 1<<len(devs) - 1
	for mask := full - 1; mask > 0; mask-- {
		var sub []string
		for i, d := range devs {
			if mask&(1<<i) != 0 {
				sub = append(sub, d)
			}
		}
		out = append(out, sub)
	}
	return out
}

// retiredCardEvent clears a card fault that nothing else will (the
// device it names no longer monitored, the state check disabled), naming
// the entities the fault named.
func retiredCardEvent(addr string, f *cardFlag, why string) *datamodels.HealthEvent {
	ents := []*datamodels.Entity{{EntityType: events.EntityPCI, EntityValue: addr}}
	for _, d := range f.Devices {
		ents = append(ents, &datamodels.Entity{EntityType: events.EntityNIC, EntityValue: d})
	}
	md := map[string]string{"role": string(f.Role)}
	if f.Expected > 0 {
		md["expected"] = strconv.Itoa(f.Expected)
	}
	return newEvent(checkName(f.LinkLayer, false), fmt.Sprintf("Card %s (%s): cleared, %s", addr, f.Role, why), false, true, ents, md)
}

func cardEvent(cd *card, mode int, back bool) *datamodels.HealthEvent {
	ents := []*datamodels.Entity{{EntityType: events.EntityPCI, EntityValue: cd.addr}}
	for _, d := range cd.devices {
		ents = append(ents, &datamodels.Entity{EntityType: events.EntityNIC, EntityValue: d})
	}
	md := map[string]string{"role": string(cd.role), "active_ports": strconv.Itoa(cd.active), "expected": strconv.Itoa(mode)}
	if back {
		return newEvent(checkName(cd.linkLayer, false), fmt.Sprintf("Card %s (%s) has %d active ports, back at peer mode %d", cd.addr, cd.role, cd.active, mode), false, true, ents, md)
	}
	return newEvent(checkName(cd.linkLayer, false), fmt.Sprintf("Card %s (%s) has %d active ports, expected %d (peer mode)", cd.addr, cd.role, cd.active, mode), true, false, ents, md)
}

// counterEvents applies Appendix A to one port: a link_downed increase
// (after a first reading) is fatal each time; the other three are fatal
// once when above 0. ps.Breached holds what stands: a threshold counter
// until it is back at 0 (a counter reset), a link_downed increase until a
// later poll finds the link up (ACTIVE, LinkUp) with no further
// increase — a link that went down is over once it is back; flapping is
// what the quarantine's flap window and the correlator's
// RepeatedNICLinkFlap count. Once nothing stands, one healthy event
// clears the port: the quarantine keys a fault by check and entities, not
// by counter, so a healthy event while another counter stands would lift
// that one too. first (the port's first counter reading: a first poll
// without usable state — fresh node, reboot, corrupt state file — or a
// port seen since): a port with no counter above its threshold gets a
// healthy baseline, which clears the degradation fatals of a previous boot
// (its counters restarted at 0 with the host), as §3.4's baseline does
// for the state check. across (the first reading of this process, over
// an earlier process's persisted counters): a link_downed increase of
// more than 1 happened while no agent ran, at times not known — hours
// apart, maybe — and its "delta" (what RepeatedNICLinkFlap sums over its
// 10-minute window) is 1, the increase in "delta_total": three downs
// across an agent stopped for a night are no flap.
func counterEvents(p *Port, ps *portState, up, first, across bool) []*datamodels.HealthEvent {
	var out []*datamodels.HealthEvent
	stood := len(ps.Breached) > 0
	var clears, codes []string
	for _, name := range slices.Sorted(maps.Keys(p.Counters)) {
		v := p.Counters[name]
		md := map[string]string{"counter": name, "value": strconv.FormatUint(v, 10), "link_layer": p.LinkLayer}
		if name == CounterLinkDowned {
			prev, ok := ps.Counters[name]
			switch {
			case ok && v > prev:
				if ps.Breached == nil {
					ps.Breached = map[string]bool{}
				}
				ps.Breached[name] = true
				md["delta"] = strconv.FormatUint(v-prev, 10)
				msg := fmt.Sprintf("Port %s port %d: link_downed increased by %d (now %d)", p.Device, p.Port, v-prev, v)
				if across && v-prev > 1 {
					md["delta"], md["delta_total"] = "1", strconv.FormatUint(v-prev, 10)
					msg += " while the agent was not running: counted as one down (when each happened is not known)"
				}
				ev := newEvent(checkName(p.LinkLayer, true), msg, true, false, portEntities(p.Device, p.Port), md)
				ev.ErrorCode = []string{name}
				out = append(out, ev)
			case ps.Breached[name] && up:
				delete(ps.Breached, name)
				clears = append(clears, fmt.Sprintf("link up again, link_downed steady at %d", v))
			}
			continue
		}
		breached := ps.Breached[name]
		switch {
		case v > 0 && !breached:
			if ps.Breached == nil {
				ps.Breached = map[string]bool{}
			}
			ps.Breached[name] = true
			ev := newEvent(checkName(p.LinkLayer, true),
				fmt.Sprintf("Port %s port %d: %s is %d (threshold > 0)", p.Device, p.Port, name, v),
				true, false, portEntities(p.Device, p.Port), md)
			ev.ErrorCode = []string{name}
			out = append(out, ev)
		case v == 0 && breached:
			delete(ps.Breached, name)
			clears = append(clears, name+" back at 0")
			codes = append(codes, name)
		}
	}
	if len(ps.Breached) > 0 {
		return out
	}
	md := map[string]string{"link_layer": p.LinkLayer}
	switch {
	case stood && len(clears) > 0:
		// No link_downed error code: the correlator counts every
		// degradation event carrying one as a link-down.
		ev := newEvent(checkName(p.LinkLayer, true),
			fmt.Sprintf("Port %s port %d: %s", p.Device, p.Port, strings.Join(clears, ", ")),
			false, true, portEntities(p.Device, p.Port), md)
		ev.ErrorCode = codes
		out = append(out, ev)
	case first && !stood && len(p.Counters) > 0:
		out = append(out, newEvent(checkName(p.LinkLayer, true),
			fmt.Sprintf("Port %s port %d: healthy (no fatal counter above 0)", p.Device, p.Port),
			false, true, portEntities(p.Device, p.Port), md))
	}
	return out
}
