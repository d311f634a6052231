package fabric

import (
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Check names of the fabric check's events.
const (
	Agent = "faultline-agent"

	CheckService     = "FabricManagerService"
	CheckConfig      = "FabricManagerConfig"
	CheckInit        = "FabricManagerInit"
	CheckTraining    = "FabricManagerNVLinkTraining"
	CheckNVSwitch    = "FabricManagerNVSwitchError"
	CheckRuntime     = "FabricManagerRuntime"
	CheckPartition   = "FabricManagerPartition"
	CheckHA          = "FabricManagerHAMode"
	CheckState       = "GPUFabricState"
	CheckHealth      = "GPUFabricHealth"
	CheckNVLink      = "GPUNVLinkState"
	CheckGPUExcl     = "GPUExclusion"
	CheckSwitchExcl  = "NVSwitchExclusion"
	CheckReach       = "NVSwitchReachability"
	CheckNVLSM       = "NVLSMService"
	CheckNVLSMLog    = "NVLSMLog"
	CheckTelemetry   = "NVSwitchTelemetry"
	EntityPartition  = "FabricPartition"
	classNVSwitch    = "NVSwitch"
	classGPU         = "GPU"
	physicalIDPrefix = "physical:"
)

// Snapshot is what one poll of the node observed. A nil or unread field
// leaves the conditions it decides as they were.
type Snapshot struct {
	// Now is the poll's time (the operator command: the newest timestamp
	// of its inputs).
	Now time.Time
	// NVSwitchPCIs are the NVSwitches the driver bound
	// (/proc/driver/nvidia-nvswitch/devices, else /dev/nvidia-nvswitchN);
	// NVSwitchCount is their number (-1 not read).
	NVSwitchPCIs  []string
	NVSwitchCount int
	// PCISwitches / PCIGPUs: NVIDIA NVSwitch and GPU functions on the PCI
	// bus (sysfs), whether or not a driver bound them; nil not read.
	PCISwitches, PCIGPUs []string
	// NVLinkBridges counts the CX7 NVLink management functions (VPD
	// SW_MNG) of an HGX B200 (-1 not read).
	NVLinkBridges int
	// Service is the nvidia-fabricmanager unit.
	Service *ServiceState
	// NVLSMRunning: whether the NVLSM daemon runs (nil not known).
	NVLSMRunning *bool
	Config       *FMConfig
	// Log holds the FM log, journal and NVLSM log lines new since the
	// last poll, in order.
	Log []LogLine
	SMI *SMIReport
	// NVLink is nvidia-smi nvlink -s / -R; Topo is topo -m.
	NVLink []*NVLinkGPU
	Topo   *TopoMatrix
	// GPUInfo are /proc/driver/nvidia/gpus/*/information (nil not read).
	GPUInfo []GPUInformation
	// ExcludedListed is `nvidia-smi -B` (nil not read).
	ExcludedListed []GPUInformation
	Excludes       *ExcludeList
	// ExpectedGPUs are the node's GPUs as last collected by the topology
	// collector (gpu_metadata.json): UUID and PCI address.
	ExpectedGPUs []ExpectedGPU
	Audit        *AuditMatrix
	Partitions   *PartitionList
	Telemetry    *SwitchTelemetry
}

// ExpectedGPU is one GPU the node is known to have.
type ExpectedGPU struct{ UUID, PCI string }

// NewSnapshot returns an empty snapshot at now.
func NewSnapshot(now time.Time) *Snapshot {
	return &Snapshot{Now: now, NVSwitchCount: -1, NVLinkBridges: -1}
}

// EvalConfig tunes an Evaluator.
type EvalConfig struct {
	// Catalog defaults to DefaultCatalog().
	Catalog *Catalog
	// Platform forces the platform (a100, h100, b200); "" or "auto"
	// detects it.
	Platform string
	// InProgressTimeout: how long a GPU's fabric registration may stay In
	// Progress / Not Started after FM started (or after the check first
	// saw it; for a GPU that registered in this FM run and re-registers,
	// a GPU reset, after it was first seen so) before it is reported
	// (default 5m).
	InProgressTimeout time.Duration
	// Service is the FM unit name, for messages.
	Service string
	// BootGrace: how long after boot an FM unit that systemd has not
	// started yet this boot is not reported (default 10m).
	BootGrace time.Duration
}

// Evaluator turns snapshots into HealthEvents. Conditions (the service,
// a GPU's fabric state, an exclusion, ...) are reported when they turn bad
// or change, and once more, healthy, when they clear; log lines are
// occurrences, except FM initialization errors, which stand until FM
// reports a successful configuration again.
type Evaluator struct {
	cfg EvalConfig
	cat *Catalog

	bad     map[string]*datamodels.HealthEvent
	stale   map[string]bool // fmrun conditions of the previous FM run, not yet seen again
	pending map[string]time.Time
	// registered are the GPUs seen Completed in the current FM run
	// (runSince: the unit's ActiveSince it began at): one of them back In
	// Progress (a GPU reset) is timed from when it was first seen so, not
	// from FM's start. Not kept across a restart of the agent (nor is
	// pending): after one, a GPU re-registering is timed from FM's start.
	registered map[string]bool
	runSince   time.Time
	counter    map[string]float64

	// sticky context
	platform   PlatformInfo
	config     *FMConfig
	topo       *Topology
	product    string
	gpuByUUID  map[string]*GPUFabric
	gpuByMod   map[int]*GPUFabric
	gpuPCIs    map[string]bool
	fmStart    time.Time
	fmRunning  bool
	fmKnown    bool
	nvswitches []string

	// Across a restart of the agent (Resume): log lines dated before
	// reported were evaluated by the previous run, those before bootStart
	// belong to a previous boot; rebootClear: report the occurrence checks
	// healthy once (the node rebooted since the previous run).
	reported, bootStart time.Time
	rebootClear         bool
	// prevBoot are the GPU fabric conditions (gpu|...) of a previous boot
	// not raised again since: a GPU the rebooted node no longer lists lets
	// them clear (the reboot reset it; a GPU that failed to enumerate is
	// the exclusion conditions' to report).
	prevBoot map[string]bool
	// reportedLines are the lines dated at reported that the previous run
	// evaluated (lineHash: count; nil: not known, every line of that
	// second was); seenAtReported the same as resumed, not consumed.
	reportedLines, seenAtReported map[string]int
	// logUpTo is the newest log line evaluated, upToLines the lines dated
	// at it (nil once there are more than maxSecondLines).
	logUpTo   time.Time
	upToLines map[string]int
}

// maxSecondLines bounds the lines of one second kept to tell them from
// lines written later in that second; past it, a restart takes every
// line of that second for one the previous run evaluated.
const maxSecondLines = 1024

// NewEvaluator returns an Evaluator.
func NewEvaluator(cfg EvalConfig) (*Evaluator, error) {
	if cfg.Catalog == nil {
		c, err := DefaultCatalog()
		if err != nil {
			return nil, err
		}
		cfg.Catalog = c
	}
	if cfg.InProgressTimeout == 0 {
		cfg.InProgressTimeout = 5 * time.Minute
	}
	if cfg.Service == "" {
		cfg.Service = "nvidia-fabricmanager"
	}
	if cfg.BootGrace == 0 {
		cfg.BootGrace = 10 * time.Minute
	}
	switch cfg.Platform {
	case "", "auto", PlatformA100, PlatformH100, PlatformB200:
	default:
		return nil, fmt.Errorf("fabric.platform: %q is not auto, a100, h100 or b200", cfg.Platform)
	}
	return &Evaluator{cfg: cfg, cat: cfg.Catalog, bad: map[string]*datamodels.HealthEvent{}, stale: map[string]bool{}, pending: map[string]time.Time{},
		registered: map[string]bool{}, counter: map[string]float64{}, platform: PlatformInfo{NVSwitches: -1, PCISwitches: -1, NVLinkBridges: -1, GPUs: -1},
		gpuByUUID: map[string]*GPUFabric{}, gpuByMod: map[int]*GPUFabric{}, gpuPCIs: map[string]bool{}}, nil
}

// Platform is the platform the evaluator currently assumes.
func (e *Evaluator) Platform() PlatformInfo { return e.platform }

// Topology is the NVSwitch port map learned from nvlink -R (nil before).
func (e *Evaluator) Topology() *Topology { return e.topo }

// out collects one evaluation's events.
type out struct {
	evs []*datamodels.HealthEvent
	// occ are the occurrence events of log lines, with the line's ordinal
	// in its second (Evaluator.lineOrdinal): they get ids of their own.
	occ []occurrence
}

type occurrence struct {
	ev *datamodels.HealthEvent
	n  int
}

func (o *out) add(ev *datamodels.HealthEvent) {
	if ev != nil {
		o.evs = append(o.evs, ev)
	}
}

// addOccurrence adds the event of the occurrence a log line is; n is the
// line's ordinal in its second, 0 when unknown.
func (o *out) addOccurrence(ev *datamodels.HealthEvent, n int) {
	o.add(ev)
	if n > 0 {
		o.occ = append(o.occ, occurrence{ev, n})
	}
}

// occurrenceIDs gives each occurrence event of a log line with a time an
// id made of the event (events.OccurrenceID) and the line's ordinal among
// the same lines of its second (FM's log prints whole seconds: a line
// repeated in one second is as many occurrences): the lines a restart
// reads again — the agent killed after their events were spooled, before
// Commit saved the position past them, or a state it could not save —
// make the same events, stored and counted once, not again under new
// ids. The line's own time tells it from the lines of every other boot.
func (o *out) occurrenceIDs() {
	for _, oc := range o.occ {
		if oc.ev.GetId() == "" {
			oc.ev.Id = events.HashID("faultline-fabric/v1", strconv.Itoa(oc.n), events.OccurrenceID(oc.ev))
		}
	}
}

// Evaluate returns the events of one snapshot.
func (e *Evaluator) Evaluate(s *Snapshot) []*datamodels.HealthEvent {
	o := &out{}
	e.learn(s)
	if e.rebootClear {
		e.rebootClear = false
		e.clearOccurrences(o, s.Now)
	}
	if s.Config != nil {
		e.sync(o, "cfg", e.configConds(s), s.Now)
	}
	if s.Excludes != nil {
		e.sync(o, "cfgx", e.excludeConfigConds(s), s.Now)
	}
	svc := s.Service
	for _, ll := range s.Log {
		e.evaluated(ll, s.Now)
		if ll.Source == SourceSystemd {
			if st := systemdLineState(ll); st != nil && s.Service == nil {
				svc = st
			}
			continue
		}
		e.logLine(o, s, ll)
	}
	if svc != nil {
		e.sync(o, "svc", e.serviceConds(s, svc), s.Now)
	}
	if s.NVLSMRunning != nil {
		e.sync(o, "nvlsmproc", e.nvlsmConds(s, svc), s.Now)
	}
	if s.SMI != nil {
		e.sync(o, "gpu", e.gpuConds(s), s.Now)
	}
	if s.NVLink != nil && hasStatus(s.NVLink) {
		e.sync(o, "link", e.linkConds(s), s.Now)
	}
	if s.NVSwitchCount >= 0 || s.PCISwitches != nil {
		e.sync(o, "swcount", e.switchCountConds(s), s.Now)
	}
	if s.GPUInfo != nil || s.ExcludedListed != nil || s.Excludes != nil || s.PCIGPUs != nil || s.PCISwitches != nil || (s.SMI != nil && len(s.ExpectedGPUs) > 0) {
		e.sync(o, "excl", e.exclusionConds(s), s.Now)
	}
	if s.Audit != nil {
		e.sync(o, "audit", e.auditConds(s), s.Now)
	}
	if s.Partitions != nil {
		e.sync(o, "part", e.partitionConds(s), s.Now)
	}
	if s.Telemetry != nil {
		e.telemetry(o, s)
	}
	// Whatever the outputs held, the gateway takes the events (one it
	// refused, the agent would drop); a log line dated after the poll is
	// dated at the poll, its printed time kept in the metadata's line.
	for _, ev := range o.evs {
		validate.Clean(ev, s.Now)
	}
	o.occurrenceIDs()
	return o.evs
}

func hasStatus(gs []*NVLinkGPU) bool {
	for _, g := range gs {
		for _, l := range g.Links {
			if l.Status != "" {
				return true
			}
		}
	}
	return false
}

// learn updates the sticky context (platform, config, GPUs, topology).
func (e *Evaluator) learn(s *Snapshot) {
	if s.Config != nil {
		e.config = s.Config
	}
	if s.SMI != nil {
		gpus := 0
		for i := range s.SMI.GPUs {
			g := &s.SMI.GPUs[i]
			gpus++
			if g.Product != "" && e.product == "" || (g.Product != "" && !g.NoFabric()) {
				e.product = g.Product
			}
			if g.UUID != "" {
				e.gpuByUUID[g.UUID] = g
			}
			if g.ModuleID >= 0 {
				e.gpuByMod[g.ModuleID] = g
			}
			if g.PCI != "" {
				e.gpuPCIs[pci4(g.PCI)] = true
			}
		}
		if gpus > 0 {
			e.platform.GPUs = gpus
		}
	}
	if s.NVSwitchCount >= 0 {
		e.platform.NVSwitches = s.NVSwitchCount
		e.nvswitches = s.NVSwitchPCIs
		if s.NVSwitchCount == 0 && len(s.PCISwitches) > 0 {
			// The driver bound none: the node's switches are those on PCI.
			e.nvswitches = slices.Sorted(slices.Values(s.PCISwitches))
		}
	}
	pciSwitches := e.platform.PCISwitches
	if s.PCISwitches != nil {
		pciSwitches = len(s.PCISwitches)
	}
	if s.NVLinkBridges >= 0 {
		e.platform.NVLinkBridges = s.NVLinkBridges
	}
	if s.NVLink != nil {
		byUUID := map[string]string{}
		for u, g := range e.gpuByUUID {
			byUUID[u] = g.PCI
		}
		for _, g := range s.NVLink {
			if g.Name != "" && e.product == "" {
				e.product = g.Name
			}
		}
		t := BuildTopology(s.NVLink, e.gpuPCIs, byUUID)
		if len(t.Access) > 0 {
			e.topo = t
			if e.platform.NVSwitches < 0 {
				e.platform.NVSwitches = len(t.Switches)
			}
		}
	}
	e.platform = DetectPlatform(e.cfg.Platform, e.product, e.platform.NVSwitches, e.platform.NVLinkBridges, e.platform.GPUs)
	e.platform.PCISwitches = pciSwitches
	if e.platform.Name == "" && pciSwitches > e.platform.NVSwitches {
		// The driver bound fewer switches than the PCI bus shows: the bus
		// tells the board.
		e.platform.Name = DetectPlatform("", "", pciSwitches, 0, -1).Name
	}
	if s.Service != nil {
		e.fmKnown = true
		e.fmRunning = s.Service.Running()
		if !s.Service.ActiveSince.IsZero() && s.Service.Running() {
			e.fmStart = s.Service.ActiveSince
			if !e.runSince.Equal(s.Service.ActiveSince) {
				// A new FM run: its GPUs register again.
				e.runSince = s.Service.ActiveSince
				clear(e.registered)
			}
		}
	}
}

func pci4(s string) string { return strings.ToLower(normPCI(s)) }

// unboundSwitches are the NVSwitches on the PCI bus that the NVSwitch
// driver does not use, as pci4 addresses, sorted.
func (s *Snapshot) unboundSwitches() []string {
	bound := map[string]bool{}
	for _, p := range s.NVSwitchPCIs {
		bound[pci4(p)] = true
	}
	var unbound []string
	for _, p := range s.PCISwitches {
		if !bound[pci4(p)] {
			unbound = append(unbound, pci4(p))
		}
	}
	sort.Strings(unbound)
	return unbound
}

// --- condition bookkeeping ---

type cond struct {
	key string
	ev  *datamodels.HealthEvent
}

// sync reports the conditions of a family that turned bad or changed code
// and the healthy event of those that cleared.
func (e *Evaluator) sync(o *out, family string, now []cond, t time.Time) {
	seen := map[string]bool{}
	for _, c := range now {
		k := family + "|" + c.key
		seen[k] = true
		o.add(e.raise(k, c.ev))
	}
	var gone []string
	for k := range e.bad {
		if strings.HasPrefix(k, family+"|") && !seen[k] {
			gone = append(gone, k)
		}
	}
	sort.Strings(gone)
	for _, k := range gone {
		o.add(e.clear(k, t))
	}
}

func (e *Evaluator) raise(key string, ev *datamodels.HealthEvent) *datamodels.HealthEvent {
	delete(e.stale, key)
	delete(e.prevBoot, key)
	prev := e.bad[key]
	if prev != nil && prev.ErrorCode[0] == ev.ErrorCode[0] {
		return nil
	}
	e.bad[key] = ev
	return ev
}

func (e *Evaluator) clear(key string, t time.Time) *datamodels.HealthEvent {
	prev := e.bad[key]
	if prev == nil {
		return nil
	}
	delete(e.bad, key)
	return &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: prev.ComponentClass, CheckName: prev.CheckName,
		IsHealthy: true, Message: "recovered: " + prev.Message, RecommendedAction: datamodels.RecommendedAction_NONE,
		EntitiesImpacted: prev.EntitiesImpacted, Metadata: map[string]string{"recovered_error_code": prev.ErrorCode[0]},
		GeneratedTimestamp: timestamppb.New(t)}
}

