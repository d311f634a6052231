package remediate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Role is the processor role name written on actions.
const Role = events.RoleRemediate

// Labels and annotations on the resources faultline creates. The labels
// select a node's resources of one group; the annotations are the
// remediation's own state (which triggers it serves, when it was created
// by faultline's clock). Counting these resources is the reboot budget:
// nothing else keeps it.
const (
	LabelNode          = "faultline.io/node"
	LabelGroup         = "faultline.io/group"
	LabelManagedBy     = "app.kubernetes.io/managed-by"
	AnnotationTriggers = "faultline.io/triggers"
	AnnotationCreated  = "faultline.io/created-at"
	AnnotationBy       = "faultline.io/created-by"
	AnnotationEvents   = "faultline.io/event-ids"
	// AnnotationSeq is the resource's sequence number in its node's group
	// (its name is derived from it); the next one is one more than the
	// newest's, so that a pruned resource's name is never used again.
	AnnotationSeq = "faultline.io/seq"
	// AnnotationCovers is the newest trigger time (the drain result's
	// timestamp) a resource answers, its creator's or a joiner's: a
	// trigger no newer that it does not list (the list keeps the newest
	// maxTriggers) follows it once it is finished instead of remediating
	// the node again.
	AnnotationCovers = "faultline.io/covers-until"
	// AnnotationGPUs lists the GPUs a resource of a template that depends
	// on them (a GPUReset's selector) was made for; empty: every GPU of
	// the node. A fault of other GPUs does not join it.
	AnnotationGPUs = "faultline.io/gpus"
	// AnnotationEntities lists, as TYPE=value, the entities a resource of a
	// template that depends on more of them than the GPUs (a custom NIC
	// reset's .Entities) was made for; empty: every entity of the node. A
	// fault of other entities does not join it.
	AnnotationEntities = "faultline.io/entities"
	// AnnotationEscalated is set on the node when faultline escalates it to
	// CONTACT_SUPPORT: the time (RFC 3339 with nanoseconds, the clock of
	// AnnotationCreated: the janitor refuses a resource created before it)
	// and why.
	AnnotationEscalated = "faultline.io/remediation-escalated"
	// annotationJanitorState is faultline's janitor's record of the signal
	// (processors/janitor AnnotationState): JSON whose "at" is when it
	// was recorded, just before it was sent.
	annotationJanitorState = "faultline.io/janitor-state"
)

const maxTriggers = 32

// DetailEscalatedAt, on an escalate action, is the time of the node's
// escalation (AnnotationEscalated) that the action repeats: the same
// failure, already escalated, neither re-stamped nor counted again.
const DetailEscalatedAt = "escalatedAt"

// Data is what a resource template sees: the triggering event as the drain
// result carried it.
type Data struct {
	// Name is the resource's deterministic name.
	Name                    string
	Cluster                 string
	NodeName                string
	CheckName               string
	RecommendedAction       string
	CustomRecommendedAction string
	// EventID is the first triggering event; EventIDs all of them.
	EventID  string
	EventIDs []string
	Entities []Entity
	// GPUs are the GPU UUIDs among the entities (events.IsGPUUUID). Empty
	// when a GPU entity names its GPU otherwise (a PCI address, an index:
	// what an agent sends when it has no UUID): the remediation is then
	// for every GPU of the node (a GPUReset without a selector), not for
	// the named ones only, which would leave that GPU out.
	GPUs []string
	// Group is the template's equivalence group.
	Group string
	// Details are the drain result's details.
	Details map[string]string
}

// Entity is one impacted entity.
type Entity struct{ Type, Value string }

// Handler is the remediate role: for a finished drain (drain/succeeded, or
// drain/gave_up when its policy stopped waiting) it creates the custom
// resource of the event's recommended action, at most one per equivalence
// group in progress per node, escalates to CONTACT_SUPPORT when a node's
// remediations fail or exceed the budget, and follows the resource's
// condition to its result.
type Handler struct {
	cfg Config
	reg *clusters.Registry
	log *slog.Logger
	now func() time.Time
	m   *metrics
	// lane takes a slow cluster's remediations off the main path.
	lane *requeue.Lane

	// caches watch the resources faultline created.
	caches *resourceCaches
}

// Options are a Handler's collaborators.
type Options struct {
	Log        *slog.Logger
	Now        func() time.Time
	Registerer prometheus.Registerer
}

// New validates cfg (compiling the templates) and returns the handler.
func New(cfg Config, reg *clusters.Registry, opts Options) (*Handler, error) {
	if err := cfg.Validate("remediate."); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Log.With("role", Role)
	h := &Handler{cfg: cfg, reg: reg, log: log, now: opts.Now,
		m: newMetrics(opts.Registerer), caches: newResourceCaches(log)}
	h.lane = &requeue.Lane{Topic: TopicSlow, Limit: cfg.SlowCluster, Handed: h.m.slowLane, Log: log}
	return h, nil
}

// WatchClusters starts the watches of every template's resource on each
// configured cluster that is not dry-run, so that replicas have synced
// before the first remediation.
func (h *Handler) WatchClusters(names []string) {
	for _, name := range names {
		cl, err := h.reg.Get(name)
		if err != nil || cl.WatchDynamic == nil || cl.DryRun {
			continue
		}
		for _, tm := range h.cfg.byAction {
			h.caches.get(cl.WatchDynamic, h.watchKey(name, tm))
		}
	}
}

// watchKey is the watch of the template's resource on the cluster.
func (h *Handler) watchKey(cluster string, tm *Template) watchKey {
	k := watchKey{cluster: cluster, gvr: tm.gvr}
	if tm.namespaced {
		k.namespace = tm.namespace
	}
	return k
}

// Close stops the handler's watches.
func (h *Handler) Close() { h.caches.close() }

// IsTrigger reports whether an action starts a remediation: a drain that
// finished, or gave up under its policy, or was decided dry-run.
func IsTrigger(a *faultlinev1.Action) bool {
	if a.GetRole() != events.RoleDrain || a.GetKind() != events.KindDrain {
		return false
	}
	switch a.GetOutcome() {
	case events.OutcomeSucceeded, events.OutcomeGaveUp, events.OutcomeDryRun:
		return true
	}
	return false
}

type trigger struct {
	rec     *kgo.Record
	src     *faultlinev1.Action
	cluster string
	node    string
	id      string // the drain id, else the first event id
}

// Handle handles one partition's batch of the actions topic or
// TopicRequeue; a slow cluster's remediations go to TopicSlow
// (requeue.Lane).
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	return h.handle(ctx, recs, h.lane)
}

