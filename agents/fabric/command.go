package fabric

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/faultline/faultline/agents/hostzone"
	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Input kinds of `fabric parse`.
const (
	KindFMLog       = "fm-log"          // /var/log/fabricmanager.log
	KindJournal     = "journal"         // journalctl -u nvidia-fabricmanager (short, short-iso or json)
	KindSMI         = "nvidia-smi-q"    // nvidia-smi -q, or grep fragments of it
	KindSystemctl   = "systemctl"       // systemctl status / systemctl show
	KindFMConfig    = "fm-config"       // fabricmanager.cfg
	KindNVLink      = "nvlink"          // nvidia-smi nvlink -s / -R
	KindTopo        = "topo"            // nvidia-smi topo -m
	KindAudit       = "nvswitch-audit"  // nvswitch-audit (table or -c)
	KindFMPM        = "fmpm"            // fmpm -l (JSON partition list)
	KindGPUInfo     = "gpu-information" // /proc/driver/nvidia/gpus/*/information
	KindModprobe    = "modprobe"        // modprobe.d conf / kernel command line with exclude lists
	KindExcluded    = "excluded-gpus"   // nvidia-smi -B
	KindTelemetry   = "dcgm-metrics"    // dcgm-exporter /metrics text
	KindNVLSMLog    = "nvlsm-log"       // /var/log/nvlsm.log
	KindGPUMetadata = "gpu-metadata"    // the topology collector's gpu_metadata.json
)

// Kinds lists the input kinds in the order detection tries them.
var Kinds = []string{KindFMLog, KindJournal, KindSMI, KindSystemctl, KindFMConfig, KindNVLink, KindTopo, KindAudit, KindFMPM,
	KindGPUInfo, KindModprobe, KindExcluded, KindTelemetry, KindNVLSMLog, KindGPUMetadata}

var (
	detFMLine      = regexp.MustCompile(`(?m)^\[[A-Z][a-z]{2} +\d{1,2} \d{4} \d{2}:\d{2}:\d{2}\] \[[A-Z]+\]`)
	detNVLinkGPU   = regexp.MustCompile(`(?m)^GPU \d+: .*\(UUID: GPU-`)
	detNVLinkLink  = regexp.MustCompile(`(?m)^\s+Link \d+: `)
	detTopoHeader  = regexp.MustCompile(`(?m)^\s*GPU0\s+GPU1?`)
	detSMIFabric   = regexp.MustCompile(`(?m)^\s*Fabric\s*$`)
	detSMIKey      = regexp.MustCompile(`(?m)^\s+State\s+:`)
	detConfigItem  = regexp.MustCompile(`(?m)^(FABRIC_MODE|LOG_FILE_NAME|ACCESS_LINK_FAILURE_MODE|TRUNK_LINK_FAILURE_MODE|NVSWITCH_FAILURE_MODE|DAEMONIZE|BIND_INTERFACE_IP|STARTING_TCP_PORT|TOPOLOGY_FILE_PATH|FM_SM_IPC_INTERFACE)=`)
	detNVLSMLine   = regexp.MustCompile(`(?m)^[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d+ \[[0-9A-Fa-f]+\] 0x[0-9A-Fa-f]+ -> `)
	detJournalLine = regexp.MustCompile(`(?m)^(?:[A-Z][a-z]{2} +\d{1,2}|\d{1,2}月 +\d{1,2}|\d{4}-\d{2}-\d{2}T)[ 0-9:T+.-]*\S* \S+ [^\s:\[]+(?:\[\d+\])?: `)
)

// DetectKind names the kind of an input from its content ("" when it
// cannot tell).
func DetectKind(text string) string {
	t := strings.TrimSpace(text)
	switch {
	case strings.HasPrefix(t, "{") && strings.Contains(t, `"partitionInfo"`):
		return KindFMPM
	case strings.HasPrefix(t, "{") && strings.Contains(t, `"nic_topology"`):
		return KindGPUMetadata
	case strings.HasPrefix(t, "{") && strings.Contains(t, `"MESSAGE"`):
		return KindJournal
	case strings.Contains(t, "GPU Reachability Matrix"):
		return KindAudit
	case strings.Contains(t, "DCGM_FI_DEV_NVSWITCH"):
		return KindTelemetry
	case strings.Contains(t, "==============NVSMI LOG") || (detSMIFabric.MatchString(t) && detSMIKey.MatchString(t)):
		return KindSMI
	case detNVLinkGPU.MatchString(t) && detNVLinkLink.MatchString(t):
		return KindNVLink
	case detTopoHeader.MatchString(t):
		return KindTopo
	case strings.Contains(t, "Active: ") && (strings.Contains(t, "Loaded: ") || strings.Contains(t, ".service")),
		strings.Contains(t, "ActiveState="), strings.Contains(t, "could not be found."):
		return KindSystemctl
	case strings.Contains(t, "GPU Excluded:") || strings.Contains(t, "Bus Location:"):
		return KindGPUInfo
	case detConfigItem.MatchString(t):
		return KindFMConfig
	case detFMLine.MatchString(t):
		return KindFMLog
	case detNVLSMLine.MatchString(t), strings.HasPrefix(t, "nvlsm: "):
		return KindNVLSMLog
	case detJournalLine.MatchString(t):
		return KindJournal
	case reExcludeParam.MatchString(t):
		return KindModprobe
	case reUUID.MatchString(t):
		return KindExcluded
	}
	return ""
}

