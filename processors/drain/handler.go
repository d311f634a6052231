package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Role is the processor role name written on actions.
const Role = events.RoleDrain

// Handler is the drain role. It consumes the actions topic (a quarantine
// that was applied, or decided dry-run, starts a drain) and TopicRequeue
// (drains in progress). All progress lives in the node's AnnotationState,
// so any replica, or a restarted one, resumes a drain where it stood.
type Handler struct {
	cfg  Config
	reg  *clusters.Registry
	log  *slog.Logger
	now  func() time.Time
	m    *metrics
	lane *requeue.Lane
	// nodes are the clusters' node watches (nodewatch.go).
	nodes *clusters.NodeWatches
}

// Options are a Handler's collaborators.
type Options struct {
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Registerer gets the role's metrics; nil: not registered.
	Registerer prometheus.Registerer
}

// New validates cfg and returns the handler.
func New(cfg Config, reg *clusters.Registry, opts Options) (*Handler, error) {
	if err := cfg.Validate("drain."); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	h := &Handler{cfg: cfg, reg: reg, log: opts.Log.With("role", Role), now: opts.Now, m: newMetrics(opts.Registerer)}
	h.lane = &requeue.Lane{Topic: TopicSlow, Limit: cfg.SlowCluster, Handed: h.m.slowLane, Log: h.log}
	h.nodes = newNodeWatches(h.log)
	return h, nil
}

// Close stops the handler's node watches.
func (h *Handler) Close() {
	h.nodes.Close()
}

// HeaderDrain names, on a requeue record, the drain its fault was
// admitted to (State.ID). The step that started, joined or resumed that
// drain sets it once the node's state holds the fault, and the record's
// next looks follow that drain (admit) instead of judging the fault anew
// by the trigger ids the state remembers (State.Seen, bounded).
const HeaderDrain = "faultline-drain-id"

// drainOf returns the drain rec names (HeaderDrain; "" when none).
func drainOf(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == HeaderDrain {
			return string(h.Value)
		}
	}
	return ""
}

// trigger is one record that asks for a drain to start or go on.
type trigger struct {
	rec     *kgo.Record
	src     *faultlinev1.Action
	cluster string
	node    string
	eventID string
	// drain is the drain the record was admitted to (HeaderDrain; ""
	// when none).
	drain string
	// admitted, when not nil, gets the drain the record's requeue names
	// (follow).
	admitted *string
	// nodeCreated is the creationTimestamp of the Node object the step
	// read (zero before it has): its actions carry it, so the remediate
	// role tells this machine's remediations from those of an earlier
	// machine of the same name.
	nodeCreated time.Time
}

// IsTrigger reports whether an action starts a drain: a quarantine that was
// applied, or decided for a dry-run cluster. Held by the breaker, skipped
// and every other kind start nothing.
func IsTrigger(a *faultlinev1.Action) bool {
	return a.GetRole() == events.RoleQuarantine && a.GetKind() == events.KindQuarantine &&
		(a.GetOutcome() == events.OutcomeApplied || a.GetOutcome() == events.OutcomeDryRun)
}

// Handle handles one partition's batch of the actions topic or
// TopicRequeue; a slow cluster's drains go to TopicSlow (requeue.Lane).
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	return h.handle(ctx, recs, h.lane)
}

// SlowHandler handles the slow lane's batches (TopicSlow): every drain
// stepped, whatever its cluster's pace.
func (h *Handler) SlowHandler() pipeline.Handler {
	return pipeline.HandlerFunc(func(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
		return h.handle(ctx, recs, nil)
	})
}

func (h *Handler) handle(ctx context.Context, recs []*kgo.Record, lane *requeue.Lane) (pipeline.Result, error) {
	var stale pipeline.Stale
	defer h.logStale(&stale)
	return requeue.Handle(ctx, recs, IsTrigger, h.cfg.Workers, TopicRequeue, h.now, h.reg, lane,
		func(ctx context.Context, a pipeline.ActionRec) ([]*faultlinev1.Action, requeue.Again) {
			id := a.Action.GetId()
			if len(a.Action.GetEventIds()) > 0 {
				id = a.Action.GetEventIds()[0]
			}
			t := trigger{rec: a.Rec, src: a.Action, cluster: a.Cluster, node: a.Node, eventID: id, drain: drainOf(a.Rec)}
			if age, ok := h.staleAge(t, h.now()); ok {
				stale.Add(t.cluster, age)
				return []*faultlinev1.Action{h.staleSkip(t, age)}, requeue.Again{}
			}
			return h.process(ctx, t)
		})
}

