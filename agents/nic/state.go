package nic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/faultline/faultline/agents/topology"
)

// stateVersion is the version of the state file format.
const stateVersion = 1

// Health levels of a port.
const (
	levelHealthy  = "healthy"
	levelNonFatal = "nonfatal" // unhealthy, IsFatal=false (INIT, ARMED, Polling, LinkErrorRecovery on IB)
	levelFatal    = "fatal"
)

// portState is the persisted snapshot of one port.
type portState struct {
	State     string `json:"state"`
	PhysState string `json:"phys_state"`
	LinkLayer string `json:"link_layer"`
	Level     string `json:"level"`
	// Counters are the last read fatal counter values.
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Breached marks threshold counters already reported fatal.
	Breached map[string]bool `json:"breached,omitempty"`
	// Held marks a port unhealthy at its first observation, on a first
	// poll that held its card down: not reported yet (Level ""), it is
	// reported with its card past the hold-down, if still unhealthy.
	Held bool `json:"held,omitempty"`
	// Unreported marks a port saved unhealthy without its event: an
	// uncabled port (down at its first observation on a card at peer
	// mode, or down as on its peers). Absent from state written before
	// it: such a port reads as reported.
	Unreported bool `json:"unreported,omitempty"`
	// WithCard marks a port whose unhealthy state was reported with its
	// card (a first observation on a card below its peer mode, or held
	// with it), kept while its level stands: only such a fault is lifted
	// with the card's (clearUncabled), not one the port reported itself.
	// Absent from state written before it: such a fault stands.
	WithCard bool `json:"with_card,omitempty"`
}

// reported reports whether ps stands for a state the port's own event
// reported (not held, not saved unhealthy without its event).
func (ps *portState) reported() bool {
	return ps != nil && ps.Level != "" && !ps.Held && !ps.Unreported
}

// cardFlag is a card reported below its role's peer mode.
type cardFlag struct {
	Role      Role     `json:"role"`
	Expected  int      `json:"expected"`
	Devices   []string `json:"devices"`
	LinkLayer string   `json:"link_layer"`
}

// persisted is the state file (§2.2: port snapshots, known devices,
// counter snapshots, breach flags, boot id).
type persisted struct {
	Version int    `json:"version"`
	BootID  string `json:"boot_id"`
	// Ports is keyed "device/port".
	Ports map[string]*portState `json:"ports"`
	// KnownDevices are the monitored devices seen this boot, with their link
	// layer.
	KnownDevices map[string]string `json:"known_devices"`
	// KnownPCI is the PCI function of each known device: a known name
	// missing while its function backs a device of another name was
	// renamed, not lost.
	KnownPCI map[string]string `json:"known_pci,omitempty"`
	// Disappeared are known devices reported gone.
	Disappeared []string `json:"disappeared,omitempty"`
	// AnomalousCards are cards reported below peer mode, by card address.
	AnomalousCards map[string]*cardFlag `json:"anomalous_cards,omitempty"`
	// FirstHeld are the cards, by address, a first poll held down below
	// peer mode, without the healthy baseline a card at mode gets: sent
	// once they reach it (an earlier boot's card fault lifted), or dropped
	// when the card is reported. Saved so that an agent restarted within
	// the boot before the card is up still sends it; absent from state
	// written before it: no card waits for its baseline.
	FirstHeld []string `json:"first_held,omitempty"`
}

// firstHeld reports whether a first poll held card addr down, its
// baseline not sent yet.
func (p *persisted) firstHeld(addr string) bool { return slices.Contains(p.FirstHeld, addr) }

// setFirstHeld marks card addr held by a first poll (held) or done with
// (its baseline sent, or the card reported), keeping FirstHeld sorted.
func (p *persisted) setFirstHeld(addr string, held bool) {
	i, found := slices.BinarySearch(p.FirstHeld, addr)
	switch {
	case held && !found:
		p.FirstHeld = slices.Insert(p.FirstHeld, i, addr)
	case !held && found:
		p.FirstHeld = slices.Delete(p.FirstHeld, i, i+1)
	}
}

func newPersisted(bootID string) *persisted {
	return &persisted{Version: stateVersion, BootID: bootID, Ports: map[string]*portState{},
		KnownDevices: map[string]string{}, KnownPCI: map[string]string{}, AnomalousCards: map[string]*cardFlag{}}
}

func portKey(dev string, port uint) string { return fmt.Sprintf("%s/%d", dev, port) }

// maxStateBytes bounds the state file read at start: the state of a node
// with 64 dual-port devices is a few tens of KiB; a larger file is not
// one the check wrote (damaged, or state_file pointed at another file) and
// is not read into memory whole.
const maxStateBytes = 1 << 20

// loadState returns the persisted state and whether it is usable; the
// reason says why not (missing, corrupt, oversized, reboot), and bad
// whether that is a fault of the file (warned about) rather than a normal
// fresh start.
func loadState(path, bootID string) (st *persisted, reason string, bad bool) {
	if path == "" {
		return newPersisted(bootID), "no state file configured", false
	}
	b, err := topology.ReadCapped(path, maxStateBytes)
	if errors.Is(err, os.ErrNotExist) {
		return newPersisted(bootID), "state file missing", false
	}
	if err != nil {
		return newPersisted(bootID), "state file unreadable: " + err.Error(), true
	}
	var p persisted
	if err := json.Unmarshal(b, &p); err != nil || p.Version != stateVersion || p.Ports == nil {
		if err == nil {
			err = fmt.Errorf("version %d, ports %v", p.Version, p.Ports != nil)
		}
		return newPersisted(bootID), "state file corrupt: " + err.Error(), true
	}
	// A null entry (the file edited or damaged) would stop every poll.
	for k, v := range p.Ports {
		if v == nil {
			return newPersisted(bootID), fmt.Sprintf("state file corrupt: port %q is null", k), true
		}
	}
	for k, v := range p.AnomalousCards {
		if v == nil {
			return newPersisted(bootID), fmt.Sprintf("state file corrupt: card %q is null", k), true
		}
	}
	if p.BootID != bootID {
		return newPersisted(bootID), fmt.Sprintf("boot id changed (%s → %s): host rebooted", p.BootID, bootID), false
	}
	if p.KnownDevices == nil {
		p.KnownDevices = map[string]string{}
	}
	if p.KnownPCI == nil {
		p.KnownPCI = map[string]string{}
	}
	if p.AnomalousCards == nil {
		p.AnomalousCards = map[string]*cardFlag{}
	}
	slices.Sort(p.FirstHeld) // setFirstHeld searches it
	p.FirstHeld = slices.Compact(p.FirstHeld)
	return &p, "", false
}

// save writes the state atomically when it changed since last written.
func (p *persisted) save(path string, last *[]byte) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode NIC state: %w", err)
	}
	if bytes.Equal(b, *last) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("NIC state dir: %w", err)
	}
	if err := topology.AtomicWrite(path, b); err != nil {
		return err
	}
	*last = b
	return nil
}

// readBootID returns the boot id; an unreadable or empty file is an
// error ("" then).
func readBootID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("boot id unreadable: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("boot id %s is empty", path)
	}
	return id, nil
}
