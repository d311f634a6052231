//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the real Source: NVIDIA's management library, loaded at run time
// (dlopen of libnvidia-ml.so.1) by go-nvml. It evaluates the conditions of
// DCGM's health watches and names them with DCGM's error codes.
//
// A query that fails (other than "not supported": the GPU has no such
// thing) says nothing of its condition: the condition stays as its last
// answer found it, incidents included, and its watch is unknown to the
// healthy baseline (GPU.Unknown) for that read; the failure is logged when
// it starts and when the query answers again. Taken for "no incident", one
// failed ECC read recovered a standing DBE, raised again at the next poll: a
// flap that lifted and applied the node's quarantine. Likewise a GPU whose
// handle NVML does not give keeps its incidents, every watch unknown: a
// failed query (a GPU reset by nvidia-smi -r answers IN_USE or
// RESET_REQUIRED meanwhile), until handleFailPolls polls in a row have
// failed, or at once for an answer no reset gives (resetting): then
// DCGM_FR_NVML_API besides, named as the GPU last read at its index (its
// UUID and PCI address).
//
// GPU_IS_LOST is no such failure: the GPU fell off the bus (Xid 79) and
// keeps its handle, every query answering GPU_IS_LOST (GetUUID also
// GPU_NOT_FOUND); NVML initialised after that (every read: NVML is shut
// down between reads, see the package doc) gives no handle, answering
// GPU_IS_LOST (or GPU_NOT_FOUND). Such a GPU has, besides what its
// conditions had, the fatal incident CodeGPULost on its Pcie watch, named
// as last read (its UUID and PCI address), until it reads again: then its
// healthy event.
type NVML struct {
	mu  sync.Mutex
	lib nvmlLib
	// By GPU id (its UUID, else "gpu<index>", as the events name it):
	replay   map[string]replaySample // id → last PCIe replay counter
	links    map[string]linkState    // "id/link" → its state since seen (forgotten: see forgetLinks)
	noHandle map[int]int             // index → polls in a row without a handle (not lost)
	last     map[string][]Incident   // "id/condition" → its incidents at its last answer
	failing  map[string]bool         // "id/query" → failing (logged)
	uuidAt   map[string]string       // PCI bus id → the UUID last read there
	byIndex  map[int]GPU             // index → the GPU last read there
	inforom  map[string]inforomRead  // id → its last InfoROM validation that answered
	gpus     []GPU                   // the GPUs of the last successful read (Inventory)
	gone     bool                    // a query of the GPU being read answered GPU_IS_LOST
	// ReplayPerMinute is the PCIe replay rate that raises
	// DCGM_FR_PCI_REPLAY_RATE (DCGM's default limit is 8 per minute).
	ReplayPerMinute float64
	// Logger logs the queries that fail (default slog.Default()).
	Logger *slog.Logger
	now    func() time.Time
}

// linkDownReads is how many reads in a row an NVLink seen active must read
// inactive to be down: one may be the link retraining.
const linkDownReads = 2

// linkRetrain is how long an NVLink seen active before its state was
// forgotten (wasUp: a driver reload, a GPU reset, a GPU lost, MIG mode) may
// read inactive, its watch unknown, before it is down: Fabric Manager
// trains the links again after those, which takes up to minutes; a link
// still inactive after that is dead (a reset, the remediation's own, may
// have broken it), not training. 5 minutes, 10 polls at the default 30 s
// poll interval; a time, not a number of reads, so that a shorter
// gpu.poll_interval does not shorten it (and at least linkDownReads reads).
const linkRetrain = 5 * time.Minute

// retiredPagesLimit is DCGM's DCGM_LIMIT_MAX_RETIRED_PAGES: SBE and DBE
// retired pages together at this many or more are DCGM_FR_RETIRED_PAGES_LIMIT.
const retiredPagesLimit = 63

