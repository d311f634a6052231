// Package gpu is the node agent's GPU health check: DCGM-style health
// watches (memory/ECC, PCIe, NVLink, thermal, power, InfoROM) read through
// the small Source interface, each incident turned into a HealthEvent with
// the recommended action of a mapping table (dcgm_actions.json).
//
// The real Source is NVML (go-nvml, which loads libnvidia-ml.so.1 at run
// time through dlopen; the binary builds and starts without it). It
// evaluates the conditions DCGM's health watches evaluate and names them
// with DCGM's error codes, so the same table serves a DCGM hostengine
// Source. Tests use Replay, a recorded sequence of health responses.
//
// NVML is initialised at the start of each read and shut down at its end,
// not held for the agent's life: a process holding NVML makes
// "nvidia-smi -r" refuse to reset the GPU ("In use by another client"),
// the agent's own local GPU reset (agents/localaction) included, and holds
// the driver module through a GPU Operator driver upgrade. What a read
// needs of earlier ones (replay counter samples, link states, the last
// answers) is kept by GPU id (UUID), never by NVML handle.
//
// Check calls the source in a goroutine, one call at a time: NVML's calls
// are cgo and do not heed the context, and one on a hung GPU (Xid 119 GSP
// timeout, a task in D state) never returns. A call that has not answered
// by the poll's deadline loses the source (as below); the polls while it
// runs start no other, and its answer, when it comes, is the next poll's.
// NVML finding no driver or library is a node without GPUs (nothing
// reported) unless the node's GPU metadata (Config.Expected) names GPUs:
// then a driver that did not load, the source lost.
//
// Events (agent "faultline-agent", componentClass "GPU"): checkName
// "Gpu<System>Watch" (GpuMemWatch, GpuPcieWatch, GpuNvlinkWatch,
// GpuThermalWatch, GpuPowerWatch, GpuInforomWatch), errorCode the DCGM code
// ("DCGM_FR_VOLATILE_DBE_DETECTED"), entities GPU=<uuid> and PCI. Each
// (GPU, watch) is a state: an event when an incident appears or changes, an
// isHealthy event when it clears. Losing the health source is its own event
// (GpuDcgmConnectivityFailure, DCGM-CONNECTIVITY-FAILURE, not fatal), never
// raised while the node is still booting (uptime below BootGrace).
//
// That state lives in memory, so a new process (agent restart, rollout,
// node reboot) does not know what an earlier one reported unhealthy; the
// healthy event of a fault it raised would never come and the node would
// stay quarantined. So the first successful read of a process reports a
// healthy baseline (see Check.baseline): for each watch of Watches, an
// isHealthy event for each GPU the source read with no incident in it (the
// unhealthy ones are reported as usual, so their faults do not flap, and a
// GPU the source does not list keeps its faults: it may have fallen off
// the bus before this process started), and GpuDcgmConnectivityFailure one
// without entity. A source without inventory names only incidents: a
// watch with none gets one event naming no entity (it clears that check
// on the whole node). A GPU of Config.Expected (the node's GPU metadata)
// that the source does not list is reported lost (CodeGPULost), and
// baselined when it reads again; a listed GPU the source cannot name at all
// (neither UUID nor PCI address) is that GPU where it is the only one of
// each (identify), else named by its index: such a fault is lifted by this
// process's reads, never by a later process's baseline. A watch the source cannot tell yet on
// some GPU (GPU.Unknown: a rate before its second sample; GPU.Unbased: an
// NVLink unused since the start) is baselined on that GPU at the first read that can; the
// other GPUs do not wait for it. A fault in a watch a read cannot tell on
// its GPU stands: unknown is not healthy. No baseline before the source answers: while
// the node boots, a source not up yet reports nothing, as before.
package gpu

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Names of the events of this package.
const (
	Agent             = "faultline-agent"
	CheckConnectivity = "GpuDcgmConnectivityFailure"
	CodeConnectivity  = "DCGM-CONNECTIVITY-FAILURE"
	// CodeGPULost is the incident (Pcie watch) of a GPU that NVML reports
	// lost (fallen off the bus), or that the source does not list though
	// this process saw it or Config.Expected names it: fatal, RESTART_BM,
	// as kmsg's Xid 79 and fallen-off events.
	CodeGPULost = "DCGM_FR_FALLEN_OFF_BUS"
)

