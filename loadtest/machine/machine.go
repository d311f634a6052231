// Package machine describes the machine a measurement ran on: its cores and
// its load (as uptime prints it), so every figure the load tools print
// carries the conditions it was taken under.
package machine

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Load returns the 1, 5 and 15 minute load averages from /proc/loadavg
// ("?" each when unknown).
func Load() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "? ? ?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "? ? ?"
	}
	return strings.Join(f[:3], " ")
}

// Describe returns e.g. "2026-11-23T19:02:11Z, 2 cores, load 3.10 2.55 1.20".
func Describe() string {
	return fmt.Sprintf("%s, %d cores, load %s", time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), Load())
}

// Stamp prefixes a figure with the machine's description, the form every
// loadtest tool prints its results in:
//
//	[2026-11-23T19:02:11Z, 2 cores, load 3.10 2.55 1.20] gateway gRPC: 91,000 events/s
func Stamp(format string, args ...any) string {
	return "[" + Describe() + "] " + fmt.Sprintf(format, args...)
}

// CPUSeconds is the user+system CPU time of a process (0 when unknown).
func CPUSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / 100 // USER_HZ
}