// linkState is what the reads of one NVLink found: up, seen active since
// its states were last forgotten; down, the reads in a row that found it
// inactive since; held and wasUp, see forgetLinks.
type linkState struct {
	up   bool
	down int
	// held: forgotten while its NVLINK_DOWN stood; until it reads active
	// it keeps the watch unknown, so that the fault stands.
	held bool
	// wasUp: forgotten after it was seen active, with no fault standing;
	// inactive since (the first such read), it may be training for
	// linkRetrain, then it is down.
	wasUp bool
	since time.Time
}

// handleFailPolls is how many polls in a row NVML must give no handle for a
// GPU being reset (resetting) before that is an incident
// (DCGM_FR_NVML_API); fewer are a failed query.
const handleFailPolls = 3

// resetting reports whether r, NVML's answer for a GPU's handle, is one a
// GPU being reset (or busy) gives: a failed query for handleFailPolls
// polls. Any other (ERROR_UNKNOWN: some drivers answer so for a GPU fallen
// off the bus before the NVML session) is an incident at once.
func resetting(r nvml.Return) bool {
	return r == nvml.ERROR_IN_USE || r == nvml.ERROR_RESET_REQUIRED || r == nvml.ERROR_TIMEOUT
}

// inforomEvery is how often a GPU's InfoROM is validated at most: as often
// as DCGM samples its validity (NVIDIA/DCGM DcgmHealthWatch.cpp, SetInforom:
// an update interval of 3600 s at least), the validation reading the whole
// InfoROM; not at every poll.
const inforomEvery = time.Hour

// inforomRead is a GPU's InfoROM validation that answered, r at t.
type inforomRead struct {
	r nvml.Return
	t time.Time
}

type replaySample struct {
	n int
	t time.Time
}

// NewNVML returns the NVML Source.
func NewNVML() *NVML {
	return &NVML{lib: pkgNVML{}, replay: map[string]replaySample{}, links: map[string]linkState{}, last: map[string][]Incident{},
		noHandle: map[int]int{}, failing: map[string]bool{}, uuidAt: map[string]string{}, byIndex: map[int]GPU{},
		inforom:         map[string]inforomRead{},
		ReplayPerMinute: 8, now: time.Now}
}

// nvmlLib is what NVML calls of the library besides a device's methods:
// go-nvml's package functions (pkgNVML), or its mock in tests.
type nvmlLib interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// pkgNVML calls go-nvml's package functions, which use its one library.
type pkgNVML struct{}

func (pkgNVML) Init() nvml.Return                  { return nvml.Init() }
func (pkgNVML) Shutdown() nvml.Return              { return nvml.Shutdown() }
func (pkgNVML) DeviceGetCount() (int, nvml.Return) { return nvml.DeviceGetCount() }
func (pkgNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return nvml.DeviceGetHandleByIndex(i)
}