// process runs one step of the trigger's drain on its cluster
// (clusters.Registry.Try). It returns the actions and, when the drain must
// be looked at again, when: at the step's asking, or when a cluster in
// trouble may be tried again; the requeue record then names the drain the
// trigger's fault is in (HeaderDrain), as far as the node's state is known
// to hold it. A step failing for good (not the cluster's trouble) of a
// drain the trigger started, running on the node, is looked at again
// after MaxPDBBackoff; any other ends with its failed action.
func (h *Handler) process(ctx context.Context, t trigger) ([]*faultlinev1.Action, requeue.Again) {
	// The drain the requeue names: the record's own, until a step puts
	// its fault in one (or judges it anew: none).
	follow := t.drain
	t.admitted = &follow
	acts, again, err := requeue.Step(ctx, h.reg, t.cluster, t.node, "drain", h.now().Add(h.cfg.PollInterval), h.log, h.m.apiErrors, h.m.conflicts,
		func(ctx context.Context, cl *clusters.Client) ([]*faultlinev1.Action, time.Time, error) {
			return h.step(ctx, cl, t)
		})
	if err == nil {
		if !again.At.IsZero() && follow != "" {
			again.Headers = append(again.Headers, kgo.RecordHeader{Key: HeaderDrain, Value: []byte(follow)})
		}
		return acts, again
	}
	failed := h.action(t, nil, events.OutcomeFailed, err.Error(), pipeline.ActionID(t.cluster, t.node, t.eventID, "failed"))
	if follow != "" && follow == pipeline.ActionID(t.cluster, t.node, t.eventID)[:16] {
		// The drain this record started is on the node, running: its
		// follow-up is this record's. Dropped, the node stayed "running"
		// with nothing stepping it until a new fault came — a write the
		// apiserver refuses for good (a 422: the node's annotations too
		// large; a webhook's denial) may be lifted by an operator. Looked
		// at again after max_pdb_backoff; its failed action, said at
		// each look, keeps its id.
		at := h.now().Add(h.cfg.MaxPDBBackoff)
		h.log.Warn("drain failed; looked at again", "cluster", t.cluster, "node", t.node, "drain", follow, "retry_at", at, "err", err)
		return append(acts, failed), requeue.Again{At: at, Headers: []kgo.RecordHeader{{Key: HeaderDrain, Value: []byte(follow)}}}
	}
	h.log.Warn("drain failed", "cluster", t.cluster, "node", t.node, "err", err)
	return append(acts, failed), requeue.Again{}
}

// follow notes the drain the record's requeue names ("": none, the
// record judged anew at its next look).
func (t trigger) follow(id string) {
	if t.admitted != nil {
		*t.admitted = id
	}
}

// opts are the drain inputs read from the trigger action.
type opts struct {
	trig  Trigger
	scope Scope
	force bool
	skip  bool
	// ignored says why the trigger's drainOverrides were not honoured.
	ignored string
	// decidedAt is when the quarantine was decided (the action's time);
	// already: the node was quarantined then (DetailAlreadyQuarantined).
	decidedAt time.Time
	already   bool
	// since is when the node's quarantine began (annotationQuarantinedAt;
	// zero when unknown), read from the node by the step.
	since time.Time
	// drain is the drain the record was admitted to (HeaderDrain; ""
	// when none): the record follows it (admit).
	drain string
}

// overrides reads the trigger's drainOverrides: "force" or "skip", honoured
// only when the quarantine action says an operator credential sent the
// event (events.DetailSubmitterRole; the quarantine role already drops
// anyone else's, so this holds the line for actions written otherwise, an
// older faultline's included). ignored says what was not honoured and why.
func overrides(a *faultlinev1.Action) (force, skip bool, ignored string) {
	v := a.GetDetails()[events.DetailDrainOverrides]
	if v != "force" && v != "skip" {
		return false, false, ""
	}
	if role := a.GetDetails()[events.DetailSubmitterRole]; role != "operator" {
		if role == "" {
			role = "agent"
		}
		who := role + " credential"
		if n := a.GetDetails()[events.DetailSubmitter]; n != "" {
			who += " " + n
		}
		return false, false, "drainOverrides." + v + " ignored: sent by " + who
	}
	return v == "force", v == "skip", ""
}

func (h *Handler) options(t trigger) opts {
	a := t.src
	o := opts{trig: Trigger{
		CheckName: a.GetCheckName(), RecommendedAction: a.GetRecommendedAction(),
		CustomAction: a.GetDetails()[events.DetailCustomAction], Entities: a.GetDetails()[events.DetailEntities],
	}}
	if at, err := time.Parse(time.RFC3339Nano, a.GetDetails()[events.DetailGeneratedAt]); err == nil {
		o.trig.GeneratedAt = at.UTC()
	}
	if t.eventID != "" {
		o.trig.EventIDs = []string{t.eventID}
	}
	o.force, o.skip, o.ignored = overrides(a)
	if ts := a.GetTimestamp(); ts != nil {
		o.decidedAt = ts.AsTime()
	}
	o.already = a.GetDetails()[events.DetailAlreadyQuarantined] == "true"
	o.drain = t.drain
	if o.trig.RecommendedAction == datamodels.RecommendedAction_COMPONENT_RESET.String() {
		o.scope.GPUs = entityValues(o.trig.Entities, events.EntityGPU)
		if len(o.scope.GPUs) > maxScopeGPUs {
			o.scope.GPUs = o.scope.GPUs[:maxScopeGPUs]
		}
		for i, g := range o.scope.GPUs {
			// A GPU UUID is ~40 bytes; anything that is not one matches
			// no pod either way.
			o.scope.GPUs[i] = events.BoundKey(g, 128)
		}
		if byUUID(o.scope.GPUs) {
			// A GPU named otherwise (a PCI address, index:N) is matched
			// by no pod and no listing: the kubelet's "no pods" for it
			// says nothing (usesGPU).
			o.scope.GPUPods = gpuPods(a.GetDetails())
		}
	}
	return o
}

// gpuPods reads the kubelet's listing of the pods holding the fault's
// GPUs from the quarantine action (events.MetaGPUPods, MetaGPUPodsAt);
// nil when it is absent or unreadable.
func gpuPods(details map[string]string) *PodList {
	v, ok := details[events.MetaGPUPods]
	if !ok {
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, details[events.MetaGPUPodsAt])
	if err != nil {
		return nil
	}
	return &PodList{Pods: splitIDs(v), At: at}
}

// entityValues returns the values of one type in an EntityKey string.
func entityValues(key, typ string) []string {
	var out []string
	for _, p := range strings.Split(key, ",") {
		if t, v, ok := strings.Cut(p, "="); ok && t == typ && v != "" {
			out = append(out, v)
		}
	}
	return out
}

// ReasonJoined begins the reason of the drain/in_progress action of a
// fault that joined a drain in progress (not a drain started).
const ReasonJoined = "fault joined the drain in progress"

