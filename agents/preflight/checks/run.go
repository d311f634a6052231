// Package checks runs the preflight checks of ADR-026 inside a GPU pod's
// init container — `faultline-preflight check dcgm-diag|nccl-loopback|
// nccl-allreduce` — and applies the check contract: exit 0 when the check
// passed, 1 when it failed, 2 on a configuration error; failures (and, to
// lift an earlier quarantine, passes) reported to the gateway as
// HealthEvents through a durable spool (package report); a Warning Event
// on the pod; the ADR's metrics pushed or written to a textfile; every
// check bounded by its own timeout.
//
// Events carry agent "preflight-<check>" (the ADR's init container and
// image names) and checkName "<check>", so the shipped quarantine rule set
// "preflight-checks" (agent contains "preflight"; fatal, or a repair
// action) applies to them.
package checks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/faultline/faultline/agents/preflight/report"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Exit codes of the check contract.
const (
	ExitPass   = 0
	ExitFail   = 1
	ExitConfig = 2
)

// The built-in checks.
const (
	DCGMDiag      = "dcgm-diag"
	NCCLLoopback  = "nccl-loopback"
	NCCLAllreduce = "nccl-allreduce"
)

// Names lists the built-in checks.
func Names() []string { return []string{DCGMDiag, NCCLLoopback, NCCLAllreduce} }

// AgentName is the HealthEvent agent of a check: "preflight-<check>".
func AgentName(check string) string { return "preflight-" + check }

// Error codes the runner itself reports.
const (
	CodeTimeout      = "PREFLIGHT_CHECK_TIMEOUT"
	CodeCheckError   = "PREFLIGHT_CHECK_ERROR"
	CodeGPUsMissing  = "PREFLIGHT_GPU_NOT_VISIBLE"
	CodeGangTimeout  = "PREFLIGHT_GANG_TIMEOUT"
	CodeGangMismatch = "PREFLIGHT_GANG_MISMATCH"
)

// ConfigError stops a check before it ran: exit 2, counted in
// preflight_config_errors_total{error=Kind}, no HealthEvent (the node is
// not at fault).
type ConfigError struct {
	Kind string
	Err  error
}

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func configErr(kind string, format string, a ...any) error {
	return &ConfigError{Kind: kind, Err: fmt.Errorf(format, a...)}
}

// Outcome is what one check found.
type Outcome struct {
	// Events to report (unstamped: the runner fills agent, check, node,
	// time, strategy and the pod metadata).
	Events []*datamodels.HealthEvent
	// Failed makes the check exit 1.
	Failed bool
	// Codes are the error codes of the failure, for
	// preflight_check_failures_total.
	Codes []string
	// Summary is one line for the log and the pod's Event.
	Summary string
	// Gang and GangWait feed preflight_gang_wait_seconds.
	Gang     string
	GangWait time.Duration
}

// Env is what a check gets to run with.
type Env struct {
	Cfg   Config
	Log   *slog.Logger
	Echo  io.Writer // tools' output goes here too (the container log)
	Child []string  // environment of the tools it starts
	Now   func() time.Time
	kube  func() kubernetes.Interface
}

// Kube returns a Kubernetes client, or nil when there is no API access.
func (e *Env) Kube() kubernetes.Interface {
	if e.kube == nil {
		return nil
	}
	return e.kube()
}

type checkFunc func(ctx context.Context, env *Env) (Outcome, error)

var registry = map[string]checkFunc{
	DCGMDiag:      runDCGMDiag,
	NCCLLoopback:  runLoopback,
	NCCLAllreduce: runAllreduce,
}

// Options are the runner's collaborators, for tests and main.
type Options struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Environ        []string
	Now            func() time.Time
	// Kube replaces the client built from the configuration.
	Kube kubernetes.Interface
}