// Health implements Source.
func (s *NVML) Health(ctx context.Context) ([]Incident, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.lib.Init(); r != nvml.SUCCESS {
		s.forgetLinks("", true) // the driver went away: see forgetLinks
		if r == nvml.ERROR_LIBRARY_NOT_FOUND || r == nvml.ERROR_DRIVER_NOT_LOADED {
			return nil, ErrNotPresent
		}
		return nil, fmt.Errorf("nvml init: %s", nvml.ErrorString(r))
	}
	// Not held between reads (a GPU reset, a driver upgrade): see the
	// package doc.
	defer s.shutdown()
	n, r := s.lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		s.forgetLinks("", true)
		return nil, fmt.Errorf("nvml device count: %s", nvml.ErrorString(r))
	}
	var out []Incident
	gpus := make([]GPU, 0, n)
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d, r := s.lib.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			// Nothing of it read: what it had stands, no watch is known.
			// Named as last read at its index (its UUID and PCI address),
			// as its incidents and its recovery name it. A GPU lost
			// before this NVML session began (fallen off the bus) has no
			// handle: CodeGPULost, as when its handle answers so. The
			// answers of a GPU being reset (resetting: TIMEOUT, IN_USE,
			// RESET_REQUIRED; nvidia-smi -r, the remediation of its own
			// fault) are a failed query, an incident (DCGM_FR_NVML_API:
			// not in the action table, a fatal CONTACT_SUPPORT) only at
			// handleFailPolls polls in a row; any other (ERROR_UNKNOWN:
			// some drivers answer so for a GPU fallen off the bus before
			// this session) is one at once. Its NVLinks retrain after a
			// reset: forgotten.
			g, ok := s.byIndex[i]
			id := gpuID(Incident{GPU: i, UUID: g.UUID})
			s.forgetLinks(id, true)
			g.Index, g.Unknown = i, slices.Clone(Watches)
			s.answered(&g, "gpu"+strconv.Itoa(i), "DeviceGetHandleByIndex", r)
			in := Incident{GPU: i, UUID: g.UUID, PCI: g.PCI, System: "Pcie", Health: "FAIL", Code: "DCGM_FR_NVML_API",
				Message: "cannot get a handle for the GPU: " + nvml.ErrorString(r)}
			switch {
			case r == nvml.ERROR_GPU_IS_LOST || r == nvml.ERROR_GPU_NOT_FOUND:
				delete(s.noHandle, i)
				in.Code, in.Message = CodeGPULost, fmt.Sprintf("GPU %d is lost (fallen off the bus): NVML answers %s for its handle", i, nvml.ErrorString(r))
				out = append(out, in)
			case !resetting(r):
				delete(s.noHandle, i)
				out = append(out, in)
			default:
				if s.noHandle[i]++; s.noHandle[i] >= handleFailPolls {
					in.Message = fmt.Sprintf("cannot get a handle for the GPU (%d polls in a row): %s", handleFailPolls, nvml.ErrorString(r))
					out = append(out, in)
				}
			}
			if ok {
				out = append(out, s.lastOf(id+"/")...)
			}
			gpus = append(gpus, g)
			continue
		}
		delete(s.noHandle, i)
		s.answered(&GPU{Index: i}, "gpu"+strconv.Itoa(i), "DeviceGetHandleByIndex", r)
		incs, g := s.device(i, d)
		out = append(out, incs...)
		gpus = append(gpus, g)
		s.byIndex[i] = g
	}
	s.gpus = gpus
	return out, nil
}

// shutdown releases NVML at the end of a read.
func (s *NVML) shutdown() {
	if r := s.lib.Shutdown(); r != nvml.SUCCESS {
		s.log().Warn("NVML shutdown failed", "err", nvml.ErrorString(r))
	}
}

func (s *NVML) log() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}

// GPUs implements Inventory. Pcie is unknown on a GPU until its second
// replay-counter sample (a rate); Nvlink while one of its links reads
// inactive at fewer than linkDownReads reads in a row, reads inactive
// forgotten while its fault stood (held: see forgetLinks), or reads
// inactive for less than linkRetrain forgotten after it was seen active
// (wasUp: training again). Nvlink is
// unbased while one reads inactive and has not been seen active since this
// process started or its link states were forgotten (a link is reported
// down only once seen up; inactive at the first read it may be a link down
// since before, one not in use, or one Fabric Manager is still training).
// A GPU in MIG mode reads no NVLink: its Nvlink watch is healthy.
func (s *NVML) GPUs() []GPU {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.gpus)
}

