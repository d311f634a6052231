package kmsg

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Event conventions (see the package documentation).
const (
	// Agent is the agent name every event of this package carries.
	Agent = "faultline-agent"

	CheckXID       = "SysLogsXIDError"
	CheckSXID      = "SysLogsSXIDError"
	CheckFallenOff = "SysLogsGPUFallenOff"
	CheckNIC       = "SysLogsNICDriverError"

	ClassGPU      = "GPU"
	ClassNVSwitch = "NVSwitch"
	ClassNIC      = "NIC"

	// CodeFallenOff is the error code of a GPU that fell off the bus without
	// an Xid 79 line.
	CodeFallenOff = "GPU-FALLEN-OFF-BUS"
)

// ParserConfig tunes a Parser. The zero value is usable.
type ParserConfig struct {
	// Catalog resolves XID and SXid codes; default DefaultCatalog().
	Catalog *Catalog
	// Topology attributes PCI addresses to devices; default none.
	Topology Topology
	// BootTime turns kernel timestamps into wall-clock times; zero leaves
	// events that only have a kernel timestamp without generatedTimestamp.
	BootTime time.Time
	// Year is the year of syslog-style timestamps, which carry none;
	// default, line by line, Now's year, or the year before for a date
	// that would be more than a day after Now (a December line read in
	// January: the year is not fixed when the parser starts, which an agent
	// running over New Year dated a year early).
	Year int
	// Location is the zone of timestamps printed without one (syslog,
	// dmesg -T): the host's, which they are written in; default
	// time.Local (the agent passes its time_zone: in its container
	// time.Local is UTC).
	Location *time.Location
	// Now is the clock; default time.Now.
	Now func() time.Time
	// FloodWindow is the window of flood control: within it, occurrences of
	// one error on one device after the first FloodBurst are counted, not
	// reported, and one event with the count closes the window. Default 10s.
	FloodWindow time.Duration
	// FloodBurst is how many occurrences per window are reported one by one;
	// default 1.
	FloodBurst int
	// DedupSize bounds the set of recently seen lines; default 16384.
	DedupSize int
}

// Parser turns kernel-log lines into HealthEvents. It is not safe for
// concurrent use.
type Parser struct {
	cfg   ParserConfig
	cat   *Catalog
	dedup *dedup
	flood *flood

	uuids     map[string]string    // GPU PCI → UUID learned from NVRM lines
	xid79     map[string]time.Time // GPU PCI → last Xid 79
	fallen    map[string]time.Time // GPU PCI → last fallen-off report
	fallenCtx struct {             // "The NVIDIA GPU <bdf>" context of a split message
		pci string
		at  int // line number
	}
	nicState map[string]bool // "pci|code" → unhealthy reported
	clock    localClock
	pending  *pendingSXID
	lines    int
	out      []*datamodels.HealthEvent
	// skipBefore, when set, drops the leading lines dated before it (those
	// of earlier boots in a file read from its start; see Check.open),
	// until the first line dated at or after it; a line without a time is
	// kept.
	skipBefore time.Time
}

type pendingSXID struct {
	key     string
	ev      *datamodels.HealthEvent
	details []string
	t       time.Time
}