// SlowHandler handles the slow lane's batches (TopicSlow): every
// remediation stepped, whatever its cluster's pace.
func (h *Handler) SlowHandler() pipeline.Handler {
	return pipeline.HandlerFunc(func(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
		return h.handle(ctx, recs, nil)
	})
}

func (h *Handler) handle(ctx context.Context, recs []*kgo.Record, lane *requeue.Lane) (pipeline.Result, error) {
	return requeue.Handle(ctx, recs, IsTrigger, h.cfg.Workers, TopicRequeue, h.now, h.reg, lane,
		func(ctx context.Context, a pipeline.ActionRec) ([]*faultlinev1.Action, requeue.Again) {
			t := trigger{rec: a.Rec, src: a.Action, cluster: a.Cluster, node: a.Node, id: a.Action.GetDetails()[events.DetailDrainID]}
			if t.id == "" && len(a.Action.GetEventIds()) > 0 {
				t.id = a.Action.GetEventIds()[0]
			}
			if t.id == "" {
				t.id = a.Action.GetId()
			}
			return h.process(ctx, t)
		})
}

// process runs one step of the trigger's remediation on its cluster
// (clusters.Registry.Try). It returns the actions and, when the
// remediation must be looked at again, when.
func (h *Handler) process(ctx context.Context, t trigger) ([]*faultlinev1.Action, requeue.Again) {
	acts, again, err := requeue.Step(ctx, h.reg, t.cluster, t.node, "remediation", h.now().Add(h.cfg.PollInterval), h.log, h.m.apiErrors, nil,
		func(ctx context.Context, cl *clusters.Client) ([]*faultlinev1.Action, time.Time, error) {
			return h.step(ctx, cl, t)
		})
	if err == nil {
		return acts, again
	}
	if apierrors.IsConflict(err) {
		// Conflicts on every one of requeue.Step's redos (what it writes
		// rewritten as fast as it is read): looked at again, not dropped
		// with the node cordoned and drained and nothing pending.
		h.log.Warn("remediation met a conflict at each try; looked at again", "cluster", t.cluster, "node", t.node,
			"retry_at", h.now().Add(h.cfg.PollInterval), "err", err)
		return acts, requeue.Again{At: h.now().Add(h.cfg.PollInterval)}
	}
	h.log.Warn("remediation failed", "cluster", t.cluster, "node", t.node, "err", err)
	return append(acts, h.action(t, events.KindRemediate, events.OutcomeFailed, err.Error(), "error")), requeue.Again{}
}

// actionKey is the template key of the trigger's recommended action.
func actionKey(a *faultlinev1.Action) string {
	ra := a.GetRecommendedAction()
	if ra == datamodels.RecommendedAction_CUSTOM.String() {
		return "custom:" + a.GetDetails()[events.DetailCustomAction]
	}
	return ra
}

func (h *Handler) data(t trigger, tm *Template) Data {
	a := t.src
	d := Data{
		Cluster: t.cluster, NodeName: t.node, CheckName: a.GetCheckName(), RecommendedAction: a.GetRecommendedAction(),
		CustomRecommendedAction: a.GetDetails()[events.DetailCustomAction], EventIDs: a.GetEventIds(),
		Group: tm.Group, Details: a.GetDetails(),
	}
	if len(d.EventIDs) > 0 {
		d.EventID = d.EventIDs[0]
	}
	named := true
	for _, p := range strings.Split(a.GetDetails()[events.DetailEntities], ",") {
		if typ, v, ok := strings.Cut(p, "="); ok {
			d.Entities = append(d.Entities, Entity{Type: typ, Value: v})
			if typ == events.EntityGPU {
				d.GPUs = append(d.GPUs, v)
				named = named && events.IsGPUUUID(v)
			}
		}
	}
	if !named {
		// A GPU named by its PCI address or index (the fabric agent's
		// gpuIDByPCI fallback, NVLINK-INACTIVE's index:N, NVSentinel's DCGM
		// events without GPU_UUID): the GPUReset CRD refuses it in
		// spec.selector.uuids. Its spec.selector.pciBusIDs is not used:
		// joining and waiting (AnnotationGPUs) know UUIDs only. The node
		// was drained before any remediation (IsTrigger), so every GPU of
		// it is reset; the agent still skips a GPU a pod holds.
		d.GPUs = nil
	}
	return d
}

// status of one remediation resource.
type status int

const (
	inProgress status = iota
	completed
	failed
	// cancelled: the operator did not attempt it, its premise gone (the
	// janitor's NotDrained: the node was lifted before the reboot
	// started). Neither a failure nor spent budget.
	cancelled
)

// status reads a resource's completion (Template.complete, .cancelled,
// .failed, .finished; see Completion): a complete matcher first, then a
// cancelled one, then a failed one, then the finished field, then
// completion_timeout from status.startTime (or the janitor's record of
// its signal, annotationJanitorState) — or, for a janitor kind with
// no status yet (queued: not started), queue_timeout from its creation;
// else completion_timeout from its creation.
func (h *Handler) status(tm *Template, o *unstructured.Unstructured) (status, string) {
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	if m, c := matchCondition(conds, tm.complete); c != nil {
		return completed, describeCondition(m, c)
	}
	if m, c := matchCondition(conds, tm.cancelled); c != nil {
		return cancelled, describeCondition(m, c)
	}
	if m, c := matchCondition(conds, tm.failed); c != nil {
		return failed, describeCondition(m, c)
	}
	if tm.finished != nil {
		if v, ok, _ := unstructured.NestedFieldNoCopy(o.Object, append([]string{"status"}, tm.finished...)...); ok && v != nil && v != "" {
			return failed, fmt.Sprintf("status.%s is set without %s (conditions: %s)", tm.FinishedField, matchers(tm.complete), summarize(conds))
		}
	}
	if start, ok := startedAt(o); ok {
		if h.now().Sub(start) > h.cfg.CompletionTimeout {
			return failed, fmt.Sprintf("not %s within %v of its start", matchers(tm.complete), h.cfg.CompletionTimeout)
		}
		return inProgress, ""
	}
	if tm.gvr.Group == JanitorGroup && len(conds) == 0 {
		// Not started, nothing written: queued behind the janitor's limits
		// or cooldown (a rack-wide fault), or the janitor is down.
		if h.now().Sub(createdAt(o)) > h.cfg.QueueTimeout {
			return failed, fmt.Sprintf("not started by the janitor (no status.startTime) within queue_timeout (%v) of its creation", h.cfg.QueueTimeout)
		}
		return inProgress, ""
	}
	if h.now().Sub(createdAt(o)) > h.cfg.CompletionTimeout {
		return failed, fmt.Sprintf("not %s within %v", matchers(tm.complete), h.cfg.CompletionTimeout)
	}
	return inProgress, ""
}

