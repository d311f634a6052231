package hostzone

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// zoneCase is a host's /etc/localtime as a distribution leaves it, or
// as it cannot be read, and the zone it gives.
type zoneCase struct {
	name    string
	setup   func(etc string) // makes etc/localtime
	file    string           // default etc/localtime
	offset  int              // of the zone at zoneAt, seconds
	zone    string           // its name, where it is said
	wantErr string
	// notCopied: Copy leaves nothing (nothing a copy could keep), and the
	// agent reads UTC from the copy, quietly: Copy said why.
	notCopied bool
}

var zoneAt = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

func zoneCases(t *testing.T) []zoneCase {
	tzif, err := os.ReadFile("testdata/Kolkata.tzif")
	if err != nil {
		t.Fatal(err)
	}
	return []zoneCase{
		{"absolute link", func(etc string) { os.Symlink("/usr/share/zoneinfo/America/New_York", filepath.Join(etc, "localtime")) }, "", -4 * 3600, "America/New_York", "", false},
		{"relative link", func(etc string) { os.Symlink("../usr/share/zoneinfo/Asia/Tokyo", filepath.Join(etc, "localtime")) }, "", 9 * 3600, "Asia/Tokyo", "", false},
		{"posix link", func(etc string) {
			os.Symlink("/usr/share/zoneinfo/posix/Australia/Adelaide", filepath.Join(etc, "localtime"))
		}, "", 9*3600 + 1800, "Australia/Adelaide", "", false},
		{"link to UTC", func(etc string) { os.Symlink("/usr/share/zoneinfo/Etc/UTC", filepath.Join(etc, "localtime")) }, "", 0, "Etc/UTC", "", false},
		{"TZif file", func(etc string) { os.WriteFile(filepath.Join(etc, "localtime"), tzif, 0o644) }, "", 5*3600 + 1800, "host", "", false},
		{"TZif file named by /etc/timezone", func(etc string) {
			os.WriteFile(filepath.Join(etc, "localtime"), tzif, 0o644)
			os.WriteFile(filepath.Join(etc, "timezone"), []byte("Asia/Kolkata\n"), 0o644)
		}, "", 5*3600 + 1800, "Asia/Kolkata", "", false},
		{"empty file (glibc: UTC)", func(etc string) { os.WriteFile(filepath.Join(etc, "localtime"), nil, 0o644) }, "", 0, "", "", false},
		{"missing file (glibc: UTC)", func(string) {}, "", 0, "UTC", "", false},
		{"etc not mounted", func(string) {}, "nothere/localtime", 0, "UTC", "is the host's /etc mounted?", true},
		{"link elsewhere", func(etc string) { os.Symlink("/opt/tz/mine", filepath.Join(etc, "localtime")) }, "", 0, "UTC", "not a zoneinfo file", false},
		{"link to no zone", func(etc string) { os.Symlink("/usr/share/zoneinfo/Mars/Olympus", filepath.Join(etc, "localtime")) }, "", 0, "UTC", "Mars/Olympus", false},
		{"not TZif", func(etc string) { os.WriteFile(filepath.Join(etc, "localtime"), []byte("EST5EDT\n"), 0o644) }, "", 0, "UTC", "malformed", false},
		{"a directory (a hostPath the kubelet made)", func(etc string) { os.Mkdir(filepath.Join(etc, "localtime"), 0o755) }, "", 0, "UTC", "is a directory", true},
	}
}

// check fails t unless loc and err are tc's zone.
func (tc zoneCase) check(t *testing.T, loc *time.Location, err error) {
	t.Helper()
	if tc.wantErr == "" && err != nil {
		t.Fatalf("error %v", err)
	}
	if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
		t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
	}
	if _, off := zoneAt.In(loc).Zone(); off != tc.offset {
		t.Errorf("%s: offset %ds at %s, want %ds", loc, off, zoneAt, tc.offset)
	}
	if tc.zone != "" && loc.String() != tc.zone {
		t.Errorf("zone %q, want %q", loc, tc.zone)
	}
}

// TestFromFile: the host's /etc/localtime as a distribution leaves it — a
// link into its zoneinfo (whose target is not in the agent's container),
// a copied TZif file, none — gives the host's zone; what cannot be read
// gives UTC and says why.
func TestFromFile(t *testing.T) {
	for _, tc := range zoneCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			etc := t.TempDir()
			tc.setup(etc)
			file := filepath.Join(etc, "localtime")
			if tc.file != "" {
				file = filepath.Join(etc, tc.file)
			}
			loc, err := FromFile(file)
			tc.check(t, loc, err)
		})
	}
}