// ParseCommand is `faultline-agent fabric parse [flags] FILE...`: it feeds
// recorded outputs to the fabric check's evaluator and prints the events
// it would report, one JSON line each (field names and enums as the REST
// API prints them). Files of different kinds form one snapshot of the node
// (a config file with an FM log, say); a kind given again starts the next
// poll, so successive recordings show transitions and counter increases.
func ParseCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("fabric parse", flag.ContinueOnError)
	fs.SetOutput(stdout)
	kind := fs.String("kind", "", "input kind of every FILE ("+strings.Join(Kinds, ", ")+"); detected from the content when not given")
	nvsw := fs.Int("nvswitches", -1, "the node's NVSwitch count (default: read from this system: /proc/driver/nvidia-nvswitch/devices or /dev/nvidia-nvswitchN)")
	bridges := fs.Int("nvlink-bridges", -1, "HGX B200 NVLink management bridges (CX7 SW_MNG functions); default: read from this system")
	platform := fs.String("platform", "auto", "auto, a100, h100 or b200")
	utc := fs.Bool("utc", false, "read timestamps printed without a zone as UTC (default: local time)")
	zone := fs.String("time-zone", "", "zone of timestamps printed without one, the recording host's: a zone name (America/Chicago) or host (this machine's /etc/localtime) (default: local time)")
	year := fs.Int("year", 0, "year of NVLSM and journal timestamps, which print none (default: the year of --now, else of this clock; the year before for a date more than a day after it)")
	nowFlag := fs.String("now", "", "time of the (last) poll, RFC 3339 (default: the newest timestamp of the inputs)")
	timeout := fs.Duration("in-progress-timeout", 5*time.Minute, "longest a GPU fabric registration may stay in progress after FM start-up")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("fabric parse: at least one FILE")
	}
	if *kind != "" && !validKind(*kind) {
		return fmt.Errorf("fabric parse: --kind %q is not one of %s", *kind, strings.Join(Kinds, ", "))
	}
	ev, err := NewEvaluator(EvalConfig{Platform: *platform, InProgressTimeout: *timeout})
	if err != nil {
		return fmt.Errorf("fabric parse: %w", err)
	}
	loc := time.Local
	if *utc {
		loc = time.UTC
	}
	if *zone != "" {
		if loc, err = hostzone.Location(*zone, ""); err != nil {
			return fmt.Errorf("fabric parse: --time-zone: %w", err)
		}
	}
	var fixedNow time.Time
	if *nowFlag != "" {
		if fixedNow, err = time.Parse(time.RFC3339Nano, *nowFlag); err != nil {
			return fmt.Errorf("fabric parse: --now: %w", err)
		}
	}
	readerNow := time.Now // the year of times printed without one
	if !fixedNow.IsZero() {
		readerNow = func() time.Time { return fixedNow }
	}
	if *nvsw < 0 {
		_, *nvsw = (&Check{cfg: withDefaults(Config{})}).nvswitches()
	}
	if *bridges < 0 {
		*bridges = (&Check{cfg: withDefaults(Config{})}).nvlinkBridges()
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	var polls []*Snapshot
	cur := NewSnapshot(time.Time{})
	seen := map[string]bool{}
	for _, path := range fs.Args() {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("fabric parse: %w", err)
		}
		k := *kind
		if k == "" {
			if k = DetectKind(string(b)); k == "" {
				return fmt.Errorf("fabric parse: %s: cannot tell what this file is; pass --kind (%s)", path, strings.Join(Kinds, ", "))
			}
		}
		if seen[k] && *kind == "" {
			polls = append(polls, cur)
			cur, seen = NewSnapshot(time.Time{}), map[string]bool{}
		}
		seen[k] = true
		if err := AddInput(cur, k, string(b), &LogReader{Loc: loc, Year: *year, Now: readerNow}); err != nil {
			return fmt.Errorf("fabric parse: %s: %w", filepath.Base(path), err)
		}
	}
	polls = append(polls, cur)
	for i, s := range polls {
		s.NVSwitchCount = *nvsw
		s.NVLinkBridges = *bridges
		if !fixedNow.IsZero() && i == len(polls)-1 {
			s.Now = fixedNow
		}
		if s.Now.IsZero() {
			s.Now = time.Now()
		}
		for _, e := range ev.Evaluate(s) {
			if err := writeEvent(w, e); err != nil {
				return err
			}
		}
	}
	return w.Flush()
}