func (s *NVML) device(i int, d nvml.Device) ([]Incident, GPU) {
	s.gone = false
	pci := ""
	if p, r := d.GetPciInfo(); r == nvml.SUCCESS {
		var b strings.Builder
		for _, c := range p.BusId {
			if c == 0 {
				break
			}
			b.WriteByte(byte(c))
		}
		pci = strings.ToLower(b.String())
	}
	// A GPU whose UUID is not read is the one last read at its PCI address
	// (neither read: at its index), else known by its index: never "",
	// which GPUs failing alike shared.
	uuid, r := d.GetUUID()
	// A GPU lost (fallen off the bus: Xid 79) keeps its handle, but every
	// query answers GPU_IS_LOST (its UUID GPU_IS_LOST or GPU_NOT_FOUND).
	lost := r == nvml.ERROR_GPU_IS_LOST || r == nvml.ERROR_GPU_NOT_FOUND
	if r != nvml.SUCCESS {
		uuid = ""
		if pci != "" {
			uuid = s.uuidAt[pci]
		} else if prev, ok := s.byIndex[i]; ok {
			// Neither read (a lost GPU: nothing reads): it is the one last
			// read at its index, so that its faults name it as its recovery
			// will, never by its index alone.
			uuid, pci = prev.UUID, prev.PCI
		}
	} else if pci != "" && uuid != "" {
		s.uuidAt[pci] = uuid
	} else if prev, ok := s.byIndex[i]; ok && pci == "" && prev.UUID == uuid {
		pci = prev.PCI
	}
	g := GPU{Index: i, PCI: pci, UUID: uuid}
	if r == nvml.SUCCESS && uuid == "" {
		r = nvml.ERROR_UNKNOWN
	}
	s.answered(&g, "gpu"+strconv.Itoa(i), "GetUUID", r)
	id := gpuID(Incident{GPU: i, UUID: uuid})
	inc := func(system, health, code, msg string, args ...any) Incident {
		return Incident{GPU: i, UUID: uuid, PCI: pci, System: system, Health: health, Code: code, Message: fmt.Sprintf(msg, args...)}
	}
	var out []Incident
	// Memory: volatile DBEs, row remapping.
	var incs []Incident
	v, r := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	dbe := r == nvml.SUCCESS && v > 0
	if dbe {
		incs = append(incs, inc("Mem", "FAIL", "DCGM_FR_VOLATILE_DBE_DETECTED", "Detected %d volatile double-bit ECC error(s)", v))
	}
	out = append(out, s.cond(&g, id, "GetTotalEccErrors", r, incs, "Mem")...)
	incs = nil
	_, unc, pending, failed, r := d.GetRemappedRows()
	if r == nvml.SUCCESS {
		switch {
		case failed:
			incs = append(incs, inc("Mem", "FAIL", "DCGM_FR_ROW_REMAP_FAILURE", "Row remapping failed (%d uncorrectable rows remapped)", unc))
		case pending:
			incs = append(incs, inc("Mem", "FAIL", "DCGM_FR_PENDING_ROW_REMAP", "Row remapping pending; reset the GPU to apply it"))
		}
	}
	out = append(out, s.cond(&g, id, "GetRemappedRows", r, incs, "Mem")...)
	if r == nvml.ERROR_NOT_SUPPORTED {
		// No row remapping (before Ampere: V100, T4): the GPU retires
		// pages instead, read as DCGM's memory watch reads them
		// (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp,
		// MonitorMemRetiredPending: a retirement pending, WARN;
		// MonitorMemSbeDbeRetiredPages: SBE and DBE pages together at
		// DCGM_LIMIT_MAX_RETIRED_PAGES or more, FAIL — 63,
		// common/DcgmGPUHardwareLimits.h) and its diagnostic (nvvs
		// software plugin, checkPageRetirement: pending with volatile
		// DBEs is DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS). Not
		// DCGM_FR_RETIRED_PAGES_DBE_LIMIT (over 15 DBE pages and more
		// than one retired in the past week): it needs a week of samples,
		// which a process does not keep.
		incs = nil
		p, r := d.GetRetiredPagesPendingStatus()
		if r == nvml.SUCCESS && p == nvml.FEATURE_ENABLED {
			if dbe {
				incs = append(incs, inc("Mem", "FAIL", "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS", "Page retirement pending with %d volatile double-bit ECC error(s); reset the GPU to apply it", v))
			} else {
				incs = append(incs, inc("Mem", "WARN", "DCGM_FR_PENDING_PAGE_RETIREMENTS", "Page retirement pending; reset the GPU to apply it"))
			}
		}
		out = append(out, s.cond(&g, id, "GetRetiredPagesPendingStatus", r, incs, "Mem")...)
		incs = nil
		sbe, r := d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
		var dbes []uint64
		if r == nvml.SUCCESS {
			dbes, r = d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
		}
		if n := len(sbe) + len(dbes); r == nvml.SUCCESS && n >= retiredPagesLimit {
			incs = append(incs, inc("Mem", "FAIL", "DCGM_FR_RETIRED_PAGES_LIMIT", "%d pages retired (%d single-bit, %d double-bit ECC; limit %d)", n, len(sbe), len(dbes), retiredPagesLimit))
		}
		out = append(out, s.cond(&g, id, "GetRetiredPages", r, incs, "Mem")...)
	}
	// PCIe: replay rate.
	incs = nil
	n, r := d.GetPcieReplayCounter()
	if r == nvml.SUCCESS {
		now := s.now()
		prev, ok := s.replay[id]
		if ok && now.After(prev.t) && n >= prev.n {
			rate := float64(n-prev.n) / now.Sub(prev.t).Minutes()
			if rate > s.ReplayPerMinute {
				incs = append(incs, inc("Pcie", "WARN", "DCGM_FR_PCI_REPLAY_RATE", "Detected %.0f PCIe replays per minute (limit %.0f)", rate, s.ReplayPerMinute))
			}
		}
		if !ok {
			unknown(&g, "Pcie")
		}
		s.replay[id] = replaySample{n, now}
	}
	out = append(out, s.cond(&g, id, "GetPcieReplayCounter", r, incs, "Pcie")...)
	// No PCIe link generation or width check (DCGM_FR_PCIE_GENERATION):
	// GPUs drop their link generation at idle to save power, so a poll
	// reading it would raise false faults.
	//
	// NVLink: a link that was active and is not any more. MIG mode turns
	// NVLink off: none is read, the watch is healthy (an NVLINK_DOWN
	// standing is lifted), the links forgotten (wasUp: MIG off, one not
	// active again within linkRetrain is down). The mode not read, no link
	// is (in MIG mode they read inactive): their last answers stand.
	mig, _, r := d.GetMigMode()
	switch {
	case r == nvml.SUCCESS && mig == nvml.DEVICE_MIG_ENABLE:
		s.forgetLinks(id, false)
	case !s.answered(&g, id, "GetMigMode", r):
		unknown(&g, "Nvlink")
		out = append(out, s.lastOf(id+"/GetNvLinkState/")...)
	default:
		out = append(out, s.nvlinks(&g, id, d, inc)...)
	}
	// Thermal and power.
	incs = nil
	t, r := d.GetTemperature(nvml.TEMPERATURE_GPU)
	if r == nvml.SUCCESS {
		var lim uint32
		if lim, r = d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); r == nvml.SUCCESS && lim > 0 && t >= lim {
			incs = append(incs, inc("Thermal", "WARN", "DCGM_FR_TEMP_VIOLATION", "Temperature %d C at or above the slowdown threshold %d C", t, lim))
		}
	}
	out = append(out, s.cond(&g, id, "GetTemperature", r, incs, "Thermal")...)
	incs = nil
	reasons, r := d.GetCurrentClocksThrottleReasons()
	if r == nvml.SUCCESS {
		if reasons&(nvml.ClocksThrottleReasonHwThermalSlowdown|nvml.ClocksThrottleReasonSwThermalSlowdown) != 0 {
			incs = append(incs, inc("Thermal", "WARN", "DCGM_FR_CLOCKS_EVENT_THERMAL", "Clocks slowed down for temperature (reasons 0x%x)", reasons))
		}
		if reasons&nvml.ClocksThrottleReasonHwPowerBrakeSlowdown != 0 {
			incs = append(incs, inc("Power", "WARN", "DCGM_FR_CLOCKS_EVENT_POWER", "Clocks slowed down by the power brake (reasons 0x%x)", reasons))
		}
	}
	out = append(out, s.cond(&g, id, "GetCurrentClocksThrottleReasons", r, incs, "Thermal", "Power")...)
	// InfoROM: validated as DCGM's diagnostic does (nvmlDeviceValidateInforom:
	// CORRUPTED_INFOROM is DCGM_FR_CORRUPT_INFOROM, a WARN in its health
	// watch), at most once every inforomEvery (the first read, then an hour
	// later...): the reads between keep its last answer (a real one, so the
	// watch is known). A validation that did not answer is tried again at
	// the next read, the watch unknown meanwhile; a GPU lost is not taken
	// from the last answer, and a driver reload or a reset a poll sees
	// (forgetLinks) validates again at the next read.
	incs = nil
	now := s.now()
	if last, ok := s.inforom[id]; ok && now.Sub(last.t) < inforomEvery && !lost && !s.gone {
		r = last.r
	} else if r = d.ValidateInforom(); r == nvml.SUCCESS || r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_CORRUPTED_INFOROM {
		s.inforom[id] = inforomRead{r, now}
	}
	if r == nvml.ERROR_CORRUPTED_INFOROM {
		incs = append(incs, inc("Inforom", "WARN", "DCGM_FR_CORRUPT_INFOROM", "The InfoROM is corrupt (NVML: %s)", nvml.ErrorString(r)))
		r = nvml.SUCCESS
	}
	out = append(out, s.cond(&g, id, "ValidateInforom", r, incs, "Inforom")...)
	if lost || s.gone {
		// Not a flaky read: the GPU is gone until reset or reboot. What
		// its conditions had stands (above); it is reported fatal on its
		// own, first, so that it is its Pcie watch's event. Its NVLinks
		// retrain when it is back: forgotten, unknown meanwhile.
		s.forgetLinks(id, true)
		unknown(&g, "Nvlink")
		out = append([]Incident{inc("Pcie", "FAIL", CodeGPULost, "GPU %d is lost (fallen off the bus): NVML answers %s", i,
			nvml.ErrorString(nvml.ERROR_GPU_IS_LOST))}, out...)
	}
	return out, g
}