func scopeString(gpus []string) string {
	if len(gpus) == 0 {
		return "node"
	}
	return "gpu:" + strings.Join(gpus, ",")
}

// step advances the node's drain once (a conflicting write makes
// requeue.Step redo it; every API call it repeats is idempotent).
func (h *Handler) step(ctx context.Context, cl *clusters.Client, t trigger) ([]*faultlinev1.Action, time.Time, error) {
	if cl == nil || cl.Kube == nil || cl.DryRun || t.src.GetDryRun() || t.src.GetOutcome() == events.OutcomeDryRun {
		acts, err := h.dryRun(ctx, cl, t)
		return acts, time.Time{}, err
	}
	return h.stepOnce(ctx, cl, t)
}

func (h *Handler) getNode(ctx context.Context, cl *clusters.Client, name string) (*corev1.Node, error) {
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	return n, nil
}

func (h *Handler) listPods(ctx context.Context, cl *clusters.Client, node string) ([]corev1.Pod, error) {
	l, err := cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list pods of node %s: %w", node, err)
	}
	return l.Items, nil
}

// stepOnce is one step of the node's drain: read the node and its pods,
// advance the state machine (machine.go), write the state, and make the
// calls it asks for.
//
// The node is the watch's copy where it holds this replica's last write
// (clusters.NodeWatches.Cached), else read live; a copy that says the node is not
// quarantined, where the step would end without a write, is read again
// live (the quarantine role's write may not have reached the watch). The
// write before the step's calls is always sent (writeState's check), so a
// copy another writer changed since stops them with a conflict.
func (h *Handler) stepOnce(ctx context.Context, cl *clusters.Client, t trigger) ([]*faultlinev1.Action, time.Time, error) {
	return h.stepNode(ctx, cl, t, true)
}

func (h *Handler) stepNode(ctx context.Context, cl *clusters.Client, t trigger, watched bool) ([]*faultlinev1.Action, time.Time, error) {
	node, cached := (*corev1.Node)(nil), false
	if watched {
		node, cached = h.nodes.Cached(cl, t.node, h.now())
	}
	if !cached {
		var err error
		node, err = h.getNode(ctx, cl, t.node)
		if apierrors.IsNotFound(err) {
			return []*faultlinev1.Action{h.action(t, nil, events.OutcomeFailed, "node not found in cluster", pipeline.ActionID(t.cluster, t.node, t.eventID, "notfound"))}, time.Time{}, nil
		}
		if err != nil {
			return nil, time.Time{}, err
		}
	}
	t.nodeCreated = node.CreationTimestamp.Time
	st, err := ReadState(node)
	if err != nil {
		h.log.Warn("corrupt drain state; starting afresh", "cluster", t.cluster, "node", t.node, "err", err)
		st = nil
	}
	now := h.now()
	quarantined := node.Labels[events.LabelQuarantined] == "true"
	o := h.options(t)
	o.since = quarantinedAt(node)
	st, adm := admit(st, t.eventID, o, quarantined, now,
		pipeline.ActionID(t.cluster, t.node, t.eventID)[:16], h.cfg.Identity)
	if cached && adm == admitUnquarantined {
		return h.stepNode(ctx, cl, t, false)
	}
	// acts are what the node's state says: returned even when the step
	// fails after them (the retry's record is newer than the state, so it
	// would not say them again). A new drain's start, or a joined fault's
	// action, joins them once a write put it on the node (wrote).
	var acts []*faultlinev1.Action
	starting, joining := adm == admitStart, adm == admitWiden
	if starting || joining {
		// Followed once a write put the fault on the node (wrote): a
		// write whose answer was lost leaves the record judged anew,
		// which finds its id in Seen.
		t.follow("")
	}
	wrote := func() {
		// The node's state holds the record's fault in st: its next
		// looks follow st.
		t.follow(st.ID)
		if starting {
			starting = false
			acts = append(acts, h.started(t, st))
			h.m.drains.WithLabelValues(t.cluster, PhaseRunning).Inc()
		}
		if joining {
			// A second fault joined the drain in progress (its scope
			// widened): said once the state holds it.
			joining = false
			acts = append(acts, h.joined(t, st))
		}
	}
	switch adm {
	case admitReplay:
		// Say the result again (same id), so a result lost in a crash
		// still reaches remediate.
		return append(h.unaudited(t, st), h.result(t, st)), time.Time{}, nil
	case admitResume:
		t.follow(st.ID)
		acts = h.unaudited(t, st)
	case admitEnded:
		// The record's drain ended and a newer one holds the node: the
		// record's fault was served by its own drain's result.
		h.log.Debug("drain replaced by a newer one; its follow-up ends", "cluster", t.cluster, "node", t.node,
			"drain", t.drain, "newer", st.ID)
		return nil, time.Time{}, nil
	case admitSkip:
		return []*faultlinev1.Action{h.action(t, nil, events.OutcomeSkipped, "drainOverrides.skip: pods left running, no remediation",
			pipeline.ActionID(t.cluster, t.node, t.eventID, "skip"))}, time.Time{}, nil
	case admitUnquarantined:
		return []*faultlinev1.Action{h.action(t, nil, events.OutcomeSkipped, "node no longer quarantined by faultline",
			pipeline.ActionID(t.cluster, t.node, t.eventID, "unquarantined"))}, time.Time{}, nil
	case admitCovered:
		return []*faultlinev1.Action{h.covered(t, st, o)}, time.Time{}, nil
	}

	if !quarantined {
		cancel(st, now)
		if _, err := h.writeState(ctx, cl, node, st, false); err != nil {
			return acts, time.Time{}, err
		}
		h.m.drains.WithLabelValues(t.cluster, PhaseCancelled).Inc()
		return append(acts, h.result(t, st)), time.Time{}, nil
	}

	pods, err := h.listPods(ctx, cl, t.node)
	if err != nil {
		return acts, time.Time{}, err
	}
	skippedBefore := st.skippedTerminating()
	ops := h.cfg.advance(st, pods, now)
	// Pods no longer waited for, said once: after the write that keeps it.
	skipped := newlySkipped(skippedBefore, st)
	if len(ops) > 0 {
		// Write the intent first: a restart after the calls and before the
		// result write finds the pods marked and counts each once. Sent
		// even when the state is unchanged (a retry after a PDB's backoff
		// or an outage): its resourceVersion check is what refuses calls
		// decided on a node that changed since it was read — the watch's
		// copy, trusted once this replica's last write is old, may hold
		// a quarantine lifted since.
		if node, err = h.writeState(ctx, cl, node, st, true); err != nil {
			return acts, time.Time{}, err
		}
		wrote()
		h.noteSkipped(t, st, skipped)
		skipped = nil
		if err := h.runOps(ctx, cl, st, ops, now); err != nil {
			// Keep what succeeded (and say it); the step is retried
			// after the backoff.
			_, werr := h.writeState(ctx, cl, node, st, false)
			if werr == nil {
				acts = append(acts, h.blocked(t, st, now)...)
			} else if !apierrors.IsConflict(werr) {
				h.log.Warn("drain state not written", "cluster", t.cluster, "node", t.node, "err", werr)
			}
			return acts, time.Time{}, err
		}
	}
	settle(st, now)
	if _, err := h.writeState(ctx, cl, node, st, false); err != nil {
		return acts, time.Time{}, err
	}
	wrote()
	h.noteSkipped(t, st, skipped)
	if len(ops) > 0 {
		// The PDBs its calls newly found blocking, one action.
		acts = append(acts, h.blocked(t, st, now)...)
	}
	if st.running() {
		if !startedBy(t, st) {
			// A fault that joined the drain, or its record again (a
			// follow-up of an older faultline, a redelivery): its step
			// is done and said, and the drain's own follow-up, its
			// starting fault's, looks at it again. A chain per joined
			// fault listed the node's pods once each per poll: a fault
			// repeating during a PDB-blocked drain ate the cluster's
			// client QPS. The starter's record, redelivered after a
			// crash, goes on (the drain is never left without one); a
			// step that met the cluster's trouble is requeued by
			// requeue.Step, and its next look says what it left
			// unsaid.
			return acts, time.Time{}, nil
		}
		// Looked at again after a quarter of its age — or, when this step
		// made calls, of theirs: the pods it evicted usually go within a
		// second, however old the drain (resumed after an outage, a PDB's
		// backoff ended).
		since := st.StartedAt
		if len(ops) > 0 {
			since = now
		}
		return acts, now.Add(pollDelay(now.Sub(since), h.cfg.PollInterval)), nil
	}
	h.m.drains.WithLabelValues(t.cluster, st.Phase).Inc()
	return append(acts, h.result(t, st)), time.Time{}, nil
}