// startedAt is when the operator started the work: status.startTime
// (faultline's janitor writes it with its signal, the time it recorded
// it), if set; else the `at` of faultline's janitor's record
// (annotationJanitorState), written before the signal is sent and before
// the status: a signal sent whose status write keeps failing is started
// all the same, its completion_timeout counted, not queue_timeout.
func startedAt(o *unstructured.Unstructured) (time.Time, bool) {
	v, _, _ := unstructured.NestedString(o.Object, "status", "startTime")
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, true
	}
	var st struct {
		At time.Time `json:"at"`
	}
	if v := o.GetAnnotations()[annotationJanitorState]; v != "" && json.Unmarshal([]byte(v), &st) == nil && !st.At.IsZero() {
		return st.At, true
	}
	return time.Time{}, false
}

// startedBefore reports whether o was started (startedAt) before fa, the
// time a trigger's fault was generated: o does not answer that fault.
// False when either is not known.
func startedBefore(o *unstructured.Unstructured, fa time.Time) bool {
	start, ok := startedAt(o)
	return ok && !fa.IsZero() && start.Before(fa)
}

// matchCondition returns the first matcher (in order) that a condition
// matches, and that condition.
func matchCondition(conds []any, ms []condMatch) (condMatch, map[string]any) {
	for _, m := range ms {
		for _, c := range conds {
			cm, ok := c.(map[string]any)
			if !ok || cm["type"] != m.typ || cm["status"] != m.status {
				continue
			}
			if m.reason != "" && cm["reason"] != m.reason {
				continue
			}
			return m, cm
		}
	}
	return condMatch{}, nil
}

// describeCondition is "Type=Status Reason: message".
func describeCondition(m condMatch, c map[string]any) string {
	s := m.typ + "=" + m.status
	if r, _ := c["reason"].(string); r != "" {
		s += " " + r
	}
	if msg, _ := c["message"].(string); msg != "" {
		s += ": " + msg
	}
	return s
}

func matchers(ms []condMatch) string {
	var out []string
	for _, m := range ms {
		out = append(out, m.String())
	}
	return strings.Join(out, " or ")
}

