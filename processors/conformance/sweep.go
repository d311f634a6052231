package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	agentconf "github.com/faultline/faultline/agents/conformance"
	"github.com/faultline/faultline/internal/clickhouse"
	ic "github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// State is the role's record of a drift, kept on the node
// (AnnotationState) so any replica continues where another stopped.
type State struct {
	// Since is when the drift was first seen (drift_remediation_timeout
	// counts from it; a change of the drifted fingerprint keeps it).
	Since time.Time `json:"since"`
	// Group is the conformance group (GroupValue) the node drifted from.
	Group    string `json:"group"`
	Expected string `json:"expected"`
	Actual   string `json:"actual"`
	// Sensitive: the node was sensitive when it drifted.
	Sensitive bool `json:"sensitive,omitempty"`
	// Drained: the sensitive-drift fatal event was sent.
	Drained bool `json:"drained,omitempty"`
	// Escalated: the timeout's fatal event was sent.
	Escalated bool `json:"escalated,omitempty"`
	// Awaiting: conforms again, waits for AnnotationApproved.
	Awaiting bool `json:"awaitingApproval,omitempty"`
	// Restoring: conforms again, the taint and label are gone; the state
	// stays until the notifier delivered the return to conformance (a
	// restart re-sends it).
	Restoring bool `json:"restoring,omitempty"`
	// Resumed counts the times the node drifted again while it awaited
	// approval (the same drift): each is a drift action of its own.
	Resumed int `json:"resumed,omitempty"`
}

// Output is what one sweep produces.
type Output struct {
	Actions []*faultlinev1.Action
	Events  []*datamodels.HealthEvent

	// sendErr is the sweep's first refused send (sendFirst): the sweep's
	// other nodes are left for the next sweep at once, not each after
	// its own wait on a broker that is down.
	sendErr error
}

// Sweeper evaluates each cluster's conformance groups and responds to
// drift on the cluster's nodes.
type Sweeper struct {
	cfg   Config
	conn  clickhouse.Conn
	reg   *clusters.Registry
	log   *slog.Logger
	now   func() time.Time
	queue *Queue // nil: no notifier
	// send produces a node's derived events and actions before the state
	// that says they were sent is written (SendWith); nil: they join the
	// sweep's Output.
	send func(ctx context.Context, o Output) error

	// dry is the state of nodes of clusters the role cannot change
	// (dry-run, or no kubeconfig), by cluster and node, so each decision
	// is recorded once. A sweep forgets the nodes it no longer sees.
	mu  sync.Mutex
	dry map[string]map[string]State
	// restored: the cluster's dry-run state was read back from ClickHouse
	// (restoreDry), once per process.
	restored map[string]bool
	// notices: the notification last queued for each cluster/node and
	// whether it was delivered. A live node's state whose notification is
	// not here (the process restarted) or failed is notified again.
	notices map[string]notice
}

type notice struct {
	key       string // Notification.Key
	delivered bool
	failed    time.Time // when it last failed: queued again renotifyAfter later
}

// renotifyAfter spaces the tries of a notification that failed (every
// attempt, or a full queue), so that a long notifier outage writes one
// failed conformance_notify action per node every 10 minutes, not every
// sweep.
const renotifyAfter = 10 * time.Minute

// NewSweeper returns the sweeper (cfg validated).
func NewSweeper(cfg Config, conn clickhouse.Conn, reg *clusters.Registry, log *slog.Logger, now func() time.Time, queue *Queue) *Sweeper {
	if now == nil {
		now = time.Now
	}
	s := &Sweeper{cfg: cfg, conn: conn, reg: reg, log: log, now: now, queue: queue, dry: map[string]map[string]State{}, restored: map[string]bool{}, notices: map[string]notice{}}
	if queue != nil {
		done := queue.done
		queue.done = func(n Notification, attempts int, err error) { s.settled(n, err); done(n, attempts, err) }
	}
	return s
}

// SendWith makes the sweep produce each live node's derived events and
// actions through send before it writes the node's state: the state says
// they were sent (Drained, Escalated, or the step itself), so an event or
// action lost after the write — the process killed before the sweep's
// output was produced, or restarted while Kafka was down — would never be
// sent again: the node never quarantined, the step never audited. A send
// that fails leaves the node for the next sweep, which decides the same
// step with the same ids (a repeat is harmless). Call it before the first
// Sweep.
func (s *Sweeper) SendWith(send func(ctx context.Context, o Output) error) {
	s.send = send
}