// standing returns a family's condition key as it stands (none when it
// does not): given to sync, it neither reports it again nor clears it.
func (e *Evaluator) standing(family, key string) []cond {
	if ev := e.bad[family+"|"+key]; ev != nil {
		return []cond{{key, ev}}
	}
	return nil
}

// markStale marks the standing conditions of a family as belonging to a
// previous run (FM restarted): the new run's initialization either reports
// them again (they stand, without a new event) or ends with a successful
// configuration (clearStale reports them healthy).
func (e *Evaluator) markStale(family string) {
	for k := range e.bad {
		if strings.HasPrefix(k, family+"|") {
			e.stale[k] = true
		}
	}
}

// clearStale clears the conditions of a family that the current run did not
// report again.
func (e *Evaluator) clearStale(o *out, family string, t time.Time) {
	var keys []string
	for k := range e.stale {
		if strings.HasPrefix(k, family+"|") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		delete(e.stale, k)
		o.add(e.clear(k, t))
	}
}

func (e *Evaluator) ev(t time.Time, class, check, code string, fatal bool, action datamodels.RecommendedAction, msg string,
	ents []*datamodels.Entity, meta map[string]string) *datamodels.HealthEvent {
	for k, v := range meta {
		if v == "" {
			delete(meta, k)
		}
	}
	return &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: class, CheckName: check, IsFatal: fatal,
		Message: msg, RecommendedAction: action, ErrorCode: []string{code}, EntitiesImpacted: ents, Metadata: meta,
		GeneratedTimestamp: timestamppb.New(t)}
}