// startedBy reports whether the trigger's fault started the drain st
// (its id is the fault's): that record's requeue chain is the drain's
// follow-up.
func startedBy(t trigger, st *State) bool {
	return pipeline.ActionID(t.cluster, t.node, t.eventID)[:16] == st.ID
}

// pollDelay is how long a running drain of the given age waits to be
// looked at again: a quarter of its age, at least a second (kubectl
// drain's own poll) and at most poll_interval. A drain whose pods go at
// once is seen done a second or two later instead of a whole poll_interval,
// and one that runs for minutes costs no more requests than before.
func pollDelay(age, pollInterval time.Duration) time.Duration {
	return min(pollInterval, max(time.Second, age/4))
}

// newlySkipped lists the pods done "skipped" that were not in before.
func newlySkipped(before []string, st *State) []string {
	var out []string
	for _, k := range st.skippedTerminating() {
		if !slices.Contains(before, k) {
			out = append(out, k)
		}
	}
	return out
}

// noteSkipped logs and counts the pods the drain just stopped waiting for.
func (h *Handler) noteSkipped(t trigger, st *State, keys []string) {
	for _, k := range keys {
		h.log.Warn("pod stuck terminating; drain no longer waits for it",
			"cluster", t.cluster, "node", t.node, "drain", st.ID, "pod", k, "reason", st.Pods[k].Reason)
		h.m.skippedTerminating.WithLabelValues(t.cluster).Inc()
	}
}

// runOps makes the step's evictions and deletions, PodWorkers at a time,
// and records their outcome in st (Config.record). It returns the first
// error that needs the cluster to recover (the others are recorded on the
// pods).
func (h *Handler) runOps(ctx context.Context, cl *clusters.Client, st *State, ops []op, now time.Time) error {
	// Every op's key is distinct: ByKey returns the results in ops' order.
	results := pipeline.ByKey(ops, func(o op) string { return o.key }, h.cfg.PodWorkers, func(os []op) callResult {
		return h.call(ctx, cl, os[0], st.Force)
	})
	var first error
	for i, r := range results {
		before := st.Pods[ops[i].key].Reason
		m := h.cfg.record(st, ops[i], r, now)
		if m != "" {
			h.m.evictions.WithLabelValues(cl.Name, m).Inc()
		}
		if m == "refused" && st.Pods[ops[i].key].Reason != before {
			// Said once per new refusal, not at every try.
			h.log.Warn("pod's eviction refused; tried again after its backoff", "cluster", cl.Name, "node", ops[i].pod.Spec.NodeName,
				"drain", st.ID, "pod", ops[i].key, "attempts", st.Pods[ops[i].key].Attempts, "err", r.err)
		}
		if r.retriable && rbacRefusal(r.err) {
			// A configuration error, not an outage: the pod is asked again
			// after the cluster's backoff (given up unanswered at its cap).
			call := "eviction"
			if r.deleted {
				call = "delete"
			}
			h.log.Error("pod's "+call+" forbidden; grant the drain's RBAC (deploy/rbac/drain.yaml: create pods/eviction, delete pods)",
				"cluster", cl.Name, "node", ops[i].pod.Spec.NodeName, "drain", st.ID, "pod", ops[i].key, "err", r.err)
		}
		if r.retriable && first == nil {
			first = r.err
		}
	}
	return first
}

