package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestHostTimeZone: a syslog kern.log (the kmsg check's file source)
// prints the host's local time without a zone; the agent reads it in the
// host's zone (time_zone: "host", the host's /etc/localtime as mounted, or
// a zone name), not in its own (UTC in the DaemonSet's container). On a
// host 5h behind UTC, read as UTC, a GPU's Xid of this boot read as older
// than the boot, went before the reboot's healthy events and was lifted by
// them, and its generatedTimestamp was 5h early; on a host 9h ahead, the
// previous boot's Xid went after them and stood as this boot's.
func TestHostTimeZone(t *testing.T) {
	boot := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, host     string // host: the zone the host writes its log in
		timeZone, link string // link: the host's /etc/localtime, for "host"
	}{
		{"host 5h behind UTC, named", "Etc/GMT+5", "Etc/GMT+5", ""},
		{"host 5h behind UTC, its /etc/localtime", "America/Chicago", "host", "/usr/share/zoneinfo/America/Chicago"},
		{"host 9h ahead of UTC, named", "Asia/Tokyo", "Asia/Tokyo", ""},
		{"host 9h ahead of UTC, its /etc/localtime", "Asia/Tokyo", "host", "../usr/share/zoneinfo/Asia/Tokyo"},
		{"host on UTC, no /etc/localtime", "UTC", "host", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.Mkdir(filepath.Join(dir, "etc"), 0o755)
			if tc.link != "" {
				if err := os.Symlink(tc.link, filepath.Join(dir, "etc/localtime")); err != nil {
					t.Fatal(err)
				}
			}
			logf, bootf, statf := filepath.Join(dir, "kern.log"), filepath.Join(dir, "boot_id"), filepath.Join(dir, "stat")
			os.WriteFile(statf, fmt.Appendf(nil, "cpu  1 2 3 4\nbtime %d\n", boot.Unix()), 0o644)
			os.WriteFile(logf, nil, 0o644)
			cfg := DefaultConfig()
			cfg.NodeName, cfg.Checks, cfg.TimeZone, cfg.TimeZoneFile = "n1", []string{"kmsg"}, tc.timeZone, filepath.Join(dir, "etc/localtime")
			cfg.Kmsg.Source, cfg.Kmsg.File, cfg.Kmsg.StateDir, cfg.Kmsg.BootIDPath, cfg.Kmsg.ProcStatPath = "file", logf, dir, bootf, statf
			cfg.Kmsg.Parser.Year, cfg.Kmsg.Parser.Now = 2024, func() time.Time { return boot.Add(time.Hour) }
			cfg.NIC.MetadataPath, cfg.Fabric.NvidiaSMI = filepath.Join(dir, "none.json"), "faultline-test-no-nvidia-smi"
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			cfg.hostZone(log)
			loc := cfg.Kmsg.Parser.Location
			if loc == nil {
				loc = time.Local
			}
			run := func(bootID string) []string {
				t.Helper()
				os.WriteFile(bootf, []byte(bootID+"\n"), 0o644)
				c, err := spec("kmsg").New(&cfg, log)
				if err != nil {
					t.Fatal(err)
				}
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if err := c.(interface{ Commit() error }).Commit(); err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, ev := range evs {
					out = append(out, fmt.Sprintf("%s %v %v %s", ev.GetCheckName(), ev.GetErrorCode(), ev.GetIsHealthy(),
						ev.GetGeneratedTimestamp().AsTime().UTC().Format("15:04")))
				}
				return out
			}
			run("boot-a") // the agent ran in the boot before
			host, err := time.LoadLocation(tc.host)
			if err != nil {
				t.Fatal(err)
			}
			f, _ := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY, 0o644)
			for _, l := range []struct {
				at  time.Time
				xid string
			}{{boot.Add(-20 * time.Minute), "79"}, {boot.Add(10 * time.Minute), "48"}} {
				// syslog's prefix: the host's local time
				fmt.Fprintf(f, "%s gpu-node-42 kernel: NVRM: Xid (PCI:0000:3b:00): %s, pid=1, name=x, DBE\n", l.at.In(host).Format("Jan _2 15:04:05"), l.xid)
			}
			f.Close()
			want := []string{
				"SysLogsXIDError [XID-79] false 09:40",
				"SysLogsXIDError [] true 10:00",
				"SysLogsSXIDError [] true 10:00",
				"SysLogsGPUFallenOff [] true 10:00",
				"SysLogsNICDriverError [] true 10:00",
				"SysLogsXIDError [XID-48] false 10:10",
			}
			if got := run("boot-b"); !slices.Equal(got, want) {
				t.Fatalf("after the reboot (read in %s):\n got %q\nwant %q", loc, got, want)
			}
		})
	}
}
