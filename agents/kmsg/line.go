package kmsg

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/faultline/faultline/agents/hostzone"
)

// Line is one kernel-log record as a source delivers it.
type Line struct {
	// Text is the record as read: a bare message, or a message behind any of
	// the prefixes splitLine understands.
	Text string
	// Mono is the record's kernel timestamp in microseconds since boot, or -1
	// when the source did not give one (splitLine may still find one in Text).
	Mono int64
	// Wall is the record's wall-clock time, zero when unknown.
	Wall time.Time
	// Offset is where in the file the line was read from it ends (the
	// file source), 0 when unknown: it tells apart repeats of a line
	// that has no finer time than whole seconds.
	Offset int64
}

// anchors are the substrings a line must contain to be worth a closer look.
// Everything else — the vast majority of a kernel log — is rejected by the
// first scan without allocating.
const (
	anchorNVRM     = "NVRM"
	anchorNVSwitch = "nvidia-nvswitch"
	anchorMLX5     = "mlx5_core"
)

// interesting reports whether s mentions a driver this parser handles, and
// where the message body starts.
func interesting(s string) (int, bool) {
	if i := strings.Index(s, anchorNVRM); i >= 0 {
		return i, true
	}
	if i := strings.Index(s, anchorNVSwitch); i >= 0 {
		return i, true
	}
	if i := strings.Index(s, anchorMLX5); i >= 0 {
		if j := strings.Index(s[:i], "NETDEV WATCHDOG"); j >= 0 {
			return j, true
		}
		return i, true
	}
	return 0, false
}

// record is a line split into its timestamps and the message body.
type record struct {
	mono int64 // µs since boot, -1 unknown
	wall time.Time
	// fine: wall has a fraction of a second (a syslog or dmesg -T time
	// has whole seconds: real repeats can share one)
	fine   bool
	offset int64 // Line.Offset
	body   string
	boot   string // the boot the line was logged in, when the source says (the journal)
}

// localClock reads the wall-clock times a log prints without a zone
// (syslog, dmesg -T): in loc, the host's, in year when they print none.
type localClock struct {
	year int // 0: now's, or last year's (hostzone.DateNoYear)
	loc  *time.Location
	now  func() time.Time
	prev time.Time // the previous such time read (hostzone.Date's notBefore)
}

// splitLine finds the message body in one line of any of the formats a
// kernel log comes in (raw /dev/kmsg, dmesg, dmesg -T/--ctime, dmesg
// --time-format iso, syslog and journalctl short/short-iso/short-precise/
// short-monotonic, journalctl -o json) and the timestamps in front of it.
// ok is false when the line holds nothing this parser handles.
func splitLine(l Line, lc *localClock) (record, bool) {
	s := l.Text
	rec := record{mono: l.Mono, wall: l.Wall, fine: !l.Wall.IsZero(), offset: l.Offset}
	if len(s) > 0 && s[0] == '{' {
		if _, ok := interesting(s); !ok && !strings.Contains(s, `"MESSAGE":[`) {
			return rec, false
		}
		return splitJournalJSON(s, rec)
	}
	i, ok := interesting(s)
	if !ok {
		return rec, false
	}
	rec.body = strings.TrimRight(s[i:], "\r\n")
	if i > 0 {
		parsePrefix(s[:i], lc, &rec)
	}
	return rec, true
}

// splitJournalJSON handles one entry of journalctl -o json.
func splitJournalJSON(s string, rec record) (record, bool) {
	var e struct {
		Message  any    `json:"MESSAGE"`
		Realtime string `json:"__REALTIME_TIMESTAMP"`
		SrcMono  string `json:"_SOURCE_MONOTONIC_TIMESTAMP"`
		Mono     string `json:"__MONOTONIC_TIMESTAMP"`
		Boot     string `json:"_BOOT_ID"`
	}
	if err := json.Unmarshal([]byte(s), &e); err != nil {
		return rec, false
	}
	msg, ok := journalString(e.Message)
	if !ok {
		return rec, false
	}
	i, ok := interesting(msg)
	if !ok {
		return rec, false
	}
	rec.body = strings.TrimRight(msg[i:], "\r\n")
	rec.boot = journalBootID(e.Boot)
	if v, err := strconv.ParseInt(e.Realtime, 10, 64); err == nil && rec.wall.IsZero() {
		rec.wall, rec.fine = time.UnixMicro(v).UTC(), true
	}
	// For kernel messages the journal keeps the printk timestamp as
	// _SOURCE_MONOTONIC_TIMESTAMP: the same number /dev/kmsg reports.
	if v, err := strconv.ParseInt(e.SrcMono, 10, 64); err == nil && rec.mono < 0 {
		rec.mono = v
	}
	if i > 0 {
		parsePrefix(msg[:i], &localClock{loc: time.UTC}, &rec)
	}
	return rec, true
}