// summarize lists the conditions as Type=Status/Reason.
func summarize(conds []any) string {
	var out []string
	for _, c := range conds {
		if cm, ok := c.(map[string]any); ok {
			s := fmt.Sprint(cm["type"], "=", cm["status"])
			if r, _ := cm["reason"].(string); r != "" {
				s += "/" + r
			}
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

func createdAt(o *unstructured.Unstructured) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, o.GetAnnotations()[AnnotationCreated]); err == nil {
		return t
	}
	return o.GetCreationTimestamp().Time
}

// at is the trigger's time (the drain result's timestamp; zero if none).
func (t trigger) at() time.Time {
	if ts := t.src.GetTimestamp(); ts != nil {
		return ts.AsTime()
	}
	return time.Time{}
}

// nodeCreated is the creationTimestamp of the Node object the drain read
// (events.DetailNodeCreated on the drain's result; zero if none).
func (t trigger) nodeCreated() time.Time {
	at, _ := time.Parse(time.RFC3339, t.src.GetDetails()[events.DetailNodeCreated])
	return at
}

// ofThisNode is items (oldest first) less those created before the
// trigger's Node object was (all of them when it is not known). Both
// clocks are the control plane's: faultline's annotation and the
// apiserver's creationTimestamp (whole seconds, so a resource of the
// same second counts as this node's).
func ofThisNode(t trigger, items []unstructured.Unstructured) []unstructured.Unstructured {
	nc := t.nodeCreated()
	if nc.IsZero() {
		return items
	}
	i := 0
	for i < len(items) && createdAt(&items[i]).Before(nc) {
		i++
	}
	return items[i:]
}

// faultAt is when the trigger's newest fault was generated
// (events.DetailGeneratedAt on the drain's result; zero if none).
func (t trigger) faultAt() time.Time {
	at, _ := time.Parse(time.RFC3339Nano, t.src.GetDetails()[events.DetailGeneratedAt])
	return at
}

// coversUntil is AnnotationCovers (zero when absent or unreadable).
func coversUntil(o *unstructured.Unstructured) time.Time {
	at, _ := time.Parse(time.RFC3339Nano, o.GetAnnotations()[AnnotationCovers])
	return at
}

func triggersOf(o *unstructured.Unstructured) []string {
	v := o.GetAnnotations()[AnnotationTriggers]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// nodeLabel is the node's name as a label value (a hash when too long).
func nodeLabel(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	return "h-" + shortHash(node, 20)
}

// step takes the trigger's remediation one step (a write that meets a
// conflict — the resource changed since it was read by a replica, the
// node's follow-up in another batch, the janitor — makes requeue.Step redo
// it; every call it repeats is idempotent).
func (h *Handler) step(ctx context.Context, cl *clusters.Client, t trigger) (acts []*faultlinev1.Action, again time.Time, err error) {
	defer func() {
		// A requeued trigger past retention whose step keeps failing (its
		// cluster down for days, a list the role may not make) is skipped,
		// not requeued for ever; a conflict is redone, a shutdown's error
		// hands it on.
		if err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && t.attempt() > 0 && h.tooOld(t) {
			acts, again, err = []*faultlinev1.Action{h.skipOld(t)}, time.Time{}, nil
		}
	}()
	if t.attempt() == 0 && h.tooOld(t) {
		// A replayed or long-delayed trigger, first looked at: its resource
		// may have been pruned, and acting on it could repeat a
		// remediation long done. One requeued is skipped only when no
		// resource lists it (choose): its own, queued or in progress, is
		// followed to its result.
		return []*faultlinev1.Action{h.skipOld(t)}, time.Time{}, nil
	}
	ra := t.src.GetRecommendedAction()
	switch ra {
	case "", datamodels.RecommendedAction_NONE.String(), datamodels.RecommendedAction_UNKNOWN.String():
		return []*faultlinev1.Action{h.action(t, events.KindRemediate, events.OutcomeSkipped, "recommendedAction "+ra+": nothing to remediate", "skip")}, time.Time{}, nil
	case datamodels.RecommendedAction_CONTACT_SUPPORT.String():
		acts, err := h.escalate(ctx, cl, t, "", "the event recommends CONTACT_SUPPORT", time.Time{})
		return acts, time.Time{}, err
	}
	tm := h.cfg.template(actionKey(t.src))
	if tm == nil {
		return []*faultlinev1.Action{h.action(t, events.KindRemediate, events.OutcomeSkipped, "no resource template for "+actionKey(t.src), "skip")}, time.Time{}, nil
	}
	d := h.data(t, tm)
	if dryRun(cl, t) {
		if acts, again, ok, err := h.followOnDryRun(ctx, cl, t, tm); ok || err != nil {
			return acts, again, err
		}
		if h.tooOld(t) { // requeued, no resource lists it
			return []*faultlinev1.Action{h.skipOld(t)}, time.Time{}, nil
		}
		d.Name = h.name(t.node, tm.Group, 1)
		a := h.action(t, events.KindRemediate, events.OutcomeDryRun, fmt.Sprintf("would create %s %s", tm.kind, d.Name), "dry_run")
		a.DryRun = true
		return []*faultlinev1.Action{a}, time.Time{}, nil
	}
	if cl.Dynamic == nil {
		return nil, time.Time{}, fmt.Errorf("cluster %q: no dynamic client", t.cluster)
	}
	return h.decide(ctx, cl, t, tm, d, false)
}

// attempt is how often the trigger was requeued (requeue.Attempt; 0
// without a record).
func (t trigger) attempt() int {
	if t.rec == nil {
		return 0
	}
	return requeue.Attempt(t.rec)
}

// tooOld reports whether the trigger is older than remediate.retention.
func (h *Handler) tooOld(t trigger) bool {
	at := t.at()
	return h.cfg.Retention > 0 && !at.IsZero() && h.now().Sub(at) > h.cfg.Retention
}

// skipOld is the skipped record of a trigger older than retention.
func (h *Handler) skipOld(t trigger) *faultlinev1.Action {
	reason := fmt.Sprintf("trigger of %s is older than remediate.retention (%s): its remediation may have been pruned; not acted on",
		t.at().UTC().Format(time.RFC3339), h.cfg.Retention)
	return h.action(t, events.KindRemediate, events.OutcomeSkipped, reason, "skip")
}

// followOnDryRun follows, read-only, the resource that a live step of
// the trigger created or joined (ok: one lists it), on a cluster
// switched to dry_run since: the operator goes on with it, and its
// result is said (succeeded; failed, and escalated as dry-run, nothing
// written). Nothing is pruned. A trigger first looked at, one that is
// dry-run itself, and a follow-up that no resource lists (it waited for
// another) are not followed: their remediation is new work, which a
// dry-run cluster would create. So is one whose resources the cluster
// does not serve or let this role list.
func (h *Handler) followOnDryRun(ctx context.Context, cl *clusters.Client, t trigger, tm *Template) ([]*faultlinev1.Action, time.Time, bool, error) {
	if cl == nil || !cl.DryRun || cl.Kube == nil || cl.Dynamic == nil || t.src.GetDryRun() || t.src.GetOutcome() == events.OutcomeDryRun ||
		t.rec == nil || requeue.Attempt(t.rec) == 0 {
		return nil, time.Time{}, false, nil
	}
	h.m.reads.WithLabelValues(t.cluster, "live").Inc()
	list, err := h.resource(cl.Dynamic, tm).List(ctx, metav1.ListOptions{LabelSelector: LabelNode + "=" + nodeLabel(t.node) + "," + LabelGroup + "=" + tm.Group})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil, time.Time{}, false, nil
	}
	if err != nil {
		return nil, time.Time{}, false, fmt.Errorf("list %s of node %s: %w", tm.gvr.Resource, t.node, err)
	}
	for i := range list.Items {
		if slices.Contains(triggersOf(&list.Items[i]), t.id) {
			acts, again, err := h.follow(ctx, cl, t, tm, &list.Items[i], false)
			return acts, again, true, err
		}
	}
	return nil, time.Time{}, false, nil
}

// uncreatable writes a remediation the apiserver refuses for good (err:
// the rendered object fails the CRD's schema, or the CRD is not
// installed) as failed, and escalates it: trying again changes nothing,
// and the node stays cordoned and drained.
func (h *Handler) uncreatable(ctx context.Context, cl *clusters.Client, t trigger, tm *Template, err error) ([]*faultlinev1.Action, time.Time, error) {
	a := h.action(t, events.KindRemediate, events.OutcomeFailed, err.Error(), "error")
	esc, eerr := h.escalate(ctx, cl, t, tm.Group, fmt.Sprintf("%s cannot be created: %v", tm.kind, err), time.Time{})
	return append([]*faultlinev1.Action{a}, esc...), time.Time{}, eerr
}

// refusedObject reports whether a create's 403 Forbidden is about the
// object itself, which no retry changes: an admission webhook denied it
// (OPA Gatekeeper, Kyverno) or a ValidatingAdmissionPolicy did, or its
// namespace is being terminated.
func refusedObject(err error) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "admission webhook") && strings.Contains(msg, "denied the request") ||
		strings.Contains(msg, "ValidatingAdmissionPolicy") && strings.Contains(msg, "denied request") ||
		strings.Contains(msg, "because it is being terminated")
}

// decide takes the remediation one step on the node's resources of the
// template's group, read from the watch (resourceCaches) or, when live is
// set or the watch's copy is not to be trusted, listed; then it prunes
// the group's old finished resources.
func (h *Handler) decide(ctx context.Context, cl *clusters.Client, t trigger, tm *Template, d Data, live bool) ([]*faultlinev1.Action, time.Time, error) {
	res := h.resource(cl.Dynamic, tm)
	g := nodeGroup{watchKey: h.watchKey(t.cluster, tm), node: nodeLabel(t.node), group: tm.Group}
	var items []unstructured.Unstructured
	cached := false
	if !live {
		items, cached = h.caches.items(cl.WatchDynamic, g)
	}
	if cached {
		h.m.reads.WithLabelValues(t.cluster, "watch").Inc()
	} else {
		h.m.reads.WithLabelValues(t.cluster, "live").Inc()
		list, err := res.List(ctx, metav1.ListOptions{LabelSelector: LabelNode + "=" + g.node + "," + LabelGroup + "=" + tm.Group})
		if apierrors.IsNotFound(err) { // a collection is not found when its CRD is not installed
			return h.uncreatable(ctx, cl, t, tm, fmt.Errorf("list %s: %w", tm.gvr.Resource, err))
		}
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("list %s of node %s: %w", tm.gvr.Resource, t.node, err)
		}
		items = list.Items
	}
	sort.Slice(items, func(i, j int) bool { return createdAt(&items[i]).Before(createdAt(&items[j])) })
	acts, again, err := h.choose(ctx, cl, t, tm, d, res, g, items, cached)
	if err != nil {
		return acts, again, err
	}
	return append(acts, h.prune(ctx, t, tm, res, items)...), again, nil
}