// call makes one op's API call: a deletion, or an eviction (answered with
// a deletion when a PDB refuses it and the drain is forced).
func (h *Handler) call(ctx context.Context, cl *clusters.Client, o op, force bool) callResult {
	var r callResult
	if o.delete {
		r.err, r.deleted = h.forceDelete(ctx, cl, o.pod), true
	} else {
		r.blockedBy, r.err = h.evict(ctx, cl, o.pod)
		if r.blockedBy != "" && force {
			r.err, r.deleted, r.blockedBy = h.forceDelete(ctx, cl, o.pod), true, ""
		}
	}
	r.notFound = apierrors.IsNotFound(r.err)
	r.retriable = !r.notFound && !podRefusal(r.err) && clusters.Retriable(r.err)
	return r
}

// podRefusal reports whether err, the answer to a pod's eviction or
// delete, is the apiserver refusing that pod rather than the cluster in
// trouble: the eviction of a pod more than one PDB selects (500 "This pod
// has more than one PodDisruptionBudget, which the eviction subresource
// does not support", k8s.io/kubernetes pkg/registry/core/pod/storage/
// eviction.go), or the request denied by an admission webhook ("admission
// webhook %q denied the request", k8s.io/apiserver
// pkg/admission/plugin/webhook/errors, with the code the webhook chose)
// or a ValidatingAdmissionPolicy ("ValidatingAdmissionPolicy '%s' ...
// denied request"). Such an error counts against the pod
// (Config.record: noted, tried again after the pod's backoff, given up at
// its deadline); it neither fails the step nor backs the cluster off,
// which held every drain on the cluster and never recorded the pod's
// refusal. So are the answers that are the pod's and lasting: a 403 for
// its namespace terminating (NamespaceTerminatingCause), and the Eviction
// API's 403s about the pod's PDB ("DisruptedPods map too big", "pdb
// disruptions allowed is negative"). Everything else stays
// clusters.Retriable's to judge: an unreachable apiserver, a 503, a
// timeout, another 500, an RBAC 403 (rbacRefusal) — and a webhook that
// could not be called ("failed calling webhook"), which may be the whole
// cluster's (an eviction interceptor whose pods are down, or on the node
// drained): taken for the pod's, every pod was given up at its deadline
// and the node rebooted under them. One failing for good is bounded by
// the pod's unanswered cap (Config.unansweredCap).
func podRefusal(err error) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return false
	}
	s := se.Status()
	switch {
	case s.Code == http.StatusInternalServerError && strings.Contains(s.Message, "more than one PodDisruptionBudget"):
		return true
	case strings.Contains(s.Message, "admission webhook ") && strings.Contains(s.Message, " denied the request"):
		return true
	case strings.Contains(s.Message, "ValidatingAdmissionPolicy '") && strings.Contains(s.Message, " denied request"):
		return true
	case s.Code == http.StatusForbidden && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return true
	case s.Code == http.StatusForbidden && s.Details != nil && s.Details.Group == policyv1.GroupName &&
		strings.HasPrefix(s.Details.Kind, "poddisruptionbudget"):
		// k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go,
		// checkAndDecrement: NewForbidden(policy.Resource("poddisruptionbudget"), ...).
		return true
	}
	return false
}

// rbacRefusal reports whether err is a 403 that is not the pod's
// (podRefusal): the drain's RBAC missing a rule.
func rbacRefusal(err error) bool {
	return apierrors.IsForbidden(err) && !podRefusal(err)
}