// journalBootID writes the journal's _BOOT_ID (32 hex digits) as the
// kernel writes the boot's id in /proc/sys/kernel/random/boot_id (a UUID
// with dashes), so a line of this boot has this boot's id however it was
// read; anything else is kept as it is.
func journalBootID(s string) string {
	if len(s) != 32 {
		return s
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) && (s[i] < 'a' || s[i] > 'f') {
			return s
		}
	}
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:]
}

// journalString is a field of journalctl -o json: a string, or, for a
// value that is not printable UTF-8 (a control character, a byte that is
// not UTF-8: an Xid line's process name can hold either), the array of its
// bytes (systemd's logs-show.c). The event made of it is made printable
// later (validate.Clean).
func journalString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []any:
		b := make([]byte, len(x))
		for i, n := range x {
			f, ok := n.(float64)
			if !ok || f < 0 || f > 255 || f != float64(byte(f)) {
				return "", false
			}
			b[i] = byte(f)
		}
		return string(b), true
	}
	return "", false
}

// parsePrefix reads the timestamps of the text in front of a message body.
func parsePrefix(p string, lc *localClock, rec *record) {
	// Raw /dev/kmsg: "pri,seq,usec,flags[,...];message".
	if semi := strings.IndexByte(p, ';'); semi > 0 && p[0] >= '0' && p[0] <= '9' {
		f := strings.SplitN(p[:semi], ",", 4)
		if len(f) >= 3 {
			if v, err := strconv.ParseInt(f[2], 10, 64); err == nil {
				if rec.mono < 0 {
					rec.mono = v
				}
				return
			}
		}
	}
	// "[ 1234.567890]" (dmesg, syslog with printk times, short-monotonic).
	if rec.mono < 0 {
		if v, ok := bracketMono(p); ok {
			rec.mono = v
			if p[0] == '[' && strings.IndexByte(p, ']') == len(strings.TrimRight(p, " "))-1 {
				return // plain dmesg: nothing else in front of the message
			}
		}
	}
	if !rec.wall.IsZero() {
		return
	}
	if t, fine, ok := isoTime(p); ok {
		rec.wall, rec.fine = t, fine
		return
	}
	if t, fine, ok := monthTime(p, lc); ok {
		rec.wall, rec.fine = t, fine
	}
}

// bracketMono finds "[ seconds.micros]" in p.
func bracketMono(p string) (int64, bool) {
	for i := 0; i < len(p); i++ {
		if p[i] != '[' {
			continue
		}
		j := i + 1
		for j < len(p) && p[j] == ' ' {
			j++
		}
		k := j
		for k < len(p) && p[k] >= '0' && p[k] <= '9' {
			k++
		}
		if k == j || k >= len(p) || p[k] != '.' {
			continue
		}
		secs, _ := strconv.ParseInt(p[j:k], 10, 64)
		k++
		m := k
		for m < len(p) && p[m] >= '0' && p[m] <= '9' {
			m++
		}
		if m >= len(p) || p[m] != ']' || m == k {
			continue
		}
		frac := p[k:m]
		for len(frac) < 6 {
			frac += "0"
		}
		us, _ := strconv.ParseInt(frac[:6], 10, 64)
		return secs*1_000_000 + us, true
	}
	return 0, false
}

// isoTime finds an ISO 8601 timestamp ("2025-10-28T10:15:30,123456+00:00",
// "2025-10-28T10:15:30.123+0000", "2025-10-28 10:15:30") in p; fine: it
// has a fraction of a second.
func isoTime(p string) (t time.Time, fine, ok bool) {
	for i := 0; i+19 <= len(p); i++ {
		if !isDigit(p[i]) || (i > 0 && isDigit(p[i-1])) {
			continue
		}
		c := p[i:]
		if len(c) < 19 || c[4] != '-' || c[7] != '-' || (c[10] != 'T' && c[10] != ' ') || c[13] != ':' || c[16] != ':' {
			continue
		}
		end := 19
		for end < len(c) && c[end] != ' ' && c[end] != ']' {
			end++
		}
		v := strings.Replace(c[:end], ",", ".", 1)
		v = strings.Replace(v, " ", "T", 1)
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999-0700", "2006-01-02T15:04:05.999999999"} {
			if t, err := time.Parse(layout, v); err == nil {
				return t.UTC(), end > 20 && (c[19] == '.' || c[19] == ','), true
			}
		}
	}
	return time.Time{}, false, false
}