// nvlinks returns the NVLink incidents of GPU id (d): a link seen active
// that reads inactive linkDownReads times in a row is down, kept down until
// it reads active. One inactive at fewer reads makes the watch unknown, as
// does one forgotten while its fault stood (held) until it reads active.
// One seen active before its state was forgotten (wasUp) makes it unknown
// while inactive for less than linkRetrain (training again), then is down.
// A link never seen active since this process started, with no fault
// (inactive at the first read: down before, unused, or training) makes the
// watch unbased only: no baseline, but it keeps no fault of another link
// (one link used, another never: a partial NVLink bridge, an uncabled
// link).
func (s *NVML) nvlinks(g *GPU, id string, d nvml.Device, inc func(system, health, code, msg string, args ...any) Incident) []Incident {
	var out []Incident
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, r := d.GetNvLinkState(l)
		key := id + "/" + strconv.Itoa(l)
		ls, seen := s.links[key]
		if r != nvml.SUCCESS && !seen {
			continue // no such link, or never read: nothing to keep
		}
		var incs []Incident
		if r == nvml.SUCCESS {
			switch {
			case st == nvml.FEATURE_ENABLED:
				ls = linkState{up: true}
			case ls.up:
				if ls.down++; ls.down >= linkDownReads {
					incs = append(incs, inc("Nvlink", "FAIL", "DCGM_FR_NVLINK_DOWN", "NVLink %d is down", l))
				} else {
					unknown(g, "Nvlink")
				}
			case ls.held:
				unknown(g, "Nvlink")
			case ls.wasUp:
				now := s.now()
				if ls.down == 0 {
					ls.since = now
				}
				if ls.down++; ls.down >= linkDownReads && now.Sub(ls.since) >= linkRetrain {
					incs = append(incs, inc("Nvlink", "FAIL", "DCGM_FR_NVLINK_DOWN", "NVLink %d is down (not active again %s after a driver reload, GPU reset or MIG mode)", l, linkRetrain))
				} else {
					unknown(g, "Nvlink")
				}
			default:
				if !slices.Contains(g.Unbased, "Nvlink") {
					g.Unbased = append(g.Unbased, "Nvlink")
				}
			}
			s.links[key] = ls
		}
		out = append(out, s.cond(g, id, "GetNvLinkState/"+strconv.Itoa(l), r, incs, "Nvlink")...)
	}
	return out
}