func (e *Evaluator) mode() string { return e.config.Mode() }

// --- across restarts of the agent and reboots of the node ---

// Standing is what an Evaluator keeps across a restart of the agent (the
// check's state file).
type Standing struct {
	// Conditions are the unhealthy conditions that stand, by key.
	Conditions map[string]*datamodels.HealthEvent
	// Reported: the log lines dated before it were evaluated (their
	// occurrences sent): the newest line evaluated.
	Reported time.Time
	// ReportedLines are the lines dated at Reported that were evaluated
	// (lineHash, repeated for a line evaluated more than once): FM's log
	// prints whole seconds, so a line written later in that second is
	// told from them. Nil: not known, every line of that second was.
	ReportedLines []string
}

// Standing returns what stands now.
func (e *Evaluator) Standing() Standing {
	c := make(map[string]*datamodels.HealthEvent, len(e.bad))
	for k, v := range e.bad {
		c[k] = v
	}
	st := Standing{Conditions: c, Reported: e.reported}
	lines := e.seenAtReported
	switch {
	case e.logUpTo.After(e.reported):
		st.Reported, lines = e.logUpTo, e.upToLines
	case e.logUpTo.Equal(e.reported) && lines != nil:
		// Those the previous run evaluated and those this one did (the
		// same lines read again by the replay counted once).
		merged := make(map[string]int, len(lines)+len(e.upToLines))
		for h, n := range lines {
			merged[h] = n
		}
		for h, n := range e.upToLines {
			merged[h] = max(merged[h], n)
		}
		lines = merged
		if e.upToLines == nil || len(lines) > maxSecondLines {
			lines = nil
		}
	}
	if !st.Reported.IsZero() && lines != nil {
		st.ReportedLines = []string{}
		for h, n := range lines {
			for range n {
				st.ReportedLines = append(st.ReportedLines, h)
			}
		}
		sort.Strings(st.ReportedLines)
	}
	return st
}

// evaluated notes a log line of the poll at now as evaluated.
func (e *Evaluator) evaluated(ll LogLine, now time.Time) {
	if ll.Time.IsZero() || ll.Time.After(now) || ll.Time.Before(e.logUpTo) {
		return
	}
	if ll.Time.After(e.logUpTo) {
		e.logUpTo, e.upToLines = ll.Time, map[string]int{}
		if ll.Resumed && ll.Time.Equal(e.reported) {
			// Read on from the position the previous run committed: the
			// lines of this second it evaluated are not read again, so
			// the count goes on from them (a line repeated in the second
			// gets the next ordinal, not the id of the one reported).
			e.upToLines = nil
			if e.seenAtReported != nil {
				e.upToLines = maps.Clone(e.seenAtReported)
			}
		}
	}
	if e.upToLines == nil {
		return
	}
	if e.upToLines[lineHash(ll)]++; len(e.upToLines) > maxSecondLines {
		e.upToLines = nil
	}
}

// lineOrdinal is how many times a line the same as ll was evaluated in
// its second, itself included (evaluated counts them); 0 when not known:
// a line without a time, out of order, or in a second of too many lines.
func (e *Evaluator) lineOrdinal(ll LogLine) int {
	if ll.Time.IsZero() || !ll.Time.Equal(e.logUpTo) || e.upToLines == nil {
		return 0
	}
	return e.upToLines[lineHash(ll)]
}

// lineHash identifies a log line among those of its second.
func lineHash(ll LogLine) string {
	h := fnv.New64a()
	h.Write([]byte(ll.Source))
	h.Write([]byte{0})
	h.Write([]byte(ll.Raw))
	return strconv.FormatUint(h.Sum64(), 16)
}

// Resume continues from what a previous run of the agent left: its
// standing conditions are cleared when a poll finds them over (a fault
// that cleared while the agent was down, or that a reboot remediated,
// otherwise stood in the quarantine for ever: nothing else reports it
// healthy), and the FM log's replay does not send its occurrences again.
// bootStart is this boot's start (zero: unknown): an occurrence before it
// belongs to a previous boot. newBoot: the node rebooted since the
// previous run; the reboot reset the NVSwitches and GPUs, so the checks
// whose faults are occurrences (SXids, partition errors, telemetry
// counters: no line says they cleared) are reported healthy once, without
// an entity, dated at the boot's start, and the FM run of the previous boot
// is over (its initialization errors clear with this run's successful
// configuration).
func (e *Evaluator) Resume(st Standing, bootStart time.Time, newBoot bool) {
	for k, v := range st.Conditions {
		if v != nil && len(v.ErrorCode) > 0 {
			e.bad[k] = v
		}
	}
	e.reported, e.bootStart = st.Reported, bootStart
	e.reportedLines, e.seenAtReported = nil, nil
	if st.ReportedLines != nil {
		e.reportedLines, e.seenAtReported = map[string]int{}, map[string]int{}
		for _, h := range st.ReportedLines {
			e.reportedLines[h]++
			e.seenAtReported[h]++
		}
	}
	if newBoot {
		e.rebootClear = true
		e.prevBoot = map[string]bool{}
		for k := range e.bad {
			if strings.HasPrefix(k, "gpu|") {
				e.prevBoot[k] = true
			}
		}
		e.markStale("fmrun")
		e.markStale("nvlsm")
	}
}

// SetBootStart sets the start of this boot (an occurrence before it belongs
// to a previous boot).
func (e *Evaluator) SetBootStart(t time.Time) { e.bootStart = t }

// past reports a log line that a previous run of the agent evaluated, or
// that belongs to a previous boot. Only the first read's lines (the log's
// tail replayed at start) can be of a previous boot: a line written while
// the agent reads the log is this boot's whatever its time says — FM's log
// is in the host's local time, which the agent reads as its own zone (UTC
// in the DaemonSet's container), so on a host west of UTC every line of
// the first hours after boot reads as older than the boot (/proc/stat
// btime, zone-free). Nor can any other read hold lines the previous run
// evaluated, nor the first when it went on from the position that run
// committed (Resumed). Where that position could not be used (the log
// rotated or truncated meanwhile, no position saved), the replayed tail's
// lines dated before the last one that run evaluated are past, and those
// dated in its second if they are among the lines that run evaluated in
// that second (the log prints whole seconds: one written after its last
// poll in that second is new); each of those is taken for one line read
// again, so a line repeated verbatim in that second is reported as often
// as it was not evaluated.
func (e *Evaluator) past(ll LogLine) bool {
	if ll.Time.IsZero() {
		return false
	}
	if ll.Replayed && ll.Time.Before(e.bootStart) {
		return true
	}
	if !ll.Replayed || ll.Resumed || e.reported.IsZero() || ll.Time.After(e.reported) {
		return false
	}
	if ll.Time.Before(e.reported) || e.reportedLines == nil {
		return true
	}
	h := lineHash(ll)
	if e.reportedLines[h] == 0 {
		return false
	}
	e.reportedLines[h]--
	return true
}

// occurrenceChecks are the checks whose fatal events are occurrences.
var occurrenceChecks = []string{CheckNVSwitch, CheckPartition, CheckTelemetry}

func (e *Evaluator) clearOccurrences(o *out, now time.Time) {
	if !e.platform.HasFabric() {
		return // no NVSwitch: none of these occurs
	}
	at := e.bootStart
	if at.IsZero() || at.After(now) {
		at = now
	}
	for _, check := range occurrenceChecks {
		standing := false
		for _, ev := range e.bad {
			standing = standing || ev.CheckName == check
		}
		if standing {
			continue // a no-entity recovery would lift the condition that stands
		}
		o.add(&datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: classNVSwitch, CheckName: check, IsHealthy: true,
			Message:           check + ": the node rebooted since the previous run of the agent (NVSwitches and GPUs reset): its occurrences of the previous boot are over",
			RecommendedAction: datamodels.RecommendedAction_NONE, Metadata: map[string]string{"reason": "reboot"},
			GeneratedTimestamp: timestamppb.New(at)})
	}
}

// --- entities ---