// choose takes the step on the node's resources of the group (oldest
// first): follow the trigger's own, join one in progress, escalate, or
// create the next.
func (h *Handler) choose(ctx context.Context, cl *clusters.Client, t trigger, tm *Template, d Data, res dynamic.ResourceInterface,
	g nodeGroup, items []unstructured.Unstructured, cached bool) ([]*faultlinev1.Action, time.Time, error) {
	// Already ours (a retry, a replay, or a second replica)?
	for i := range items {
		if slices.Contains(triggersOf(&items[i]), t.id) {
			return h.follow(ctx, cl, t, tm, &items[i], false)
		}
	}
	if h.tooOld(t) {
		// Requeued (it waited, or its cluster was unreachable) past
		// retention, and no resource lists it: what answered it may have
		// been pruned.
		return []*faultlinev1.Action{h.skipOld(t)}, time.Time{}, nil
	}
	// The resources made before the node's Node object was created were
	// for the machine an earlier Node of this name was (a replacement
	// registered under it): they neither answer, nor are joined by, nor
	// escalate or spend the budget of this one. Only the names count on.
	all := items
	items = ofThisNode(t, items)
	// Answered by the newest, finished, though not listed (its id was
	// trimmed from the list, or it was late)? Not if it started before
	// the fault was generated (below: it waited, and others joined since).
	fa := t.faultAt()
	if n := len(items); n > 0 && !t.at().IsZero() && !t.at().After(coversUntil(&items[n-1])) && serves(tm, &items[n-1], d) &&
		!startedBefore(&items[n-1], fa) {
		if st, _ := h.status(tm, &items[n-1]); st != inProgress {
			return h.follow(ctx, cl, t, tm, &items[n-1], false)
		}
	}
	// Answered by a remediation that succeeded and was started after the
	// fault was generated: a repeat generated before the reboot and
	// delivered after it (the agent's spool), decided by a new drain after
	// the first had finished, would otherwise reboot the node again.
	if !fa.IsZero() {
		for i := len(items) - 1; i >= 0 && createdAt(&items[i]).After(fa); i-- {
			if st, _ := h.status(tm, &items[i]); st == completed && serves(tm, &items[i], d) {
				return h.follow(ctx, cl, t, tm, &items[i], false)
			}
		}
	}
	// An equivalent remediation in progress: join it. One of other GPUs
	// (a reset of GPUs that are not the trigger's) is waited for, and so
	// is one started before the fault was generated: the machine came
	// back from that reboot and failed again (a GPU off the bus at driver
	// load) before the janitor saw it ready; joined, the fault would be
	// answered by the reboot that preceded it, the node left cordoned
	// for ever. Once it has finished the trigger is decided again: a new
	// reboot, or CONTACT_SUPPORT when the budget is spent. The price: a
	// fault generated between the signal and the shutdown itself gets
	// one more reboot of a node already drained, within the budget.
	var busy *unstructured.Unstructured
	for i := range items {
		if st, _ := h.status(tm, &items[i]); st == inProgress {
			if serves(tm, &items[i], d) && !startedBefore(&items[i], fa) {
				return h.join(ctx, cl, t, tm, res, g, &items[i])
			}
			busy = &items[i]
		}
	}
	if busy != nil {
		return h.wait(t, tm, busy, d)
	}
	// Escalation: the last one attempted failed, or the budget is spent.
	// A cancelled one (not attempted: the node was no longer drained) is
	// neither.
	if last := h.lastAttempted(tm, items); last >= 0 {
		if st, why := h.status(tm, &items[last]); st == failed {
			acts, err := h.escalate(ctx, cl, t, tm.Group, fmt.Sprintf("the last %s %s failed (%s)", tm.kind, items[last].GetName(), why),
				h.failedAt(tm, &items[last]))
			return acts, time.Time{}, err
		}
	}
	if h.cfg.Budget > 0 {
		recent := 0
		for i := range items {
			if h.now().Sub(createdAt(&items[i])) < h.cfg.BudgetWindow {
				if st, _ := h.status(tm, &items[i]); st != cancelled {
					recent++
				}
			}
		}
		if recent >= h.cfg.Budget {
			acts, err := h.escalate(ctx, cl, t, tm.Group, fmt.Sprintf("budget spent: %d %s remediations within %v (budget %d)",
				recent, tm.Group, h.cfg.BudgetWindow, h.cfg.Budget), time.Time{})
			return acts, time.Time{}, err
		}
	}
	// Create, with the next sequence number of the node's group: two
	// replicas racing pick the same name and one of them wins.
	next := nextSeq(all)
	for seq := next; seq < next+10; seq++ {
		d.Name = h.name(t.node, tm.Group, seq)
		obj, err := tm.render(d)
		if err != nil {
			// The template does not render for this fault: no retry makes
			// it, and the node stays cordoned and drained. Escalated.
			a := h.action(t, events.KindRemediate, events.OutcomeFailed, "template: "+err.Error(), "template")
			esc, eerr := h.escalate(ctx, cl, t, tm.Group, fmt.Sprintf("%s cannot be created: its template does not render: %v", tm.kind, err), time.Time{})
			return append([]*faultlinev1.Action{a}, esc...), time.Time{}, eerr
		}
		if err := tm.checkTarget(obj, t.node); err != nil {
			h.m.refused.WithLabelValues(t.cluster).Inc()
			h.log.Warn("remediation refused: the rendered object targets another node", "cluster", t.cluster, "node", t.node,
				"kind", tm.kind, "err", err)
			a := h.action(t, events.KindRemediate, events.OutcomeRefused, "refused: "+err.Error(), "refused")
			a.Details[events.DetailTemplate] = tm.Action
			return []*faultlinev1.Action{a}, time.Time{}, nil
		}
		obj.SetName(d.Name)
		lbl := obj.GetLabels()
		if lbl == nil {
			lbl = map[string]string{}
		}
		lbl[LabelNode], lbl[LabelGroup], lbl[LabelManagedBy] = nodeLabel(t.node), tm.Group, "faultline"
		obj.SetLabels(lbl)
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[AnnotationTriggers] = t.id
		ann[AnnotationCreated] = h.now().UTC().Format(time.RFC3339Nano)
		ann[AnnotationBy] = h.cfg.Identity
		ann[AnnotationEvents] = strings.Join(t.src.GetEventIds(), ",")
		ann[AnnotationSeq] = strconv.Itoa(seq)
		if !t.at().IsZero() {
			ann[AnnotationCovers] = t.at().UTC().Format(time.RFC3339Nano)
		}
		if tm.byGPU {
			ann[AnnotationGPUs] = strings.Join(d.GPUs, ",")
		}
		if tm.byEntity {
			ann[AnnotationEntities] = strings.Join(entityKeys(d.Entities), ",")
		}
		obj.SetAnnotations(ann)
		h.caches.wrote(g, "", "")
		created, err := res.Create(ctx, obj, metav1.CreateOptions{FieldManager: "faultline-remediate"})
		if apierrors.IsAlreadyExists(err) {
			h.m.races.WithLabelValues(t.cluster).Inc()
			if cached {
				// The watch had not shown it: decide again on what the
				// apiserver holds (the budget, the last result).
				return h.decide(ctx, cl, t, tm, d, true)
			}
			cur, gerr := res.Get(ctx, d.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) {
				continue
			}
			if gerr != nil {
				return nil, time.Time{}, fmt.Errorf("get %s %s: %w", tm.kind, d.Name, gerr)
			}
			if slices.Contains(triggersOf(cur), t.id) {
				return h.follow(ctx, cl, t, tm, cur, false)
			}
			if st, _ := h.status(tm, cur); st == inProgress {
				if !serves(tm, cur, d) || startedBefore(cur, t.faultAt()) {
					return h.wait(t, tm, cur, d)
				}
				return h.join(ctx, cl, t, tm, res, g, cur)
			}
			continue
		}
		if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsNotFound(err) || refusedObject(err) {
			return h.uncreatable(ctx, cl, t, tm, fmt.Errorf("create %s %s: %w", tm.kind, d.Name, err))
		}
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("create %s %s: %w", tm.kind, d.Name, err)
		}
		h.caches.wrote(g, created.GetName(), created.GetResourceVersion())
		h.m.created.WithLabelValues(t.cluster, tm.Group).Inc()
		a := h.action(t, events.KindRemediate, events.OutcomeApplied, fmt.Sprintf("created %s %s", tm.kind, created.GetName()), "applied")
		a.Details[events.DetailResource] = tm.kind + "/" + created.GetName()
		return []*faultlinev1.Action{a}, h.now().Add(h.cfg.PollInterval), nil
	}
	return nil, time.Time{}, fmt.Errorf("create %s for node %s: no free name after 10 tries", tm.kind, t.node)
}

