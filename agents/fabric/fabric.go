// Package fabric is the node agent's NVIDIA Fabric Manager check: the
// nvidia-fabricmanager service state, its log file (initialization
// failures, NVLink training failures, NVSwitch errors) and each GPU's
// Fabric State/Status/Health as nvidia-smi -q prints it. Recovery actions
// follow the Fabric Manager User Guide (../shared/seeds/
// fabric-manager-user-guide.txt): FM initialization and NVLink training
// failures call for restarting FM and the host, and RMA if they persist
// (Table 17); fatal NVSwitch errors for a GPU/NVSwitch reset.
//
// Systems without NVSwitches are not flagged: the service and log are only
// looked at when NVSwitch devices exist, and GPUs whose fabric state is
// "Not Supported" or "N/A" are skipped.
//
// Events (agent "faultline-agent"):
//
//	checkName                  componentClass errorCode                     isFatal action
//	FabricManagerService       NVSwitch       FM-SERVICE-<STATE>            true    RESTART_BM
//	FabricManagerInit          NVSwitch       FM-INIT-FAILURE               true    RESTART_BM
//	FabricManagerNVLinkTraining NVSwitch      FM-NVLINK-TRAINING-FAILURE    true    RESTART_BM
//	FabricManagerNVSwitchError NVSwitch       SXID-N                        per log COMPONENT_RESET / NONE
//	GPUFabricState             GPU            FABRIC-PROBE-FAILURE|TIMEOUT  true    RESTART_BM
//	GPUFabricHealth            GPU            FABRIC-UNHEALTHY              true    RESTART_BM
//	GPUFabricHealth            GPU            FABRIC-BANDWIDTH-DEGRADED     false   NONE
//
// Service and GPU conditions are states: an event when one turns bad, and
// an isHealthy event when it recovers. Log lines are one-off occurrences.
package fabric

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Check names and classes.
const (
	Agent = "faultline-agent"

	CheckService  = "FabricManagerService"
	CheckInit     = "FabricManagerInit"
	CheckTraining = "FabricManagerNVLinkTraining"
	CheckNVSwitch = "FabricManagerNVSwitchError"
	CheckState    = "GPUFabricState"
	CheckHealth   = "GPUFabricHealth"
)

// Recovery texts from the Fabric Manager User Guide, put in metadata.
const (
	recoveryFM       = "Restart the Fabric Manager service and the host; if the error persists, RMA the GPU or inspect the NVLink/baseboard connections (FM guide, Table 17)."
	recoveryNVSwitch = "Reset the GPU and all GPUs of the affected workload; on a trunk port stop FM, reset all GPUs and NVSwitches, start FM; if it persists, reboot (FM guide, Fatal SXid Errors)."
)

// Runner runs a command and returns its standard output.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, name, args...).Output()
}

