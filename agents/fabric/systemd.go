package fabric

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ServiceState is the nvidia-fabricmanager unit as systemd reports it, from
// `systemctl show` properties or the text of `systemctl status`.
type ServiceState struct {
	Unit                                     string
	LoadState, ActiveState, SubState, Result string
	// MainPID and MainProcess: "Main PID: 29850 (nv-fabricmanage)" — the
	// kernel's 15-character comm of nv-fabricmanager, not a different
	// process.
	MainPID     int
	MainProcess string
	// ActiveSince is when the unit last entered its active state (FM's
	// start-up time while it runs).
	ActiveSince time.Time
	// NotStartedThisBoot: systemd has no record of starting the unit
	// this boot (`systemctl show` InactiveExitTimestamp and
	// ActiveEnterTimestamp empty): at boot, FM not started yet.
	NotStartedThisBoot bool
	// Processes are the command lines of the unit's cgroup (status only):
	// nv-fabricmanager and, on HGX B200, nvlsm.
	Processes []string
	// Journal holds the log lines `systemctl status` prints after the
	// unit's properties.
	Journal []string
}

// Running reports a unit whose daemon runs: active and not "exited" (a
// Type=forking unit whose daemon died shows "active (exited)").
func (s *ServiceState) Running() bool {
	return s.ActiveState == "active" && s.SubState != "exited"
}

// HasProcess reports whether a cgroup process line mentions name.
func (s *ServiceState) HasProcess(name string) bool {
	for _, p := range s.Processes {
		if strings.Contains(p, name) {
			return true
		}
	}
	return false
}

// ParseSystemctlShow reads `systemctl show UNIT --property=...` output;
// loc is the zone systemctl printed its times in (nil: time.Local).
func ParseSystemctlShow(out string, loc *time.Location) *ServiceState {
	s := &ServiceState{}
	// unset: a timestamp property shown empty ("n/a" in newer systemd);
	// both must be shown for the unit to count as not started.
	unset := func(v string) bool { v = strings.TrimSpace(v); return v == "" || v == "n/a" }
	enterUnset, exitUnset := false, false
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if !ok {
			continue
		}
		switch k {
		case "Id":
			s.Unit = v
		case "LoadState":
			s.LoadState = v
		case "ActiveState":
			s.ActiveState = v
		case "SubState":
			s.SubState = v
		case "Result":
			s.Result = v
		case "MainPID":
			s.MainPID, _ = strconv.Atoi(v)
		case "ActiveEnterTimestamp":
			s.ActiveSince = parseSystemdTime(v, loc)
			enterUnset = unset(v)
		case "InactiveExitTimestamp":
			exitUnset = unset(v)
		}
	}
	s.NotStartedThisBoot = enterUnset && exitUnset
	return s
}

var (
	reActive  = regexp.MustCompile(`^Active: (\S+) \(([^)]*)\)(?: since (.+?)(?:;.*)?)?$`)
	reMainPID = regexp.MustCompile(`^Main PID: (\d+) \(([^)]*)\)`)
	reResult  = regexp.MustCompile(`Result: ([a-z-]+)`)
	reCGroup  = regexp.MustCompile(`^[│├└─\s|` + "`" + `-]*(\d+) (.+)$`)
)

// ParseSystemctlStatus reads the text of `systemctl status UNIT`. Only the
// Active line decides the state: a Type=forking unit prints its start
// script as "Process: N ExecStart=... (code=exited, status=0/SUCCESS)",
// which is the parent exiting after forking the daemon, not a failure.
// loc: as ParseSystemctlShow's.
func ParseSystemctlStatus(out string, loc *time.Location) *ServiceState {
	s := &ServiceState{}
	inCGroup, inJournal := false, false
	for _, raw := range strings.Split(out, "\n") {
		raw = strings.TrimRight(raw, "\r")
		l := strings.TrimSpace(raw)
		if inJournal {
			if l != "" {
				s.Journal = append(s.Journal, l)
			}
			continue
		}
		if l == "" {
			if s.ActiveState != "" {
				inJournal = true
			}
			inCGroup = false
			continue
		}
		switch {
		case strings.HasPrefix(l, "Unit ") && strings.HasSuffix(l, "could not be found."):
			s.Unit = strings.TrimSuffix(strings.TrimPrefix(l, "Unit "), " could not be found.")
			s.LoadState, s.ActiveState, s.SubState = "not-found", "inactive", "dead"
		case strings.HasPrefix(l, "● ") || strings.HasPrefix(l, "× ") || strings.HasPrefix(l, "○ ") ||
			strings.HasPrefix(l, "* ") || strings.HasPrefix(l, "↻ "):
			name, _, _ := strings.Cut(l[strings.Index(l, " ")+1:], " ")
			s.Unit = name
		case s.Unit == "" && strings.Contains(l, ".service - "):
			s.Unit, _, _ = strings.Cut(l, " ")
		case strings.HasPrefix(l, "Loaded: "):
			v := strings.TrimPrefix(l, "Loaded: ")
			s.LoadState, _, _ = strings.Cut(v, " ")
		case strings.HasPrefix(l, "Active: "):
			if m := reActive.FindStringSubmatch(l); m != nil {
				s.ActiveState, s.SubState = m[1], m[2]
				if r := reResult.FindStringSubmatch(m[2]); r != nil {
					s.SubState, s.Result = "failed", r[1]
				}
				if m[3] != "" {
					s.ActiveSince = parseSystemdTime(m[3], loc)
				}
			} else {
				f := strings.Fields(strings.TrimPrefix(l, "Active: "))
				if len(f) > 0 {
					s.ActiveState = f[0]
				}
			}
		case strings.HasPrefix(l, "Main PID: "):
			if m := reMainPID.FindStringSubmatch(l); m != nil {
				s.MainPID, _ = strconv.Atoi(m[1])
				if !strings.HasPrefix(m[2], "code=") {
					s.MainProcess = m[2]
				}
			}
		case strings.HasPrefix(l, "CGroup: "):
			inCGroup = true
		case inCGroup:
			if m := reCGroup.FindStringSubmatch(l); m != nil {
				s.Processes = append(s.Processes, m[2])
			}
		}
	}
	return s
}

// parseSystemdTime reads "Fri 2025-05-16 15:10:10 UTC": systemctl prints
// its local zone's abbreviation, which only that zone knows the offset of
// (time.Parse takes one it does not know for UTC): systemctl run on the
// host (a wrapper entering its namespaces) prints the host's, loc.
func parseSystemdTime(v string, loc *time.Location) time.Time {
	if loc == nil {
		loc = time.Local
	}
	v = strings.TrimSpace(v)
	if v == "" || v == "n/a" {
		return time.Time{}
	}
	for _, l := range []string{"Mon 2006-01-02 15:04:05 MST", "Mon 2006-01-02 15:04:05 -0700", "2006-01-02 15:04:05 MST"} {
		if t, err := time.ParseInLocation(l, v, loc); err == nil {
			return t
		}
	}
	return time.Time{}
}

// fmComm is the 15-character process name the kernel keeps for
// nv-fabricmanager ("nv-fabricmanage"): a process list showing it is FM.
const fmComm = "nv-fabricmanage"

// isFMProcess reports whether a process name or command line is FM's,
// truncated or not.
func isFMProcess(name string) bool {
	return strings.Contains(name, fmComm)
}