// sendFirst sends o (SendWith), or adds it to out.
func (s *Sweeper) sendFirst(ctx context.Context, o Output, out *Output) error {
	if s.send == nil {
		out.Actions = append(out.Actions, o.Actions...)
		out.Events = append(out.Events, o.Events...)
		return nil
	}
	if len(o.Actions)+len(o.Events) == 0 {
		return nil
	}
	if out.sendErr != nil {
		return fmt.Errorf("left for the next sweep: an earlier send of this sweep was not produced: %w", out.sendErr)
	}
	if err := s.send(ctx, o); err != nil {
		out.sendErr = err
		return fmt.Errorf("produce %d derived event(s) and %d action(s) before the node's state: %w", len(o.Events), len(o.Actions), err)
	}
	return nil
}

// settled records a notification's result: delivered, or failed (queued
// again by a sweep renotifyAfter later).
func (s *Sweeper) settled(n Notification, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := n.Cluster + "/" + n.Node
	if s.notices[k].key != n.Key {
		return // superseded
	}
	if err != nil {
		s.notices[k] = notice{key: n.Key, failed: s.now()}
		return
	}
	s.notices[k] = notice{key: n.Key, delivered: true}
}

// GroupValue is the label and taint value naming a pool's group: the pool,
// or "cluster" for the nodes without a pool. A group's hardware identity is
// not in it (no label value can hold it): the node's own hardware labels
// tell it.
func GroupValue(pool string) string {
	if pool == "" {
		return "cluster"
	}
	return pool
}

type member struct {
	node      *corev1.Node // nil without a cluster client
	name      string
	group     group
	sensitive bool
}

// group is a conformance group of a cluster: the nodes of a pool with one
// hardware identity (the values of hardware_labels they carry).
type group struct {
	pool string
	// hardware is "label=value,…" of the hardware labels the nodes carry,
	// in the configured order; "" without any.
	hardware string
	// incomplete: the nodes lack a hardware label that another node of
	// the pool carries (GPU Feature Discovery's labels not written yet on
	// a new node, its pod down): their hardware is not known, so they are
	// judged against nobody (Undecided), not a group of their own that is
	// its own majority.
	incomplete bool
}

// tally is what a group's fresh reports say, beyond each node's verdict.
type tally struct {
	members  int            // the group's nodes
	complete int            // those with a fresh complete report
	partial  int            // those with a fresh partial report
	agree    map[string]int // fresh complete reports by fingerprint
}

func tallyOf(in []ic.Member) tally {
	t := tally{members: len(in), agree: map[string]int{}}
	for _, m := range in {
		switch {
		case m.Report == nil:
		case m.Report.Partial:
			t.partial++
		default:
			t.complete++
			t.agree[m.Report.Fingerprint]++
		}
	}
	return t
}

// tooFewReports: an undecided group would have a strict majority if its
// nodes without a fresh complete report (silent, or partial) held its
// most common fingerprint; a tie of nodes all reporting complete, or a
// split they could not end, is not for want of reports.
func (t tally) tooFewReports() bool {
	top := 0
	for _, c := range t.agree {
		top = max(top, c)
	}
	return t.complete < t.members && 2*(top+t.members-t.complete) > t.members
}

// undecided is the verdicts of a group judged against nobody.
func undecided(in []ic.Member) []ic.Verdict {
	out := make([]ic.Verdict, len(in))
	for i, m := range in {
		out[i] = ic.Verdict{Node: m.Node, State: ic.StateUnknown, Actual: ic.Unknown}
		if m.Report != nil {
			out[i].State, out[i].Actual = ic.Undecided, m.Report.Fingerprint
		}
	}
	return out
}

// key names the group in actions and events: groupKey, then the hardware
// identity in braces when there is one ("prod-a/h100{nvidia.com/gpu.product=…}").
func (g group) key(cluster string) string {
	k := groupKey(cluster, g.pool)
	if g.hardware != "" {
		k += "{" + g.hardware + "}"
	}
	return k
}

// labelGPUProduct is GPU Feature Discovery's GPU model label.
const labelGPUProduct = "nvidia.com/gpu.product"

// hardwareOf is a node's hardware identity: "label=value" of each of
// labels it carries, joined by ",". The value of labelGPUProduct is the
// model alone (gpuProduct).
func hardwareOf(nodeLabels map[string]string, labels []string) string {
	var parts []string
	for _, l := range labels {
		v := nodeLabels[l]
		if l == labelGPUProduct {
			v = gpuProduct(v)
		}
		if v != "" {
			parts = append(parts, l+"="+v)
		}
	}
	return strings.Join(parts, ",")
}

// gpuProduct is the GPU model of an nvidia.com/gpu.product value: GPU
// Feature Discovery appends "-SHARED" on a time-sliced or MPS node and
// "-MIG-<profile>" on a MIG node (single strategy), on the same hardware
// (such a node was a hardware group of one, its own majority: its drift
// was never caught).
func gpuProduct(v string) string {
	for _, suffix := range []string{"-MIG-", "-SHARED"} {
		if i := strings.Index(v, suffix); i > 0 {
			v = v[:i]
		}
	}
	return v
}