// NewParser returns a Parser.
func NewParser(cfg ParserConfig) (*Parser, error) {
	if cfg.Catalog == nil {
		c, err := DefaultCatalog()
		if err != nil {
			return nil, err
		}
		cfg.Catalog = c
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Location == nil {
		cfg.Location = time.Local
	}
	if cfg.FloodWindow <= 0 {
		cfg.FloodWindow = 10 * time.Second
	}
	if cfg.FloodBurst <= 0 {
		cfg.FloodBurst = 1
	}
	if cfg.DedupSize <= 0 {
		cfg.DedupSize = 16384
	}
	return &Parser{
		cfg:      cfg,
		cat:      cfg.Catalog,
		dedup:    newDedup(cfg.DedupSize),
		flood:    newFlood(cfg.FloodWindow, cfg.FloodBurst),
		uuids:    map[string]string{},
		xid79:    map[string]time.Time{},
		fallen:   map[string]time.Time{},
		nicState: map[string]bool{},
		clock:    localClock{year: cfg.Year, loc: cfg.Location, now: cfg.Now},
	}, nil
}

// Process reads one line. Events it completes are returned by Drain.
func (p *Parser) Process(l Line) {
	p.lines++
	rec, ok := splitLine(l, &p.clock)
	if !ok {
		return
	}
	t, known := p.eventTime(rec)
	if !p.skipBefore.IsZero() && known {
		if t.Before(p.skipBefore) {
			return
		}
		p.skipBefore = time.Time{}
	}
	if p.dedup.seen(rec) {
		return
	}
	p.flood.observe(t, p.cfg.Now())
	body := rec.body
	switch {
	case strings.HasPrefix(body, anchorNVSwitch):
		p.sxid(rec, t, known)
	case strings.HasPrefix(body, anchorNVRM):
		p.flushPending()
		p.nvrm(rec, t, known)
	default:
		p.flushPending()
		p.mlx5(rec, t, known)
	}
}

// Flush completes what waits for more lines: a multi-line SXid group, and
// flood windows that have closed by now. final closes every window (end of
// input).
func (p *Parser) Flush(final bool) {
	p.flushPending()
	p.out = append(p.out, p.flood.flush(final, p.cfg.Now())...)
}

// held returns the summaries of the occurrences that open flood windows
// hold, as they stand, leaving the windows open; windows past maxBytes of
// summaries are closed, their summaries returned by Drain.
func (p *Parser) held(maxBytes int) []*datamodels.HealthEvent {
	h := p.flood.held(maxBytes)
	p.out = append(p.out, p.flood.take()...)
	return h
}

// Drain returns the events completed so far and forgets them.
func (p *Parser) Drain() []*datamodels.HealthEvent {
	out := p.out
	p.out = nil
	return out
}

// eventTime is the time flood windows run on: the line's wall-clock time, or
// boot time + kernel timestamp, or the kernel timestamp alone, or the clock.
// known says whether it is a real wall-clock time fit for generatedTimestamp.
func (p *Parser) eventTime(r record) (time.Time, bool) {
	switch {
	case !r.wall.IsZero():
		return r.wall, true
	case r.mono >= 0 && !p.cfg.BootTime.IsZero():
		return p.cfg.BootTime.Add(time.Duration(r.mono) * time.Microsecond).UTC(), true
	case r.mono >= 0:
		return time.Unix(0, 0).Add(time.Duration(r.mono) * time.Microsecond).UTC(), false
	default:
		return p.cfg.Now().UTC(), false
	}
}

// emit reports the event build makes, unless flood control counts it.
func (p *Parser) emit(floodKey string, t time.Time, build func() *datamodels.HealthEvent) {
	now := p.flood.admit(floodKey, build, t)
	p.out = append(p.out, p.flood.take()...)
	if now {
		p.out = append(p.out, build())
	}
}

// --- NVRM: GPU Xid, UUID map, fallen off the bus ---

func (p *Parser) nvrm(r record, t time.Time, known bool) {
	b := r.body
	if i := strings.Index(b, "Xid ("); i >= 0 {
		p.xid(r, b[i+len("Xid ("):], t, known)
		return
	}
	if rest, ok := cutAfter(b, "GPU at PCI:"); ok {
		// "NVRM: GPU at PCI:0000:34:00: GPU-c43f0536-…"
		if j := strings.Index(rest, ": GPU-"); j > 0 {
			p.uuids[events.NormalizePCI(rest[:j], false)] = strings.TrimSpace(rest[j+2:])
		}
		return
	}
	if rest, ok := cutAfter(b, "The NVIDIA GPU "); ok {
		// First line of the split "fallen off the bus" message.
		p.fallenCtx.pci = events.NormalizePCI(firstField(rest), false)
		p.fallenCtx.at = p.lines
	}
	if strings.Contains(b, "fallen off the bus") {
		pci := ""
		if rest, ok := cutAfter(b, "NVRM: GPU "); ok {
			// "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
			// "NVRM: GPU at 0000:01:00.0 has fallen off the bus."
			rest = strings.TrimPrefix(rest, "at ")
			f := strings.TrimSuffix(firstField(rest), ":")
			if strings.Count(f, ":") >= 1 && !strings.EqualFold(f, "has") {
				pci = events.NormalizePCI(f, false)
			}
		}
		if pci == "" && p.fallenCtx.pci != "" && p.lines-p.fallenCtx.at <= 3 {
			pci = p.fallenCtx.pci
		}
		p.fallenOff(r, pci, t, known)
	}
}

func (p *Parser) fallenOff(r record, pci string, t time.Time, known bool) {
	if last, ok := p.xid79[pci]; ok && absDur(t.Sub(last)) <= 5*time.Minute {
		return // already reported as Xid 79
	}
	if last, ok := p.fallen[pci]; ok && absDur(t.Sub(last)) <= 5*time.Minute {
		return // the same loss, printed again
	}
	p.fallen[pci] = t
	p.emit(CodeFallenOff+"|"+pci, t, func() *datamodels.HealthEvent { return p.fallenEvent(r, pci, t, known) })
}

func (p *Parser) fallenEvent(r record, pci string, t time.Time, known bool) *datamodels.HealthEvent {
	meta := lineMeta(r)
	ents := p.gpuEntities(pci, meta)
	return p.event(ClassGPU, CheckFallenOff, CodeFallenOff, true, datamodels.RecommendedAction_RESTART_BM,
		fmt.Sprintf("GPU %s has fallen off the bus", orUnknown(pci)), ents, meta, t, known)
}

func (p *Parser) xid(r record, s string, t time.Time, known bool) {
	// s: "PCI:0000:3b:00): 79, pid=…, name=…, text" or "0000:01:00 GPU-I:05): 94, …"
	close := strings.IndexByte(s, ')')
	if close < 0 {
		return
	}
	inside := strings.TrimPrefix(s[:close], "PCI:")
	pciRaw, mig, _ := strings.Cut(inside, " ")
	rest := strings.TrimLeft(strings.TrimPrefix(s[close+1:], ":"), " ")
	n := 0
	for n < len(rest) && isDigit(rest[n]) {
		n++
	}
	if n == 0 {
		return
	}
	code, _ := strconv.Atoi(rest[:n])
	rest = strings.TrimPrefix(strings.TrimLeft(rest[n:], " "), ",")
	pci := events.NormalizePCI(pciRaw, false)
	if code == 79 {
		p.xid79[pci] = t
		p.fallen[pci] = t
	}
	key := "XID-" + strconv.Itoa(code) + "|" + pci
	if info := p.cat.XIDs[code]; info.SeverityInLine || code == 154 {
		// The line's own words set its fatality and action: it is counted
		// only with lines that say the same, so that a flood summary (the
		// last occurrence's event) never hides a fatal one.
		action, sev := xidSeverity(info, code, xidDetail(rest))
		key += "|" + sev + "|" + action.String()
	}
	p.emit(key, t, func() *datamodels.HealthEvent {
		return p.xidEvent(r, code, pci, mig, rest, t, known)
	})
}

// xidDetail is the text of an Xid line after its code, less the pid= and
// name= parts: what xidEvent reads the severity and action out of.
func xidDetail(rest string) string {
	var detail []string
	for _, part := range strings.Split(rest, ",") {
		part = strings.TrimSpace(part)
		if part != "" && !strings.HasPrefix(part, "pid=") && !strings.HasPrefix(part, "name=") {
			detail = append(detail, part)
		}
	}
	return strings.Join(detail, ", ")
}

// xidSeverity is the action of an Xid line and the severity it states
// ("" when none): for codes 144-150 the line's Fatal/Nonfatal, for 154
// the recovery action it names, else the catalog's action.
func xidSeverity(info XIDInfo, code int, text string) (datamodels.RecommendedAction, string) {
	switch {
	case info.SeverityInLine:
		if containsFold(text, "nonfatal") || containsFold(text, "non-fatal") {
			return datamodels.RecommendedAction_NONE, "Nonfatal"
		} else if strings.Contains(text, "Fatal") || strings.Contains(text, "fatal") {
			return info.Action, "Fatal"
		}
	case code == 154:
		return xid154Action(text), ""
	}
	return info.Action, ""
}

func (p *Parser) xidEvent(r record, code int, pci, mig, rest string, t time.Time, known bool) *datamodels.HealthEvent {
	info, listed := p.cat.XID(code)

	meta := lineMeta(r)
	meta["xid"] = strconv.Itoa(code)
	meta["mnemonic"] = info.Mnemonic
	meta["description"] = info.Description
	meta["resolution"] = info.Immediate
	if info.Investigatory != "" {
		meta["investigatory_action"] = info.Investigatory
	}
	if !listed {
		meta["catalog"] = "unlisted"
	}
	if mig = strings.TrimSpace(mig); mig != "" {
		meta["mig_instance"] = mig
	}
	var detail []string
	for _, part := range strings.Split(rest, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
		case strings.HasPrefix(part, "pid="):
			if v := strings.Trim(part[4:], "'\""); v != "" && v != "<unknown>" {
				meta["pid"] = v
			}
		case strings.HasPrefix(part, "name="):
			if v := strings.Trim(part[5:], "'\""); v != "" && v != "<unknown>" {
				meta["process_name"] = v
			}
		case strings.HasPrefix(part, "Ch "), strings.HasPrefix(part, "channel "), strings.HasPrefix(part, "Channel "):
			meta["channel"] = strings.TrimSpace(part[strings.IndexByte(part, ' '):])
			detail = append(detail, part)
		default:
			detail = append(detail, part)
		}
	}
	text := strings.Join(detail, ", ")
	if i := strings.Index(text, "Link "); i >= 0 {
		if l := leadingInt(text[i+5:]); l != "" {
			meta["link"] = l
		}
	} else if i := strings.Index(text, "link "); i >= 0 {
		if l := leadingInt(text[i+5:]); l != "" {
			meta["link"] = l
		}
	}
	action, sev := xidSeverity(info, code, text)
	if sev != "" {
		meta["severity"] = sev
	}
	ents := p.gpuEntities(pci, meta)
	msg := fmt.Sprintf("XID %d %s (%s) on GPU %s; Resolution: %s", code, info.Mnemonic, info.Description, orUnknown(pci), info.Immediate)
	if text != "" {
		msg += "; " + text
	}
	return p.event(ClassGPU, CheckXID, "XID-"+strconv.Itoa(code), action != datamodels.RecommendedAction_NONE, action, msg, ents, meta, t, known)
}