// lastAttempted is the index of the newest of items (oldest first) that
// is not cancelled, -1 if none: its result is the node's last.
func (h *Handler) lastAttempted(tm *Template, items []unstructured.Unstructured) int {
	for i := len(items) - 1; i >= 0; i-- {
		if st, _ := h.status(tm, &items[i]); st != cancelled {
			return i
		}
	}
	return -1
}

// nextSeq is the sequence number of the group's next resource: one more
// than the highest of items (AnnotationSeq; a resource created before the
// annotation counts as its place among them, oldest first, which was its
// number while nothing was pruned).
func nextSeq(items []unstructured.Unstructured) int {
	n := 0
	for i := range items {
		s, err := strconv.Atoi(items[i].GetAnnotations()[AnnotationSeq])
		if err != nil || s < 1 {
			s = i + 1
		}
		n = max(n, s)
	}
	return n + 1
}

// prune deletes the group's finished resources (items, oldest first)
// created longer ago than Retention, never the newest (its sequence
// number is what the next remediation reads) nor the newest not cancelled
// (its result is). A delete is
// conditional on the uid and resourceVersion read, so a resource changed
// since (or a stale copy of the watch) is left for the next look, as is
// one whose delete failed; one whose delete's answer was lost and that is
// gone when read again was deleted. Every delete is an action; none fails
// the step.
func (h *Handler) prune(ctx context.Context, t trigger, tm *Template, res dynamic.ResourceInterface, items []unstructured.Unstructured) []*faultlinev1.Action {
	if h.cfg.Retention == 0 || len(items) < 2 {
		return nil
	}
	var acts []*faultlinev1.Action
	last := h.lastAttempted(tm, items)
	for i := range items[:len(items)-1] {
		o := &items[i]
		if i == last {
			continue
		}
		age := h.now().Sub(createdAt(o))
		if age <= h.cfg.Retention {
			break // the rest are newer
		}
		st, why := h.status(tm, o)
		if st == inProgress {
			continue
		}
		uid, rv := o.GetUID(), o.GetResourceVersion()
		err := res.Delete(ctx, o.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		// Gone or changed since it was read: left. Failed: read again, it
		// may have gone through with its answer lost.
		apiErr := err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err)
		lost := apiErr && gone(ctx, res, o)
		if err != nil && !lost {
			if apiErr {
				h.m.apiErrors.WithLabelValues(t.cluster).Inc()
				h.log.Warn("pruning an old remediation failed; tried again at the node's next one", "cluster", t.cluster, "node", t.node,
					"resource", tm.kind+"/"+o.GetName(), "err", err)
			}
			continue
		}
		result := "completed"
		if st == failed {
			result = "failed: " + why
		}
		if lost {
			result += " (the delete's answer was lost; the resource is gone)"
		}
		ref := tm.kind + "/" + o.GetName()
		a := h.action(t, events.KindPrune, events.OutcomeApplied,
			fmt.Sprintf("deleted %s, created %s ago (retention %s), %s", ref, age.Round(time.Minute), h.cfg.Retention, result), "prune/"+o.GetName())
		a.Details[events.DetailResource] = ref
		acts = append(acts, a)
	}
	return acts
}

// gone reports whether o no longer exists, as read now: a delete whose
// answer was lost (a connection cut after the apiserver acted) went
// through.
func gone(ctx context.Context, res dynamic.ResourceInterface, o *unstructured.Unstructured) bool {
	now, err := res.Get(ctx, o.GetName(), metav1.GetOptions{})
	return apierrors.IsNotFound(err) || err == nil && now.GetUID() != o.GetUID()
}

// resource is the dynamic client of a template's resource.
func (h *Handler) resource(dyn dynamic.Interface, tm *Template) dynamic.ResourceInterface {
	if tm.namespaced {
		return dyn.Resource(tm.gvr).Namespace(tm.namespace)
	}
	return dyn.Resource(tm.gvr)
}

// follow reports on the trigger's own resource: the result once its
// condition says so, else the applied record again (same id) and a requeue.
// joined: this step added the trigger to o (join).
func (h *Handler) follow(ctx context.Context, cl *clusters.Client, t trigger, tm *Template, o *unstructured.Unstructured, joined bool) ([]*faultlinev1.Action, time.Time, error) {
	st, why := h.status(tm, o)
	ref := tm.kind + "/" + o.GetName()
	switch st {
	case completed:
		a := h.action(t, events.KindRemediate, events.OutcomeSucceeded, ref+" completed", "succeeded")
		a.Details[events.DetailResource] = ref
		return []*faultlinev1.Action{a}, time.Time{}, nil
	case failed:
		a := h.action(t, events.KindRemediate, events.OutcomeFailed, ref+" failed: "+why, "failed")
		a.Details[events.DetailResource] = ref
		acts, err := h.escalate(ctx, cl, t, tm.Group, fmt.Sprintf("%s failed (%s)", ref, why), h.failedAt(tm, o))
		return append([]*faultlinev1.Action{a}, acts...), time.Time{}, err
	case cancelled:
		// Not attempted: the node was no longer quarantined and drained
		// when the operator came to it (the fault recovered meanwhile).
		// No escalation; the node's next fault is remediated afresh.
		a := h.action(t, events.KindRemediate, events.OutcomeCancelled, ref+" cancelled, not attempted: "+why, "cancelled")
		a.Details[events.DetailResource] = ref
		return []*faultlinev1.Action{a}, time.Time{}, nil
	}
	var acts []*faultlinev1.Action
	// Said by the step that joined, at the first look (a replay says it
	// again, same id) and after a step that failed: it may have been this
	// trigger's create or join, taken by the apiserver and its answer lost.
	// A trigger that waited for another remediation joins at a later look.
	if joined || requeue.Attempt(t.rec) == 0 || requeue.AfterTrouble(t.rec) {
		kind, outcome, reason := events.KindRemediate, events.OutcomeApplied, "created "+ref
		if o.GetAnnotations()[AnnotationTriggers] != t.id && !strings.HasPrefix(o.GetAnnotations()[AnnotationTriggers], t.id+",") {
			outcome, reason = events.OutcomeInProgress, "joined "+ref+": an equivalent remediation is in progress"
		}
		a := h.action(t, kind, outcome, reason, outcome)
		a.Details[events.DetailResource] = ref
		acts = append(acts, a)
	}
	return acts, h.now().Add(h.cfg.PollInterval), nil
}

// serves reports whether resource o answers the trigger's GPUs, or
// entities (d): a template that does not depend on them serves any, as
// does a resource made for every GPU (entity) of the node, or before its
// annotation; one made for some serves a trigger of those only.
func serves(tm *Template, o *unstructured.Unstructured, d Data) bool {
	if v, ok := o.GetAnnotations()[AnnotationEntities]; tm.byEntity && ok {
		return v == "" || covers(strings.Split(v, ","), entityKeys(d.Entities))
	}
	v, ok := o.GetAnnotations()[AnnotationGPUs]
	return !tm.byGPU || !ok || v == "" || covers(strings.Split(v, ","), d.GPUs)
}

// madeFor says what a resource was made for: its GPUs, or its entities.
func madeFor(tm *Template, o *unstructured.Unstructured) (what, made string) {
	if v, ok := o.GetAnnotations()[AnnotationEntities]; tm.byEntity && ok {
		return "entities", v
	}
	return "GPUs", o.GetAnnotations()[AnnotationGPUs]
}

// covers: want is some of have, and not none.
func covers(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return len(want) > 0
}

// entityKeys are the entities as TYPE=value.
func entityKeys(es []Entity) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Type + "=" + e.Value
	}
	return out
}

// wait looks at the trigger again after poll_interval: a remediation of
// other GPUs (o), or one started before the trigger's fault was generated,
// is in progress on the node, and the trigger's is decided once it has
// finished (said at the first look, and after a failed step).
func (h *Handler) wait(t trigger, tm *Template, o *unstructured.Unstructured, d Data) ([]*faultlinev1.Action, time.Time, error) {
	var acts []*faultlinev1.Action
	if requeue.Attempt(t.rec) == 0 || requeue.AfterTrouble(t.rec) {
		ref := tm.kind + "/" + o.GetName()
		what, made := madeFor(tm, o)
		why := "it does not serve this fault's " + what
		if serves(tm, o, d) {
			start, _ := startedAt(o)
			why = fmt.Sprintf("it started at %s, before this fault was generated (%s)",
				start.UTC().Format(time.RFC3339), t.faultAt().UTC().Format(time.RFC3339Nano))
		}
		a := h.action(t, events.KindRemediate, events.OutcomeInProgress,
			fmt.Sprintf("waiting for %s (%s %s) to finish: %s", ref, what, made, why), "waiting")
		a.Details[events.DetailResource] = ref
		acts = append(acts, a)
	}
	return acts, h.now().Add(h.cfg.PollInterval), nil
}

// join adds the trigger to a resource in progress (so its retries find it)
// and creates nothing.
func (h *Handler) join(ctx context.Context, cl *clusters.Client, t trigger, tm *Template, res dynamic.ResourceInterface, g nodeGroup, o *unstructured.Unstructured) ([]*faultlinev1.Action, time.Time, error) {
	trs := append(triggersOf(o), t.id)
	if len(trs) > maxTriggers {
		trs = trs[len(trs)-maxTriggers:]
	}
	ann := map[string]string{AnnotationTriggers: strings.Join(trs, ",")}
	if at := t.at(); at.After(coversUntil(o)) {
		ann[AnnotationCovers] = at.UTC().Format(time.RFC3339Nano)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": o.GetResourceVersion(),
		"annotations":     ann,
	}})
	h.caches.wrote(g, "", "")
	out, err := res.Patch(ctx, o.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "faultline-remediate"})
	if apierrors.IsNotFound(err) {
		// Deleted since it was read (an operator resetting the budget, the
		// retention's prune): decided again, as a conflict.
		err = apierrors.NewConflict(tm.gvr.GroupResource(), o.GetName(), err)
	}
	if err != nil {
		// A conflict (changed under us, or a stale copy of the watch) is
		// redone by requeue.Step, on a live list (the write is in flight
		// for the cache).
		return nil, time.Time{}, fmt.Errorf("join %s %s: %w", tm.kind, o.GetName(), err)
	}
	h.caches.wrote(g, out.GetName(), out.GetResourceVersion())
	h.m.joined.WithLabelValues(t.cluster, tm.Group).Inc()
	return h.follow(ctx, cl, t, tm, out, true)
}

// escalate records CONTACT_SUPPORT for the node: an escalate action and an
// annotation on the node. Nothing is created.
// It is counted once written: a write that fails is retried (the step's
// error), and counts nothing. A dry-run trigger (dryRun) annotates
// nothing, on a live cluster too, and counts nothing; its action says
// dryRun.
// since, when set, is when the failed resource escalated for finished
// (failedAt): a node whose annotation is at or after it was escalated for
// that failure already (by another of the faults that joined it), and is
// neither stamped again (the janitor refuses a resource created before
// the annotation's time: a re-stamp cancelled a reboot created after the
// first escalation) nor counted; the action says so (DetailEscalatedAt).
func (h *Handler) escalate(ctx context.Context, cl *clusters.Client, t trigger, group, why string, since time.Time) ([]*faultlinev1.Action, error) {
	dry := dryRun(cl, t)
	var repeat string
	if !dry && !since.IsZero() {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, t.node, metav1.GetOptions{})
		switch {
		case err == nil:
			if v, at, ok := escalatedAt(n.GetAnnotations()); ok && !at.Before(since) {
				repeat = v
			}
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			// Gone (nothing to annotate), or a ClusterRole without nodes
			// get (before it was needed): stamped, as before.
		default:
			return nil, fmt.Errorf("read node %s: %w", t.node, err)
		}
	}
	if !dry && repeat == "" {
		val := h.now().UTC().Format(time.RFC3339Nano) + " " + why
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationEscalated: events.Truncate(val, 1024)}}})
		_, err := cl.Kube.CoreV1().Nodes().Patch(ctx, t.node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "faultline-remediate"})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("annotate node %s escalated: %w", t.node, err)
		}
		h.m.escalations.WithLabelValues(t.cluster).Inc()
	}
	reason := "CONTACT_SUPPORT: " + why
	if repeat != "" {
		reason += " (already escalated at " + repeat + " for it: not stamped again)"
	}
	a := h.action(t, events.KindEscalate, events.OutcomeApplied, reason, "escalate")
	if repeat != "" {
		a.Details[DetailEscalatedAt] = repeat
	}
	a.RecommendedAction = datamodels.RecommendedAction_CONTACT_SUPPORT.String()
	a.Details[events.DetailRequestedAction] = t.src.GetRecommendedAction()
	if group != "" {
		a.Details[events.DetailGroup] = group
	}
	a.DryRun = a.DryRun || dry
	return []*faultlinev1.Action{a}, nil
}

// escalatedAt reads AnnotationEscalated: its time as written, and parsed.
func escalatedAt(ann map[string]string) (string, time.Time, bool) {
	v, _, _ := strings.Cut(ann[AnnotationEscalated], " ")
	at, err := time.Parse(time.RFC3339Nano, v)
	return v, at, err == nil
}

// failedAt is when a failed resource finished: status.completionTime,
// else its failed condition's lastTransitionTime, else its start, else
// its creation (the earliest it can have failed).
func (h *Handler) failedAt(tm *Template, o *unstructured.Unstructured) time.Time {
	if v, _, _ := unstructured.NestedString(o.Object, "status", "completionTime"); v != "" {
		if at, err := time.Parse(time.RFC3339, v); err == nil {
			return at
		}
	}
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	if _, c := matchCondition(conds, tm.failed); c != nil {
		if v, _ := c["lastTransitionTime"].(string); v != "" {
			if at, err := time.Parse(time.RFC3339, v); err == nil {
				return at
			}
		}
	}
	if at, ok := startedAt(o); ok {
		return at
	}
	return createdAt(o)
}

// dryRun reports whether the trigger's remediation changes nothing: its
// cluster is dry-run, or the trigger is (a drain/dry_run result, or one
// marked dry-run: in flight when the cluster was switched to live, or
// replayed), whatever the cluster is now.
func dryRun(cl *clusters.Client, t trigger) bool {
	return cl == nil || cl.Kube == nil || cl.DryRun || t.src.GetDryRun() || t.src.GetOutcome() == events.OutcomeDryRun
}

// name is the deterministic name of a node's seq-th resource of a group:
// "maintenance-<node>-<hash>", the form of NVSentinel's fault remediation
// (its RebootNode names are maintenance-<node>-<event id>).
func (h *Handler) name(node, group string, seq int) string {
	n := node
	if len(n) > 200 {
		n = n[:200]
	}
	return h.cfg.NamePrefix + "-" + strings.Trim(n, ".-") + "-" + shortHash(node+"\x00"+group+"\x00"+strconv.Itoa(seq), 12)
}

func (h *Handler) action(t trigger, kind, outcome, reason, idPart string) *faultlinev1.Action {
	h.m.actions.WithLabelValues(t.cluster, kind, outcome).Inc()
	a := &faultlinev1.Action{
		Id:      shortHash(strings.Join([]string{t.cluster, t.node, t.id, kind, idPart}, "\x00"), 32),
		Cluster: t.cluster, Node: t.node, Role: Role, Kind: kind, Outcome: outcome, Reason: events.Truncate(reason, 1024),
		EventIds: t.src.GetEventIds(), DryRun: t.src.GetDryRun(), Timestamp: timestamppb.New(h.now()),
		Details: map[string]string{}, CheckName: t.src.GetCheckName(), RecommendedAction: t.src.GetRecommendedAction(),
	}
	for _, k := range []string{events.DetailDrainID, events.DetailEntities, events.DetailCustomAction} {
		if v := t.src.GetDetails()[k]; v != "" {
			a.Details[k] = v
		}
	}
	return a
}

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

type metrics struct {
	actions, created, joined, races, escalations, apiErrors, refused, reads, slowLane *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		actions:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_actions_total", Help: "Remediate actions written."}, []string{"cluster", "kind", "outcome"}),
		created:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_created_total", Help: "Remediation resources created."}, []string{"cluster", "group"}),
		joined:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_joined_total", Help: "Faults that joined a remediation in progress."}, []string{"cluster", "group"}),
		races:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_name_races_total", Help: "Creates that found the name taken."}, []string{"cluster"}),
		escalations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_escalations_total", Help: "Nodes escalated to CONTACT_SUPPORT."}, []string{"cluster"}),
		apiErrors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_api_errors_total", Help: "Retriable Kubernetes API errors."}, []string{"cluster"}),
		refused:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_refused_total", Help: "Rendered remediation objects refused because they did not target the event's node."}, []string{"cluster"}),
		reads:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_reads_total", Help: "A node's remediation resources read, from the watch or live (a list request)."}, []string{"cluster", "from"}),
		slowLane: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_remediate_slow_lane_handovers_total",
			Help: "A slow cluster's remediations handed to the slow lane (remediate.slow_cluster), a count per node and batch (the node's later work in the batch goes with it)."}, []string{"cluster"}),
	}
	if reg != nil {
		reg.MustRegister(m.actions, m.created, m.joined, m.races, m.escalations, m.apiErrors, m.refused, m.reads, m.slowLane)
	}
	return m
}