// Sweep evaluates one cluster and acts on its drifted and recovered nodes.
// It returns what to produce (actions, derived events); an error is a
// read that failed (ClickHouse, the node list): nothing was decided.
func (s *Sweeper) Sweep(ctx context.Context, cluster string) (Output, error) {
	var out Output
	now := s.now()
	latest, err := ic.Latest(ctx, s.conn, cluster, now.Add(-s.cfg.Staleness), nil)
	if err != nil {
		return out, err
	}
	cl, _ := s.reg.Get(cluster) // unconfigured: nil, decisions only
	if !s.live(cl) {
		if err := s.restoreDry(ctx, cluster); err != nil {
			return out, err
		}
	}
	var members []member
	carried := map[string]map[string]bool{} // pool -> hardware labels some node of it carries
	if cl != nil && cl.Kube != nil {
		list, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return out, fmt.Errorf("conformance: list nodes of %s: %w", cluster, err)
		}
		for i := range list.Items {
			n := &list.Items[i]
			m := member{node: n, name: n.Name}
			if s.cfg.PoolLabel != "" {
				m.group.pool = n.Labels[s.cfg.PoolLabel]
			}
			m.group.hardware = hardwareOf(n.Labels, s.cfg.HardwareLabels)
			m.sensitive = s.cfg.sensKey != "" && n.Labels[s.cfg.sensKey] == s.cfg.sensVal
			members = append(members, m)
		}
		for _, m := range members {
			for _, l := range s.cfg.HardwareLabels {
				if m.node.Labels[l] != "" {
					if carried[m.group.pool] == nil {
						carried[m.group.pool] = map[string]bool{}
					}
					carried[m.group.pool][l] = true
				}
			}
		}
		for i := range members {
			for l := range carried[members[i].group.pool] {
				if members[i].node.Labels[l] == "" {
					members[i].group.incomplete = true
				}
			}
		}
	} else {
		for node := range latest {
			members = append(members, member{name: node})
		}
	}
	groups := map[group][]member{}
	for _, m := range members {
		groups[m.group] = append(groups[m.group], m)
	}
	order := make([]group, 0, len(groups))
	for g := range groups {
		order = append(order, g)
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].pool != order[j].pool {
			return order[i].pool < order[j].pool
		}
		return order[i].hardware < order[j].hardware
	})
	cache := map[string]map[string]string{} // components by fingerprint, for this sweep
	perPool := map[string]int{}
	for _, m := range members {
		perPool[m.group.pool]++
	}
	var alone []string   // hardware groups of one in a pool of more, without a baseline
	var unheard []string // groups undecided for want of fresh complete reports
	for _, g := range order {
		ms := groups[g]
		in := make([]ic.Member, len(ms))
		for i, m := range ms {
			in[i].Node = m.name
			if r, ok := latest[m.name]; ok {
				in[i].Report = &r
			}
		}
		// A pool's baseline applies to each of its hardware groups.
		verdicts := undecided(in)
		if !g.incomplete {
			verdicts = ic.Evaluate(in, s.cfg.baseline[groupKey(cluster, g.pool)])
		} else {
			// Said at every sweep: these nodes are never judged (CPU or
			// system nodes in a pool of GPU nodes, GPU Feature Discovery
			// not run on them) and nothing else tells the operator why.
			var missing []string
			for l := range carried[g.pool] {
				for _, m := range ms {
					if m.node.Labels[l] == "" {
						missing = append(missing, l)
						break
					}
				}
			}
			sort.Strings(missing)
			s.log.Info("conformance: nodes not judged: they lack hardware labels other nodes of their pool carry",
				"cluster", cluster, "group", g.key(cluster), "nodes", len(ms), "missing_labels", strings.Join(missing, ","))
		}
		if len(ms) == 1 && g.hardware != "" && !g.incomplete && perPool[g.pool] > 1 && s.cfg.baseline[groupKey(cluster, g.pool)] == "" {
			alone = append(alone, g.key(cluster))
		}
		t := tallyOf(in)
		if !g.incomplete && len(verdicts) > 0 && verdicts[0].Expected == "" && t.tooFewReports() {
			unheard = append(unheard, fmt.Sprintf("%s (%d/%d complete, %d partial)", g.key(cluster), t.complete, t.members, t.partial))
		}
		for i, v := range verdicts {
			if err := s.reconcile(ctx, cl, cluster, g, t, ms[i], v, now, cache, &out); err != nil {
				s.log.Warn("conformance: node not reconciled", "cluster", cluster, "node", v.Node, "err", err)
			}
		}
	}
	// Once per sweep: a node alone of its hardware in its pool is its own
	// majority, so its drift cannot be seen (another model, or a hardware
	// label value that differs on the same hardware).
	s.logGroups("conformance: hardware groups of one not judged: each node is its own majority", cluster, alone, " ")
	// Once per sweep: a group is judged only when more than half of all
	// its nodes report the same fingerprint fresh and complete; until then
	// its drift is not detected (nodes rebooting, their driver not loaded
	// yet; agents down; nodes running no agent in a pool of nodes that
	// do), and nothing else says so.
	s.logGroups("conformance: groups undecided: too few fresh complete reports for a majority of their nodes, drift not detected", cluster, unheard, "; ")
	s.forgetDry(cluster, members, s.live(cl))
	return out, nil
}

