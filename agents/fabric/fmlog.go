package fabric

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/faultline/faultline/agents/hostzone"
)

// Log sources of a LogLine.
const (
	SourceFM      = "fm"      // nv-fabricmanager and its start script
	SourceNVLSM   = "nvlsm"   // the NVLink subnet manager (HGX B200)
	SourceSystemd = "systemd" // systemd's own lines about the unit
)

// LogLine is one message of the Fabric Manager log, the NVLSM log or the
// unit's journal, with its prefixes removed.
type LogLine struct {
	Source string
	// Level is FM's [INFO]/[WARNING]/[ERROR]/[FATAL] word ("" when the
	// line has none, as FM's stderr lines in the journal).
	Level string
	Msg   string
	// Time is the line's own timestamp (zero when it has none).
	Time time.Time
	// Raw is the line as read (continuation lines joined with "\n").
	Raw string
	// Replayed: read by the agent's first read of the log (its tail as it
	// was when the agent started, which may hold earlier boots' lines),
	// not written while the agent reads it.
	Replayed bool `json:"-"`
	// Resumed: read on from the position a previous run of the agent
	// committed, so not evaluated by it, whatever its time.
	Resumed bool `json:"-"`
}

var (
	// "[Oct 28 2024 10:00:01] [INFO] [tid 841] message"
	fmPrefix = regexp.MustCompile(`^\[([A-Z][a-z]{2} +\d{1,2} \d{4} \d{2}:\d{2}:\d{2})\] \[([A-Z]+)\] (?:\[tid \d+\] )?`)
	// journal short / short-iso: "Nov 15 14:15:47 host ident[pid]: msg",
	// "2023-11-15T14:15:47+0800 host ident[pid]: msg", "11月 15 14:15:47 ..."
	journalPrefix = regexp.MustCompile(`^(?:([A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2})|(\d{1,2}月 +\d{1,2} \d{2}:\d{2}:\d{2})|(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)) (\S+) ([^\s:\[]+)(?:\[(\d+)\])?: (.*)$`)
	// OpenSM/NVLSM log: "Nov 25 13:58:49 123456 [7F3A5C1FF700] 0x02 -> SUBNET UP"
	nvlsmPrefix = regexp.MustCompile(`^([A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}) \d+ \[[0-9A-Fa-f]+\] 0x[0-9A-Fa-f]+ -> (.*)$`)
)

// LogReader turns lines of any of the supported log formats into
// LogLines, joining FM's continuation lines (a multi-line message goes on
// without a "[date]" prefix) to the message they continue.
type LogReader struct {
	// Loc is the zone of timestamps printed without one (FM log, NVLSM
	// log, journal short format): the host's, which FM and NVLSM write in;
	// default time.Local. A time in an hour repeated when summer time ends
	// is read as in hostzone.Date, after the previous line's.
	Loc *time.Location
	// Year is the year of the timestamps that print none (NVLSM log,
	// journal short format); default, line by line, Now's, or the year
	// before for a date that would be more than a day after Now (a
	// December line read in January: hostzone.DateNoYear).
	Year int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// DefaultSource is the source of lines with no prefix telling it
	// (a bare NVLSM log file: SourceNVLSM); default SourceFM.
	DefaultSource string

	pending *LogLine
	last    time.Time // the previous line's local time, for hostzone.Date
}

// maxMessageBytes bounds a message joined from continuation lines.
const maxMessageBytes = 16 << 10

// Feed reads one raw line; it returns the lines completed by it (the
// previous message, when this line starts a new one).
func (r *LogReader) Feed(raw string) []LogLine {
	raw = strings.TrimRight(raw, "\r\n")
	if strings.TrimSpace(raw) == "" {
		return nil
	}
	ll, ok := r.parse(raw)
	if !ok {
		// A continuation of the previous FM message (past maxMessageBytes
		// dropped: a message of endless unprefixed lines grew without
		// bound, each line copying all before it).
		if r.pending != nil {
			if len(r.pending.Raw) < maxMessageBytes {
				r.pending.Msg += "\n" + strings.TrimSpace(raw)
				r.pending.Raw += "\n" + raw
			}
			return nil
		}
		ll = LogLine{Source: r.source(), Msg: strings.TrimSpace(raw), Raw: raw}
	}
	var out []LogLine
	if r.pending != nil {
		out = append(out, *r.pending)
	}
	r.pending = &ll
	return out
}