func withDefaults(c Config) Config { c.defaults(); return c }

func validKind(k string) bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

func writeEvent(w *bufio.Writer, e *datamodels.HealthEvent) error {
	b, err := kmsg.MarshalEvent(e)
	if err != nil {
		return err
	}
	w.Write(b)
	return w.WriteByte('\n')
}

// AddInput adds one recorded output of a kind to a snapshot; the
// snapshot's Now moves to the newest timestamp the input carries.
func AddInput(s *Snapshot, kind, text string, r *LogReader) error {
	later := func(t time.Time) {
		if t.After(s.Now) {
			s.Now = t
		}
	}
	switch kind {
	case KindFMLog, KindJournal, KindNVLSMLog:
		if kind == KindNVLSMLog {
			r.DefaultSource = SourceNVLSM
		}
		lines := r.ReadLog(text)
		if len(lines) == 0 {
			return fmt.Errorf("no log lines")
		}
		for _, l := range lines {
			later(l.Time)
		}
		s.Log = append(s.Log, lines...)
	case KindSMI:
		rep := ParseSMI(text)
		if len(rep.GPUs) == 0 {
			return fmt.Errorf("no GPU in the nvidia-smi -q output")
		}
		later(rep.Timestamp)
		s.SMI = rep
	case KindSystemctl:
		var st *ServiceState
		if strings.Contains(text, "ActiveState=") {
			st = ParseSystemctlShow(text, r.loc())
		} else {
			st = ParseSystemctlStatus(text, r.loc())
		}
		if st.ActiveState == "" && st.LoadState == "" {
			return fmt.Errorf("no Active/ActiveState line")
		}
		s.Service = st
		if st.HasProcess("nvlsm") {
			// NVLSM in the unit's cgroup (the guide's unit starts it with
			// FM). Its absence proves nothing: some distributions run it
			// as a unit of its own.
			running := true
			s.NVLSMRunning = &running
		}
		if len(st.Journal) > 0 {
			lines := r.ReadLog(strings.Join(st.Journal, "\n"))
			for _, l := range lines {
				later(l.Time)
			}
			s.Log = append(s.Log, lines...)
		}
	case KindFMConfig:
		s.Config = ParseFMConfig(text)
	case KindNVLink:
		s.NVLink = ParseNVLink(text, s.NVLink)
		if len(s.NVLink) == 0 {
			return fmt.Errorf("no GPU in the nvlink output")
		}
	case KindTopo:
		m, err := ParseTopoMatrix(text)
		if err != nil {
			return err
		}
		s.Topo = m
	case KindAudit:
		a, err := ParseAudit(text)
		if err != nil {
			return err
		}
		s.Audit = a
	case KindFMPM:
		p, err := ParsePartitions(text)
		if err != nil {
			return err
		}
		s.Partitions = p
	case KindGPUInfo:
		for _, block := range splitBlocks(text) {
			g := ParseGPUInformation(block)
			if g.PCI == "" && g.UUID == "" {
				continue
			}
			s.GPUInfo = append(s.GPUInfo, g)
		}
		if s.GPUInfo == nil {
			return fmt.Errorf("no GPU information block")
		}
	case KindModprobe:
		if s.Excludes == nil {
			s.Excludes = &ExcludeList{}
		}
		s.Excludes.Parse("file", text)
	case KindExcluded:
		s.ExcludedListed = append([]GPUInformation{}, ParseExcludedGPUs(text)...)
	case KindTelemetry:
		t, err := ParseTelemetry(strings.NewReader(text))
		if err != nil {
			return err
		}
		s.Telemetry = t
	case KindGPUMetadata:
		m, err := parseMetadata(text)
		if err != nil {
			return err
		}
		s.ExpectedGPUs = m
	default:
		return fmt.Errorf("unknown kind %q", kind)
	}
	return nil
}

// splitBlocks splits concatenated information files (blank-line or
// "==> file <==" separated, as `head` prints them).
func splitBlocks(text string) []string {
	var blocks []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			blocks = append(blocks, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "==>") {
			flush()
			continue
		}
		if strings.HasPrefix(t, "Model:") {
			flush()
		}
		cur = append(cur, l)
	}
	flush()
	return blocks
}