// Main runs `faultline-preflight check NAME [flags]` and returns the exit
// code.
func Main(ctx context.Context, name string, args []string, opt Options) (code int) {
	if opt.Stdout == nil {
		opt.Stdout = os.Stdout
	}
	if opt.Stderr == nil {
		opt.Stderr = os.Stderr
	}
	if opt.Getenv == nil {
		opt.Getenv = os.Getenv
	}
	if opt.Environ == nil {
		opt.Environ = os.Environ()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	m := NewMetrics()
	cfg := DefaultConfig()
	cfg.WithEnv(opt.Getenv)
	if _, err := config.Load("faultline-preflight check "+name, args, &cfg, cfg.RegisterFlags, cfg.Validate, opt.Stderr, config.NoArgs()); err != nil {
		fmt.Fprintln(opt.Stderr, "faultline-preflight: check "+name+":", err)
		m.configErrors.WithLabelValues("config").Inc()
		_ = m.Publish(cfg.Metrics, cfg.NodeName, name)
		return ExitConfig
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(opt.Stderr, &slog.HandlerOptions{Level: lvl})).With("check", name, "node", cfg.NodeName)
	if name == NCCLAllreduce {
		// Its reruns in this pod must know that it failed before the gang
		// ConfigMap can say so.
		defer func() { recordAllreduceExit(cfg.Gang.MarkerDir, code, log) }()
	}
	fn, ok := registry[name]
	if !ok {
		log.Error("unknown check", "known", strings.Join(Names(), ","))
		m.configErrors.WithLabelValues("unknown_check").Inc()
		_ = m.Publish(cfg.Metrics, cfg.NodeName, name)
		return ExitConfig
	}
	rep, err := report.Open(cfg.Config, log)
	if err != nil {
		// A check running as the pod's non-root user where the spool's
		// root is not writable to it (README, "Reporting"): the result
		// still goes to the gateway, directly.
		log.Warn("cannot open the spool; the check's events are sent directly, and are lost if the gateway does not take them in spool.drain_timeout", "err", err)
		m.configErrors.WithLabelValues("spool").Inc()
		rep = report.Direct(cfg.Config, log)
	}
	defer rep.Close()

	env := &Env{Cfg: cfg, Log: log, Echo: opt.Stdout, Child: opt.Environ, Now: opt.Now}
	var kc kubernetes.Interface
	kubeTried := false
	env.kube = func() kubernetes.Interface {
		if opt.Kube != nil {
			return opt.Kube
		}
		if !kubeTried {
			kubeTried = true
			kc = kubeClient(cfg.Kube, log)
		}
		return kc
	}

	start := opt.Now()
	limit := cfg.Timeout
	if name == NCCLAllreduce {
		limit += cfg.Gang.Timeout // the gang wait is not the check's time
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	out, err := fn(cctx, env)
	cancel()
	dur := opt.Now().Sub(start)
	var ce *ConfigError
	switch {
	case errors.As(err, &ce):
		log.Error("configuration error", "err", err)
		m.configErrors.WithLabelValues(ce.Kind).Inc()
		m.total.WithLabelValues(name, "error").Inc()
		_ = m.Publish(cfg.Metrics, cfg.NodeName, name)
		return ExitConfig
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		msg := fmt.Sprintf("%s did not finish within %s", name, limit)
		out = Outcome{Failed: true, Codes: []string{CodeTimeout}, Summary: msg,
			Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeTimeout}, nodeEntity(cfg.NodeName), nil)}}
	case err != nil:
		msg := fmt.Sprintf("%s could not run: %v", name, err)
		out = Outcome{Failed: true, Codes: []string{CodeCheckError}, Summary: msg,
			Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeCheckError}, nodeEntity(cfg.NodeName), nil)}}
	}

	for _, ev := range out.Events {
		env.stamp(ev, name)
	}
	lost := 0
	if len(out.Events) > 0 {
		if err := rep.Report(out.Events); err != nil {
			log.Error("events could not be spooled; sending them directly", "err", err)
		}
		fr := rep.Flush(ctx)
		lost = fr.Lost
		switch {
		case fr.NoAgent:
			// No agent ever served the socket: a run again would wait
			// the same, and the pod's init container would loop for ever
			// on a node that never gets one. The check's verdict stands.
			lost = 0
			log.Error("no faultline agent on this node: the check's events were not recorded; exiting on the check's result",
				"events", fr.Lost, "socket", cfg.RelaySocket, "failed", out.Failed)
			m.configErrors.WithLabelValues("relay").Inc()
			if cfg.Kube.Events {
				env.podEvent(ctx, reasonNotReported, name, fmt.Sprintf("no faultline agent on node %s (relay socket %s): the check's result (%s) was not recorded",
					cfg.NodeName, cfg.RelaySocket, resultWord(out.Failed)))
			}
		case fr.Lost > 0:
			log.Error("events neither spooled nor delivered: the check's result would be lost", "events", fr.Lost, "spool", rep.Dir())
			m.configErrors.WithLabelValues("spool").Inc()
		case fr.Pending > 0:
			log.Warn("the gateway did not take every event in time; they stay spooled for the next run on this node",
				"pending_bytes", fr.Pending, "spool", rep.Dir())
		default:
			log.Info("events delivered", "events", len(out.Events), "adopted_spools", fr.Adopted)
		}
	}
	result := "pass"
	if out.Failed {
		result = "fail"
		for _, c := range out.Codes {
			m.failures.WithLabelValues(name, cfg.NodeName, c).Inc()
		}
		if cfg.Kube.Events {
			env.podEvent(ctx, reasonFailed, name, out.Summary)
		}
	}
	m.total.WithLabelValues(name, result).Inc()
	m.duration.WithLabelValues(name).Observe(dur.Seconds())
	if out.Gang != "" {
		m.gangWait.WithLabelValues(out.Gang).Observe(out.GangWait.Seconds())
	}
	if err := m.Publish(cfg.Metrics, cfg.NodeName, name); err != nil {
		log.Warn("metrics not published", "err", err)
	}
	if lost > 0 && cfg.ProcessingStrategy != "STORE_ONLY" {
		// The spool failing as it does when it cannot be opened: the pod
		// shows Init:Error and the kubelet runs the check again.
		log.Error("exiting so that the kubelet runs the check again: its events were not recorded", "failed", out.Failed, "summary", out.Summary)
		return ExitConfig
	}
	if !out.Failed {
		log.Info("check passed", "summary", out.Summary, "duration", dur.String())
		return ExitPass
	}
	log.Error("check failed", "summary", out.Summary, "codes", strings.Join(out.Codes, ","), "duration", dur.String())
	if cfg.ProcessingStrategy == "STORE_ONLY" {
		log.Warn("processing_strategy STORE_ONLY: the failure is recorded but does not block the pod")
		return ExitPass
	}
	return ExitFail
}