func gpuEntities(id, pci string) []*datamodels.Entity {
	ents := []*datamodels.Entity{{EntityType: events.EntityGPU, EntityValue: id}}
	if pci != "" && pci != id {
		ents = append(ents, &datamodels.Entity{EntityType: events.EntityPCI, EntityValue: pci})
	}
	return ents
}

func switchEntity(id string) *datamodels.Entity {
	return &datamodels.Entity{EntityType: events.EntityNVSwitch, EntityValue: id}
}

// nodeEntities are the entities of a node-wide fabric condition: the
// NVSwitches when known, else the FM service.
func (e *Evaluator) nodeEntities() []*datamodels.Entity {
	if len(e.nvswitches) > 0 {
		var ents []*datamodels.Entity
		for _, s := range e.nvswitches {
			ents = append(ents, switchEntity(s))
		}
		return ents
	}
	return []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: e.cfg.Service}}
}

// gpuRef resolves the GPU a message names (UUID, physical/module id or
// PCI address).
func (e *Evaluator) gpuRef(r Refs) (id, pci string, ok bool) {
	switch {
	case r.GPUUUID != "":
		if g := e.gpuByUUID[r.GPUUUID]; g != nil {
			return g.UUID, g.PCI, true
		}
		return r.GPUUUID, "", true
	case r.PCI != "" && e.gpuPCIs[pci4(r.PCI)]:
		for _, g := range e.gpuByUUID {
			if pci4(g.PCI) == pci4(r.PCI) {
				return g.ID(), g.PCI, true
			}
		}
		return pci4(r.PCI), pci4(r.PCI), true
	case r.GPUPhysID >= 0:
		if e.platform.Name != PlatformA100 {
			// H100 and later: the physical id is the Module ID.
			if g := e.gpuByMod[r.GPUPhysID]; g != nil {
				return g.ID(), g.PCI, true
			}
		}
		return physicalIDPrefix + strconv.Itoa(r.GPUPhysID), "", true
	}
	return "", "", false
}

// --- the FM service ---

// systemdLineState reads systemd's journal lines about the unit.
func systemdLineState(ll LogLine) *ServiceState {
	m := ll.Msg
	switch {
	case strings.Contains(m, "Failed with result"), strings.Contains(m, "Failed to start"):
		return &ServiceState{LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: strings.Trim(after(m, "result "), "'.")}
	case strings.HasPrefix(m, "Started "):
		return &ServiceState{LoadState: "loaded", ActiveState: "active", SubState: "running", ActiveSince: ll.Time}
	case strings.HasPrefix(m, "Stopped "), strings.Contains(m, "Deactivated successfully"):
		return &ServiceState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead"}
	}
	return nil
}

func (e *Evaluator) serviceConds(s *Snapshot, st *ServiceState) []cond {
	meta := map[string]string{"active_state": st.ActiveState, "sub_state": st.SubState, "result": st.Result,
		"load_state": st.LoadState, "platform": e.platform.Name, "fabric_mode": e.mode()}
	if st.MainProcess != "" {
		meta["main_process"] = st.MainProcess
		if isFMProcess(st.MainProcess) && st.MainProcess != "nv-fabricmanager" {
			meta["main_process_note"] = "nv-fabricmanager, its name truncated to the kernel's 15-character comm"
		}
	}
	if !e.platform.HasFabric() {
		if e.booting(s.Now) {
			// Early in a boot the NVSwitch driver may not have probed its
			// switches yet: nothing is decided of the service, what a
			// previous boot reported stands.
			return append(e.standing("svc", "service"), e.standing("svc", "nofabric")...)
		}
		// FM has nothing to manage here; a unit that fails or keeps
		// restarting is a misconfiguration, not a fabric failure.
		if st.LoadState == "not-found" || st.LoadState == "" || st.Running() || st.ActiveState == "inactive" {
			return nil
		}
		meta["recovery"] = "No NVSwitch on this host (NVSwitch count 0, no NVLink management bridge): FM is not needed; disable the nvidia-fabricmanager unit."
		return []cond{{"nofabric", e.ev(s.Now, classNVSwitch, CheckConfig, "FM-CONFIG-NO-NVSWITCH", false,
			datamodels.RecommendedAction_NONE, fmt.Sprintf("Fabric Manager service %s is %s on a host without NVSwitches: a misconfiguration (FM is not needed here)",
				e.cfg.Service, st.ActiveState), []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: e.cfg.Service}}, meta)}}
	}
	state := ""
	switch {
	case st.LoadState == "not-found":
		state = "NOT-INSTALLED"
	case st.ActiveState == "failed":
		state = "FAILED"
	case st.ActiveState == "inactive", st.ActiveState == "deactivating":
		state = "INACTIVE"
	case st.ActiveState == "active" && st.SubState == "exited":
		state = "NOT-RUNNING"
	}
	if state == "INACTIVE" && st.NotStartedThisBoot && e.booting(s.Now) {
		// The node is booting and systemd has not started FM yet: not a
		// fault (yet); what a previous boot left stands.
		return e.standing("svc", "service")
	}
	if state == "" && !st.Running() && (st.ActiveState == "activating" || st.SubState == "auto-restart") {
		// Starting (again): a unit that Restart= brings back after a
		// failure is not healthy until it runs; what was reported stands
		// (otherwise a unit failing in a restart loop alternates
		// fatal/healthy every poll).
		return e.standing("svc", "service")
	}
	if state == "" {
		return nil
	}
	h := e.cat.Handling["table17_config"]
	meta["recovery"] = "Start the FM service; restart the host if it fails again (FM guide: Managing the Fabric Manager Service, Table 17)."
	if c := e.abortCUDA(); c != "" {
		meta["cuda_jobs"] = c
	}
	return []cond{{"service", e.ev(s.Now, classNVSwitch, CheckService, "FM-SERVICE-"+state, true, h.Action(e.mode()),
		fmt.Sprintf("Fabric Manager service %s is %s (%s/%s, result %s) on an NVSwitch system: CUDA jobs cannot start",
			e.cfg.Service, strings.ToLower(state), st.ActiveState, st.SubState, orNA(st.Result)), e.nodeEntities(), meta)}}
}

// booting reports a poll within the boot grace (the boot's start known).
func (e *Evaluator) booting(now time.Time) bool {
	return !e.bootStart.IsZero() && !now.Before(e.bootStart) && now.Sub(e.bootStart) < e.cfg.BootGrace
}

// abortCUDA describes what happens to CUDA jobs while FM is down.
func (e *Evaluator) abortCUDA() string {
	m := e.cat.AbortCUDA[e.platform.Name]
	if m == nil {
		return ""
	}
	if v, ok := m["any"]; ok {
		return v
	}
	val := 0
	if e.config != nil && e.config.AbortCUDAJobsOnFMExit >= 0 {
		val = e.config.AbortCUDAJobsOnFMExit
	}
	return m[strconv.Itoa(val)]
}

func (e *Evaluator) nvlsmConds(s *Snapshot, st *ServiceState) []cond {
	if e.platform.Name != PlatformB200 || *s.NVLSMRunning {
		return nil
	}
	if st != nil && !st.Running() {
		// FM is down (its own fault stands) and starts NVLSM: NVLSM is not
		// judged, and what was reported of it stays, not cleared as if it ran.
		return e.standing("nvlsmproc", "proc")
	}
	h := e.cat.Handling["nvlsm"]
	return []cond{{"proc", e.ev(s.Now, classNVSwitch, CheckNVLSM, "NVLSM-NOT-RUNNING", h.Fatal, h.Action(e.mode()),
		"NVLSM (NVLink subnet manager) is not running on an HGX B200-class system: the NVSwitch routing is not configured",
		e.nodeEntities(), map[string]string{"guide": h.Guide, "impact": h.Impact, "recovery": h.Recovery})}}
}

// --- the FM configuration ---

func (e *Evaluator) configConds(s *Snapshot) []cond {
	var cs []cond
	c := s.Config
	for _, p := range c.Problems {
		cs = append(cs, cond{"invalid|" + p, e.ev(s.Now, classNVSwitch, CheckConfig, "FM-CONFIG-INVALID-VALUE", false,
			datamodels.RecommendedAction_CONTACT_SUPPORT, "fabricmanager.cfg: "+p,
			[]*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: e.cfg.Service}},
			map[string]string{"recovery": "Set a value the FM guide defines and restart the FM service."})})
	}
	if c.FabricMode == 2 && c.NVSwitchFailureMode == 1 {
		cs = append(cs, cond{"vgpu-nvswitch-mode", e.ev(s.Now, classNVSwitch, CheckConfig, "FM-CONFIG-HA-MODE-UNSUPPORTED", false,
			datamodels.RecommendedAction_CONTACT_SUPPORT,
			"fabricmanager.cfg: NVSWITCH_FAILURE_MODE=1 is not supported in vGPU multitenancy mode (FABRIC_MODE=2); FM behaves as with 0",
			[]*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: e.cfg.Service}},
			map[string]string{"guide": "NVSwitch Failure: Shared NVSwitch and vGPU Virtualization Behavior", "recovery": "Set NVSWITCH_FAILURE_MODE=0 in vGPU mode."})})
	}
	return cs
}