// evict asks the Eviction API to evict the pod. A refusal under a PDB
// (429 with a DisruptionBudget cause, budgetCause) is not an error: it
// returns the PDB's name. Any other 429 is the apiserver throttling
// (API Priority and Fairness, max-in-flight): the cluster's error,
// retried after its backoff — taken for a PDB's refusal, a forced drain
// answered it with a delete of grace period 0.
//
// The call is made once (MaxRetries(0)): the apiserver answers a PDB it
// has not processed yet (no disruption controller has observed it) with
// 429 and Retry-After: 10, and client-go's typed EvictV1 honours that by
// sleeping and retrying inside the call — up to 10 times, so the call ran
// into kube.timeout and the refusal looked like the cluster failing. The
// drain has its own backoff for refusals (pdb_backoff).
func (h *Handler) evict(ctx context.Context, cl *clusters.Client, p *corev1.Pod) (string, error) {
	// The UID precondition: a pod recreated under the same name since the
	// list (a StatefulSet's, bound elsewhere) is not evicted in its place.
	// The apiserver answers 409 — but a 409 also comes from a PDB's status
	// update conflicting (many evictions against one PDB), a pending pod's
	// resourceVersion or a webhook: it is the pod's refusal (tried again
	// after its backoff), never taken for the pod gone. The next step's
	// list shows a recreated copy under another key (podKey holds the
	// UID), and the entry meant goes gone there.
	uid := p.UID
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}}
	if h.cfg.GracePeriod >= 0 {
		g := int64(h.cfg.GracePeriod / time.Second)
		ev.DeleteOptions.GracePeriodSeconds = &g
	}
	var err error
	if rc, ok := cl.Kube.CoreV1().RESTClient().(*rest.RESTClient); ok && rc != nil {
		err = rc.Post().Namespace(p.Namespace).Resource("pods").Name(p.Name).SubResource("eviction").
			MaxRetries(0).Body(ev).Do(ctx).Error()
	} else {
		// A client without a REST client (client-go's fake): its own call.
		err = cl.Kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, ev)
	}
	if _, ok := budgetCause(err); ok {
		return h.pdbName(ctx, cl, p, err), nil
	}
	if err != nil {
		return "", fmt.Errorf("evict pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return "", nil
}

// budgetCause returns the cause of type DisruptionBudget
// (policyv1.DisruptionBudgetCause) of a 429: the Eviction API's refusal
// under a PDB carries one, whether the PDB allows no disruption or is
// "still being processed" (k8s.io/kubernetes v1.34
// pkg/registry/core/pod/storage/eviction.go, checkAndDecrement and
// createTooManyRequestsError); the apiserver's throttling answers 429
// without it.
func budgetCause(err error) (metav1.StatusCause, bool) {
	var se apierrors.APIStatus
	if !apierrors.IsTooManyRequests(err) || !errors.As(err, &se) || se.Status().Details == nil {
		return metav1.StatusCause{}, false
	}
	for _, c := range se.Status().Details.Causes {
		if c.Type == policyv1.DisruptionBudgetCause {
			return c, true
		}
	}
	return metav1.StatusCause{}, false
}

// pdbName finds the PDB behind a PDB's refusal: the apiserver names it in
// the DisruptionBudget cause ("The disruption budget NAME needs ..."); else
// the first PDB of the namespace whose selector matches the pod.
func (h *Handler) pdbName(ctx context.Context, cl *clusters.Client, p *corev1.Pod, err error) string {
	if c, ok := budgetCause(err); ok {
		if rest, ok := strings.CutPrefix(c.Message, "The disruption budget "); ok {
			if name, _, ok := strings.Cut(rest, " "); ok {
				return name
			}
		}
	}
	l, lerr := cl.Kube.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{})
	if lerr == nil {
		for _, b := range l.Items {
			sel, serr := metav1.LabelSelectorAsSelector(b.Spec.Selector)
			if serr == nil && sel.Matches(labels.Set(p.Labels)) {
				return b.Name
			}
		}
	}
	return "(unknown)"
}

func (h *Handler) forceDelete(ctx context.Context, cl *clusters.Client, p *corev1.Pod) error {
	zero := int64(0)
	uid := p.UID
	err := cl.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if apierrors.IsConflict(err) {
		// The UID changed: the pod we meant is gone.
		return apierrors.NewNotFound(corev1.Resource("pods"), p.Name)
	}
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// writeState writes the drain's annotation and label with a merge patch
// that carries the resourceVersion read, so a concurrent writer makes it
// fail with a conflict (and the step re-read and redo). A state the node
// already holds is not sent, unless check: then the patch goes anyway, a
// compare-and-swap on the node as read (the apiserver checks the
// resourceVersion before it finds nothing to change), before calls that
// node decided.
func (h *Handler) writeState(ctx context.Context, cl *clusters.Client, node *corev1.Node, st *State, check bool) (*corev1.Node, error) {
	enc := st.encode()
	if !check && node.Annotations[AnnotationState] == enc && node.Labels[LabelDrain] == st.Phase {
		return node, nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": node.ResourceVersion,
		"annotations":     map[string]string{AnnotationState: enc},
		"labels":          map[string]string{LabelDrain: st.Phase},
	}})
	out, err := cl.Kube.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "faultline-drain"})
	if err != nil {
		h.nodes.Wrote(cl.Name, node.Name, h.now(), "") // read it live next
		return nil, fmt.Errorf("write drain state of node %s: %w", node.Name, err)
	}
	h.nodes.Wrote(cl.Name, node.Name, h.now(), out.ResourceVersion)
	return out, nil
}

// dryRun lists what a drain would do and changes nothing.
func (h *Handler) dryRun(ctx context.Context, cl *clusters.Client, t trigger) ([]*faultlinev1.Action, error) {
	var pods []corev1.Pod
	if cl != nil && cl.Kube != nil {
		n, err := h.getNode(ctx, cl, t.node)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		if n != nil {
			if pods, err = h.listPods(ctx, cl, t.node); err != nil {
				return nil, err
			}
		}
	}
	o := h.options(t)
	st := &State{ID: pipeline.ActionID(t.cluster, t.node, t.eventID)[:16], Scope: o.scope, Force: o.force, Trigger: o.trig}
	var would []string
	skipped := map[string]int{}
	for i := range pods {
		pl := h.cfg.classify(&pods[i], o.scope, o.force)
		if pl.skip != "" {
			skipped[pl.skip]++
			continue
		}
		would = append(would, pods[i].Namespace+"/"+pods[i].Name+"("+string(pl.mode)+")")
	}
	st.Skipped = skipped
	reason := fmt.Sprintf("would drain %d pods (%s)", len(would), scopeString(o.scope.GPUs))
	if o.skip {
		reason = "drainOverrides.skip: would leave pods running"
	}
	if cl == nil || cl.Kube == nil {
		reason = "cluster has no client (dry-run): pods not listed"
	}
	a := h.action(t, st, events.OutcomeDryRun, reason, pipeline.ActionID(st.ID, "dry_run"))
	a.DryRun = true
	sort.Strings(would)
	if len(would) > 20 {
		would = append(would[:20], fmt.Sprintf("... %d more", len(would)-20))
	}
	a.Details[events.DetailWouldDrain] = strings.Join(would, " ")
	return []*faultlinev1.Action{a}, nil
}