// TestCopy: the chart's init container copies the host's zone out of its
// /etc, so that the agent need not mount the rest of it (/etc/shadow, the
// kubelet's and other credentials): Copy says the zone it read, and the
// agent reads the same zone from the copy. What cannot be read is said by
// Copy and leaves no copy (the agent reads UTC); a copy made before (a
// pod's init container run again) is replaced.
func TestCopy(t *testing.T) {
	for _, tc := range zoneCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			etc, out := t.TempDir(), t.TempDir()
			tc.setup(etc)
			if tc.file != "" {
				etc = filepath.Join(etc, filepath.Dir(tc.file))
			}
			// An earlier run's copy, of another zone.
			os.Symlink("/usr/share/zoneinfo/Europe/Berlin", filepath.Join(out, "localtime"))
			os.WriteFile(filepath.Join(out, "timezone"), []byte("Europe/Berlin\n"), 0o644)
			loc, zoneErr, err := Copy(etc, out)
			if err != nil {
				t.Fatalf("copy: %v", err)
			}
			tc.check(t, loc, zoneErr)
			copied, err := FromFile(filepath.Join(out, "localtime"))
			if tc.notCopied {
				tc = zoneCase{zone: "UTC"}
			}
			tc.check(t, copied, err)
		})
	}
	t.Run("out not writable", func(t *testing.T) {
		etc := t.TempDir()
		os.Symlink("/usr/share/zoneinfo/Asia/Tokyo", filepath.Join(etc, "localtime"))
		if _, _, err := Copy(etc, filepath.Join(t.TempDir(), "missing")); err == nil {
			t.Fatal("no error copying into a directory that is not there")
		}
	})
}

func TestLocation(t *testing.T) {
	for _, tc := range []struct {
		setting, want string
		bad           bool
	}{
		{"UTC", "UTC", false},
		{"America/Chicago", "America/Chicago", false},
		{"Local", "Local", false},
		{"America/Chicag", "UTC", true},
		{"+05:00", "UTC", true},
	} {
		loc, err := Location(tc.setting, "")
		if (err != nil) != tc.bad || (Validate(tc.setting) != nil) != tc.bad {
			t.Errorf("%q: error %v, want error %v", tc.setting, err, tc.bad)
		}
		if loc.String() != tc.want {
			t.Errorf("%q: %s, want %s", tc.setting, loc, tc.want)
		}
	}
}

// TestDate: a wall-clock time where the zone's clock changes. In the hour
// repeated when summer time ends (America/New_York, 1 November 2026, 01:00–
// 02:00 twice) it is the first pass unless the previous line of the log
// was already past it; in the hour skipped when summer time starts (8
// March 2026, 02:00–03:00) it is read with the offset before the change.
func TestDate(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(h, m int, day int, month time.Month) time.Time {
		return time.Date(2026, month, day, h, m, 0, 0, time.UTC)
	}
	for _, tc := range []struct {
		name      string
		month     time.Month
		day, h, m int
		notBefore time.Time
		want      time.Time
	}{
		{"before the repeated hour", time.November, 1, 0, 30, time.Time{}, utc(4, 30, 1, time.November)},
		{"repeated hour, first line", time.November, 1, 1, 30, time.Time{}, utc(5, 30, 1, time.November)},
		{"repeated hour, after a line of the first pass", time.November, 1, 1, 30, utc(5, 20, 1, time.November), utc(5, 30, 1, time.November)},
		{"repeated hour, after a line of the second pass", time.November, 1, 1, 30, utc(6, 10, 1, time.November), utc(6, 30, 1, time.November)},
		{"repeated hour, after a later line (out of order)", time.November, 1, 1, 30, utc(8, 0, 1, time.November), utc(5, 30, 1, time.November)},
		{"after the repeated hour", time.November, 1, 2, 30, time.Time{}, utc(7, 30, 1, time.November)},
		{"skipped hour", time.March, 8, 2, 30, time.Time{}, utc(7, 30, 8, time.March)},
		{"after the skipped hour", time.March, 8, 3, 30, time.Time{}, utc(7, 30, 8, time.March)},
		{"summer", time.July, 1, 12, 0, time.Time{}, utc(16, 0, 1, time.July)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Date(2026, tc.month, tc.day, tc.h, tc.m, 0, 0, ny, tc.notBefore)
			if !got.Equal(tc.want) {
				t.Errorf("%02d:%02d on %s %d: %s, want %s", tc.h, tc.m, tc.month, tc.day, got.UTC(), tc.want)
			}
		})
	}
}

// TestDateNoYear: a time printed without its year is in the reader's
// year, or the year before where that would be more than a day ahead.
func TestDateNoYear(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		month       time.Month
		day, h, min int
		loc         *time.Location
		now, want   time.Time
	}{
		{"this year", time.March, 3, 10, 0, time.UTC, time.Date(2027, 3, 3, 11, 0, 0, 0, time.UTC), time.Date(2027, 3, 3, 10, 0, 0, 0, time.UTC)},
		{"December, read in January", time.December, 31, 23, 59, time.UTC, time.Date(2027, 1, 1, 0, 5, 0, 0, time.UTC), time.Date(2026, 12, 31, 23, 59, 0, 0, time.UTC)},
		{"a few hours ahead", time.January, 1, 3, 0, time.UTC, time.Date(2027, 1, 1, 0, 5, 0, 0, time.UTC), time.Date(2027, 1, 1, 3, 0, 0, 0, time.UTC)},
		// 1 January 08:00 in Tokyo is still 31 December in UTC: the year is the host's.
		{"the host's new year, not UTC's", time.January, 1, 8, 30, tokyo, time.Date(2026, 12, 31, 23, 45, 0, 0, time.UTC), time.Date(2026, 12, 31, 23, 30, 0, 0, time.UTC)},
	} {
		if got := DateNoYear(tc.month, tc.day, tc.h, tc.min, 0, 0, tc.loc, time.Time{}, tc.now); !got.Equal(tc.want) {
			t.Errorf("%s: %s", tc.name, got.UTC())
		}
	}
}