func (e *Evaluator) excludeConfigConds(s *Snapshot) []cond {
	var cs []cond
	x := s.Excludes
	ents := []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: "nvidia.ko"}}
	if len(x.Deprecated) > 0 {
		cs = append(cs, cond{"deprecated", e.ev(s.Now, classGPU, CheckConfig, "EXCLUDE-PARAMETER-DEPRECATED", false, datamodels.RecommendedAction_NONE,
			"deprecated exclusion parameters in use: "+strings.Join(x.Deprecated, ", "), ents,
			map[string]string{"recovery": "Use NVreg_ExcludedGpus / NvSwitchExcludelist (the deprecated names will be removed).", "sources": strings.Join(x.Sources, ",")})})
	}
	if len(x.NVSwitches) > 0 && e.platform.Name == PlatformB200 {
		cs = append(cs, cond{"b200-switch-exclusion", e.ev(s.Now, classNVSwitch, CheckConfig, "NVSWITCH-EXCLUSION-UNSUPPORTED", false,
			datamodels.RecommendedAction_NONE, "NvSwitchExcludelist is set on an HGX B200-class system, whose NVSwitches the kernel NVSwitch driver does not control: it has no effect",
			ents, map[string]string{"guide": "NVSwitch Exclusion (note on DGX/HGX B200)", "listed": strings.Join(x.NVSwitches, ",")})})
	}
	return cs
}

// --- log lines ---

// logOccurrence reports an FM line that logLine makes an occurrence event
// of by its text alone: an SXid, or a partition operation's error.
func (e *Evaluator) logOccurrence(ll LogLine) bool {
	if ll.Source != SourceFM {
		return false
	}
	if _, ok := parseSXidLine(ll.Msg); ok {
		return true
	}
	return partitionCodeOf(e.cat, ll.Msg) != nil
}

func (e *Evaluator) logLine(o *out, s *Snapshot, ll LogLine) {
	t := ll.Time
	if t.IsZero() {
		t = s.Now
	}
	if sx, ok := parseSXidLine(ll.Msg); ok && ll.Source == SourceFM {
		if !e.past(ll) {
			o.addOccurrence(e.sxidEvent(t, ll, sx), e.lineOrdinal(ll))
		}
		return
	}
	if p := partitionCodeOf(e.cat, ll.Msg); p != nil && ll.Source != SourceNVLSM {
		if !e.past(ll) {
			o.addOccurrence(e.partitionCodeEvent(t, ll, p), e.lineOrdinal(ll))
		}
		return
	}
	r := e.cat.Match(ll.Source, ll.Level, ll.Msg)
	for r != nil && r.Requires == "trunks" && !e.platform.HasTrunks() {
		r = e.cat.matchAfter(r, ll)
	}
	if r == nil {
		return
	}
	switch r.Marker {
	case "ignore":
		return
	case "fm_start":
		if !t.IsZero() {
			e.fmStart = t
		}
		clear(e.registered)
		e.markStale("fmrun")
		return
	case "fm_ready":
		// FM configured the fabric: errors of a previous run that this run
		// did not report are over; this run's (degraded modes) stand.
		e.clearStale(o, "fmrun", t)
		return
	case "nvlsm_ready":
		e.markStale("nvlsm")
		e.clearStale(o, "nvlsm", t)
		return
	}
	if ll.Replayed && !ll.Time.IsZero() && ll.Time.Before(e.bootStart) {
		// A line of an earlier boot in the replayed tail (no usable saved
		// position): its FM run is over, the reboot reset the NVSwitches
		// and GPUs; its markers above still tell the runs apart, its
		// faults are not raised on this boot (as past drops its SXids).
		return
	}
	refs := refsOf(ll.Msg)
	meta := map[string]string{"log_line": ll.Raw, "log_source": ll.Source, "catalog_id": r.ID, "platform": e.platform.Name, "fabric_mode": e.mode()}
	var ents []*datamodels.Entity
	entKey := "node"
	low := strings.ToLower(ll.Msg)
	if id, pci, ok := e.gpuRef(refs); ok && (refs.GPUUUID != "" || refs.GPUPhysID >= 0 || e.gpuPCIs[pci4(refs.PCI)]) {
		ents = gpuEntities(id, pci)
		entKey = id
		meta["gpu"] = id
		if sw := switchPCIOf(ll.Msg); sw != "" {
			ents = append(ents, switchEntity(sw))
		}
	} else if sw := switchPCIOf(ll.Msg); sw != "" {
		ents = []*datamodels.Entity{switchEntity(sw)}
		entKey = sw
	} else if refs.PCI != "" && strings.Contains(low, "nvswitch") {
		ents = []*datamodels.Entity{switchEntity(pci4(refs.PCI))}
		entKey = pci4(refs.PCI)
	} else if refs.SwitchUUID != "" {
		ents = []*datamodels.Entity{switchEntity(refs.SwitchUUID)}
		entKey = refs.SwitchUUID
	} else if refs.SwitchPhysID >= 0 {
		id := "nvswitch-physical:" + strconv.Itoa(refs.SwitchPhysID)
		ents = []*datamodels.Entity{switchEntity(id)}
		entKey = id
	} else {
		ents = e.nodeEntities()
	}
	if refs.SwitchUUID != "" {
		meta["nvswitch_uuid"] = refs.SwitchUUID
	}
	if refs.Link >= 0 {
		meta["link"] = strconv.Itoa(refs.Link)
	}
	if refs.Partition >= 0 {
		meta["partition_id"] = strconv.Itoa(refs.Partition)
	}
	if r.Exclusion == "nvswitch_excluded" {
		o.add(e.raise("fmrun|switch-excluded|"+entKey, e.ev(t, classNVSwitch, CheckSwitchExcl, "NVSWITCH-EXCLUDED", false,
			datamodels.RecommendedAction_NONE, "NVSwitch excluded (FM log): "+oneLine(ll.Msg), ents, meta)))
		if r.HA != "" {
			ha, _ := e.haEvent(t, r.HA, entKey, ents, meta)
			o.add(ha)
		}
		return
	}
	h := e.cat.Handling[r.Handling]
	check, code, fatal, action := r.Check, r.Code, h.Fatal, h.Action(e.mode())
	msg := oneLine(ll.Msg)
	meta["guide"], meta["impact"], meta["recovery"] = h.Guide, h.Impact, h.Recovery
	if r.Special == "nothing_to_do" {
		if !e.platform.HasFabric() {
			check, code, fatal, action = CheckConfig, "FM-CONFIG-NO-NVSWITCH", false, datamodels.RecommendedAction_NONE
			meta["recovery"] = "No NVSwitch on this host: FM is not needed; disable the nvidia-fabricmanager unit (a misconfiguration, not a fabric failure)."
			meta["impact"] = "None: the host has no NVSwitch fabric."
		} else if e.platform.Name == PlatformB200 {
			meta["recovery"] = "HGX B200-class: FM exits with NV_WARN_NOTHING_TO_DO when NVLSM is not running: check the nvlsm process, the nvlink5 packages and /var/log/nvlsm.log; restart the FM unit."
		}
	}
	if e.config != nil && e.config.StayResidentOnFailures == 1 && r.Handling == "table17_config" {
		meta["stay_resident"] = "FM_STAY_RESIDENT_ON_FAILURES=1: the service keeps running, partition activation/deactivation is not supported"
	}
	class := classNVSwitch
	if len(ents) > 0 && ents[0].EntityType == events.EntityGPU {
		class = classGPU
	}
	var ha *datamodels.HealthEvent
	haRule := (*HARule)(nil)
	if r.HA != "" && (ents[0].EntityType == events.EntityGPU || (r.HA != "access" && r.HA != "gpu")) {
		ha, haRule = e.haEvent(t, r.HA, entKey, ents, meta)
	}
	if haRule != nil {
		// FM's high-availability policy decides what the node needs: the
		// HA event carries it, and this event the guide's Table 17
		// recovery as advice (one actionable event per failure).
		fatal = false
		meta["handled_by"] = CheckHA + " " + haRule.Code
	}
	ev := e.ev(t, class, check, code, fatal, action, prefixFor(check)+msg, ents, meta)
	switch r.State {
	case "oneoff":
		if !e.past(ll) {
			o.addOccurrence(ev, e.lineOrdinal(ll))
		}
	case "nvlsm":
		o.add(e.raise("nvlsm|"+code+"|"+entKey, ev))
	default:
		o.add(e.raise("fmrun|"+code+"|"+entKey, ev))
	}
	o.add(ha)
	switch r.Exclusion {
	case "gpu_candidate":
		if ents[0].EntityType == events.EntityGPU {
			m := clone(meta)
			m["reason"] = exclusionReason(r)
			m["guide"] = "Manual Degradation: GPU Exclusion (recommended error conditions), GPU Exclusion Flow"
			m["recovery"] = "Diagnose the GPU (DCGM exclusion recommendation script or health check); if it is confirmed, add its UUID to NVreg_ExcludedGpus and reboot."
			o.add(e.raise("fmrun|gpu-candidate|"+entKey, e.ev(t, classGPU, CheckGPUExcl, "GPU-EXCLUSION-CANDIDATE", false,
				datamodels.RecommendedAction_RUN_DCGMEUD, fmt.Sprintf("GPU %s is an exclusion candidate: %s", ents[0].EntityValue, m["reason"]), ents, m)))
		}
	case "nvswitch_candidate":
		if e.platform.Name == PlatformA100 {
			m := clone(meta)
			m["guide"] = "Manual Degradation: NVSwitch Exclusion (DGX/HGX A100)"
			m["recovery"] = "If the NVSwitch keeps failing, add its UUID (from the FM log) to NvSwitchExcludelist and reboot; FM then also excludes its trunk peer on two-baseboard systems."
			o.add(e.raise("fmrun|switch-candidate|"+entKey, e.ev(t, classNVSwitch, CheckSwitchExcl, "NVSWITCH-EXCLUSION-CANDIDATE", false,
				datamodels.RecommendedAction_CONTACT_SUPPORT, "NVSwitch exclusion candidate: "+msg, ents, m)))
		}
	}
}