// xid154Action reads the new recovery action out of an Xid 154 line
// ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)").
func xid154Action(text string) datamodels.RecommendedAction {
	to := text
	if i := strings.LastIndex(text, " to "); i >= 0 {
		to = text[i:]
	}
	switch {
	case containsFold(to, "reboot"):
		return datamodels.RecommendedAction_RESTART_BM
	case containsFold(to, "reset"):
		return datamodels.RecommendedAction_COMPONENT_RESET
	case containsFold(to, "(none)"):
		return datamodels.RecommendedAction_NONE
	default:
		return datamodels.RecommendedAction_CONTACT_SUPPORT
	}
}

// gpuEntities are the entities of the GPU at pci, its PCI address and
// (when an NVRM line named it) its UUID, also recorded in meta. A line that
// names no device ("Xid (): 79") has none: its fault is the node's.
func (p *Parser) gpuEntities(pci string, meta map[string]string) []*datamodels.Entity {
	if pci == "" {
		return nil
	}
	meta["pci_bus_id"] = pci
	ents := []*datamodels.Entity{entity(events.EntityPCI, pci)}
	if u := p.gpuUUID(pci); u != "" {
		meta["gpu_uuid"] = u
		ents = append(ents, entity(events.EntityGPU, u))
	}
	return ents
}