// stamp fills the fields every event of a check carries.
func (e *Env) stamp(ev *datamodels.HealthEvent, check string) {
	ev.Agent = AgentName(check)
	ev.CheckName = check
	if ev.ComponentClass == "" {
		ev.ComponentClass = "GPU"
	}
	ev.NodeName = e.Cfg.NodeName
	ev.GeneratedTimestamp = timestamppb.New(e.Now())
	ev.ProcessingStrategy = datamodels.ProcessingStrategy(datamodels.ProcessingStrategy_value[e.Cfg.ProcessingStrategy])
	if ev.Metadata == nil {
		ev.Metadata = map[string]string{}
	}
	if e.Cfg.Pod.Name != "" {
		ev.Metadata["preflight.faultline.io/pod"] = e.Cfg.Pod.Namespace + "/" + e.Cfg.Pod.Name
	}
	ev.Message = events.Truncate(ev.Message, 8<<10)
	for k, v := range ev.Metadata {
		ev.Metadata[k] = events.Truncate(v, 2000)
	}
}

// Unhealthy builds an unhealthy event.
func (e *Env) Unhealthy(fatal bool, action datamodels.RecommendedAction, msg string, codes []string, ents []*datamodels.Entity, meta map[string]string) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{IsFatal: fatal, IsHealthy: false, RecommendedAction: action, Message: msg,
		ErrorCode: codes, EntitiesImpacted: ents, Metadata: meta}
}