func exclusionReason(r *MessageRule) string {
	switch r.HA {
	case "access":
		return "GPU side NVLink training error (FM)"
	case "gpu":
		return "GPU failed to initialize (FM)"
	}
	return r.ID
}

func prefixFor(check string) string {
	switch check {
	case CheckTraining:
		return "Fabric Manager NVLink training failure: "
	case CheckInit:
		return "Fabric Manager initialization failure: "
	case CheckConfig:
		return "Fabric Manager configuration: "
	case CheckNVLSM, CheckNVLSMLog:
		return "NVLSM: "
	}
	return "Fabric Manager: "
}

// matchAfter continues matching after rule r (a rule whose requirement the
// platform does not meet).
func (c *Catalog) matchAfter(r *MessageRule, ll LogLine) *MessageRule {
	low := matchText(ll.Msg)
	found := false
	for _, m := range c.Messages {
		if found && m.matches(ll.Source, ll.Level, low) {
			return m
		}
		if m == r {
			found = true
		}
	}
	return nil
}

// haEvent reports what FM does about a failure found at initialization,
// under the platform, fabric mode and configured *_FAILURE_MODE.
func (e *Evaluator) haEvent(t time.Time, kind, entKey string, ents []*datamodels.Entity, src map[string]string) (*datamodels.HealthEvent, *HARule) {
	if e.platform.Name == "" {
		return nil, nil
	}
	value, set := e.config.FailureMode(kind)
	meta := map[string]string{"failure_kind": kind, "platform": e.platform.Name, "fabric_mode": e.mode(), "log_line": src["log_line"],
		"guide": "Supported High Availability Modes; High Availability Mode Comparison"}
	item := map[string]string{"access": "ACCESS_LINK_FAILURE_MODE", "trunk": "TRUNK_LINK_FAILURE_MODE", "nvswitch": "NVSWITCH_FAILURE_MODE"}[kind]
	if item != "" {
		meta["config_item"] = item
		meta["config_value"] = strconv.Itoa(value)
		if set {
			meta["config_value_source"] = "fabricmanager.cfg"
		} else {
			meta["config_value_source"] = "default"
		}
	}
	if kind == "nvswitch" && e.platform.Name == PlatformA100 && value == 1 {
		if e.mode() == ModeVGPU {
			value = 0
			meta["config_note"] = "NVSWITCH_FAILURE_MODE=1 is not supported in vGPU mode: FM behaves as with 0"
		} else if e.failedSwitches(entKey) > 1 {
			value = 0
			meta["config_note"] = "several NVSwitch failures: FM falls back to NVSWITCH_FAILURE_MODE=0"
		}
	}
	r := e.cat.HARuleFor(e.platform.Name, e.mode(), kind, value)
	if r == nil {
		return nil, nil
	}
	meta["consequence"], meta["recovery"], meta["bandwidth_fraction"] = r.Consequence, r.Recovery, r.Bandwidth
	if len(r.Partitions) > 0 {
		var ids []string
		for _, p := range r.Partitions {
			ids = append(ids, strconv.Itoa(p))
		}
		meta["removed_partitions"] = strings.Join(ids, ",")
	}
	class := classNVSwitch
	if len(ents) > 0 && ents[0].EntityType == events.EntityGPU {
		class = classGPU
	}
	return e.raise("fmrun|ha|"+kind+"|"+entKey, e.ev(t, class, CheckHA, r.Code, r.Fatal, r.Action,
		fmt.Sprintf("%s failure on %s (%s, %s mode): %s", kind, ents[0].EntityValue, strings.ToUpper(e.platform.Name), e.mode(), r.Consequence), ents, meta)), r
}

// switchPCIOf finds the NVSwitch a message names by PCI address
// ("NVSwitch pci bus id 00000000:c4:00.0").
func switchPCIOf(msg string) string {
	if m := reSwitchPCI.FindStringSubmatch(msg); m != nil {
		return pci4(m[1])
	}
	return ""
}

// failedSwitches counts the NVSwitches that failed in this FM run: those a
// standing NVSwitch failure names (entKey included) and those missing from
// the driver's count (swcount) that none of them is. One switch is often
// both (FM names the switch the driver lost, by its PCI address): it
// counts once (named by physical id or UUID, another: pciAddrRE). A missing
// switch still on the PCI bus is known by its address; one a failure names
// that the driver has bound is not among the missing; one missing without
// an address is taken for one a failure names by an address the driver
// has not bound.
func (e *Evaluator) failedSwitches(entKey string) int {
	named := map[string]bool{entKey: true}
	for k := range e.bad {
		if id, ok := strings.CutPrefix(k, "fmrun|ha|nvswitch|"); ok {
			named[id] = true
		}
	}
	n := len(named)
	sw := e.bad["swcount|missing"]
	if sw == nil {
		return n
	}
	missing := mustAtoi(sw.Metadata["expected_nvswitches"]) - mustAtoi(sw.Metadata["nvswitches"])
	unbound := map[string]bool{}
	for _, p := range strings.Split(sw.Metadata["nvswitches_not_bound"], ",") {
		if p != "" {
			unbound[p] = true
			if !named[p] {
				n++
			}
		}
	}
	bound := map[string]bool{}
	for _, p := range e.nvswitches {
		bound[pci4(p)] = !unbound[pci4(p)]
	}
	unaddressed := missing - len(unbound)
	for id := range named {
		if pciAddrRE.MatchString(id) && !unbound[id] && !bound[id] {
			unaddressed--
		}
	}
	return n + max(0, unaddressed)
}

// pciAddrRE matches a PCI address as failedSwitches keys a switch by it;
// a switch FM names otherwise (UUID, physical id, none) cannot be told
// from the missing one and counts as another failure: the safe side, FM's
// fallback to NVSWITCH_FAILURE_MODE=0 reported fatal.
var pciAddrRE = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