func (p *Parser) gpuUUID(pci string) string {
	if u, ok := p.uuids[pci]; ok {
		return u
	}
	if p.cfg.Topology != nil {
		return p.cfg.Topology.GPUUUID(pci)
	}
	return ""
}

// --- NVSwitch SXid ---

func (p *Parser) sxid(r record, t time.Time, known bool) {
	b := r.body
	// "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)"
	idx := leadingInt(b[len(anchorNVSwitch):])
	i := strings.Index(b, "SXid (")
	if i < 0 {
		p.flushPending()
		return
	}
	s := b[i+len("SXid ("):]
	close := strings.IndexByte(s, ')')
	if close < 0 {
		p.flushPending()
		return
	}
	swPCI := events.NormalizePCI(s[:close], true)
	rest := strings.TrimLeft(strings.TrimPrefix(s[close+1:], ":"), " ")
	num := leadingInt(rest)
	if num == "" {
		p.flushPending()
		return
	}
	code, _ := strconv.Atoi(num)
	rest = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest[len(num):]), ","))
	sev, after, _ := strings.Cut(rest, ",")
	sev = strings.TrimSpace(sev)
	fatal := strings.EqualFold(sev, "Fatal")
	header := fatal || strings.EqualFold(sev, "Non-fatal") || strings.EqualFold(sev, "Nonfatal")
	key := swPCI + "|" + num
	if !header {
		// A detail line ("Severity 0 Engine instance …", "Data {…}") of the
		// group in progress; alone it is never an event.
		if p.pending != nil && p.pending.key == key {
			p.pending.details = append(p.pending.details, rest)
		}
		return
	}
	p.flushPending()
	after = strings.TrimSpace(after)
	link := -1
	desc := after
	if strings.HasPrefix(after, "Link ") {
		l := leadingInt(after[5:])
		if l != "" {
			link, _ = strconv.Atoi(l)
			desc = strings.TrimSpace(after[5+len(l):])
		}
	}
	info, listed := p.cat.SXID(code, fatal)
	action := info.Action
	if !fatal && info.Class != "nonfatal" {
		// The driver's word wins over the table: a line that says
		// Non-fatal does not abort jobs.
		action = datamodels.RecommendedAction_NONE
	}
	meta := lineMeta(r)
	meta["sxid"] = num
	meta["severity"] = sev
	meta["table_class"] = info.Class
	meta["table_text"] = info.Text
	meta["recovery"] = info.Recovery
	meta["nvswitch"] = anchorNVSwitch + idx
	meta["pci_bus_id"] = swPCI
	if !listed {
		meta["catalog"] = "unlisted"
	}
	ents := []*datamodels.Entity{entity(events.EntityNVSwitch, swPCI)}
	if link >= 0 {
		meta["link"] = strconv.Itoa(link)
		if p.cfg.Topology != nil {
			if u := p.cfg.Topology.GPUAtNVSwitchLink(swPCI, link); u != "" {
				meta["gpu_uuid"] = u
				ents = append(ents, entity(events.EntityGPU, u))
			}
		}
	}
	where := "NVSwitch " + swPCI
	if link >= 0 {
		where += " link " + strconv.Itoa(link)
	}
	msg := fmt.Sprintf("SXid %d %s on %s: %s", code, sev, where, desc)
	ev := p.event(ClassNVSwitch, CheckSXID, "SXID-"+num, fatal, action, msg, ents, meta, t, known)
	p.pending = &pendingSXID{key: key, ev: ev, t: t}
}