// Flush returns the message still waiting for continuation lines.
func (r *LogReader) Flush() []LogLine {
	if r.pending == nil {
		return nil
	}
	ll := *r.pending
	r.pending = nil
	return []LogLine{ll}
}

func (r *LogReader) source() string {
	if r.DefaultSource != "" {
		return r.DefaultSource
	}
	return SourceFM
}

func (r *LogReader) loc() *time.Location {
	if r.Loc != nil {
		return r.Loc
	}
	return time.Local
}

// parse recognises a line that starts a message; false for a continuation.
func (r *LogReader) parse(raw string) (LogLine, bool) {
	s := strings.TrimSpace(raw)
	if strings.HasPrefix(s, "{") {
		if ll, ok := r.parseJSON(s); ok {
			return ll, true
		}
	}
	if m := fmPrefix.FindStringSubmatch(s); m != nil {
		t := r.fmTime(m[1])
		return LogLine{Source: r.source(), Level: m[2], Msg: s[len(m[0]):], Time: t, Raw: raw}, true
	}
	if m := nvlsmPrefix.FindStringSubmatch(s); m != nil {
		return LogLine{Source: SourceNVLSM, Msg: m[2], Time: r.shortTime(m[1]), Raw: raw}, true
	}
	if m := journalPrefix.FindStringSubmatch(s); m != nil {
		var t time.Time
		switch {
		case m[1] != "":
			t = r.shortTime(m[1])
		case m[2] != "":
			mon, rest, _ := strings.Cut(m[2], "月")
			if n, err := strconv.Atoi(mon); err == nil && n >= 1 && n <= 12 {
				t = r.shortTime(time.Month(n).String()[:3] + rest)
			}
		default:
			t = r.isoTime(m[3])
		}
		return r.fromIdent(m[5], m[7], t, raw), true
	}
	if strings.HasPrefix(s, "nvlsm: ") {
		return LogLine{Source: SourceNVLSM, Msg: strings.TrimPrefix(s, "nvlsm: "), Raw: raw}, true
	}
	if strings.HasPrefix(s, "[") {
		return LogLine{}, false
	}
	// A bare line: a new message unless it continues an FM message (FM's
	// continuation lines follow a [date]-prefixed line).
	if r.pending != nil && r.pending.Source == SourceFM && !r.pending.Time.IsZero() && r.DefaultSource != SourceNVLSM {
		return LogLine{}, false
	}
	return LogLine{Source: r.source(), Msg: s, Raw: raw}, true
}

// fromIdent builds the line of a journal record from its identifier.
func (r *LogReader) fromIdent(ident, msg string, t time.Time, raw string) LogLine {
	ll := LogLine{Msg: strings.TrimSpace(msg), Time: t, Raw: raw}
	switch {
	case ident == "systemd" || strings.HasPrefix(ident, "systemd"):
		ll.Source = SourceSystemd
	case strings.Contains(ident, "nvlsm"):
		ll.Source = SourceNVLSM
	default:
		ll.Source = SourceFM
	}
	// FM's own prefix inside the journal message.
	if m := fmPrefix.FindStringSubmatch(ll.Msg); m != nil {
		if ft := r.fmTime(m[1]); !ft.IsZero() {
			ll.Time = ft
		}
		ll.Level = m[2]
		ll.Msg = ll.Msg[len(m[0]):]
	}
	if ll.Source == SourceNVLSM {
		if m := nvlsmPrefix.FindStringSubmatch(ll.Msg); m != nil {
			ll.Msg = m[2]
		}
	}
	return ll
}