// logGroups logs msg with how many groups of the cluster it concerns and
// the first 10 (nothing when none).
func (s *Sweeper) logGroups(msg, cluster string, groups []string, sep string) {
	if len(groups) == 0 {
		return
	}
	s.log.Info(msg, "cluster", cluster, "groups", len(groups), "first", strings.Join(groups[:min(len(groups), 10)], sep))
}

// forgetDry drops the dry-run state of the cluster's nodes this sweep did
// not see (deleted, or without a report within staleness when the
// cluster has no kubeconfig), and all of it once the cluster is live
// (its state is on the nodes then).
func (s *Sweeper) forgetDry(cluster string, members []member, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		delete(s.dry, cluster)
		delete(s.restored, cluster) // dry-run again later: read back then
		return
	}
	seen := make(map[string]bool, len(members))
	for _, m := range members {
		seen[m.name] = true
	}
	for node := range s.dry[cluster] {
		if !seen[node] {
			delete(s.dry[cluster], node)
		}
	}
}

func (s *Sweeper) live(cl *clusters.Client) bool { return cl != nil && cl.Kube != nil && !cl.DryRun }

// reconcile moves one node toward its verdict's response (t: its group's
// tally).
func (s *Sweeper) reconcile(ctx context.Context, cl *clusters.Client, cluster string, g group, t tally, m member, v ic.Verdict, now time.Time, cache map[string]map[string]string, out *Output) error {
	live := s.live(cl)
	if v.State == ic.Drifted && s.unreadableOnly(ctx, cache, cluster, v) {
		return s.escalateStale(ctx, cl, cluster, g, m, now, "its reports since differ only in unreadable components (partial)", false, out)
	}
	st, has := s.readState(cluster, m, live)
	value := GroupValue(g.pool)
	switch v.State {
	case ic.StateUnknown:
		return s.escalateStale(ctx, cl, cluster, g, m, now, "it stopped reporting (no report within staleness)", true, out)
	case ic.Undecided:
		// No expected fingerprint. With every member reporting complete
		// (a rolling upgrade at a tie) nothing says the node is the one
		// that is wrong: its taint and state stay and it is not escalated
		// (the 4 early-upgraded nodes of a pool of 10 at 5/5 were cordoned
		// and drained for running what half the pool, and soon all of it,
		// ran). A tie that members without a fresh complete report make
		// (3 nodes, one drifted, another gone partial: 1/1) says nothing
		// new of a drifted node: its clock runs on, as if it stopped
		// reporting; left alone it kept its taint (and a sensitive node
		// its drain) for ever.
		if t.complete == t.members {
			return nil
		}
		return s.escalateStale(ctx, cl, cluster, g, m, now, "its group has no expected fingerprint (members without a fresh complete report)", false, out)
	case ic.Drifted:
		if st.Restoring { // drifted again before its return was told: a new drift
			st, has = State{}, false
		}
		// A start in whole seconds, as the actions' driftSince holds it: a
		// dry-run state read back from them (restoreDry) has the start
		// and action ids the sweep had.
		next := State{Since: now.UTC().Truncate(time.Second), Group: value, Expected: v.Expected, Actual: v.Actual, Sensitive: m.sensitive || st.Sensitive}
		if has {
			next.Since, next.Drained, next.Escalated, next.Resumed = st.Since, st.Drained, st.Escalated, st.Resumed
			if st.Awaiting {
				next.Resumed++
			}
		}
		changed := !has || st.Actual != v.Actual || st.Expected != v.Expected || st.Awaiting
		var acts []*faultlinev1.Action
		var evs []*datamodels.HealthEvent
		details := map[string]string{events.DetailConformanceGroup: g.key(cluster), events.DetailBasis: v.Basis,
			events.DetailExpected: v.Expected, events.DetailActual: v.Actual, events.DetailDriftSince: sinceKey(next.Since)}
		if changed {
			// The drift's id holds its start: the same fingerprints again
			// after a return to conformance are another drift (the audit
			// kept one of the two, and a dry-run restart read back the
			// first and its return, the node drifted with no state).
			diff := s.diff(ctx, cache, cluster, v)
			details[events.DetailDiffering] = events.Truncate(strings.Join(diff, "; "), 2000)
			acts = append(acts, s.action(cluster, m.name, events.KindConformanceDrift, outcome(live),
				fmt.Sprintf("drifted from group %s (%s %s): %d components differ", g.key(cluster), v.Basis, short(v.Expected), len(diff)), details, driftKey(next)+v.Actual+v.Expected, !live))
		}
		// Decided at every sweep, not only when the fingerprints change: a
		// node labelled sensitive after it drifted is drained at the next
		// sweep (it waited for the timeout's escalation, up to 4h, and its
		// return then needed no approval).
		if next.Sensitive && !next.Drained {
			next.Drained = true
			evs = append(evs, s.derived(cluster, m.name, CheckDriftSensitive, false, datamodels.RecommendedAction_NONE, next,
				"sensitive node drifted from conformance group "+g.key(cluster)+": drained until it conforms again and is approved ("+AnnotationApproved+")"))
			acts = append(acts, s.action(cluster, m.name, events.KindConformanceDrain, outcome(live),
				"sensitive node: sent down the quarantine path (cordon, taint, drain)", details, sinceKey(next.Since), !live))
		}
		timeout := s.cfg.DriftRemediationTimeout
		if next.Sensitive {
			timeout = s.cfg.SensitiveTimeout
		}
		if !next.Escalated && now.Sub(next.Since) >= timeout {
			next.Escalated = true
			evs = append(evs, s.derived(cluster, m.name, CheckDriftTimeout, false, datamodels.RecommendedAction_CONTACT_SUPPORT, next,
				fmt.Sprintf("still drifted from conformance group %s after %v (since %s): expected %s, actual %s", g.key(cluster), timeout,
					next.Since.UTC().Format(time.RFC3339), short(v.Expected), short(v.Actual))))
			acts = append(acts, s.action(cluster, m.name, events.KindEscalate, outcome(live),
				fmt.Sprintf("drift_remediation_timeout %v passed: fatal event %s", timeout, CheckDriftTimeout), details, sinceKey(next.Since), !live))
		}
		if len(acts) == 0 {
			if live {
				s.notify(cl, m, true, v, next) // unless queued or delivered
			}
			return nil
		}
		if live {
			if err := s.sendFirst(ctx, Output{Actions: acts, Events: evs}, out); err != nil {
				return err
			}
			if err := s.setDrift(ctx, cl.Kube, m.name, next); err != nil {
				return err
			}
			if changed {
				s.kubeEvent(ctx, cl.Kube, m, "ConformanceDrift", acts[0].Reason+": "+details[events.DetailDiffering])
			}
			s.notify(cl, m, true, v, next)
		} else {
			s.setDry(cluster, m.name, &next)
			out.Actions = append(out.Actions, acts...)
		}
	case ic.Conforming:
		if !has {
			return nil
		}
		if st.Restoring {
			if !s.delivered(cl.Name, m.name, notificationKey(false, v, st)) {
				s.notify(cl, m, false, v, st) // unless queued
				return nil
			}
			s.forgetNotice(cl.Name, m.name)
			return s.clearDrift(ctx, cl.Kube, m.name, nil)
		}
		// The group's expectation is firmly the node's fingerprint: the
		// baseline, or the fresh complete reports of a majority of all the
		// group's members (as ic.Evaluate now requires; kept here should a
		// group ever be decided otherwise). A majority of the few that
		// report complete (the drifted node alone, its peers partial after
		// a reboot) is not: it lifted the quarantine of a node that drifted
		// again, with a new start, once its peers read everything again.
		firm := v.Basis == ic.BasisBaseline || 2*t.agree[v.Expected] > t.members
		if st.Escalated && st.Actual == v.Actual && !firm {
			// Escalated with the fingerprint the group now expects, but
			// not firmly: state, taint and quarantine stay until it is
			// firm (then lifted) or the fingerprint changes. Clearing the
			// state here lost the lift for good: a pool of 10 flipping at
			// 5 of 9 complete reports kept the node drained at 6/10.
			return nil
		}
		details := map[string]string{events.DetailConformanceGroup: g.key(cluster), events.DetailBasis: v.Basis,
			events.DetailExpected: v.Expected, events.DetailActual: v.Actual, events.DetailDriftSince: sinceKey(st.Since)}
		var first Output // sent before the state is cleared
		if st.Drained {
			approved := ""
			if m.node != nil {
				approved = m.node.Annotations[AnnotationApproved]
			}
			if len(approved) < 12 || !strings.HasPrefix(v.Actual, approved) {
				if st.Awaiting {
					return nil
				}
				st.Awaiting = true
				a := s.action(cluster, m.name, events.KindConformanceUndrain, events.OutcomeInProgress,
					fmt.Sprintf("conforms again (%s); stays drained until an operator sets %s=<fingerprint>", short(v.Actual), AnnotationApproved), details, driftKey(st)+"awaiting", !live)
				if live {
					if err := s.sendFirst(ctx, Output{Actions: []*faultlinev1.Action{a}}, out); err != nil {
						return err
					}
					return s.setDrift(ctx, cl.Kube, m.name, st)
				}
				s.setDry(cluster, m.name, &st)
				out.Actions = append(out.Actions, a)
				return nil
			}
			if live {
				first.Events = append(first.Events, s.derived(cluster, m.name, CheckDriftSensitive, true, datamodels.RecommendedAction_NONE, st,
					"sensitive node re-verified ("+short(v.Actual)+") and approved: drain lifted"))
			}
			first.Actions = append(first.Actions, s.action(cluster, m.name, events.KindConformanceUndrain, outcome(live),
				"re-verified and approved by "+AnnotationApproved+": quarantine lifted", details, sinceKey(st.Since), !live))
		}
		reason := "conforms again: taint and label removed"
		switch {
		case st.Escalated && st.Actual == v.Actual && firm:
			// Its fingerprint is the one it drifted with: the group's
			// expectation moved to the node (the majority of a rolling
			// upgrade flipped, a baseline was set to it), nothing on it
			// was remediated — it runs the group's configuration. The
			// timeout's quarantine is lifted (the healthy event of its
			// check and node); it stayed, a drained node running exactly
			// what the pool now runs.
			if live {
				first.Events = append(first.Events, s.derived(cluster, m.name, CheckDriftTimeout, true, datamodels.RecommendedAction_NONE, st,
					"group "+g.key(cluster)+" now expects the fingerprint the node was escalated with ("+short(v.Actual)+"): timeout quarantine lifted"))
			}
			reason += "; the group now expects the fingerprint it drifted with: the timeout's quarantine lifted"
		case st.Escalated:
			reason += " (the timeout's quarantine stays until an operator lifts it)"
		}
		first.Actions = append(first.Actions, s.action(cluster, m.name, events.KindConformanceRestored, outcome(live), reason, details, sinceKey(st.Since), !live))
		if !live {
			s.setDry(cluster, m.name, nil)
			out.Actions = append(out.Actions, first.Actions...)
			return nil
		}
		if err := s.sendFirst(ctx, first, out); err != nil {
			return err
		}
		// With a notifier the state stays (Restoring) until the return is
		// delivered; the taint and label go now.
		var restoring *State
		if s.queue != nil {
			st.Restoring = true
			restoring = &st
		}
		if err := s.clearDrift(ctx, cl.Kube, m.name, restoring); err != nil {
			return err
		}
		s.notify(cl, m, false, v, st)
	}
	return nil
}