func (p *Parser) flushPending() {
	pd := p.pending
	if pd == nil {
		return
	}
	p.pending = nil
	if len(pd.details) > 0 {
		// The details join the event after event() cleaned it: each line
		// is made printable on its own (the newlines between them stay).
		for i, d := range pd.details {
			pd.details[i] = events.Printable(d)
		}
		pd.ev.Metadata["details"] = events.Truncate(strings.Join(pd.details, "\n"), validate.MaxMetadataVal)
	}
	// A Fatal and a Non-fatal line of one code are counted apart, so that
	// a flood summary (the last occurrence's event) never hides a fatal
	// one; each summary gets its own copy of the event to add its count to.
	key := pd.ev.ErrorCode[0] + "|" + pd.ev.Metadata["pci_bus_id"] + "|" + pd.ev.Metadata["link"] + "|" + strconv.FormatBool(pd.ev.IsFatal)
	p.emit(key, pd.t, func() *datamodels.HealthEvent { return proto.Clone(pd.ev).(*datamodels.HealthEvent) })
}

// --- mlx5 ---

type nicRule struct {
	match   func(string) bool
	code    string
	fatal   bool
	action  datamodels.RecommendedAction
	healthy string // code this line clears, for recovery lines
}

var nicRules = []nicRule{
	{match: func(s string) bool {
		return strings.Contains(s, "timeout. Will cause a leak of a command resource") || strings.Contains(s, "canceled on out of queue timeout")
	}, code: "MLX5-CMD-TIMEOUT"},
	{match: func(s string) bool {
		return strings.Contains(s, "TX timeout") || (strings.Contains(s, "NETDEV WATCHDOG") && strings.Contains(s, "timed out"))
	}, code: "MLX5-TX-TIMEOUT"},
	{match: func(s string) bool { return strings.Contains(s, "Port module event[error]") }, code: "MLX5-MODULE-ERROR",
		action: datamodels.RecommendedAction_CONTACT_SUPPORT},
	{match: func(s string) bool {
		return strings.Contains(s, "Port module event") && (strings.Contains(s, "Cable unplugged") || strings.Contains(s, "Cable disabled"))
	}, code: "MLX5-MODULE-UNPLUGGED"},
	{match: func(s string) bool {
		return strings.Contains(s, "Port module event") && strings.Contains(s, "Cable plugged")
	},
		healthy: "MLX5-MODULE-UNPLUGGED"},
	{match: func(s string) bool { return strings.Contains(s, "insufficient power") }, code: "MLX5-INSUFFICIENT-POWER",
		action: datamodels.RecommendedAction_CONTACT_SUPPORT},
	{match: func(s string) bool { return strings.Contains(s, "advertised sufficient power") }, healthy: "MLX5-INSUFFICIENT-POWER"},
	{match: func(s string) bool {
		return strings.Contains(s, "health compromised") || (strings.Contains(s, "Fatal error") && strings.Contains(s, "detected"))
	}, code: "MLX5-FATAL", fatal: true, action: datamodels.RecommendedAction_COMPONENT_RESET},
}