// parseJSON reads a `journalctl -o json` record.
func (r *LogReader) parseJSON(s string) (LogLine, bool) {
	var rec map[string]any
	if err := json.Unmarshal([]byte(s), &rec); err != nil {
		return LogLine{}, false
	}
	msg, _ := rec["MESSAGE"].(string)
	if msg == "" {
		return LogLine{}, false
	}
	ident, _ := rec["SYSLOG_IDENTIFIER"].(string)
	if ident == "" {
		ident, _ = rec["_COMM"].(string)
	}
	var t time.Time
	if us, ok := rec["__REALTIME_TIMESTAMP"].(string); ok {
		if n, err := strconv.ParseInt(us, 10, 64); err == nil {
			t = time.UnixMicro(n).UTC()
		}
	}
	ll := r.fromIdent(ident, msg, t, s)
	if !t.IsZero() {
		ll.Time = t // the journal's time is zone-free: it wins over FM's own
	}
	return ll, true
}

func (r *LogReader) shortTime(s string) time.Time {
	t, err := time.Parse("Jan _2 15:04:05", strings.Join(strings.Fields(s), " "))
	if err != nil {
		return time.Time{}
	}
	if r.Year != 0 {
		return r.local(time.Date(r.Year, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC))
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	r.last = hostzone.DateNoYear(t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, r.loc(), r.last, now())
	return r.last
}

// fmTime reads FM's "Oct 28 2024 10:00:01" (the host's local time).
func (r *LogReader) fmTime(s string) time.Time {
	t, err := time.Parse("Jan _2 2006 15:04:05", s)
	if err != nil {
		return time.Time{}
	}
	return r.local(t)
}

// local is the instant of a wall-clock time of the log (given as UTC's
// fields), in the log's zone.
func (r *LogReader) local(w time.Time) time.Time {
	t := hostzone.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), r.loc(), r.last)
	r.last = t
	return t
}

// isoTime reads a journal short-iso time: with its offset, or, without
// one, in the log's zone.
func (r *LogReader) isoTime(s string) time.Time {
	for _, l := range []string{"2006-01-02T15:04:05.999999999Z07:00", "2006-01-02T15:04:05.999999999Z0700"} {
		if t, err := time.Parse(l, s); err == nil {
			return t
		}
	}
	if t, err := time.Parse("2006-01-02T15:04:05.999999999", s); err == nil {
		return r.local(t)
	}
	return time.Time{}
}

// ReadLog parses a whole log text.
func (r *LogReader) ReadLog(text string) []LogLine {
	var out []LogLine
	for _, l := range strings.Split(text, "\n") {
		out = append(out, r.Feed(l)...)
	}
	return append(out, r.Flush()...)
}

// --- references in FM messages ---

var (
	reSXid       = regexp.MustCompile(`(?i)detected nvswitch (fatal|non-fatal) error (\d+)(?: on (fid|nodeid) (\d+))? on nvswitch pci bus id ([0-9a-fA-F:.]+)(?: physical id (\d+))?(?: port (\d+))?`)
	reGPUPhys    = regexp.MustCompile(`(?i)gpu (?:physical id|physicalid|module id)[: ]+(\d+)`)
	reSwitchPCI  = regexp.MustCompile(`(?i)nvswitch (?:pci bus id|pci|bdf)[: ]+([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)`)
	reSwitchPhys = regexp.MustCompile(`(?i)(?:nvswitch|switch) (?:physical id|physicalid)[: ]+(\d+)`)
	rePCI        = regexp.MustCompile(`(?i)(?:pci bus id|pci|bdf)[: ]+([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)`)
	reLink       = regexp.MustCompile(`(?i)\b(?:link|port) (?:id |index |number )?(\d+)`)
	reUUID       = regexp.MustCompile(`\bGPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`)
	reSwitchUUID = regexp.MustCompile(`(?i)\b(?:nvswitch )?uuid[: ]+((?:SWX-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})`)
	rePartition  = regexp.MustCompile(`(?i)partition(?: id)?[: ]+(\d+)`)
	reFMReturn   = regexp.MustCompile(`(?i)fmReturn[: =]+(-\d+)`)
	reFMSt       = regexp.MustCompile(`\bFM_ST_[A-Z_]+\b`)
)