// ErrNotPresent is returned by a Source on a node without NVIDIA GPUs or
// driver; the check then reports nothing, unless Config.Expected names
// GPUs (a driver that did not load): then the source is lost.
var ErrNotPresent = errors.New("gpu: no NVIDIA GPU or driver on this node")

// Incident is one failed or warning health watch on one GPU.
type Incident struct {
	GPU     int    `json:"gpu"`
	UUID    string `json:"uuid"`
	PCI     string `json:"pci"`
	System  string `json:"system"` // Mem, Pcie, Nvlink, Thermal, Power, Inforom, Driver, Nvswitch
	Health  string `json:"health"` // WARN or FAIL
	Code    string `json:"code"`   // DCGM error code name, DCGM_FR_…
	Message string `json:"message"`
}

// Source reads the current health of every GPU.
type Source interface {
	Health(ctx context.Context) ([]Incident, error)
}

// GPU names one GPU as the events name it (GPU=<uuid, else gpu<index>>,
// PCI=<bus id>).
type GPU struct {
	Index int    `json:"gpu"`
	UUID  string `json:"uuid"`
	PCI   string `json:"pci"`
	// Unknown names the watches (systems: Pcie, Nvlink...) whose health
	// the last read could not tell for this GPU, so that no incident of
	// them does not mean healthy (not baselined, a fault in them stands):
	// a rate before its second sample, an NVLink whose fault stood when
	// the driver went away and not seen active since (down, or training),
	// one inactive at fewer reads than make it down, one seen active before
	// a driver reload, GPU reset or MIG mode and inactive since for less
	// than linkRetrain (training again), a query that failed.
	Unknown []string `json:"unknown,omitempty"`
	// Unbased names the watches that the last read tells well enough to
	// lift a fault this process raised in them (no incident now) but not
	// to send their healthy baseline on this GPU: an NVLink never seen
	// active since the process started, with no fault of it standing
	// (unused, or down since before the process: a fault an earlier
	// process raised must not be lifted).
	Unbased []string `json:"unbased,omitempty"`
}

// canBaseline reports whether the last read of g tells watch w well enough
// for its healthy baseline (neither Unknown nor Unbased).
func (g *GPU) canBaseline(w string) bool {
	return !slices.Contains(g.Unknown, w) && !slices.Contains(g.Unbased, w)
}

// Inventory is implemented by a Source that names every GPU of its last
// successful Health call. The healthy baseline of a watch in which some GPU
// is unhealthy names the others; without an inventory it knows only the
// GPUs named by incidents.
type Inventory interface {
	GPUs() []GPU
}

// Watches are the health watches (Incident.System) that the first
// successful read of a process reports healthy where they are (the healthy
// baseline): the six of the check names above.
var Watches = []string{"Mem", "Pcie", "Nvlink", "Thermal", "Power", "Inforom"}

//go:embed dcgm_actions.json
var actionsJSON []byte

// Rule is one row of the DCGM error → action table.
type Rule struct {
	Severity string `json:"severity"` // isolate or monitor
	Action   string `json:"action"`
}

// Actions is the DCGM error → action table.
type Actions map[string]Rule

// DefaultActions returns the embedded table.
func DefaultActions() (Actions, error) {
	var f struct {
		Codes Actions `json:"codes"`
	}
	if err := json.Unmarshal(actionsJSON, &f); err != nil {
		return nil, fmt.Errorf("dcgm_actions.json: %w", err)
	}
	for code, r := range f.Codes {
		if _, ok := datamodels.RecommendedAction_value[r.Action]; !ok {
			return nil, fmt.Errorf("dcgm_actions.json: %s: unknown action %q", code, r.Action)
		}
	}
	return f.Codes, nil
}

// Resolve returns an incident's action and fatality.
func (a Actions) Resolve(in Incident) (datamodels.RecommendedAction, bool) {
	r, ok := a[in.Code]
	if !ok {
		return datamodels.RecommendedAction_CONTACT_SUPPORT, strings.EqualFold(in.Health, "FAIL")
	}
	return datamodels.RecommendedAction(datamodels.RecommendedAction_value[r.Action]), r.Severity == "isolate"
}

