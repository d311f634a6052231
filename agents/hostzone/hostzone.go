// Package hostzone finds the time zone of the host whose logs an agent
// reads. Fabric Manager's log, the NVLSM log and a syslog kern.log print
// their times in the host's local time with no zone; the agent runs in a
// container with no zone of its own (time.Local is UTC there), so it must
// learn the host's from the host's /etc/localtime, mounted into the
// container, or be told it.
//
// Go's zone database is embedded (time/tzdata): the agent's image has no
// /usr/share/zoneinfo, and a host's /etc/localtime is usually a link into
// the host's own, which is not in the container.
package hostzone

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	_ "time/tzdata" // zone names resolve in a container without zoneinfo

	"github.com/faultline/faultline/agents/topology"
)

const (
	// Host is the time_zone setting that reads the host's zone from its
	// /etc/localtime (Location's file).
	Host = "host"
	// DefaultFile is the host's zone file.
	DefaultFile = "/etc/localtime"
)

// maxZoneBytes bounds a zone file read (TZif files are a few KiB).
const maxZoneBytes = 256 << 10

// Validate checks a time_zone setting: "host", "UTC", "Local" or an IANA
// zone name ("America/New_York").
func Validate(setting string) error {
	if setting == Host || setting == "" {
		return nil
	}
	_, err := time.LoadLocation(setting)
	return err
}

// Location resolves a time_zone setting: "host" (or "") reads file (the
// host's /etc/localtime as mounted, FromFile); anything else is a zone
// name (time.LoadLocation: "UTC", "Local" — the agent process's own zone
// —, or an IANA name). On error it returns UTC with the error, which the
// caller logs: a zone that cannot be read is no reason not to run.
func Location(setting, file string) (*time.Location, error) {
	if setting != Host && setting != "" {
		loc, err := time.LoadLocation(setting)
		if err != nil {
			return time.UTC, fmt.Errorf("time zone %q: %w", setting, err)
		}
		return loc, nil
	}
	if file == "" {
		file = DefaultFile
	}
	return FromFile(file)
}