// unaudited says again the actions of the steps of st that the record
// now handled may be the input of: a record not newer than a step (the
// trigger itself, a requeue record due no later than the step ran) may be
// the one whose batch died after the step wrote the state and before its
// actions were produced, and the state cannot tell. A record that step
// produced asks for a time after it, so a drain that was not interrupted
// says nothing twice — unless the step before it failed (its write may
// have been taken with its answer lost): then it says them all, as the
// trigger does. Same ids (and times) as the first time: the store keeps
// one. A joined fault's own trigger says its join again (same id,
// the time of now).
func (h *Handler) unaudited(t trigger, st *State) []*faultlinev1.Action {
	nb := requeue.NotBefore(t.rec)
	if requeue.AfterTrouble(t.rec) {
		// The step before failed: its write may have been taken with
		// its answer lost (the apiserver killed mid-request), what it
		// wrote unsaid. Said as a replay says it (same ids).
		nb = time.Time{}
	}
	var acts []*faultlinev1.Action
	if !nb.After(st.StartedAt) {
		acts = append(acts, h.started(t, st))
	}
	if nb.IsZero() && slices.Contains(st.Trigger.EventIDs, t.eventID) && !startedBy(t, st) {
		// The trigger of a fault that joined the drain: its batch may
		// have died before producing the joined action.
		acts = append(acts, h.joined(t, st))
	}
	for _, at := range blockTimes(st) {
		if !nb.After(at) {
			acts = append(acts, h.blocked(t, st, at)...)
		}
	}
	return acts
}

// joined is the action of a fault that joined the drain in progress (st
// holds it, its scope widened): its id is the drain's and the fault's.
func (h *Handler) joined(t trigger, st *State) *faultlinev1.Action {
	return h.action(t, st, events.OutcomeInProgress, ReasonJoined+" ("+scopeString(st.GPUs)+")", pipeline.ActionID(st.ID, "joined", t.eventID))
}

// ReasonCovered begins the reason of the drain/skipped action of a fault
// that a finished drain covered (State.covers): no drain, and no
// remediation of its own.
const ReasonCovered = "fault covered by the finished drain"

// covered is the action of a fault the node's finished drain covers: the
// fault's own (its event ids and check), naming that drain. It writes
// nothing, so a redelivery decides the same and says the same id.
func (h *Handler) covered(t trigger, st *State, o opts) *faultlinev1.Action {
	after := "this quarantine was decided"
	if st.generatedBefore(o) {
		after = "this fault was generated at " + o.trig.GeneratedAt.UTC().Format(time.RFC3339Nano)
	}
	a := h.action(t, nil, events.OutcomeSkipped, fmt.Sprintf("%s %s (%s at %s, after %s); its remediation serves this fault",
		ReasonCovered, st.ID, st.Phase, st.FinishedAt.UTC().Format(time.RFC3339Nano), after), pipeline.ActionID(st.ID, "covered", t.eventID))
	a.Details[events.DetailDrainID] = st.ID
	a.Details[events.DetailScope] = scopeString(st.GPUs)
	return a
}

// started is the action that starts a drain: its id is the drain's, its
// time the drain's start, its counts zero, as when the drain began.
func (h *Handler) started(t trigger, st *State) *faultlinev1.Action {
	s := *st
	s.Pods, s.Skipped = nil, nil
	a := h.action(t, &s, events.OutcomeInProgress, "drain started ("+scopeString(st.GPUs)+")", pipeline.ActionID(st.ID, "started"))
	a.Timestamp = timestamppb.New(st.StartedAt)
	return a
}

// blocked is the action of the pods a step made at newly found blocked:
// one for the set of PDBs, its id the drain's and those pods' with their
// PDBs, its time the step's (nil when there are none).
func (h *Handler) blocked(t trigger, st *State, at time.Time) []*faultlinev1.Action {
	pdbs, pods := blockedAt(st, at)
	if len(pdbs) == 0 {
		return nil
	}
	a := h.action(t, st, events.OutcomeBlocked, blockedReason(pdbs), pipeline.ActionID(st.ID, "blocked", strings.Join(pods, ",")))
	a.Details[events.DetailBlockedBy] = strings.Join(pdbs, ",")
	a.Timestamp = timestamppb.New(at)
	return []*faultlinev1.Action{a}
}

// result is the action that ends a drain; its id depends only on the drain
// and its phase, so a repeated result is the same record.
func (h *Handler) result(t trigger, st *State) *faultlinev1.Action {
	c := st.Count()
	var reason string
	outcome := st.Phase
	switch st.Phase {
	case PhaseSucceeded:
		reason = fmt.Sprintf("drained: %d pods evicted, %d deleted, %d completed", c.Evicted, c.Deleted, c.Completed)
	case PhaseGaveUp:
		var why []string
		for _, k := range sortedKeys(st.Pods) {
			if p := st.Pods[k]; p.Done == "gave_up" {
				why = append(why, k+": "+p.Reason)
			}
		}
		reason = fmt.Sprintf("gave up on %d pods: %s", c.GaveUp, strings.Join(why, "; "))
	case PhaseCancelled:
		reason = "node no longer quarantined; drain stopped"
	}
	if k := st.skippedTerminating(); len(k) > 0 && st.Phase != PhaseCancelled {
		reason += fmt.Sprintf("; %d stuck terminating, not waited for: %s", len(k), strings.Join(k, ", "))
	}
	return h.action(t, st, outcome, reason, pipeline.ActionID(st.ID, st.Phase))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// action builds an audit record. With st it carries the drain's trigger
// and counts (what remediate reads).
func (h *Handler) action(t trigger, st *State, outcome, reason, id string) *faultlinev1.Action {
	h.m.actions.WithLabelValues(t.cluster, outcome).Inc()
	_, _, ignored := overrides(t.src)
	if ignored != "" {
		reason += " (" + ignored + ")"
	}
	a := &faultlinev1.Action{
		Id: id, Cluster: t.cluster, Node: t.node, Role: Role, Kind: events.KindDrain, Outcome: outcome,
		Reason: events.Truncate(reason, 1024), EventIds: t.src.GetEventIds(), DryRun: t.src.GetDryRun(),
		Timestamp: timestamppb.New(h.now()), Details: map[string]string{},
		CheckName: t.src.GetCheckName(), RecommendedAction: t.src.GetRecommendedAction(),
	}
	// Who sent the event, and what the quarantine already ignored, stay
	// on the audit trail.
	for _, k := range []string{events.DetailEntities, events.DetailCustomAction, events.DetailDrainOverrides,
		events.DetailSubmitterRole, events.DetailSubmitter, events.DetailOverridesIgnored, events.DetailGeneratedAt} {
		if v := t.src.GetDetails()[k]; v != "" {
			a.Details[k] = v
		}
	}
	if ignored != "" {
		// Only honoured overrides travel on (to remediate).
		delete(a.Details, events.DetailDrainOverrides)
		a.Details[events.DetailOverridesIgnored] = ignored
	}
	if !t.nodeCreated.IsZero() {
		a.Details[events.DetailNodeCreated] = t.nodeCreated.UTC().Format(time.RFC3339)
	}
	if st == nil {
		return a
	}
	if len(st.Trigger.EventIDs) > 0 {
		a.EventIds = st.Trigger.EventIDs
	}
	a.CheckName, a.RecommendedAction = st.Trigger.CheckName, st.Trigger.RecommendedAction
	// The state keeps a bounded stand-in of a long entity list; the
	// trigger's own details have it whole.
	// Those of another fault that joined the drain are not the drain's.
	if e := st.Trigger.Entities; events.BoundKey(a.Details[events.DetailEntities], maxTriggerEntities) != e {
		a.Details[events.DetailEntities] = e
		if e == "" {
			delete(a.Details, events.DetailEntities)
		}
	}
	if st.Trigger.CustomAction != "" {
		a.Details[events.DetailCustomAction] = st.Trigger.CustomAction
	}
	// The newest of the drain's faults (a state from before it has none:
	// then remediate does not compare).
	if g := st.Trigger.GeneratedAt; !g.IsZero() {
		a.Details[events.DetailGeneratedAt] = g.UTC().Format(time.RFC3339Nano)
	} else {
		delete(a.Details, events.DetailGeneratedAt)
	}
	a.Details[events.DetailDrainID] = st.ID
	a.Details[events.DetailScope] = scopeString(st.GPUs)
	c := st.Count()
	a.Details[events.DetailInScope] = strconv.Itoa(c.InScope)
	a.Details[events.DetailEvicted] = strconv.Itoa(c.Evicted)
	a.Details[events.DetailDeleted] = strconv.Itoa(c.Deleted)
	a.Details[events.DetailCompleted] = strconv.Itoa(c.Completed)
	a.Details[events.DetailGaveUp] = strconv.Itoa(c.GaveUp)
	a.Details[events.DetailRemaining] = strconv.Itoa(c.Remaining)
	if b := st.blockers(); len(b) > 0 {
		a.Details[events.DetailBlockedBy] = strings.Join(b, ",")
	}
	if len(st.Skipped) > 0 {
		var parts []string
		for _, k := range sortedKeys(st.Skipped) {
			parts = append(parts, k+"="+strconv.Itoa(st.Skipped[k]))
		}
		a.Details[events.DetailSkipped] = strings.Join(parts, ",")
	}
	if k := st.skippedTerminating(); len(k) > 0 {
		if len(k) > 20 {
			k = append(k[:20:20], fmt.Sprintf("... %d more", len(k)-20))
		}
		a.Details[events.DetailSkippedTerminating] = strings.Join(k, ",")
	}
	if st.Force {
		a.Details[events.DetailForce] = "true"
	}
	return a
}

type metrics struct {
	actions   *prometheus.CounterVec
	drains    *prometheus.CounterVec
	evictions *prometheus.CounterVec
	apiErrors *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	slowLane  *prometheus.CounterVec
	// skippedTerminating: pods no longer waited for
	// (Config.SkipWaitForDeleteTimeout).
	skippedTerminating *prometheus.CounterVec
	// staleTriggers: triggers too old to act on (Config.MaxTriggerAge).
	staleTriggers *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		actions:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_actions_total", Help: "Drain actions written, by outcome."}, []string{"cluster", "outcome"}),
		drains:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_drains_total", Help: "Drains started (running) and ended, by phase."}, []string{"cluster", "phase"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_pod_calls_total", Help: "Eviction and delete calls, by result (evicted, blocked, deleted, refused: the pod's own error, a webhook's denial or more than one PDB)."}, []string{"cluster", "result"}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_api_errors_total", Help: "Retriable Kubernetes API errors."}, []string{"cluster"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_conflicts_total", Help: "Drain state writes redone after a resourceVersion conflict."}, []string{"cluster"}),
		slowLane: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_slow_lane_handovers_total",
			Help: "A slow cluster's drains handed to the slow lane (drain.slow_cluster), a count per node and batch (the node's later work in the batch goes with it)."}, []string{"cluster"}),
		skippedTerminating: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_pods_skipped_terminating_total",
			Help: "Pods a drain stopped waiting for: terminating more than skip_wait_for_delete_timeout past their DeletionTimestamp (kubelet not finishing them)."}, []string{"cluster"}),
		staleTriggers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_drain_stale_triggers_total",
			Help: "Quarantines first read longer than drain.max_trigger_age after they were decided (a replay or a long delay): no drain started or joined."}, []string{"cluster"}),
	}
	if reg != nil {
		reg.MustRegister(m.actions, m.drains, m.evictions, m.apiErrors, m.conflicts, m.slowLane, m.skippedTerminating, m.staleTriggers)
	}
	return m
}