func (e *Evaluator) sxidEvent(t time.Time, ll LogLine, sx SXidLine) *datamodels.HealthEvent {
	info, listed := e.cat.SXID.SXID(sx.Code, sx.Fatal)
	action := info.Action
	if !sx.Fatal && info.Class != "nonfatal" {
		action = datamodels.RecommendedAction_NONE
	}
	ents := []*datamodels.Entity{switchEntity(sx.SwitchPCI)}
	meta := map[string]string{"sxid": strconv.Itoa(sx.Code), "table_class": info.Class, "table_text": info.Text, "recovery": info.Recovery,
		"pci_bus_id": sx.SwitchPCI, "log_line": ll.Raw, "platform": e.platform.Name}
	if sx.NodeID != "" {
		meta["node_id"] = sx.NodeID
	} else {
		meta["fid"] = sx.Fid
	}
	if !listed {
		meta["catalog"] = "unlisted"
	}
	if sx.SwitchPhys >= 0 {
		meta["switch_physical_id"] = strconv.Itoa(sx.SwitchPhys)
	}
	if sx.Port >= 0 {
		meta["port"] = strconv.Itoa(sx.Port)
		a, pt := e.topo.Port(sx.SwitchPCI, sx.Port, e.platform.HasTrunks())
		meta["port_type"] = pt
		switch pt {
		case PortAccess:
			if a.GPUUUID != "" {
				ents = append(ents, &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: a.GPUUUID})
				meta["gpu_uuid"] = a.GPUUUID
			}
			if a.GPUPCI != "" {
				meta["gpu_pci"] = kmsgPCI(a.GPUPCI)
			}
			meta["gpu_index"] = strconv.Itoa(a.GPUIndex)
			meta["gpu_link"] = strconv.Itoa(a.LocalLink)
			if sx.Fatal {
				meta["expected_gpu_xids"] = "XID-74,XID-45"
				if info.Class == "fatal" {
					switch {
					case e.mode() != ModeBareMetal:
						action = datamodels.RecommendedAction_RESTART_VM
						meta["recovery"] = "Fatal SXid on an access port: the impact is limited to the guest VM using this GPU; shut it down (FM guide, Runtime NVSwitch Errors, Table 20)."
					case e.platform.Name == PlatformA100 && e.fmKnown && !e.fmRunning:
						action = datamodels.RecommendedAction_RESTART_BM
						meta["recovery"] = "Fatal SXid on an access port while FM is not running: an A100 GPU cannot be reset alone then; reset all GPUs and NVSwitches (GPU VM System Reset, Ampere and NVSwitch)."
					default:
						action = datamodels.RecommendedAction_COMPONENT_RESET
						meta["recovery"] = "Fatal SXid on an access port: reset the GPU on this port and all GPUs of the affected workload (nvidia-smi -r); if it persists, reboot (FM guide, Fatal SXid Errors)."
					}
				}
			}
		case PortTrunk:
			if sx.Fatal {
				meta["expected_gpu_xids"] = "XID-45"
				if info.Class == "fatal" {
					action = datamodels.RecommendedAction_RESTART_BM
					meta["recovery"] = "Fatal SXid on a trunk port: FM aborts all CUDA jobs; stop FM, reset all GPUs and NVSwitches (nvidia-smi -r without -i), start FM; if it persists, reboot (FM guide, Fatal SXid Errors)."
					if e.mode() != ModeBareMetal {
						action = datamodels.RecommendedAction_RESTART_VM
						meta["recovery"] = "Fatal SXid on a trunk port: shut down the guest VM partitions that cross the trunk ports (the 16-GPU partition and the 8-GPU partitions with four GPUs per baseboard); they can be recreated (FM guide, Table 20)."
					}
				}
			}
		}
	}
	if sx.Code == 11004 || sx.Code == 12028 {
		meta["expected_gpu_xids"] = "XID-45"
	}
	sev := "Non-fatal"
	if sx.Fatal {
		sev = "Fatal"
	}
	where := "NVSwitch " + sx.SwitchPCI
	if sx.Port >= 0 {
		where += " port " + strconv.Itoa(sx.Port)
		if meta["port_type"] != PortUnknown {
			where += " (" + meta["port_type"] + ")"
		}
	}
	return e.ev(t, classNVSwitch, CheckNVSwitch, "SXID-"+strconv.Itoa(sx.Code), sx.Fatal, action,
		fmt.Sprintf("Fabric Manager: SXid %d %s on %s: %s", sx.Code, sev, where, info.Text), ents, meta)
}

// kmsgPCI is the "dddd:bb:dd" form the kernel-log events use for GPUs.
func kmsgPCI(p string) string { return events.NormalizePCI(p, false) }

func (e *Evaluator) partitionCodeEvent(t time.Time, ll LogLine, p *PartitionCode) *datamodels.HealthEvent {
	meta := map[string]string{"fm_return": p.Name, "fm_return_value": strconv.Itoa(p.Value), "guide": p.Guide, "condition": p.Condition,
		"recovery": p.Recovery, "log_line": ll.Raw, "fabric_mode": e.mode()}
	refs := refsOf(ll.Msg)
	ents := e.nodeEntities()
	if refs.Partition >= 0 {
		meta["partition_id"] = strconv.Itoa(refs.Partition)
		ents = []*datamodels.Entity{{EntityType: EntityPartition, EntityValue: strconv.Itoa(refs.Partition)}}
	}
	return e.ev(t, classNVSwitch, CheckPartition, "FM-PARTITION-"+strings.TrimPrefix(p.Name, "FM_ST_"), p.Fatal, p.Action(e.mode()),
		fmt.Sprintf("Fabric Manager partition operation returned %s: %s", p.Name, p.Condition), ents, meta)
}

// --- GPU fabric state and health (nvidia-smi -q) ---

func (e *Evaluator) gpuConds(s *Snapshot) []cond {
	var cs []cond
	gpus := append([]GPUFabric(nil), s.SMI.GPUs...)
	sort.SliceStable(gpus, func(i, j int) bool { return gpus[i].ID() < gpus[j].ID() })
	seen := map[string]bool{}
	listed := map[string]bool{} // every GPU nvidia-smi -q shows, fabric or not
	unread := map[string]bool{} // those whose Fabric section says nothing (NoFabric)
	fabricHost := e.platform.HasFabric() || e.platform.OffNodeFabric
	for _, g := range gpus {
		ids := []string{g.ID(), g.UUID}
		if g.PCI != "" {
			ids = append(ids, pci4(g.PCI))
		}
		for _, id := range ids {
			if id != "" {
				listed[id] = true
				unread[id] = unread[id] || g.NoFabric()
			}
		}
		fabricHost = fabricHost || !g.NoFabric()
	}
	// A GPU with a fabric condition that nvidia-smi no longer lists fell
	// off the bus (or the driver lost it): absence is not health, its
	// condition stands until the GPU is seen again. Nor is a Fabric State
	// that turned N/A (or Not Supported, or no Fabric section) on a host
	// that still has a fabric (NVSwitches, the B200 bridge, an off-node
	// fabric, another GPU with a fabric state): N/A is the normal state of
	// a GPU without an NVLink fabric (PCIe boards, no NVSwitch), not of one
	// that was registering; the GPU no longer says, so its condition stands
	// until it reads again (its pending registration too). Only the
	// previous boot's conditions clear (the reboot reset the GPU), and
	// every one of a host no longer showing a fabric.
	for k, ev := range e.bad {
		rest, ok := strings.CutPrefix(k, "gpu|")
		if !ok || e.prevBoot[k] {
			continue
		}
		_, id, _ := strings.Cut(rest, "|")
		switch {
		case id == "":
		case !listed[id] && !listed[pci4(id)]:
			cs = append(cs, cond{rest, ev})
		case fabricHost && (unread[id] || unread[pci4(id)]):
			cs = append(cs, cond{rest, ev})
			seen[id] = true
		}
	}
	for _, g := range gpus {
		if g.NoFabric() {
			continue // no NVLink fabric on this GPU: an all-N/A block is not a failure
		}
		id := g.ID()
		seen[id] = true
		ents := gpuEntities(id, g.PCI)
		meta := map[string]string{"fabric_state": g.State, "fabric_status": g.Status, "pci_bus_id": g.PCI, "gpu_uuid": g.UUID,
			"health_summary": g.Summary, "bandwidth": g.Bandwidth, "clique_id": g.CliqueID, "cluster_uuid": g.ClusterUUID,
			"route_recovery": g.RouteRecovery, "route_unhealthy": g.RouteUnhealthy, "access_timeout_recovery": g.AccessTimeoutRecovery,
			"incorrect_configuration": g.IncorrectConfiguration, "platform": e.platform.Name}
		if g.Fragment {
			meta["gpu_index"] = strconv.Itoa(g.Index)
		}
		hFM := e.cat.Handling["table17_config"]
		st := strings.ToLower(g.State)
		switch st {
		case "completed":
			delete(e.pending, id)
			e.registered[id] = true
			if !strings.EqualFold(g.Status, "Success") {
				m := clone(meta)
				m["recovery"] = "Restart the FM service and the host; if the GPU keeps failing registration, RMA it or inspect the NVLink connections (FM guide, Table 17)."
				if g.CliqueID == "0" && isZeroUUID(g.ClusterUUID) {
					m["fabric_attached"] = "false"
				}
				action := e.offNode(m, hFM.Action(e.mode()))
				cs = append(cs, cond{"state|" + id, e.ev(s.Now, classGPU, CheckState, "FABRIC-PROBE-FAILURE", true, action,
					fmt.Sprintf("GPU %s fabric registration completed with status %q (not Success)", id, g.Status), ents, m)})
			}
		default: // In Progress, Not Started: Status N/A means "no result yet"
			first, ok := e.pending[id]
			if !ok {
				first = s.Now
				e.pending[id] = first
			}
			since, from := first, "first seen"
			if !e.fmStart.IsZero() && e.fmRunning && e.fmStart.Before(since) && !e.registered[id] {
				// Never registered in this FM run: FM has been at it
				// since its start. One that registered and is at it again
				// (a GPU reset) is timed from then.
				since, from = e.fmStart, "FM start-up"
			}
			if s.Now.Sub(since) > e.cfg.InProgressTimeout {
				m := clone(meta)
				m["recovery"] = "The GPU did not complete fabric registration: check that FM (and on HGX B200 NVLSM) runs; restart the FM service, then the host (FM guide, Table 17)."
				m["pending_since"] = since.UTC().Format(time.RFC3339)
				m["pending_since_source"] = from
				action := e.offNode(m, hFM.Action(e.mode()))
				cs = append(cs, cond{"state|" + id, e.ev(s.Now, classGPU, CheckState, "FABRIC-PROBE-TIMEOUT", true, action,
					fmt.Sprintf("GPU %s fabric state %q for %s after %s", id, g.State, s.Now.Sub(since).Round(time.Second), from), ents, m)})
			}
		}
		if c := e.healthCond(s, g, id, ents, meta); c != nil {
			cs = append(cs, *c)
		}
	}
	for id := range e.pending {
		if !seen[id] {
			delete(e.pending, id)
		}
	}
	return cs
}