// Config configures the GPU check (TOML section [gpu], flags --gpu.*).
type Config struct {
	// PollInterval is how often the check runs (default 30s).
	PollInterval time.Duration `toml:"poll_interval"`
	// BootGrace is how long after boot a lost health source is not
	// reported (the driver, DCGM and persistenced may still be starting;
	// default 10m).
	BootGrace time.Duration `toml:"boot_grace"`
	// Replay, when set, is a recording (see Replay) used instead of NVML:
	// for demos and tests on machines without GPUs.
	Replay string `toml:"replay"`
	// Source reads GPU health (default NewNVML(), or the Replay file).
	Source Source `toml:"-"`
	// Actions maps DCGM errors to actions (default DefaultActions()).
	Actions Actions `toml:"-"`
	// Uptime returns the time since boot (default reads /proc/uptime).
	Uptime func() (time.Duration, error) `toml:"-"`
	// Expected returns the GPUs the node is known to have, by UUID and
	// PCI address (default nil: not known). One of them that the source's
	// inventory does not list is missing: fatal CodeGPULost, as a GPU this
	// process saw and no longer lists. The agent reads them from the GPU
	// metadata (nic.metadata_path) at every poll.
	Expected func() []GPU `toml:"-"`
	// Now is the clock (default time.Now).
	Now func() time.Time `toml:"-"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `toml:"-"`
}

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	return Config{PollInterval: 30 * time.Second, BootGrace: 10 * time.Minute}
}

// RegisterFlags adds the check's flags under prefix ("gpu."), each named
// after its TOML key (--gpu.poll-interval), with c's values as defaults; the
// earlier spellings (--gpu-poll-interval, ...) still work, deprecated.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often the GPU health check runs")
	fs.DurationVar(&c.BootGrace, prefix+"boot-grace", c.BootGrace, "time after boot during which a lost DCGM/NVML connection is not reported")
	fs.StringVar(&c.Replay, prefix+"replay", c.Replay, "recorded health responses to play instead of NVML")
	// The spellings before flags were named after their TOML keys.
	config.Alias(fs, "gpu-poll-interval", prefix+"poll-interval")
	config.Alias(fs, "gpu-boot-grace", prefix+"boot-grace")
	config.Alias(fs, "gpu-replay", prefix+"replay")
}

// Validate names the first bad setting.
func (c *Config) Validate() error {
	if c.BootGrace < 0 {
		return errors.New("gpu.boot_grace: must not be negative")
	}
	if c.PollInterval < 0 {
		return errors.New("gpu.poll_interval: must not be negative")
	}
	return nil
}

// Check is the GPU health check.
type Check struct {
	cfg    Config
	mu     sync.Mutex
	bad    map[string]*datamodels.HealthEvent // "gpu|system" → its unhealthy event
	lost   *datamodels.HealthEvent
	absent bool
	// pending: the watches whose healthy baseline is still to be sent;
	// connBaselined: the connectivity check's was (or was not needed).
	pending       map[string]bool
	connBaselined bool
	// seen: the GPUs with a UUID that the source's inventory listed in this
	// process, or that Config.Expected names, by id.
	seen map[string]GPU
	// unbased: "gpu|watch" of the GPUs missing when the watch's baseline
	// was still to be sent: baselined when the GPU reads again.
	unbased map[string]bool
	// call is the Source.Health call in flight, or answered and not yet
	// taken (nil: none; see health).
	call *healthCall
}

// New returns the GPU check.
func New(cfg Config) (*Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Actions == nil {
		a, err := DefaultActions()
		if err != nil {
			return nil, err
		}
		cfg.Actions = a
	}
	if cfg.Source == nil && cfg.Replay != "" {
		r, err := LoadReplay(cfg.Replay)
		if err != nil {
			return nil, fmt.Errorf("gpu.replay: %w", err)
		}
		cfg.Source = r
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Source == nil {
		n := NewNVML()
		n.Logger = cfg.Logger
		cfg.Source = n
	}
	if cfg.BootGrace == 0 {
		cfg.BootGrace = 10 * time.Minute
	}
	if cfg.Uptime == nil {
		cfg.Uptime = procUptime
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pending := map[string]bool{}
	for _, w := range Watches {
		pending[w] = true
	}
	return &Check{cfg: cfg, bad: map[string]*datamodels.HealthEvent{}, pending: pending, seen: map[string]GPU{},
		unbased: map[string]bool{}}, nil
}

// Name implements check.Check.
func (c *Check) Name() string { return "gpu" }

// Check implements check.Check.
func (c *Check) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	incs, err := c.health(ctx)
	if errors.Is(err, ErrNotPresent) {
		if n := c.expectedGPUs(); n > 0 {
			// The node has GPUs (its metadata says so) and no driver or
			// library answers: one that did not load after a reboot.
			return c.lostSource(fmt.Errorf("%w, though the node's GPU metadata names %d GPU(s)", err, n))
		}
		if !c.absent {
			c.cfg.Logger.Info("no NVIDIA GPU on this node; gpu check idle")
		}
		c.absent = true
		return nil, nil
	}
	if err != nil {
		return c.lostSource(err)
	}
	var out []*datamodels.HealthEvent
	switch {
	case c.lost != nil:
		out = append(out, c.healthy(c.lost))
		c.lost = nil
	case !c.connBaselined:
		// A connectivity failure an earlier process raised.
		out = append(out, c.baselineEvent(CheckConnectivity, nil))
	}
	c.connBaselined = true
	// The GPUs this read tells (nil: the source names none, and a fault
	// without incident is lifted as before). A GPU it does not list is not
	// healthy: its faults stand, and one listed earlier in this process is
	// missing (fatal CodeGPULost) until it is listed again.
	// atIndex: "gpu<index>" → the GPU listed with a UUID at that index, so
	// that a fault this process raised under the index alone (nothing of
	// the GPU read yet) is lifted when that GPU tells its watch.
	// read: the GPUs listed, by id.
	var read map[string]GPU
	var atIndex map[string]GPU
	var gpus []GPU
	if inv, ok := c.cfg.Source.(Inventory); ok {
		if gpus = inv.GPUs(); gpus != nil {
			// A GPU listed twice (a recording can) is read as its first
			// listing, as baseline reads it: a later listing telling a
			// watch the first cannot sent its baseline one read late.
			ids := map[string]bool{}
			gpus = slices.DeleteFunc(slices.Clone(gpus), func(g GPU) bool {
				id := gpuID(Incident{GPU: g.Index, UUID: g.UUID})
				dup := ids[id]
				ids[id] = true
				return dup
			})
			var expected []GPU
			if c.cfg.Expected != nil {
				expected = c.cfg.Expected()
			}
			incs = identify(gpus, incs, expected)
			read, atIndex = map[string]GPU{}, map[string]GPU{}
			for _, g := range gpus {
				id := gpuID(Incident{GPU: g.Index, UUID: g.UUID})
				read[id] = g
				if g.UUID != "" {
					c.seen[id] = GPU{Index: g.Index, UUID: g.UUID, PCI: g.PCI}
					atIndex[gpuID(Incident{GPU: g.Index})] = g
				}
			}
			c.expect(gpus, expected)
			var missing []string
			for id := range c.seen {
				if _, ok := read[id]; !ok {
					missing = append(missing, id)
				}
			}
			sort.Strings(missing)
			for _, id := range missing {
				g := c.seen[id]
				incs = append(incs, Incident{GPU: g.Index, UUID: g.UUID, PCI: g.PCI, System: "Pcie", Health: "FAIL", Code: CodeGPULost,
					Message: "GPU no longer listed by the GPU health source (fallen off the bus?)"})
				for w := range c.pending {
					c.unbased[id+"|"+w] = true
				}
			}
		}
	}
	cur := map[string]*datamodels.HealthEvent{}
	for _, in := range incs {
		key := gpuID(in) + "|" + in.System
		if prev := cur[key]; prev != nil {
			// Several incidents of one watch: keep the most severe.
			if a, _ := c.cfg.Actions.Resolve(in); !prev.IsFatal && a != datamodels.RecommendedAction_NONE {
				cur[key] = c.event(in)
			}
			continue
		}
		cur[key] = c.event(in)
	}
	// A GPU missing when its watches were baselined, read again: its own
	// baseline (a fault this process raised recovers as usual). One that
	// could not be named then (no handle at the first read: waiting as
	// "gpu<index>") is the GPU this NVML session reads at its index now.
	var back []*datamodels.HealthEvent
	for i := range gpus {
		id := gpuID(Incident{GPU: gpus[i].Index, UUID: gpus[i].UUID})
		byIndex := gpuID(Incident{GPU: gpus[i].Index})
		for _, w := range Watches {
			k := id + "|" + w
			if c.pending[w] || !gpus[i].canBaseline(w) {
				continue
			}
			if gpus[i].UUID != "" && c.unbased[byIndex+"|"+w] {
				delete(c.unbased, byIndex+"|"+w)
				c.unbased[k] = true
			}
			if !c.unbased[k] {
				continue
			}
			delete(c.unbased, k)
			if cur[k] == nil && c.bad[k] == nil {
				back = append(back, c.gpuBaselines("Gpu"+w+"Watch", &gpus[i])...)
			}
		}
	}
	keys := make([]string, 0, len(cur)+len(c.bad))
	for k := range cur {
		keys = append(keys, k)
	}
	for k := range c.bad {
		if cur[k] == nil {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		prev, now := c.bad[k], cur[k]
		switch {
		case now != nil && (prev == nil || prev.ErrorCode[0] != now.ErrorCode[0]):
			c.bad[k] = now
			out = append(out, now)
		case now == nil && prev != nil:
			// A GPU not read, or read but not telling the watch (a failed
			// query, an NVLink whose fault stood when forgotten, not seen
			// active since), keeps its fault; Unbased does not keep it.
			if id, w, _ := strings.Cut(k, "|"); read != nil {
				g, ok := read[id]
				if !ok {
					g, ok = atIndex[id]
				}
				if !ok || slices.Contains(g.Unknown, w) {
					continue
				}
			}
			delete(c.bad, k)
			out = append(out, c.healthy(prev))
		}
	}
	if len(c.pending) > 0 {
		out = append(out, c.baseline(incs, cur, gpus)...)
	}
	return append(out, back...), nil
}

// healthCall is one Source.Health call, run in a goroutine of its own:
// NVML's calls are cgo and do not heed the context, and one on a hung GPU
// (Xid 119 GSP timeout, a task in D state) never returns.
type healthCall struct {
	start  time.Time
	done   chan struct{} // closed when Health returned (incs, err set)
	incs   []Incident
	err    error
	warned bool
}

// health returns the answer of a Source.Health call: the call in flight
// (one an earlier poll gave up on) or, when none is, one it starts. When
// ctx ends first it returns an error (the source is lost) and leaves the
// call running: no other is started while it runs, and its answer, when it
// comes, is taken by the next poll, not dropped: the source is back, and a
// source slower than the poll's deadline still reports every other poll.
// What it read is at most one poll old then, and the poll after reads
// afresh.
func (c *Check) health(ctx context.Context) ([]Incident, error) {
	if c.call == nil {
		c.call = c.startHealth(ctx)
	}
	call := c.call
	select {
	case <-call.done:
	default:
		select {
		case <-call.done:
		case <-ctx.Done():
			d := c.cfg.Now().Sub(call.start).Round(time.Second)
			if !call.warned {
				call.warned = true
				c.cfg.Logger.Warn("GPU health source did not answer; no other call until it does", "running", d)
			}
			return nil, fmt.Errorf("GPU health source did not answer within %s (a hung GPU?); no other call until it does", d)
		}
	}
	c.call = nil
	return call.incs, call.err
}

// startHealth starts a Source.Health call, with ctx's values but not its
// cancellation (the call may outlive the poll: see health). A panic of the
// source is its error: the call runs out of the runner's recovery.
func (c *Check) startHealth(ctx context.Context) *healthCall {
	call := &healthCall{start: c.cfg.Now(), done: make(chan struct{})}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer close(call.done)
		defer func() {
			if r := recover(); r != nil {
				call.incs, call.err = nil, fmt.Errorf("GPU health source panicked: %v", r)
			}
		}()
		call.incs, call.err = c.cfg.Source.Health(ctx)
	}()
	return call
}

// expectedGPUs is how many GPUs Config.Expected names (0 without it).
func (c *Check) expectedGPUs() int {
	if c.cfg.Expected == nil {
		return 0
	}
	return len(c.cfg.Expected())
}

// expect adds to seen the GPUs of Config.Expected (expected) that the
// inventory listed does not name (by UUID or PCI address), so that they
// are reported missing.
func (c *Check) expect(listed, expected []GPU) {
	for _, g := range unlisted(listed, expected) {
		if c.seen[g.UUID].UUID == "" {
			c.seen[g.UUID] = g
		}
	}
}

// unlisted returns the GPUs of expected (with a UUID) that listed does not
// name by UUID or PCI address (another GPU in its slot: replaced), named
// as NVML names them (PCI "00000000:bb:dd.f"), so that their fault is the
// one an earlier process raised when it lost them.
func unlisted(listed, expected []GPU) []GPU {
	uuids, pcis := map[string]bool{}, map[string]bool{}
	for _, g := range listed {
		uuids[g.UUID] = true
		if g.PCI != "" {
			pcis[events.NormalizePCI(g.PCI, true)] = true
		}
	}
	var out []GPU
	for _, g := range expected {
		if g.UUID == "" || uuids[g.UUID] {
			continue
		}
		if g.PCI != "" {
			p := events.NormalizePCI(g.PCI, true)
			if pcis[p] {
				continue
			}
			g.PCI = "0000" + p
		}
		out = append(out, GPU{Index: g.Index, UUID: g.UUID, PCI: g.PCI})
	}
	return out
}

// identify names the one listed GPU of which the source read neither UUID
// nor PCI address (NVML: lost, or no handle, before this process read it)
// as the one GPU of expected (the node's GPU metadata) that no listed GPU
// is, and the incidents named by its index alone with it (a copy of incs),
// so that its faults are those its recovery, or a later process's
// baseline, lifts: named "GPU=gpu<index>" they would stand for ever (the
// baseline never names a GPU by its index alone: after a reboot without a
// GPU the indexes shift). With several such GPUs, or several such expected
// ones, which is which is not known: they stay named by index (as without
// metadata), their faults lifted only by this process's reads of them.
func identify(listed []GPU, incs []Incident, expected []GPU) []Incident {
	at := -1
	for i, g := range listed {
		if g.UUID == "" && g.PCI == "" {
			if at >= 0 {
				return incs
			}
			at = i
		}
	}
	if at < 0 {
		return incs
	}
	missing := unlisted(listed, expected)
	if len(missing) != 1 {
		return incs
	}
	g := &listed[at]
	g.UUID, g.PCI = missing[0].UUID, missing[0].PCI
	incs = slices.Clone(incs)
	for i := range incs {
		if incs[i].GPU == g.Index && incs[i].UUID == "" && incs[i].PCI == "" {
			incs[i].UUID, incs[i].PCI = g.UUID, g.PCI
		}
	}
	return incs
}

// baseline reports, once a process, what is healthy in each watch still
// pending, so that faults an earlier process raised are lifted. With the
// source's inventory (listed: the GPUs this read named; nil without): one isHealthy event for each GPU it read and that
// has no incident in the watch, with the GPU's entities, so that a GPU it
// does not list (gone before this process started: its faults are not
// this process's to know) and an unhealthy GPU keep their faults. Without
// inventory (the source tells only incidents): a watch with no incident on
// any GPU, one isHealthy event without entity (the quarantine lifts every
// fault of that check on the node); a watch with some GPU unhealthy, one
// for each other GPU of the incidents. A GPU of the inventory that cannot
// tell the watch yet (GPU.Unknown, GPU.Unbased) is left out, and baselined alone at the
// first read that can (unbased). The events carry this read's
// time: after any fault of an earlier process, and clearing nothing of this
// read (no entity-less event for a watch with an incident now).
func (c *Check) baseline(incs []Incident, cur map[string]*datamodels.HealthEvent, listed []GPU) []*datamodels.HealthEvent {
	var gpus []GPU
	seen := map[string]bool{}
	add := func(g GPU) {
		if id := gpuID(Incident{GPU: g.Index, UUID: g.UUID}); !seen[id] {
			seen[id] = true
			gpus = append(gpus, g)
		}
	}
	inventory := listed != nil
	for _, g := range listed {
		add(g)
	}
	if !inventory {
		for _, in := range incs {
			add(GPU{Index: in.GPU, UUID: in.UUID, PCI: in.PCI})
		}
	}
	sort.SliceStable(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	var out []*datamodels.HealthEvent
	for _, w := range Watches {
		// With an inventory a GPU that cannot tell w waits alone (unbased),
		// the others are baselined now: one GPU's NVLink unused since the
		// start must not keep another's NVLink fault for ever.
		if !c.pending[w] || !inventory && slices.ContainsFunc(gpus, func(g GPU) bool { return !g.canBaseline(w) }) {
			continue
		}
		delete(c.pending, w)
		check := "Gpu" + w + "Watch"
		perGPU := inventory
		for k := range cur {
			perGPU = perGPU || strings.HasSuffix(k, "|"+w)
		}
		if !perGPU {
			out = append(out, c.baselineEvent(check, nil))
			continue
		}
		for i := range gpus {
			k := gpuID(Incident{GPU: gpus[i].Index, UUID: gpus[i].UUID}) + "|" + w
			if !gpus[i].canBaseline(w) {
				c.unbased[k] = true // baselined when it reads w
				continue
			}
			delete(c.unbased, k)
			if cur[k] == nil {
				out = append(out, c.gpuBaselines(check, &gpus[i])...)
			}
		}
	}
	return out
}

// baselineEvent is the isHealthy event of a baseline: of check on the whole
// node (g nil), or on one GPU.
// gpuBaselines are a GPU's healthy baselines of a watch: under its UUID,
// and, where it has a PCI address, under its index at that address, as a
// process that could not read its UUID (NVML's GPU_IS_LOST: a GPU fallen
// off the bus, or one gone before the process started) named its faults
// ("GPU=gpu3,PCI=…"): repaired, it would otherwise keep them for ever. Not
// under its index alone: after a reboot without a GPU the indexes shift,
// and gpu3 is another GPU.
func (c *Check) gpuBaselines(check string, g *GPU) []*datamodels.HealthEvent {
	out := []*datamodels.HealthEvent{c.baselineEvent(check, g)}
	if g.UUID != "" && g.PCI != "" {
		byIndex := *g
		byIndex.UUID = ""
		out = append(out, c.baselineEvent(check, &byIndex))
	}
	return out
}

func (c *Check) baselineEvent(check string, g *GPU) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: "GPU", CheckName: check, IsHealthy: true,
		Message: check + ": no incident on any GPU (healthy baseline of a new agent process)", RecommendedAction: datamodels.RecommendedAction_NONE,
		Metadata: map[string]string{"baseline": "true"}, GeneratedTimestamp: timestamppb.New(c.cfg.Now())}
	if check == CheckConnectivity {
		ev.Message = check + ": the GPU health source answered (healthy baseline of a new agent process)"
	}
	if g != nil {
		id := gpuID(Incident{GPU: g.Index, UUID: g.UUID})
		ev.Message = fmt.Sprintf("%s: no incident on GPU %d (healthy baseline of a new agent process)", check, g.Index)
		ev.EntitiesImpacted = entities(id, g.PCI)
		ev.Metadata["gpu_index"], ev.Metadata["gpu_uuid"] = strconv.Itoa(g.Index), g.UUID
	}
	return ev
}

// entities are the entities of a GPU's events.
func entities(id, pci string) []*datamodels.Entity {
	ents := []*datamodels.Entity{{EntityType: events.EntityGPU, EntityValue: id}}
	if pci != "" {
		ents = append(ents, &datamodels.Entity{EntityType: events.EntityPCI, EntityValue: pci})
	}
	return ents
}

func (c *Check) lostSource(err error) ([]*datamodels.HealthEvent, error) {
	if up, uerr := c.cfg.Uptime(); uerr == nil && up < c.cfg.BootGrace {
		c.cfg.Logger.Info("GPU health source not reachable while booting", "uptime", up, "err", err)
		return nil, nil
	}
	if c.lost != nil {
		return nil, nil
	}
	c.lost = &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: "GPU", CheckName: CheckConnectivity,
		Message: "GPU health source (DCGM/NVML) not reachable: " + err.Error(), RecommendedAction: datamodels.RecommendedAction_CONTACT_SUPPORT,
		ErrorCode: []string{CodeConnectivity}, Metadata: map[string]string{"error": err.Error()},
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: "dcgm"}},
		GeneratedTimestamp: timestamppb.New(c.cfg.Now())}
	return []*datamodels.HealthEvent{c.lost}, nil
}

func (c *Check) event(in Incident) *datamodels.HealthEvent {
	action, fatal := c.cfg.Actions.Resolve(in)
	ents := entities(gpuID(in), in.PCI)
	return &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: "GPU", CheckName: "Gpu" + in.System + "Watch",
		IsFatal: fatal, Message: fmt.Sprintf("GPU %d %s watch %s: %s", in.GPU, in.System, in.Health, in.Message),
		RecommendedAction: action, ErrorCode: []string{in.Code}, EntitiesImpacted: ents,
		Metadata: map[string]string{"gpu_index": strconv.Itoa(in.GPU), "gpu_uuid": in.UUID, "health": in.Health,
			"system": in.System, "dcgm_error": in.Code},
		GeneratedTimestamp: timestamppb.New(c.cfg.Now())}
}

func (c *Check) healthy(prev *datamodels.HealthEvent) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: prev.ComponentClass, CheckName: prev.CheckName,
		IsHealthy: true, Message: "recovered: " + prev.Message, RecommendedAction: datamodels.RecommendedAction_NONE,
		EntitiesImpacted: prev.EntitiesImpacted, Metadata: map[string]string{"recovered_error_code": prev.ErrorCode[0]},
		GeneratedTimestamp: timestamppb.New(c.cfg.Now())}
}

func gpuID(in Incident) string {
	if in.UUID != "" {
		return in.UUID
	}
	return "gpu" + strconv.Itoa(in.GPU)
}

func procUptime() (time.Duration, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty /proc/uptime")
	}
	s, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(s * float64(time.Second)), nil
}

// Replay is a Source that plays back recorded health responses, one per
// Health call, repeating the last: the recorded fake of the tests, and a
// way to demo the check without a GPU.
type Replay struct {
	mu    sync.Mutex
	Steps []ReplayStep `json:"steps"`
	i     int
	gpus  []GPU
}

// ReplayStep is one recorded response: incidents, or an error; GPUs, when
// recorded, is the inventory of that read (Inventory).
type ReplayStep struct {
	Incidents  []Incident `json:"incidents"`
	GPUs       []GPU      `json:"gpus,omitempty"`
	Error      string     `json:"error,omitempty"`
	NotPresent bool       `json:"notPresent,omitempty"`
}

// LoadReplay reads a recording (JSON {"steps":[…]}).
func LoadReplay(path string) (*Replay, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := parseReplay(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// parseReplay decodes a recording and checks each incident names what an
// event needs: a watch system and an error code the gateway takes as a
// check name and code, and a health of WARN or FAIL.
func parseReplay(b []byte) (*Replay, error) {
	r := &Replay{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, err
	}
	for i, s := range r.Steps {
		for j, in := range s.Incidents {
			at := fmt.Sprintf("steps[%d].incidents[%d]", i, j)
			switch {
			case !identifier(in.System, validate.MaxNameLen-len("GpuWatch")):
				return nil, fmt.Errorf("%s.system: want a watch name such as Mem or Nvlink, got %q", at, in.System)
			case !identifier(in.Code, validate.MaxErrorCodeLen):
				return nil, fmt.Errorf("%s.code: want an error code such as DCGM_FR_VOLATILE_DBE_DETECTED, got %q", at, in.Code)
			case !strings.EqualFold(in.Health, "WARN") && !strings.EqualFold(in.Health, "FAIL"):
				return nil, fmt.Errorf("%s.health: want WARN or FAIL, got %q", at, in.Health)
			}
		}
	}
	return r, nil
}

// identifier reports whether s is 1 to max letters, digits, '_' and '-'.
func identifier(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Health implements Source.
func (r *Replay) Health(ctx context.Context) ([]Incident, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.Steps) == 0 {
		return nil, nil
	}
	s := r.Steps[r.i]
	if r.i < len(r.Steps)-1 {
		r.i++
	}
	switch {
	case s.NotPresent:
		return nil, ErrNotPresent
	case s.Error != "":
		return nil, errors.New(s.Error)
	}
	r.gpus = s.GPUs
	return s.Incidents, nil
}

// GPUs implements Inventory: the GPUs recorded with the last step played
// that answered (none when it recorded none).
func (r *Replay) GPUs() []GPU {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.gpus)
}