// escalateStale runs a drifted node's timeout when the sweep cannot judge
// it now (why): its drift clock keeps running from the state's start, and
// past drift_remediation_timeout it is escalated with the last known
// fingerprints. Left alone, a drifted node whose agent stopped reporting
// kept its taint and state forever, never escalated. A node awaiting
// approval is not, unless it stopped reporting (stopped): it was
// remediated and reported the expected fingerprint, and it waits for the
// operator, not for remediation; silent, its approval can never be
// taken (that needs a fresh conforming report).
func (s *Sweeper) escalateStale(ctx context.Context, cl *clusters.Client, cluster string, g group, m member, now time.Time, why string, stopped bool, out *Output) error {
	live := s.live(cl)
	st, has := s.readState(cluster, m, live)
	if !has || st.Restoring || st.Escalated || st.Awaiting && !stopped {
		return nil
	}
	timeout := s.cfg.DriftRemediationTimeout
	if st.Sensitive {
		timeout = s.cfg.SensitiveTimeout
	}
	if now.Sub(st.Since) < timeout {
		return nil
	}
	st.Escalated = true
	details := map[string]string{events.DetailConformanceGroup: g.key(cluster), events.DetailExpected: st.Expected,
		events.DetailActual: st.Actual, events.DetailDriftSince: sinceKey(st.Since)}
	ev := s.derived(cluster, m.name, CheckDriftTimeout, false, datamodels.RecommendedAction_CONTACT_SUPPORT, st,
		fmt.Sprintf("drifted from conformance group %s for %v (since %s), last known expected %s, actual %s; not re-judged: %s",
			g.key(cluster), timeout, st.Since.UTC().Format(time.RFC3339), short(st.Expected), short(st.Actual), why))
	act := s.action(cluster, m.name, events.KindEscalate, outcome(live),
		fmt.Sprintf("drift_remediation_timeout %v passed (%s): fatal event %s", timeout, why, CheckDriftTimeout), details, sinceKey(st.Since), !live)
	if !live {
		s.setDry(cluster, m.name, &st)
		out.Actions = append(out.Actions, act)
		return nil
	}
	if err := s.sendFirst(ctx, Output{Actions: []*faultlinev1.Action{act}, Events: []*datamodels.HealthEvent{ev}}, out); err != nil {
		return err
	}
	return s.setDrift(ctx, cl.Kube, m.name, st)
}

func outcome(live bool) string {
	if live {
		return events.OutcomeApplied
	}
	return events.OutcomeDryRun
}

func short(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

func (s *Sweeper) readState(cluster string, m member, live bool) (State, bool) {
	if !live || m.node == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		st, ok := s.dry[cluster][m.name]
		return st, ok
	}
	raw, ok := m.node.Annotations[AnnotationState]
	if !ok {
		return State{}, false
	}
	var st State
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		s.log.Warn("conformance: unreadable state annotation; starting over", "node", m.name, "err", err)
		return State{}, false
	}
	return st, true
}

func (s *Sweeper) setDry(cluster, node string, st *State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == nil {
		delete(s.dry[cluster], node)
		return
	}
	if s.dry[cluster] == nil {
		s.dry[cluster] = map[string]State{}
	}
	s.dry[cluster][node] = *st
}

// diff names the components that differ between the group's expected
// fingerprint and the node's (from any node's report of each).
func (s *Sweeper) diff(ctx context.Context, cache map[string]map[string]string, cluster string, v ic.Verdict) []string {
	exp, err := s.components(ctx, cache, cluster, v.Expected)
	if err != nil || len(exp) == 0 {
		return []string{"components of the expected fingerprint unknown (no node of " + cluster + " reported it)"}
	}
	act, err := s.components(ctx, cache, cluster, v.Actual)
	if err != nil {
		return []string{"components unknown: " + err.Error()}
	}
	return ic.Diff(exp, act)
}

// components are a fingerprint's, read once a sweep (cache).
func (s *Sweeper) components(ctx context.Context, cache map[string]map[string]string, cluster, fp string) (map[string]string, error) {
	if c, ok := cache[fp]; ok {
		return c, nil
	}
	c, err := ic.ComponentsOf(ctx, s.conn, cluster, fp)
	if err == nil {
		cache[fp] = c
	}
	return c, err
}

// unreadableOnly: every component in which a drifted node differs from
// its expected fingerprint could not be read on it ("unreadable: …") — a
// driver not loaded yet after a reboot, a BMC tool that timed out. That
// is no evidence of drift: the node is left as it is (as without a fresh
// report) until a report that reads them; it was tainted, and a sensitive
// one drained, on that one report.
func (s *Sweeper) unreadableOnly(ctx context.Context, cache map[string]map[string]string, cluster string, v ic.Verdict) bool {
	exp, err := s.components(ctx, cache, cluster, v.Expected)
	if err != nil || len(exp) == 0 {
		return false
	}
	act, err := s.components(ctx, cache, cluster, v.Actual)
	if err != nil {
		return false
	}
	differ := 0
	for name, a := range act {
		if e, ok := exp[name]; ok && e == a {
			continue
		}
		if !strings.HasPrefix(a, agentconf.Unreadable) {
			return false
		}
		differ++
	}
	for name := range exp {
		if _, ok := act[name]; !ok {
			return false // a component the node no longer reports
		}
	}
	return differ > 0
}

func (s *Sweeper) updateNode(ctx context.Context, kube kubernetes.Interface, name string, mutate func(n *corev1.Node) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !mutate(n) {
			return nil
		}
		_, err = kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// setDrift sets the PreferNoSchedule taint, the group label and the state.
func (s *Sweeper) setDrift(ctx context.Context, kube kubernetes.Interface, name string, st State) error {
	raw, _ := json.Marshal(st)
	return s.updateNode(ctx, kube, name, func(n *corev1.Node) bool {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Labels[LabelGroup] = st.Group
		n.Annotations[AnnotationState] = string(raw)
		taint := corev1.Taint{Key: TaintDrift, Value: st.Group, Effect: corev1.TaintEffectPreferNoSchedule}
		found := false
		for i, t := range n.Spec.Taints {
			if t.Key == TaintDrift {
				n.Spec.Taints[i], found = taint, true
			}
		}
		if !found {
			n.Spec.Taints = append(n.Spec.Taints, taint)
		}
		return true
	})
}

// clearDrift removes what setDrift set, and the approval (a later drift
// needs a new one); with restoring set, the state annotation is written
// as it instead of removed.
func (s *Sweeper) clearDrift(ctx context.Context, kube kubernetes.Interface, name string, restoring *State) error {
	raw, _ := json.Marshal(restoring)
	return s.updateNode(ctx, kube, name, func(n *corev1.Node) bool {
		delete(n.Labels, LabelGroup)
		delete(n.Annotations, AnnotationState)
		delete(n.Annotations, AnnotationApproved)
		if restoring != nil {
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[AnnotationState] = string(raw)
		}
		var keep []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != TaintDrift {
				keep = append(keep, t)
			}
		}
		n.Spec.Taints = keep
		return true
	})
}

// kubeEvent records a Warning Event on the node (best effort).
func (s *Sweeper) kubeEvent(ctx context.Context, kube kubernetes.Interface, m member, reason, msg string) {
	now := metav1.NewTime(s.now())
	ref := corev1.ObjectReference{Kind: "Node", Name: m.name, APIVersion: "v1"}
	if m.node != nil {
		ref.UID = m.node.UID
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.conformance.%d", m.name, s.now().UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: ref, Reason: reason, Message: events.Truncate(msg, 1024), Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "faultline-conformance"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := kube.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.log.Warn("conformance: node event not recorded", "node", m.name, "err", err)
	}
}

// notificationKey identifies a notification: the drift (its start), its
// direction and the fingerprint.
func notificationKey(drifted bool, v ic.Verdict, st State) string {
	return sinceKey(st.Since) + fmt.Sprint(drifted) + v.Actual
}

// sinceKey is a drift's start in the keys of its notifications and action
// ids: the same for the start as decided and as read back (the annotation's
// JSON, on any replica). Its String() was not: time.Now's monotonic reading
// ("m=+…") is not written, and the zone's name is the reader's.
func sinceKey(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

// driftKey is the start of a drift and its resumptions (Resumed), in the
// ids of the steps it may take again: a drift and an approval awaited.
func driftKey(st State) string {
	if st.Resumed == 0 {
		return sinceKey(st.Since)
	}
	return fmt.Sprintf("%s+%d", sinceKey(st.Since), st.Resumed)
}

// delivered says whether the node's notification key was delivered.
func (s *Sweeper) delivered(cluster, node, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.notices[cluster+"/"+node]
	return n.key == key && n.delivered
}

func (s *Sweeper) forgetNotice(cluster, node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.notices, cluster+"/"+node)
}

// notify queues the node's notification unless it is queued or delivered
// already.
func (s *Sweeper) notify(cl *clusters.Client, m member, drifted bool, v ic.Verdict, st State) {
	if s.queue == nil {
		return
	}
	key := notificationKey(drifted, v, st)
	s.mu.Lock()
	if last := s.notices[cl.Name+"/"+m.name]; last.key == key && (last.failed.IsZero() || s.now().Sub(last.failed) < renotifyAfter) {
		s.mu.Unlock()
		return // queued, delivered, or failed a short while ago
	}
	s.notices[cl.Name+"/"+m.name] = notice{key: key}
	s.mu.Unlock()
	xname := m.name
	if m.node != nil && s.cfg.Notifier.XnameLabel != "" {
		if x := m.node.Labels[s.cfg.Notifier.XnameLabel]; x != "" {
			xname = x
		}
	}
	n := Notification{Cluster: cl.Name, Node: m.name, Xname: xname, Drifted: drifted, Expected: v.Expected, Actual: v.Actual, Key: key}
	if !s.queue.Enqueue(n) {
		s.queue.done(n, 0, fmt.Errorf("notifier queue full (%d waiting)", s.cfg.Notifier.Queue))
	}
}

// action is one audit Action of the role.
func (s *Sweeper) action(cluster, node, kind, outcome, reason string, details map[string]string, key string, dry bool) *faultlinev1.Action {
	d := make(map[string]string, len(details))
	for k, v := range details {
		d[k] = v
	}
	return &faultlinev1.Action{
		Id: pipeline.ActionID(cluster, node, Role, kind, key), Cluster: cluster, Node: node, Role: Role, Kind: kind,
		Outcome: outcome, Reason: events.Truncate(reason, 1024), DryRun: dry, Timestamp: timestamppb.New(s.now()),
		Details: d, CheckName: agentconf.CheckName,
	}
}

// derived is a HealthEvent of the role for the quarantine path.
func (s *Sweeper) derived(cluster, node, check string, healthy bool, action datamodels.RecommendedAction, st State, msg string) *datamodels.HealthEvent {
	now := timestamppb.New(s.now())
	pol := "fault"
	if healthy {
		pol = "recovery"
	}
	return &datamodels.HealthEvent{
		Version: 1, Id: events.HashID(Role, cluster, node, check, sinceKey(st.Since), pol),
		Agent: Agent, ComponentClass: agentconf.ComponentClass, CheckName: check,
		IsFatal: !healthy, IsHealthy: healthy, Message: events.Truncate(msg, 1024), RecommendedAction: action,
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: node}},
		GeneratedTimestamp: now, ReceivedTimestamp: now, Cluster: cluster, NodeName: node, DerivedBy: Role,
		Submitter: &datamodels.Submitter{Name: Role, Role: datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE},
		Metadata: map[string]string{events.DetailExpected: st.Expected, events.DetailActual: st.Actual,
			events.DetailConformanceGroup: st.Group, events.DetailDriftSince: sinceKey(st.Since)},
	}
}