// FromFile reads the zone a host's /etc/localtime gives (file: its path
// as mounted). A link (what systemd's timedatectl and every distribution
// installer make: "/usr/share/zoneinfo/Europe/Berlin", possibly relative)
// names its zone, loaded from the embedded database — the link's target
// is in the host's tree, not the container's; a regular file is read as
// TZif data (its name then is the one in /etc/timezone beside it, else
// "host"). A missing file in an existing directory is UTC, as glibc reads
// it: nil error. A missing directory (the host's /etc not mounted), an
// unreadable file or one that is no zone returns UTC and the error.
func FromFile(file string) (*time.Location, error) {
	fi, err := os.Lstat(file)
	if errors.Is(err, os.ErrNotExist) {
		if _, derr := os.Stat(filepath.Dir(file)); derr != nil {
			return time.UTC, fmt.Errorf("host time zone: %w (is the host's /etc mounted?)", derr)
		}
		return time.UTC, nil
	}
	if err != nil {
		return time.UTC, fmt.Errorf("host time zone: %w", err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(file)
		if err != nil {
			return time.UTC, fmt.Errorf("host time zone: %w", err)
		}
		name, ok := zoneName(target)
		if !ok {
			return time.UTC, fmt.Errorf("host time zone: %s links to %s, not a zoneinfo file", file, target)
		}
		loc, err := time.LoadLocation(name)
		if err != nil {
			return time.UTC, fmt.Errorf("host time zone: %s links to %s: %w", file, target, err)
		}
		return loc, nil
	}
	b, err := topology.ReadCapped(file, maxZoneBytes)
	if err != nil {
		return time.UTC, fmt.Errorf("host time zone: %w", err)
	}
	if len(b) == 0 {
		return time.UTC, nil // glibc reads an empty file as UTC too
	}
	name := "host"
	if n, err := topology.ReadCapped(filepath.Join(filepath.Dir(file), "timezone"), 255); err == nil {
		if s := strings.TrimSpace(string(n)); s != "" {
			name = s
		}
	}
	loc, err := time.LoadLocationFromTZData(name, b)
	if err != nil {
		return time.UTC, fmt.Errorf("host time zone: %s: %w", file, err)
	}
	return loc, nil
}

// zoneName is the zone a link into a zoneinfo directory names
// ("../usr/share/zoneinfo/America/New_York" → "America/New_York"); the
// posix/ and right/ variants are the same zones.
func zoneName(target string) (string, bool) {
	i := strings.LastIndex(target, "zoneinfo/")
	if i < 0 {
		return "", false
	}
	name := target[i+len("zoneinfo/"):]
	for _, p := range []string{"posix/", "right/"} {
		name = strings.TrimPrefix(name, p)
	}
	return name, name != ""
}

// Date is the instant a log line's wall-clock time in loc stands for —
// time.Date, made deterministic where the zone's clock changes: a time in
// the hour repeated when summer time ends is the earlier of its two
// instants (the first pass), unless that is before notBefore (the
// previous line of the same log, zero when none) and the later is not — a
// log written in order that went past the first pass is in the second; a
// time in the hour skipped when summer time starts (no line can carry
// one) is read with the offset before the change.
func Date(year int, month time.Month, day, hour, min, sec, nsec int, loc *time.Location, notBefore time.Time) time.Time {
	wall := time.Date(year, month, day, hour, min, sec, nsec, time.UTC)
	var first, second time.Time
	for _, probe := range []time.Duration{-24 * time.Hour, 24 * time.Hour} {
		_, off := wall.Add(probe).In(loc).Zone()
		t := wall.Add(-time.Duration(off) * time.Second)
		if !sameWall(t.In(loc), wall) {
			continue
		}
		switch {
		case first.IsZero():
			first = t
		case t.Before(first):
			first, second = t, first
		case t.After(first):
			second = t
		}
	}
	switch {
	case first.IsZero():
		_, off := wall.Add(-24 * time.Hour).In(loc).Zone()
		return wall.Add(-time.Duration(off) * time.Second)
	case !second.IsZero() && first.Before(notBefore) && !second.Before(notBefore):
		return second
	}
	return first
}

func sameWall(t, wall time.Time) bool {
	y, mo, d := t.Date()
	wy, wmo, wd := wall.Date()
	return y == wy && mo == wmo && d == wd && t.Hour() == wall.Hour() && t.Minute() == wall.Minute() && t.Second() == wall.Second()
}

// yearSlack is how far after now a time printed without its year may be
// (clocks of the writer and the reader apart) before it is last year's.
const yearSlack = 24 * time.Hour

// DateNoYear is Date for a time printed without its year (syslog's
// "Jan _2 15:04:05", NVLSM's log): in now's year in loc, or the year
// before where that would be more than a day after now — a December line
// read in January, a log's tail replayed after New Year.
func DateNoYear(month time.Month, day, hour, min, sec, nsec int, loc *time.Location, notBefore, now time.Time) time.Time {
	y := now.In(loc).Year()
	t := Date(y, month, day, hour, min, sec, nsec, loc, notBefore)
	if t.Sub(now) > yearSlack {
		t = Date(y-1, month, day, hour, min, sec, nsec, loc, notBefore)
	}
	return t
}

// Copy copies the zone of a host's /etc (etc: its path as mounted) into
// out, for FromFile to read there as it would have read etc: localtime as
// a link (its target kept, not followed: it is the host's) or as a
// regular file (TZif data, with the timezone file beside it that names
// it); nothing where the host has none (UTC). The chart runs it in an
// init container, not root, that alone mounts the host's /etc: the agent
// mounts out and sees nothing else of /etc. It returns what FromFile reads
// from etc (the zone, or UTC and why), and err only when out cannot be
// written. What cannot be read or is neither a link nor a file is not
// copied: the agent then reads UTC, and the error is the caller's to say.
func Copy(etc, out string) (loc *time.Location, zoneErr, err error) {
	src, dst := filepath.Join(etc, filepath.Base(DefaultFile)), filepath.Join(out, filepath.Base(DefaultFile))
	for _, name := range []string{dst, filepath.Join(out, "timezone")} {
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("host zone copy: %w", err)
		}
	}
	loc, zoneErr = FromFile(src)
	fi, lerr := os.Lstat(src)
	switch {
	case lerr != nil: // none (UTC), or etc not mounted (zoneErr says so)
	case fi.Mode()&os.ModeSymlink != 0:
		if target, rerr := os.Readlink(src); rerr == nil {
			err = os.Symlink(target, dst)
		}
	case fi.Mode().IsRegular():
		if b, rerr := topology.ReadCapped(src, maxZoneBytes); rerr == nil {
			err = os.WriteFile(dst, b, 0o644)
			if n, rerr := topology.ReadCapped(filepath.Join(etc, "timezone"), 255); rerr == nil && err == nil {
				err = os.WriteFile(filepath.Join(out, "timezone"), n, 0o644)
			}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("host zone copy: %w", err)
	}
	return loc, zoneErr, nil
}