func (p *Parser) mlx5(r record, t time.Time, known bool) {
	b := r.body
	var rule *nicRule
	for i := range nicRules {
		if nicRules[i].match(b) {
			rule = &nicRules[i]
			break
		}
	}
	if rule == nil {
		return
	}
	pci, netdev := "", ""
	if rest, ok := cutAfter(b, "NETDEV WATCHDOG: "); ok {
		netdev = firstField(rest)
	} else if rest, ok := cutAfter(b, anchorMLX5+" "); ok {
		f := strings.Fields(rest)
		if len(f) > 0 {
			pci = events.NormalizePCI(strings.TrimSuffix(f[0], ":"), true)
			if !strings.HasSuffix(f[0], ":") && len(f) > 1 && strings.HasSuffix(f[1], ":") {
				netdev = strings.TrimSuffix(f[1], ":")
			}
		}
	}
	nic := ""
	if pci != "" && p.cfg.Topology != nil {
		nic = p.cfg.Topology.NICName(pci)
	}
	if nic == "" {
		nic = netdev
	}
	if nic == "" {
		nic = pci
	}
	meta := lineMeta(r)
	var ents []*datamodels.Entity
	if nic != "" {
		ents = append(ents, entity(events.EntityNIC, nic))
	}
	if pci != "" {
		meta["pci_bus_id"] = pci
		ents = append(ents, entity(events.EntityPCI, pci))
	}
	if netdev != "" {
		meta["netdev"] = netdev
	}
	if i := strings.Index(b, "module "); i >= 0 {
		if m := leadingInt(b[i+7:]); m != "" {
			meta["module"] = m
		}
	}
	dev := nic + "|" + meta["module"]
	if rule.healthy != "" {
		// A recovery line is reported only when it ends a reported fault.
		if !p.nicState[dev+"|"+rule.healthy] {
			return
		}
		delete(p.nicState, dev+"|"+rule.healthy)
		// The fault's occurrences its flood window holds go before.
		p.flood.end(rule.healthy + "|" + dev)
		p.out = append(p.out, p.flood.take()...)
		ev := p.event(ClassNIC, CheckNIC, rule.healthy, false, datamodels.RecommendedAction_NONE,
			fmt.Sprintf("NIC %s recovered: %s", nic, msgTail(b)), ents, meta, t, known)
		ev.IsHealthy = true
		p.out = append(p.out, ev)
		return
	}
	p.nicState[dev+"|"+rule.code] = true
	p.emit(rule.code+"|"+dev, t, func() *datamodels.HealthEvent {
		return p.event(ClassNIC, CheckNIC, rule.code, rule.fatal, rule.action,
			fmt.Sprintf("NIC %s: %s", nic, msgTail(b)), ents, meta, t, known)
	})
}

// msgTail drops the "mlx5_core 0000:0c:00.0: func:123:(pid 0): " head.
func msgTail(b string) string {
	if i := strings.Index(b, "): "); i >= 0 && strings.Contains(b[:i], "(pid") {
		return b[i+3:]
	}
	if i := strings.Index(b, ": "); i >= 0 {
		return b[i+2:]
	}
	return b
}

// --- helpers ---

// MetaBootID is the metadata key of the boot a line was logged in, where
// the source records it (the journal's _BOOT_ID, written as
// /proc/sys/kernel/random/boot_id writes it).
const MetaBootID = "boot_id"

// MetaKernelTimestamp and MetaFileOffset are the metadata keys of what
// tells the events of a line repeated within one second apart when the
// line's wall-clock time has whole seconds (syslog, dmesg -T): its printk
// timestamp ("500.100000", seconds since boot), or, with none, where in
// the file it was read from the line ends (the file source). Each is the
// same when the line is read again, so its event keeps its id
// (Check.occurrenceIDs).
const (
	MetaKernelTimestamp = "kernel_timestamp"
	MetaFileOffset      = "file_offset"
)

// lineMeta is the metadata an event of a line starts with: the line, the
// boot it was logged in when known, and what tells repeats within one
// second apart when its time does not (MetaKernelTimestamp).
func lineMeta(r record) map[string]string {
	m := map[string]string{"kernel_message": r.body}
	if r.boot != "" {
		m[MetaBootID] = r.boot
	}
	if !r.wall.IsZero() && !r.fine {
		switch {
		case r.mono >= 0:
			m[MetaKernelTimestamp] = fmt.Sprintf("%d.%06d", r.mono/1_000_000, r.mono%1_000_000)
		case r.offset > 0:
			m[MetaFileOffset] = strconv.FormatInt(r.offset, 10)
		}
	}
	return m
}

func (p *Parser) event(class, check, code string, fatal bool, action datamodels.RecommendedAction, msg string,
	ents []*datamodels.Entity, meta map[string]string, t time.Time, known bool) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{
		Version:           1,
		Agent:             Agent,
		ComponentClass:    class,
		CheckName:         check,
		IsFatal:           fatal,
		IsHealthy:         false,
		Message:           msg,
		RecommendedAction: action,
		ErrorCode:         []string{code},
		EntitiesImpacted:  ents,
		Metadata:          meta,
	}
	meta["count"] = "1"
	if known {
		ev.GeneratedTimestamp = timestamppb.New(t)
		meta["log_time"] = t.Format(time.RFC3339Nano)
	}
	validate.Clean(ev, p.cfg.Now()) // whatever the log line held, the gateway takes the event
	return ev
}

func entity(typ, val string) *datamodels.Entity {
	return &datamodels.Entity{EntityType: typ, EntityValue: val}
}

func cutAfter(s, sep string) (string, bool) {
	i := strings.Index(s, sep)
	if i < 0 {
		return "", false
	}
	return s[i+len(sep):], true
}

func firstField(s string) string {
	s = strings.TrimLeft(s, " ")
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

func leadingInt(s string) string {
	n := 0
	for n < len(s) && isDigit(s[n]) {
		n++
	}
	return s[:n]
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown PCI address)"
	}
	return s
}

func itoa(i int) string { return strconv.Itoa(i) }

// sortedKeys is used by tests and the parse command for stable output.
func sortedKeys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