// forgetLinks forgets what the reads of GPU id's NVLinks found ("": every
// GPU's). After the driver went away (a GPU Operator upgrade: Init or the
// count fails), a GPU reset (its handle failing meanwhile), a GPU lost or
// MIG mode, links are inactive until Fabric Manager retrains them: not
// "was active, now down" at once. With held, a link whose NVLINK_DOWN
// stands is remembered as held (see nvlinks: its fault stands until it
// reads active); any other link seen active, and every one without held
// (MIG mode: the watch is healthy, the fault lifted), as wasUp: inactive
// for linkRetrain once read again, it is down. Deleted, it was taken for a
// link never used: a link dead after a reset was never reported.
func (s *NVML) forgetLinks(id string, held bool) {
	for k, ls := range s.links {
		if id == "" || strings.HasPrefix(k, id+"/") {
			gpu, l, _ := strings.Cut(k, "/")
			switch {
			case held && (ls.held || len(s.last[gpu+"/GetNvLinkState/"+l]) > 0):
				s.links[k] = linkState{held: true}
			case ls.up || ls.wasUp || ls.held:
				s.links[k] = linkState{wasUp: true}
			default:
				delete(s.links, k)
			}
		}
	}
	for k := range s.last {
		if (id == "" || strings.HasPrefix(k, id+"/")) && strings.Contains(k, "/GetNvLinkState/") {
			delete(s.last, k)
		}
	}
	if held {
		// The driver went away or the GPU was reset (a reflashed InfoROM
		// takes one): its InfoROM is validated again at the next read, not
		// taken from an answer up to an hour old.
		for k := range s.inforom {
			if id == "" || k == id {
				delete(s.inforom, k)
			}
		}
	}
}

// cond returns the incidents of one condition of GPU id, read by query
// with answer r: incs when it answered (remembered), else those of its
// last answer, the watches it belongs to (systems) unknown for this read.
func (s *NVML) cond(g *GPU, id, query string, r nvml.Return, incs []Incident, systems ...string) []Incident {
	key := id + "/" + query
	if s.answered(g, id, query, r) {
		if len(incs) == 0 {
			delete(s.last, key)
		} else {
			s.last[key] = incs
		}
		return incs
	}
	for _, sys := range systems {
		unknown(g, sys)
	}
	return s.last[key]
}

// answered reports whether query on GPU id answered ("not supported" is an
// answer: the GPU has no such thing); it logs when the query starts
// failing and when it answers again.
func (s *NVML) answered(g *GPU, id, query string, r nvml.Return) bool {
	key := id + "/" + query
	log := s.log()
	if r == nvml.ERROR_GPU_IS_LOST {
		s.gone = true
	}
	if r == nvml.SUCCESS || r == nvml.ERROR_NOT_SUPPORTED {
		if s.failing[key] {
			delete(s.failing, key)
			log.Info("NVML query answers again", "gpu", g.Index, "uuid", g.UUID, "pci", g.PCI, "query", query)
		}
		return true
	}
	if !s.failing[key] {
		s.failing[key] = true
		log.Warn("NVML query failed; what it reads is kept as last read", "gpu", g.Index, "uuid", g.UUID, "pci", g.PCI,
			"query", query, "err", nvml.ErrorString(r))
	}
	return false
}

// lastOf returns the incidents the conditions under prefix (GPU id's:
// "id/") had at their last answers.
func (s *NVML) lastOf(prefix string) []Incident {
	var keys []string
	for k := range s.last {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []Incident
	for _, k := range keys {
		out = append(out, s.last[k]...)
	}
	return out
}

// unknown adds watch to the watches g's read could not tell.
func unknown(g *GPU, watch string) {
	if !slices.Contains(g.Unknown, watch) {
		g.Unknown = append(g.Unknown, watch)
	}
}