// Healthy builds the event that says the entities passed (it lifts what an
// earlier failure of the same check set on them).
func (e *Env) Healthy(msg string, ents []*datamodels.Entity, meta map[string]string) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{IsHealthy: true, RecommendedAction: datamodels.RecommendedAction_NONE, Message: msg,
		EntitiesImpacted: ents, Metadata: meta}
}

func nodeEntity(node string) []*datamodels.Entity {
	return []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: node}}
}

func gpuEntity(id string) *datamodels.Entity {
	return &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: id}
}

// The reasons of the Warning Events a check records on its pod.
const (
	reasonFailed      = "PreflightCheckFailed"
	reasonNotReported = "PreflightCheckNotReported"
)

// resultWord is a check's verdict in a message.
func resultWord(failed bool) string {
	if failed {
		return "fail"
	}
	return "pass"
}

// podEvent records a Warning Event with reason on the pod (best effort).
func (e *Env) podEvent(ctx context.Context, reason, check, summary string) {
	kc := e.Kube()
	p := e.Cfg.Pod
	if kc == nil || p.Name == "" || p.Namespace == "" {
		return
	}
	now := metav1.NewTime(e.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: p.Name + ".preflight-", Namespace: p.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name,
			UID: types.UID(p.UID), FieldPath: "spec.initContainers{preflight-" + check + "}"},
		Reason:         reason,
		Message:        events.Truncate(fmt.Sprintf("%s: %s", check, summary), 1024),
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "faultline-preflight", Host: e.Cfg.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "faultline.io/preflight", ReportingInstance: e.Cfg.NodeName,
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := kc.CoreV1().Events(p.Namespace).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		e.Log.Warn("could not record a Kubernetes Event on the pod", "err", err)
	}
}

// kubeClient builds a client from the kubeconfig, else in-cluster, else
// none (outside a cluster).
func kubeClient(cfg KubeConfig, log *slog.Logger) kubernetes.Interface {
	var rc *rest.Config
	var err error
	switch {
	case cfg.Kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	default:
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil
		}
	}
	if err != nil {
		log.Warn("no Kubernetes API access; node labels and pod Events are skipped", "err", err)
		return nil
	}
	rc.Timeout = 10 * time.Second
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		log.Warn("no Kubernetes API access", "err", err)
		return nil
	}
	return kc
}

// podGPUs returns the UUIDs of the pod's GPUs (nvidia-smi). A missing
// nvidia-smi is a configuration error (err); GPUs that cannot be listed
// fail the check with a non-fatal PREFLIGHT_GPU_NOT_VISIBLE event, returned
// as missing.
func (e *Env) podGPUs(ctx context.Context) (uuids []string, missing *Outcome, err error) {
	uuids, err = gpuUUIDs(ctx, e.Echo, e.Child, e.Cfg.DCGM.NvidiaSMI)
	switch {
	case errors.Is(err, errNotFound):
		return nil, nil, configErr("nvidia-smi", "dcgm.nvidia_smi: %v", err)
	case err != nil && ctx.Err() != nil:
		return nil, nil, ctx.Err()
	case err != nil:
		msg := "the pod's GPUs are not visible: " + err.Error()
		return nil, &Outcome{Failed: true, Codes: []string{CodeGPUsMissing}, Summary: msg,
			Events: []*datamodels.HealthEvent{e.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeGPUsMissing}, nodeEntity(e.Cfg.NodeName), nil)}}, nil
	}
	return uuids, nil, nil
}

// derefOutcome is *o, or the zero Outcome.
func derefOutcome(o *Outcome) Outcome {
	if o == nil {
		return Outcome{}
	}
	return *o
}