// Refs are the devices a message names.
type Refs struct {
	GPUPhysID, SwitchPhysID, Link, Partition int
	PCI, GPUUUID, SwitchUUID                 string
}

// refsOf extracts the references of a message (-1 / "" when absent).
func refsOf(msg string) Refs {
	r := Refs{GPUPhysID: -1, SwitchPhysID: -1, Link: -1, Partition: -1}
	if m := reGPUPhys.FindStringSubmatch(msg); m != nil {
		r.GPUPhysID, _ = strconv.Atoi(m[1])
	}
	if m := reSwitchPhys.FindStringSubmatch(msg); m != nil {
		r.SwitchPhysID, _ = strconv.Atoi(m[1])
	}
	if m := rePCI.FindStringSubmatch(msg); m != nil {
		r.PCI = normPCI(m[1])
	}
	if m := reLink.FindStringSubmatch(msg); m != nil {
		r.Link, _ = strconv.Atoi(m[1])
	}
	if m := reUUID.FindString(msg); m != "" {
		r.GPUUUID = m
	}
	if m := reSwitchUUID.FindStringSubmatch(msg); m != nil && !strings.HasPrefix(m[1], "GPU-") {
		r.SwitchUUID = m[1]
	}
	if m := rePartition.FindStringSubmatch(msg); m != nil {
		r.Partition, _ = strconv.Atoi(m[1])
	}
	return r
}

// SXidLine is an FM log "detected NVSwitch (non-)fatal error" line. FM
// names the fabric node as "on fid N" (up to 580) or "on NodeId N" (590).
type SXidLine struct {
	Code       int
	Fatal      bool
	Fid        string
	NodeID     string
	SwitchPCI  string
	SwitchPhys int
	Port       int
}

func parseSXidLine(msg string) (SXidLine, bool) {
	if !containsFold(msg, "detected nvswitch") {
		return SXidLine{}, false
	}
	m := reSXid.FindStringSubmatch(msg)
	if m == nil {
		return SXidLine{}, false
	}
	s := SXidLine{Fatal: strings.EqualFold(m[1], "fatal"), SwitchPCI: normPCI(m[5]), SwitchPhys: -1, Port: -1}
	s.Code, _ = strconv.Atoi(m[2])
	if strings.EqualFold(m[3], "nodeid") {
		s.NodeID = m[4]
	} else {
		s.Fid = m[4]
	}
	if m[6] != "" {
		s.SwitchPhys, _ = strconv.Atoi(m[6])
	}
	if m[7] != "" {
		s.Port, _ = strconv.Atoi(m[7])
	}
	return s, true
}

// partitionCodeOf finds an FM SDK return code in a message: an FM_ST_*
// name or "fmReturn: -N".
func partitionCodeOf(c *Catalog, msg string) *PartitionCode {
	if !strings.Contains(msg, "FM_ST_") && !containsFold(msg, "fmreturn") {
		return nil
	}
	for _, name := range reFMSt.FindAllString(msg, -1) {
		if name == "FM_ST_SUCCESS" {
			continue
		}
		if p := c.Partitions[name]; p != nil {
			return p
		}
	}
	if m := reFMReturn.FindStringSubmatch(msg); m != nil {
		v, _ := strconv.Atoi(m[1])
		return c.PartitionByValue(v)
	}
	return nil
}

// containsFold reports whether s contains the lower-case ASCII word sub,
// in any case, without allocating.
func containsFold(s, sub string) bool {
	n := len(sub)
	for i := 0; i+n <= len(s); i++ {
		j := 0
		for ; j < n; j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != sub[j] {
				break
			}
		}
		if j == n {
			return true
		}
	}
	return false
}