// offNode returns the action of a GPU fabric registration failure: the
// local FM's (Table 17) where FM runs here; where the fabric is managed off
// the node (GB200/GB300 NVL72 compute tray), the FM guide's local recovery
// (restart the FM service and the host) does not apply: the rack's fabric
// management is to be looked at (CONTACT_SUPPORT), the GPU still unusable
// for NVLink (fatal).
func (e *Evaluator) offNode(m map[string]string, local datamodels.RecommendedAction) datamodels.RecommendedAction {
	if !e.platform.OffNodeFabric {
		return local
	}
	m["fabric_manager"] = "off-node"
	m["recovery"] = "This GPU's NVLink fabric is managed off this node (GB200/GB300 NVL72: Fabric Manager runs on the rack's NVLink switch trays, not here): check the rack's fabric management for this compute tray; the FM guide's local recovery does not apply."
	return datamodels.RecommendedAction_CONTACT_SUPPORT
}

func (e *Evaluator) healthCond(s *Snapshot, g GPUFabric, id string, ents []*datamodels.Entity, meta map[string]string) *cond {
	m := clone(meta)
	m["degraded"] = "true"
	var code, msg string
	action := datamodels.RecommendedAction_NONE
	switch {
	case strings.EqualFold(g.Summary, "Unhealthy"), isTrue(g.RouteUnhealthy):
		code = "FABRIC-HEALTH-UNHEALTHY"
		msg = fmt.Sprintf("GPU %s fabric health is degraded: summary %s, route unhealthy %s (registration %s/%s)", id, orNA(g.Summary), orNA(g.RouteUnhealthy), g.State, orNA(g.Status))
		m["recovery"] = "The GPU stays registered but its fabric is degraded: watch it; reset the GPU or restart FM at a convenient time."
	case isSet(g.IncorrectConfiguration):
		code, action = "FABRIC-INCORRECT-CONFIGURATION", datamodels.RecommendedAction_CONTACT_SUPPORT
		msg = fmt.Sprintf("GPU %s fabric reports an incorrect configuration: %s", id, g.IncorrectConfiguration)
		m["recovery"] = "Fix the reported fabric configuration (partition, NVLink count, firmware, location, system GUID or chassis serial)."
	case strings.EqualFold(g.Bandwidth, "Degraded"), strings.EqualFold(g.Summary, "Limited Capacity"):
		code = "FABRIC-BANDWIDTH-DEGRADED"
		msg = fmt.Sprintf("GPU %s fabric bandwidth %s, health %s", id, orNA(g.Bandwidth), orNA(g.Summary))
	case isTrue(g.RouteRecovery), isTrue(g.AccessTimeoutRecovery):
		code = "FABRIC-RECOVERY-IN-PROGRESS"
		msg = fmt.Sprintf("GPU %s fabric recovery in progress (route recovery %s, access timeout recovery %s)", id, orNA(g.RouteRecovery), orNA(g.AccessTimeoutRecovery))
	default:
		return nil
	}
	return &cond{"health|" + id, e.ev(s.Now, classGPU, CheckHealth, code, false, action, msg, ents, m)}
}

func isZeroUUID(s string) bool {
	return strings.Trim(s, "0-") == "" && s != ""
}

// --- NVLink state (nvidia-smi nvlink -s) ---

func (e *Evaluator) linkConds(s *Snapshot) []cond {
	var cs []cond
	for _, g := range s.NVLink {
		in := g.InactiveLinks()
		if len(in) == 0 {
			continue
		}
		if f := e.gpuByUUID[g.UUID]; f != nil && e.platform.Name == PlatformA100 && strings.EqualFold(f.MIG, "Enabled") {
			// A100 trains its NVLinks off while MIG mode is enabled (FM
			// guide, Interoperability With Multi-Instance GPUs).
			continue
		}
		id := g.UUID
		if id == "" {
			id = "index:" + strconv.Itoa(g.Index)
		}
		pci := ""
		if f := e.gpuByUUID[g.UUID]; f != nil {
			pci = f.PCI
		}
		ents := gpuEntities(id, pci)
		var ls []string
		for _, n := range in {
			ls = append(ls, strconv.Itoa(n))
		}
		meta := map[string]string{"inactive_links": strings.Join(ls, ","), "links": strconv.Itoa(len(g.Links)), "platform": e.platform.Name,
			"gpu_index": strconv.Itoa(g.Index)}
		if r := e.cat.HARuleFor(e.platform.Name, e.mode(), "access", -1); r != nil && r.Value == -1 {
			meta["consequence"], meta["recovery"] = r.Consequence, r.Recovery
			meta["guide"] = "High Availability Mode Comparison (DGX/HGX H100: ACCESS_LINK_FAILURE_MODE ignored)"
			cs = append(cs, cond{"inactive|" + id, e.ev(s.Now, classGPU, CheckHA, r.Code, r.Fatal, r.Action,
				fmt.Sprintf("GPU %s has %d inactive NVLink(s) (%s): access link failure", id, len(in), meta["inactive_links"]), ents, meta)})
			continue
		}
		meta["recovery"] = "Reset the GPU (FM retrains its links); if the links stay inactive, RMA the GPU."
		cs = append(cs, cond{"inactive|" + id, e.ev(s.Now, classGPU, CheckNVLink, "NVLINK-INACTIVE", false, datamodels.RecommendedAction_COMPONENT_RESET,
			fmt.Sprintf("GPU %s has %d inactive NVLink(s) (%s)", id, len(in), meta["inactive_links"]), ents, meta)})
	}
	return cs
}

// --- NVSwitch count ---

func (e *Evaluator) switchCountConds(s *Snapshot) []cond {
	want := e.platform.ExpectedNVSwitches()
	if want <= 0 {
		return nil
	}
	// The NVSwitches the driver uses: one missing from the PCI bus, or on
	// it but excluded (NvSwitchExcludelist), is an NVSwitch failure for the
	// HA policy alike (NVSWITCH_FAILURE_MODE covers both).
	have := s.NVSwitchCount
	if have < 0 || have >= want || (have == 0 && len(s.PCISwitches) == 0) {
		// None at all, on the PCI bus either, is a board without
		// NVSwitches (HGX A100/H100 4-GPU), not a switch failure.
		return nil
	}
	if have == 0 && e.booting(s.Now) {
		// Early in a boot the NVSwitch driver may not have bound the
		// switches on the bus yet: what stands stays.
		return e.standing("swcount", "missing")
	}
	meta := map[string]string{"nvswitches": strconv.Itoa(have), "expected_nvswitches": strconv.Itoa(want), "platform": e.platform.Name,
		"guide": "High Availability: NVSwitch failure (not displayed on the PCIe bus) or an excluded NVSwitch"}
	if s.PCISwitches != nil {
		meta["nvswitches_on_pci"] = strconv.Itoa(len(s.PCISwitches))
		meta["nvswitches_not_bound"] = strings.Join(s.unboundSwitches(), ",")
	}
	ents := e.nodeEntities()
	key := "missing"
	ev := e.haEventFromCount(s.Now, ents, meta, want-have)
	if ev == nil {
		return nil
	}
	return []cond{{key, ev}}
}

func (e *Evaluator) haEventFromCount(t time.Time, ents []*datamodels.Entity, meta map[string]string, missing int) *datamodels.HealthEvent {
	value, set := e.config.FailureMode("nvswitch")
	if e.platform.Name == PlatformA100 && value == 1 && (missing > 1 || e.mode() == ModeVGPU) {
		value = 0
	}
	r := e.cat.HARuleFor(e.platform.Name, e.mode(), "nvswitch", value)
	if r == nil {
		return nil
	}
	m := clone(meta)
	m["consequence"], m["recovery"], m["bandwidth_fraction"] = r.Consequence, r.Recovery, r.Bandwidth
	m["config_item"], m["config_value"] = "NVSWITCH_FAILURE_MODE", strconv.Itoa(value)
	m["config_value_source"] = "default"
	if set {
		m["config_value_source"] = "fabricmanager.cfg"
	}
	return e.ev(t, classNVSwitch, CheckHA, r.Code, r.Fatal, r.Action,
		fmt.Sprintf("%d of %d NVSwitches missing (%s, %s mode): %s", missing, missing+mustAtoi(meta["nvswitches"]), strings.ToUpper(e.platform.Name), e.mode(), r.Consequence), ents, m)
}

func mustAtoi(s string) int { n, _ := strconv.Atoi(s); return n }

// --- helpers ---

func clone(m map[string]string) map[string]string {
	o := make(map[string]string, len(m)+4)
	for k, v := range m {
		o[k] = v
	}
	return o
}

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

func after(s, sep string) string {
	i := strings.Index(strings.ToLower(s), strings.ToLower(sep))
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+len(sep):])
	if len(f) == 0 {
		return ""
	}
	return strings.TrimRight(f[0], ",.")
}

// normPCI turns "00000000:18:00.0" into "0000:18:00.0" (lower case), the
// form events.NormalizePCI gives every PCI address.
func normPCI(s string) string { return events.NormalizePCI(s, true) }