// monthNames maps lower-case month abbreviations of the locales dmesg -T,
// syslog and journalctl print in (en, de, fr, es, it, pt, ru) to months.
var monthNames = map[string]time.Month{}

func init() {
	for m, names := range map[time.Month][]string{
		time.January:   {"jan", "ene", "gen", "янв", "janv"},
		time.February:  {"feb", "fév", "fev", "févr", "фев"},
		time.March:     {"mar", "mär", "mrz", "мар", "mars"},
		time.April:     {"apr", "abr", "avr", "апр"},
		time.May:       {"may", "mai", "mag", "май", "мая"},
		time.June:      {"jun", "juin", "giu", "июн"},
		time.July:      {"jul", "juil", "lug", "июл"},
		time.August:    {"aug", "ago", "aoû", "août", "авг"},
		time.September: {"sep", "sept", "set", "сен"},
		time.October:   {"oct", "okt", "ott", "out", "окт"},
		time.November:  {"nov", "ноя"},
		time.December:  {"dec", "dez", "dic", "déc", "дек"},
	} {
		for _, n := range names {
			monthNames[n] = m
		}
	}
}

// monthOf recognises a month token ("Oct", "Okt", "oct.", "octobre", "окт").
func monthOf(tok string) (time.Month, bool) {
	tok = strings.ToLower(strings.TrimRight(tok, ".,"))
	if m, ok := monthNames[tok]; ok {
		return m, true
	}
	// Try the first 4 and then 3 runes (full names: "October", "Oktober").
	for _, n := range []int{4, 3} {
		if utf8.RuneCountInString(tok) > n {
			r := []rune(tok)[:n]
			if m, ok := monthNames[string(r)]; ok {
				return m, true
			}
		}
	}
	return 0, false
}

// monthTime finds "Mon DD HH:MM:SS[.frac] [YYYY]" in p, with or without a
// weekday in front (syslog, journalctl short, dmesg -T/--ctime), in lc's
// zone (hostzone.Date: after the previous line's in an hour repeated when
// summer time ends); fine: it has a fraction of a second.
func monthTime(p string, lc *localClock) (t time.Time, fine, ok bool) {
	f := strings.FieldsFunc(p, func(r rune) bool { return r == ' ' || r == '[' || r == ']' || r == '\t' })
	for i := 0; i+2 < len(f); i++ {
		m, ok := monthOf(f[i])
		if !ok {
			continue
		}
		day, err := strconv.Atoi(strings.TrimRight(f[i+1], "."))
		if err != nil || day < 1 || day > 31 {
			continue
		}
		hh, mm, ss, ns, ok := clock(f[i+2])
		if !ok {
			continue
		}
		y := lc.year
		if i+3 < len(f) && len(f[i+3]) == 4 {
			if v, err := strconv.Atoi(f[i+3]); err == nil {
				y = v
			}
		}
		loc := lc.loc
		if loc == nil {
			loc = time.Local
		}
		if y == 0 && lc.now != nil {
			t = hostzone.DateNoYear(m, day, hh, mm, ss, ns, loc, lc.prev, lc.now())
		} else {
			t = hostzone.Date(y, m, day, hh, mm, ss, ns, loc, lc.prev)
		}
		t = t.UTC()
		lc.prev = t
		return t, len(f[i+2]) > 9 && (f[i+2][8] == '.' || f[i+2][8] == ','), true
	}
	return time.Time{}, false, false
}

// clock parses "HH:MM:SS[.frac]".
func clock(s string) (hh, mm, ss, ns int, ok bool) {
	if len(s) < 8 || s[2] != ':' || s[5] != ':' {
		return 0, 0, 0, 0, false
	}
	var err error
	if hh, err = strconv.Atoi(s[0:2]); err != nil {
		return 0, 0, 0, 0, false
	}
	if mm, err = strconv.Atoi(s[3:5]); err != nil {
		return 0, 0, 0, 0, false
	}
	if ss, err = strconv.Atoi(s[6:8]); err != nil {
		return 0, 0, 0, 0, false
	}
	if len(s) > 9 && (s[8] == '.' || s[8] == ',') {
		frac := s[9:]
		for len(frac) < 9 {
			frac += "0"
		}
		if v, err := strconv.Atoi(frac[:9]); err == nil {
			ns = v
		}
	}
	return hh, mm, ss, ns, true
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }
