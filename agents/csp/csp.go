// Package csp is the agent's cloud maintenance check (the CSP health
// monitor of NVSentinel's data flow) for GCP: it reads the instance's
// metadata server — `maintenance-event` (NONE, MIGRATE_ON_HOST_MAINTENANCE,
// TERMINATE_ON_HOST_MAINTENANCE) and `upcoming-maintenance` (the scheduled
// window, 404 when none) — and reports a scheduled or imminent host
// maintenance as a non-fatal HealthEvent naming the kind and the window
// (agent csp-health-monitor, class CSP, check SCHEDULED_MAINTENANCE), and
// a recovery event once it is gone or its window has passed. What it
// reported as standing is kept in a state file across restarts: a
// TERMINATE_ON_HOST_MAINTENANCE stops the VM, and the agent that starts
// after it must report that maintenance's end.
package csp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Names on the events (the same as processors/janitor's EC2 monitor).
const (
	Agent = "csp-health-monitor"
	Class = "CSP"
	Check = "SCHEDULED_MAINTENANCE"
)

// Config is the agent's [csp] section.
type Config struct {
	// MetadataURL is the instance metadata base. Default
	// "http://metadata.google.internal/computeMetadata/v1/instance".
	MetadataURL string `toml:"metadata_url"`
	// PollInterval is how often it is read. Default 30s.
	PollInterval time.Duration `toml:"poll_interval"`
	// StateFile keeps the maintenance reported as standing across
	// restarts, so that its end is reported after one (the VM stopped for
	// it) and it is not reported again. Default
	// "/var/lib/faultline-agent/csp/state.json"; empty: none.
	StateFile string `toml:"state_file"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{MetadataURL: "http://metadata.google.internal/computeMetadata/v1/instance", PollInterval: 30 * time.Second,
		StateFile: "/var/lib/faultline-agent/csp/state.json"}
}

// RegisterFlags adds the flags under prefix ("csp.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.MetadataURL, prefix+"metadata-url", c.MetadataURL, "GCP instance metadata base URL")
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often the maintenance metadata is read")
	fs.StringVar(&c.StateFile, prefix+"state-file", c.StateFile, "file keeping the maintenance reported across restarts; empty: none")
}

// Validate names the first bad key.
func (c Config) Validate() error {
	if !strings.HasPrefix(c.MetadataURL, "http://") && !strings.HasPrefix(c.MetadataURL, "https://") {
		return fmt.Errorf("csp.metadata_url: want an http(s) URL, got %q", c.MetadataURL)
	}
	if c.PollInterval <= 0 {
		return fmt.Errorf("csp.poll_interval: must be positive, got %v", c.PollInterval)
	}
	return nil
}

// maint is one maintenance as read.
type maint struct {
	kind       string
	start, end time.Time
	// unreadable names window times the server gave that did not parse
	// (the maintenance is reported anyway, its window said unknown).
	unreadable string
}

// GCP reads the metadata server; it keeps the maintenance it reported.
type GCP struct {
	cfg      Config
	client   *http.Client
	now      func() time.Time
	standing *maint
	saved    []byte // the state file's content as last read or written
}

// New returns the check, with the maintenance the state file says was
// reported as standing (a file that cannot be read is warned of: the
// check starts afresh).
func New(cfg Config, log *slog.Logger) *GCP {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the metadata server is never behind a proxy
	g := &GCP{cfg: cfg, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, now: time.Now}
	if err := g.resume(); err != nil {
		log.Warn("csp state file not read: starting afresh", "path", cfg.StateFile, "err", err)
	}
	return g
}

// state is the state file's content.
type state struct {
	Standing *stateMaint `json:"standing"` // null: none
}

type stateMaint struct {
	Kind       string    `json:"kind"`
	Start      time.Time `json:"start,omitzero"`
	End        time.Time `json:"end,omitzero"`
	Unreadable string    `json:"unreadable,omitempty"`
}

// maxStateBytes bounds the state file read (it holds one maintenance).
const maxStateBytes = 64 << 10

func (g *GCP) resume() error {
	if g.cfg.StateFile == "" {
		return nil
	}
	b, err := topology.ReadCapped(g.cfg.StateFile, maxStateBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return err
	}
	if s := st.Standing; s != nil {
		if s.Kind == "" {
			return errors.New("standing: no kind")
		}
		g.standing = &maint{kind: s.Kind, start: s.Start.UTC(), end: s.End.UTC(), unreadable: s.Unreadable}
	}
	g.saved = b
	return nil
}

// Commit implements check.Committer: the state file is written (when it
// changed) once the last poll's events are spooled.
func (g *GCP) Commit() error {
	if g.cfg.StateFile == "" {
		return nil
	}
	var st state
	if m := g.standing; m != nil {
		st.Standing = &stateMaint{Kind: m.kind, Start: m.start, End: m.end, Unreadable: m.unreadable}
	}
	b, err := json.Marshal(st)
	if err != nil || bytes.Equal(b, g.saved) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(g.cfg.StateFile), 0o755); err != nil {
		return fmt.Errorf("csp state: %w", err)
	}
	if err := topology.AtomicWrite(g.cfg.StateFile, b); err != nil {
		return fmt.Errorf("csp state: %w", err)
	}
	g.saved = b
	return nil
}

// Name is "csp".
func (g *GCP) Name() string { return "csp" }

var errNotFound = errors.New("not found")

func (g *GCP) get(ctx context.Context, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(g.cfg.MetadataURL, "/")+"/"+key, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := g.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("metadata %s: %w", key, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return "", errNotFound
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("metadata %s: %s", key, resp.Status)
	}
	return strings.TrimSpace(string(b)), nil
}

// read returns the maintenance now standing (nil: none).
func (g *GCP) read(ctx context.Context) (*maint, error) {
	ev, err := g.get(ctx, "maintenance-event")
	if err != nil && !errors.Is(err, errNotFound) {
		return nil, err
	}
	ev = strings.ToValidUTF8(ev, "\uFFFD") // as the state file keeps it
	var m *maint
	if ev != "" && ev != "NONE" {
		m = &maint{kind: ev, start: g.now().UTC().Truncate(time.Second)}
		if s := g.standing; s != nil && s.kind == ev {
			m.start = s.start // the same event: first seen then
		}
	}
	up, err := g.get(ctx, "upcoming-maintenance")
	switch {
	case errors.Is(err, errNotFound):
	case err != nil:
		return nil, err
	case up != "":
		var u struct {
			Type   string `json:"type"`
			Status string `json:"maintenance_status"`
			Start  string `json:"window_start_time"`
			End    string `json:"window_end_time"`
		}
		if err := json.Unmarshal([]byte(up), &u); err != nil {
			return nil, fmt.Errorf("metadata upcoming-maintenance: %w", err)
		}
		var bad []string
		start := windowTime("window_start_time", u.Start, &bad)
		end := windowTime("window_end_time", u.End, &bad)
		kind := "SCHEDULED_MAINTENANCE"
		if u.Type != "" {
			kind = u.Type + "_MAINTENANCE"
		}
		if m != nil {
			kind = m.kind // the imminent event's word wins
		}
		if end.IsZero() || g.now().Before(end) {
			m = &maint{kind: kind, start: start.UTC(), end: end.UTC(), unreadable: strings.Join(bad, ", ")}
		}
	}
	return m, nil
}

// windowTime parses an RFC 3339 window time; one that does not parse is
// added to bad and read as unknown (zero).
func windowTime(key, v string, bad *[]string) time.Time {
	if v == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		*bad = append(*bad, fmt.Sprintf("%s %q", key, v))
	}
	return t
}

// Check reports a maintenance that appeared or changed, and its recovery.
func (g *GCP) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	m, err := g.read(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case m != nil && (g.standing == nil || *g.standing != *m):
		g.standing = m
		return []*datamodels.HealthEvent{g.event(m, false)}, nil
	case m == nil && g.standing != nil:
		old := g.standing
		g.standing = nil
		return []*datamodels.HealthEvent{g.event(old, true)}, nil
	}
	return nil, nil
}

func (g *GCP) event(m *maint, healthy bool) *datamodels.HealthEvent {
	window := "now"
	if !m.start.IsZero() {
		window = m.start.Format(time.RFC3339)
	}
	if !m.end.IsZero() {
		window += " to " + m.end.Format(time.RFC3339)
	}
	msg := fmt.Sprintf("GCP host maintenance %s, window %s", m.kind, window)
	if healthy {
		msg = fmt.Sprintf("GCP host maintenance %s is over (window %s)", m.kind, window)
	}
	md := map[string]string{"maintenance_kind": m.kind, "cloud_provider": "gcp"}
	if m.unreadable != "" {
		msg += " (unreadable: " + m.unreadable + ")"
		md["window_unreadable"] = m.unreadable
	}
	if !m.start.IsZero() {
		md["maintenance_start"] = m.start.Format(time.RFC3339)
	}
	if !m.end.IsZero() {
		md["maintenance_end"] = m.end.Format(time.RFC3339)
	}
	return &datamodels.HealthEvent{
		Version: 1, Agent: Agent, ComponentClass: Class, CheckName: Check, IsFatal: false, IsHealthy: healthy,
		Message: msg, RecommendedAction: datamodels.RecommendedAction_NONE, Metadata: md,
	}
}