// Config configures the fabric check (TOML section [fabric], flags
// --fabric-*).
type Config struct {
	// PollInterval is how often the check runs (default 30s).
	PollInterval time.Duration `toml:"poll_interval"`
	// NVSwitchGlob finds NVSwitch devices (default
	// "/dev/nvidia-nvswitch[0-9]*"). No match: not an NVSwitch system.
	NVSwitchGlob string `toml:"nvswitch_glob"`
	// Service is the FM systemd unit (default "nvidia-fabricmanager").
	Service string `toml:"service"`
	// LogFile is FM's log (default /var/log/fabricmanager.log).
	LogFile string `toml:"log_file"`
	// Systemctl and NvidiaSMI are the binaries (defaults "systemctl" and
	// "nvidia-smi").
	Systemctl string `toml:"systemctl"`
	NvidiaSMI string `toml:"nvidia_smi"`
	// InProgressTimeout is how long a GPU's fabric probe may stay "In
	// Progress" or "Not Started" before it is reported (default 5m).
	InProgressTimeout time.Duration `toml:"in_progress_timeout"`
	// Runner runs systemctl and nvidia-smi (default ExecRunner).
	Runner Runner `toml:"-"`
	// Now is the clock (default time.Now).
	Now func() time.Time `toml:"-"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `toml:"-"`
}

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	return Config{PollInterval: 30 * time.Second, NVSwitchGlob: "/dev/nvidia-nvswitch[0-9]*", Service: "nvidia-fabricmanager",
		LogFile: "/var/log/fabricmanager.log", Systemctl: "systemctl", NvidiaSMI: "nvidia-smi", InProgressTimeout: 5 * time.Minute}
}

// RegisterFlags binds the --fabric-* flags to c, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.PollInterval, "fabric-poll-interval", c.PollInterval, "how often the fabric check runs (fabric.poll_interval)")
	fs.StringVar(&c.NVSwitchGlob, "fabric-nvswitch-glob", c.NVSwitchGlob, "NVSwitch device files (fabric.nvswitch_glob)")
	fs.StringVar(&c.Service, "fabric-service", c.Service, "Fabric Manager systemd unit (fabric.service)")
	fs.StringVar(&c.LogFile, "fabric-log-file", c.LogFile, "Fabric Manager log file (fabric.log_file)")
	fs.StringVar(&c.NvidiaSMI, "fabric-nvidia-smi", c.NvidiaSMI, "nvidia-smi binary (fabric.nvidia_smi)")
	fs.DurationVar(&c.InProgressTimeout, "fabric-in-progress-timeout", c.InProgressTimeout, "longest a GPU fabric probe may stay in progress (fabric.in_progress_timeout)")
}

// Validate names the first bad setting.
func (c *Config) Validate() error {
	if c.InProgressTimeout < 0 {
		return errors.New("fabric.in_progress_timeout: must not be negative")
	}
	if c.PollInterval < 0 {
		return errors.New("fabric.poll_interval: must not be negative")
	}
	return nil
}

// Check is the Fabric Manager check.
type Check struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	bad       map[string]*datamodels.HealthEvent // condition key → its unhealthy event
	pending   map[string]time.Time               // GPU → first seen in progress
	logOffset int64
	logInode  uint64
	logStart  bool
}

// New returns the fabric check.
func New(cfg Config) (*Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.NVSwitchGlob == "" {
		cfg.NVSwitchGlob = "/dev/nvidia-nvswitch[0-9]*"
	}
	if cfg.Service == "" {
		cfg.Service = "nvidia-fabricmanager"
	}
	if cfg.LogFile == "" {
		cfg.LogFile = "/var/log/fabricmanager.log"
	}
	if cfg.Systemctl == "" {
		cfg.Systemctl = "systemctl"
	}
	if cfg.NvidiaSMI == "" {
		cfg.NvidiaSMI = "nvidia-smi"
	}
	if cfg.InProgressTimeout == 0 {
		cfg.InProgressTimeout = 5 * time.Minute
	}
	if cfg.Runner == nil {
		cfg.Runner = ExecRunner{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Check{cfg: cfg, log: cfg.Logger, bad: map[string]*datamodels.HealthEvent{}, pending: map[string]time.Time{}}, nil
}

// Name implements check.Check.
func (c *Check) Name() string { return "fabric" }

// Check implements check.Check.
func (c *Check) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*datamodels.HealthEvent
	var errs []error
	switches, _ := filepath.Glob(c.cfg.NVSwitchGlob)
	if len(switches) > 0 {
		evs, err := c.service(ctx, switches)
		out = append(out, evs...)
		errs = append(errs, err)
		evs, err = c.logFile()
		out = append(out, evs...)
		errs = append(errs, err)
	}
	evs, err := c.gpus(ctx)
	out = append(out, evs...)
	errs = append(errs, err)
	return out, errors.Join(errs...)
}

// transition records a condition's state and returns the event to report,
// if any: the unhealthy event when it turns bad (or changes code), a
// healthy one when it recovers.
func (c *Check) transition(key string, bad *datamodels.HealthEvent) *datamodels.HealthEvent {
	prev := c.bad[key]
	switch {
	case bad != nil && (prev == nil || prev.ErrorCode[0] != bad.ErrorCode[0]):
		c.bad[key] = bad
		return bad
	case bad == nil && prev != nil:
		delete(c.bad, key)
		ok := &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: prev.ComponentClass, CheckName: prev.CheckName,
			IsHealthy: true, Message: "recovered: " + prev.Message, RecommendedAction: datamodels.RecommendedAction_NONE,
			EntitiesImpacted: prev.EntitiesImpacted, Metadata: map[string]string{"recovered_error_code": prev.ErrorCode[0]},
			GeneratedTimestamp: timestamppb.New(c.cfg.Now())}
		return ok
	}
	return nil
}

func (c *Check) event(class, check, code string, fatal bool, action datamodels.RecommendedAction, msg string,
	ents []*datamodels.Entity, meta map[string]string) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: class, CheckName: check, IsFatal: fatal,
		Message: msg, RecommendedAction: action, ErrorCode: []string{code}, EntitiesImpacted: ents, Metadata: meta,
		GeneratedTimestamp: timestamppb.New(c.cfg.Now())}
}

// --- service ---

func (c *Check) service(ctx context.Context, switches []string) ([]*datamodels.HealthEvent, error) {
	out, err := c.cfg.Runner.Run(ctx, c.cfg.Systemctl, "show", c.cfg.Service, "--property=LoadState,ActiveState,SubState,Result")
	if err != nil {
		return nil, fmt.Errorf("systemctl show %s: %w", c.cfg.Service, err)
	}
	p := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			p[k] = v
		}
	}
	state := ""
	switch {
	case p["LoadState"] == "not-found":
		state = "NOT-INSTALLED"
	case p["ActiveState"] == "failed":
		state = "FAILED"
	case p["ActiveState"] == "inactive", p["ActiveState"] == "deactivating":
		state = "INACTIVE"
	}
	var bad *datamodels.HealthEvent
	if state != "" {
		bad = c.event(events.EntityNVSwitch, CheckService, "FM-SERVICE-"+state, true, datamodels.RecommendedAction_RESTART_BM,
			fmt.Sprintf("Fabric Manager service %s is %s (%s/%s, result %s) on an NVSwitch system: CUDA jobs cannot start",
				c.cfg.Service, strings.ToLower(state), p["ActiveState"], p["SubState"], p["Result"]),
			switchEntities(switches),
			map[string]string{"active_state": p["ActiveState"], "sub_state": p["SubState"], "result": p["Result"], "recovery": recoveryFM})
	}
	if ev := c.transition("service", bad); ev != nil {
		return []*datamodels.HealthEvent{ev}, nil
	}
	return nil, nil
}

// --- log file ---

func (c *Check) logFile() ([]*datamodels.HealthEvent, error) {
	f, err := os.Open(c.cfg.LogFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	ino := inodeOf(fi)
	if ino != c.logInode || fi.Size() < c.logOffset {
		c.logInode, c.logOffset = ino, 0
	}
	if _, err := f.Seek(c.logOffset, io.SeekStart); err != nil {
		return nil, err
	}
	var out []*datamodels.HealthEvent
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // a partial line waits for the next call
		}
		c.logOffset += int64(len(line))
		if ev := c.ParseLogLine(strings.TrimRight(line, "\r\n")); ev != nil {
			out = append(out, ev)
		}
	}
	return out, nil
}

// ParseLogLine returns the event of one Fabric Manager log line, or nil.
func (c *Check) ParseLogLine(line string) *datamodels.HealthEvent {
	low := strings.ToLower(line)
	isErr := strings.Contains(line, "[ERROR]") || strings.Contains(line, "[FATAL]")
	meta := map[string]string{"log_line": line}
	sw := []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: c.cfg.Service}}
	switch {
	case strings.Contains(low, "detected nvswitch fatal error"), strings.Contains(low, "detected nvswitch non-fatal error"):
		fatal := strings.Contains(low, "nvswitch fatal error")
		code := firstInt(low[strings.Index(low, "error ")+6:])
		if pci := after(low, "pci bus id "); pci != "" {
			sw = []*datamodels.Entity{{EntityType: events.EntityNVSwitch, EntityValue: normPCI(pci)}}
			meta["pci_bus_id"] = normPCI(pci)
		}
		if port := after(low, " port "); port != "" {
			meta["port"] = port
		}
		action := datamodels.RecommendedAction_NONE
		if fatal {
			action = datamodels.RecommendedAction_COMPONENT_RESET
			meta["recovery"] = recoveryNVSwitch
		}
		return c.event("NVSwitch", CheckNVSwitch, "SXID-"+code, fatal, action, "Fabric Manager: "+msgOf(line), sw, meta)
	case !isErr:
		return nil
	case strings.Contains(low, "training failed"), strings.Contains(low, "failed to train"),
		strings.Contains(low, "train nvlink connections failed"), strings.Contains(low, "training error"):
		meta["recovery"] = recoveryFM
		return c.event("NVSwitch", CheckTraining, "FM-NVLINK-TRAINING-FAILURE", true, datamodels.RecommendedAction_RESTART_BM,
			"Fabric Manager NVLink training failure: "+msgOf(line), sw, meta)
	case strings.Contains(low, "failed to initialize"), strings.Contains(low, "initialization failed"),
		strings.Contains(low, "aborting fabric manager"), strings.Contains(low, "don't match with driver version"),
		strings.Contains(low, "fabric manager failed"), strings.Contains(low, "failed to start"):
		meta["recovery"] = recoveryFM
		return c.event("NVSwitch", CheckInit, "FM-INIT-FAILURE", true, datamodels.RecommendedAction_RESTART_BM,
			"Fabric Manager initialization failure: "+msgOf(line), sw, meta)
	}
	return nil
}

// msgOf drops "[date] [LEVEL] [tid N] " from an FM log line.
func msgOf(line string) string {
	for strings.HasPrefix(line, "[") {
		i := strings.IndexByte(line, ']')
		if i < 0 {
			break
		}
		line = strings.TrimLeft(line[i+1:], " ")
	}
	return line
}

// --- nvidia-smi -q ---

// GPUFabric is one GPU's Fabric section of nvidia-smi -q.
type GPUFabric struct {
	PCI, UUID             string
	State, Status         string
	Summary, Bandwidth    string
	RouteUnhealthy        string
	CliqueID, ClusterUUID string
}

// ParseSMI reads the per-GPU Fabric sections of nvidia-smi -q output.
func ParseSMI(out string) []GPUFabric {
	var gpus []GPUFabric
	var cur *GPUFabric
	var path []string // section names by indent level
	var indents []int
	for _, raw := range strings.Split(out, "\n") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		ind := len(raw) - len(strings.TrimLeft(raw, " \t"))
		line := strings.TrimSpace(raw)
		if ind == 0 {
			if strings.HasPrefix(line, "GPU ") {
				gpus = append(gpus, GPUFabric{PCI: normPCI(strings.TrimPrefix(line, "GPU "))})
				cur = &gpus[len(gpus)-1]
			} else {
				cur = nil
			}
			path, indents = nil, nil
			continue
		}
		for len(indents) > 0 && indents[len(indents)-1] >= ind {
			indents = indents[:len(indents)-1]
			path = path[:len(path)-1]
		}
		k, v, ok := strings.Cut(line, ":")
		if cur == nil {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || (v == "" && !strings.Contains(line, " : ")) {
			path = append(path, line)
			indents = append(indents, ind)
			continue
		}
		sec := strings.Join(path, "/")
		switch {
		case sec == "" && k == "GPU UUID":
			cur.UUID = v
		case sec == "Fabric" && k == "State":
			cur.State = v
		case sec == "Fabric" && k == "Status":
			cur.Status = v
		case sec == "Fabric" && k == "CliqueId":
			cur.CliqueID = v
		case sec == "Fabric" && k == "ClusterUUID":
			cur.ClusterUUID = v
		case strings.HasPrefix(sec, "Fabric") && k == "Summary":
			cur.Summary = v
		case sec == "Fabric/Health" && k == "Bandwidth":
			cur.Bandwidth = v
		case sec == "Fabric/Health" && k == "Route Unhealthy":
			cur.RouteUnhealthy = v
		}
	}
	return gpus
}

func (c *Check) gpus(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	out, err := c.cfg.Runner.Run(ctx, c.cfg.NvidiaSMI, "-q")
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, nil // no NVIDIA driver: hardware not present
		}
		return nil, fmt.Errorf("nvidia-smi -q: %w", err)
	}
	now := c.cfg.Now()
	var evs []*datamodels.HealthEvent
	gpus := ParseSMI(string(out))
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].PCI < gpus[j].PCI })
	for _, g := range gpus {
		id := g.UUID
		if id == "" {
			id = g.PCI
		}
		ents := []*datamodels.Entity{{EntityType: events.EntityGPU, EntityValue: id}, {EntityType: events.EntityPCI, EntityValue: g.PCI}}
		meta := map[string]string{"fabric_state": g.State, "fabric_status": g.Status, "pci_bus_id": g.PCI, "gpu_uuid": g.UUID,
			"health_summary": g.Summary, "bandwidth": g.Bandwidth, "clique_id": g.CliqueID, "cluster_uuid": g.ClusterUUID}
		for k, v := range meta {
			if v == "" {
				delete(meta, k)
			}
		}
		st := strings.ToLower(g.State)
		if st == "" || st == "n/a" || st == "not supported" {
			continue // no fabric on this GPU (not an NVSwitch/NVLink-domain system)
		}
		var stateBad, healthBad *datamodels.HealthEvent
		switch st {
		case "completed":
			delete(c.pending, id)
			if !strings.EqualFold(g.Status, "Success") {
				m := clone(meta)
				m["recovery"] = recoveryFM
				stateBad = c.event("GPU", CheckState, "FABRIC-PROBE-FAILURE", true, datamodels.RecommendedAction_RESTART_BM,
					fmt.Sprintf("GPU %s fabric registration completed with status %q", id, g.Status), ents, m)
			}
		default: // "In Progress", "Not Started"
			first, ok := c.pending[id]
			if !ok {
				c.pending[id] = now
				first = now
			}
			if now.Sub(first) > c.cfg.InProgressTimeout {
				m := clone(meta)
				m["recovery"] = recoveryFM
				m["pending_since"] = first.UTC().Format(time.RFC3339)
				stateBad = c.event("GPU", CheckState, "FABRIC-PROBE-TIMEOUT", true, datamodels.RecommendedAction_RESTART_BM,
					fmt.Sprintf("GPU %s fabric state %q for %s", id, g.State, now.Sub(first).Round(time.Second)), ents, m)
			}
		}
		switch {
		case strings.EqualFold(g.Summary, "Unhealthy"), strings.EqualFold(g.RouteUnhealthy, "True"):
			m := clone(meta)
			m["recovery"] = recoveryFM
			healthBad = c.event("GPU", CheckHealth, "FABRIC-UNHEALTHY", true, datamodels.RecommendedAction_RESTART_BM,
				fmt.Sprintf("GPU %s fabric health is %s (route unhealthy %s)", id, orNA(g.Summary), orNA(g.RouteUnhealthy)), ents, m)
		case strings.EqualFold(g.Bandwidth, "Degraded"), strings.EqualFold(g.Summary, "Limited Capacity"):
			healthBad = c.event("GPU", CheckHealth, "FABRIC-BANDWIDTH-DEGRADED", false, datamodels.RecommendedAction_NONE,
				fmt.Sprintf("GPU %s fabric bandwidth %s, health %s", id, orNA(g.Bandwidth), orNA(g.Summary)), ents, clone(meta))
		}
		if ev := c.transition("state|"+id, stateBad); ev != nil {
			evs = append(evs, ev)
		}
		if ev := c.transition("health|"+id, healthBad); ev != nil {
			evs = append(evs, ev)
		}
	}
	return evs, nil
}

func switchEntities(devs []string) []*datamodels.Entity {
	var e []*datamodels.Entity
	for _, d := range devs {
		e = append(e, &datamodels.Entity{EntityType: events.EntityNVSwitch, EntityValue: filepath.Base(d)})
	}
	return e
}

func clone(m map[string]string) map[string]string {
	o := make(map[string]string, len(m)+2)
	for k, v := range m {
		o[k] = v
	}
	return o
}

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

func firstInt(s string) string {
	s = strings.TrimLeft(s, " ")
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return s[:n]
}

func after(s, sep string) string {
	i := strings.Index(s, sep)
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+len(sep):])
	if len(f) == 0 {
		return ""
	}
	return strings.TrimRight(f[0], ",.")
}

// normPCI turns "00000000:18:00.0" into "0000:18:00.0".
func normPCI(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if d, rest, ok := strings.Cut(s, ":"); ok && len(d) > 4 {
		s = d[len(d)-4:] + ":" + rest
	}
	return s
}
