package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/processors/clusters"
)

// The circuit breaker's state lives in one ConfigMap per cluster, in the
// cluster itself (BreakerConfig.Namespace/Name), so that every replica of
// every processor shares it and it survives restarts:
//
//	data:
//	  state:    "closed" | "open"
//	  cordons:  JSON [{"node":"n1","at":"RFC3339","record":...}...]
//	            (faultline's new quarantines within the window, one per
//	            node, with the record each was reserved for)
//	  openedAt, reason: when and why it opened
//	  openedBy: JSON {"record":..., "count":n, ...}  (the record whose
//	            reservation opened it, with the figures it reported)
//	  closedBy: the record whose reservation closed it after its window
//
// Every new quarantine first reserves a slot in `cordons` with an update
// guarded by resourceVersion (a conflict re-reads and re-decides), so two
// replicas can never both take the last slot. Within one process the
// reservations of a cluster are serialized, and the ConfigMap is read from
// a watch of it (breakerWatch; a GET while the watch has not synced), so a
// reservation costs one request: its write.
//
// An operator closes an open breaker by setting data.state to "closed" (or
// deleting the ConfigMap): the next reservation drops the window's cordons
// with openedAt, so the next fault starts a fresh window; with AutoClose
// it closes by itself once Window has passed since it opened. A held
// verdict is never made on the watch's copy alone (it writes nothing, so
// no conflict would correct a stale copy): an open copy is read live. Events held while it was open are not replayed:
// they were recorded as held_by_breaker actions and their offsets committed.
//
// A transition is reported by the record whose reservation made it
// (breakerVerdict.Opened, Closed). That record is handed out again when
// its replica dies between the write and its batch's produce (or the
// batch fails and is redone, on another replica): its reservation then
// finds openedBy or closedBy naming it and reports the transition again,
// with the figures first reported — the same action id, so the audit
// record is never lost and the store keeps one.

// Breaker ConfigMap keys and states.
const (
	breakerKeyState    = "state"
	breakerKeyCordons  = "cordons"
	breakerKeyOpenedAt = "openedAt"
	breakerKeyReason   = "reason"
	breakerKeyOpenedBy = "openedBy"
	breakerKeyClosedBy = "closedBy"
	breakerOpen        = "open"
	breakerClosed      = "closed"
)

// errBreakerNamespace: the breaker's ConfigMap cannot be created, its
// namespace missing in the cluster.
var errBreakerNamespace = errors.New("breaker namespace missing")

// maxConflictPause caps the random pause before a reservation's write is
// tried again after another replica's write won (breaker.decide).
const maxConflictPause = 100 * time.Millisecond

// breaker is one cluster's circuit breaker.
type breaker struct {
	cfg  BreakerConfig
	kube kubernetes.Interface
	now  func() time.Time

	qmu   sync.Mutex
	queue []*reservation

	// watch is the ConfigMap's watch (nil: none; read it from the API);
	// listed returns the cluster's nodes a selector matches from the node
	// watch (false until it has synced; nil: none).
	watch  *breakerWatch
	listed func(labels.Selector) ([]*corev1.Node, bool)

	mu sync.Mutex // held by the one deciding a group
	// cm is the copy this replica last read from the API or wrote (nil:
	// none): without a watch it is reused for a second; with one, a write
	// is used until the watch delivers it (recentWrite at most).
	cm   *corev1.ConfigMap
	cmAt time.Time
	// live: read the next copy from the API (a write met a newer one,
	// which the watch may not have delivered yet).
	live    bool
	nodes   nodeCounts
	nodesAt time.Time
	// cordonSeen: by node, when a count last showed it unschedulable
	// (kept for the window): a reservation made before that is in the
	// count, and no longer pending once the node is schedulable again
	// (lifted). Under mu.
	cordonSeen map[string]time.Time

	// shownOpen: this replica's faultline_quarantine_breaker_open says
	// open (refreshGauges looks again).
	shownOpen atomic.Bool

	// log, cluster and unmatched say when GPUNodeSelector matches no node
	// of the cluster (nil: nothing said); unmatchedSaid: when the warning
	// was last logged (zero: it matches nodes). Under mu.
	log           *slog.Logger
	cluster       string
	unmatched     func(bool)
	unmatchedSaid time.Time
}

// unmatchedEvery is how often the warning that GPUNodeSelector matches no
// node of a cluster is logged again while it lasts.
const unmatchedEvery = time.Hour

type nodeCounts struct {
	total, schedulable int
	// all: GPUNodeSelector matched no node, so every node is counted.
	all bool
	// open are the nodes counted schedulable.
	open map[string]struct{}
}

// pending reports whether the count does not show e's cordon: its node is
// counted schedulable, and no count showed it unschedulable since e was
// reserved (its patch in flight, deferred to the retry topic, or refused).
func (b *breaker) pending(e cordonEntry) bool {
	_, open := b.nodes.open[e.Node]
	return open && b.cordonSeen[e.Node].Before(e.At)
}

type cordonEntry struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
	// Record is the record the slot was reserved for (by recordID): the
	// same record asking again is the same quarantine; another is a new
	// one of a node lifted since. Empty in entries written before it was
	// kept: any record counts as the same.
	Record string `json:"record,omitempty"`
}

// again reports whether record asking for e's node is e's reservation
// asked again (its patch met a conflict and the decision was redone, or
// it was deferred to the retry topic), not a new quarantine of the node.
func (e cordonEntry) again(record string) bool {
	return e.Record == "" || e.Record == record
}

// breakerVerdict is the result of a reservation.
type breakerVerdict struct {
	// Allowed: the node may be quarantined.
	Allowed bool
	// Open: the breaker is open after this reservation (a node that
	// already holds a slot is allowed while it is open).
	Open bool
	// Opened: this reservation's record tripped the breaker (report it).
	Opened bool
	// Closed: this reservation's record found the window over and closed it.
	Closed bool
	// ManualClose: this reservation found the breaker closed by an
	// operator, and dropped the Dropped quarantines of the window that
	// tripped it.
	ManualClose bool
	Dropped     int
	// Reason says why it is open.
	Reason string
	// Count and Limit are the window's quarantines and the cap.
	Count, Limit, Total, Schedulable int
}

// openedBy is what the ConfigMap keeps of the reservation that opened
// the breaker: its record and the figures its verdict reported.
type openedBy struct {
	Record      string `json:"record"`
	Count       int    `json:"count"`
	Limit       int    `json:"limit"`
	Total       int    `json:"total"`
	Schedulable int    `json:"schedulable"`
}

func newBreaker(cfg BreakerConfig, kube kubernetes.Interface, now func() time.Time) *breaker {
	return &breaker{cfg: cfg, kube: kube, now: now}
}

// breakerWatch watches the one ConfigMap of a cluster's breaker (RBAC:
// list and watch limited to its name), and knows whether it has delivered
// this replica's last write.
type breakerWatch struct {
	name   string
	lister corelisters.ConfigMapNamespaceLister
	synced func() bool

	mu sync.Mutex
	// pending is the resourceVersion of this replica's last write, made at
	// pendingAt, until the watch delivers it; seen, the last it delivered.
	pending   string
	pendingAt time.Time
	seen      string
}

// newBreakerWatch starts the watch; it ends when stop is closed.
func newBreakerWatch(cfg BreakerConfig, cl *clusters.Client, log *slog.Logger, stop <-chan struct{}) *breakerWatch {
	f := informers.NewSharedInformerFactoryWithOptions(cl.WatchKube, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.Name).String()
		}))
	inf := f.Core().V1().ConfigMaps()
	w := &breakerWatch{name: cfg.Name, lister: inf.Lister().ConfigMaps(cfg.Namespace), synced: inf.Informer().HasSynced}
	_ = inf.Informer().SetWatchErrorHandler(clusters.WatchErrorLogger(log.With("cluster", cl.Name), "breaker configmap"))
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.delivered,
		UpdateFunc: func(_, obj any) { w.delivered(obj) },
	})
	f.Start(stop)
	return w
}

func (w *breakerWatch) delivered(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = cm.ResourceVersion
	if w.pending == cm.ResourceVersion {
		w.pending = ""
	}
}

// wrote notes this replica's write, which produced rv.
func (w *breakerWatch) wrote(rv string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen != rv {
		w.pending, w.pendingAt = rv, now
	}
}

// get returns the watch's copy (nil: there is none) once it has synced
// and delivered this replica's last write (or recentWrite has passed
// since it); false: not yet.
func (w *breakerWatch) get(now time.Time) (*corev1.ConfigMap, bool) {
	w.mu.Lock()
	pending := w.pending != "" && now.Sub(w.pendingAt) < recentWrite
	w.mu.Unlock()
	if pending || !w.synced() {
		return nil, false
	}
	cm, err := w.lister.Get(w.name)
	if err != nil {
		return nil, apierrors.IsNotFound(err)
	}
	return cm, true
}

// reservation is one caller's request, decided in a group (see reserve).
type reservation struct {
	node        string
	record      string // the record asking, by recordID
	schedulable bool
	verdict     breakerVerdict
	err         error
	done        chan struct{}
}

// reserve takes a slot for a new quarantine of node, or says why not.
// schedulable says whether the node is schedulable now (cordoning an
// unschedulable node does not lower the healthy count).
//
// Reservations are group-committed: callers queue their request, and
// whoever holds the breaker decides every queued request in order with one
// ConfigMap write, so a burst of simultaneous failures costs a few writes,
// not one serialized write per node.
func (b *breaker) reserve(ctx context.Context, node, record string, schedulable bool) (breakerVerdict, error) {
	if !b.cfg.Enabled {
		return breakerVerdict{Allowed: true}, nil
	}
	req := &reservation{node: node, record: record, schedulable: schedulable, done: make(chan struct{})}
	b.qmu.Lock()
	b.queue = append(b.queue, req)
	b.qmu.Unlock()
	b.mu.Lock()
	select {
	case <-req.done: // a previous holder decided it
	default:
		b.qmu.Lock()
		batch := b.queue
		b.queue = nil
		b.qmu.Unlock()
		b.decide(ctx, batch)
	}
	b.mu.Unlock()
	return req.verdict, req.err
}

// decide settles a group of reservations, retrying conflicts until ctx
// ends. A burst of faults (a fabric incident) has every replica reserving
// at once, each round of writes won by one: a cap on the rounds recorded
// the last replicas' faults as failed quarantines, their offsets
// committed, the nodes never quarantined. Each retry waits a random pause
// (growing to maxConflictPause) to spread the contenders; a ctx that ends
// first is the error, so the fault is tried again later (the batch's
// deadline: deferred to the retry topic).
func (b *breaker) decide(ctx context.Context, batch []*reservation) {
	var err error
	for attempt := 0; ; attempt++ {
		err = b.tryReserve(ctx, batch)
		if err == nil {
			break
		}
		b.cm, b.live = nil, true // re-read it from the API
		// NotFound: an operator deleted the ConfigMap (closing the
		// breaker) since it was read; read again, it is made anew.
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsNotFound(err) {
			err = fmt.Errorf("breaker %s/%s: %w", b.cfg.Namespace, b.cfg.Name, err)
			break
		}
		pause := time.NewTimer(rand.N(min(time.Millisecond<<min(attempt, 10), maxConflictPause)) + time.Millisecond)
		select {
		case <-ctx.Done():
			pause.Stop()
			err = fmt.Errorf("breaker %s/%s: %d writes met another replica's: %w", b.cfg.Namespace, b.cfg.Name, attempt+1, ctx.Err())
		case <-pause.C:
			continue
		}
		break
	}
	for _, r := range batch {
		if err != nil {
			r.verdict, r.err = breakerVerdict{}, err
		}
		close(r.done)
	}
}

func (b *breaker) tryReserve(ctx context.Context, batch []*reservation) error {
	now := b.now()
	cm, err := b.read(ctx, now)
	if err != nil {
		return err
	}
	if cm.Data[breakerKeyState] == breakerOpen && (cm != b.cm || now.Sub(b.cmAt) >= time.Second) {
		// Open in the watch's copy: a held verdict writes nothing, so no
		// conflict would correct a stale copy (the watch failing while an
		// operator closed or deleted the ConfigMap), and the faults it
		// holds are never replayed. Read it live.
		b.live = true
		if cm, err = b.read(ctx, now); err != nil {
			return err
		}
	}
	state, entries, openedAt := parseBreaker(cm)
	opener, closer := parseTransitions(cm)
	manual, dropped := false, 0
	if state == breakerClosed && (cm.Data[breakerKeyOpenedAt] != "" || cm.Data[breakerKeyOpenedBy] != "") {
		// Closed, yet still saying when and why it opened: an operator
		// closed it (its runbook patches data.state alone; a close after
		// the window, and a deletion, leave neither). The quarantines of
		// the window that tripped it go with it: kept, the next new fault
		// found the window as full as when it opened and opened it again,
		// its window starting anew. This write drops them with openedAt.
		manual, dropped, entries = true, len(entries), nil
	}
	// Prune the window.
	kept := entries[:0]
	for _, e := range entries {
		if now.Sub(e.At) < b.cfg.Window {
			kept = append(kept, e)
		}
	}
	entries = kept
	if state == breakerOpen && b.expired(openedAt, now) {
		state, closer = breakerClosed, batch[0].record
	}
	slotOf := func(r *reservation) int {
		return slices.IndexFunc(entries, func(e cordonEntry) bool { return e.Node == r.node })
	}
	if state == breakerOpen {
		for _, r := range batch {
			r.verdict = breakerVerdict{Open: true, Reason: cm.Data[breakerKeyReason], Count: len(entries), Closed: r.record == closer}
			if r.record == opener.Record {
				// Its first report may have been lost: report it again.
				r.verdict = breakerVerdict{Open: true, Opened: true, Closed: r.verdict.Closed, Reason: r.verdict.Reason,
					Count: opener.Count, Limit: opener.Limit, Total: opener.Total, Schedulable: opener.Schedulable}
			}
			// A reservation asked again — its patch met a conflict (the
			// decision is redone) or was deferred to the retry topic — was
			// let through before the breaker opened, and its slot counts
			// toward the limit anyway. Another record for a node holding
			// a slot is a new quarantine of it (lifted since): held.
			i := slotOf(r)
			r.verdict.Allowed = i >= 0 && entries[i].again(r.record)
		}
		return nil
	}
	counts, err := b.counts(ctx, now)
	if err != nil {
		return err
	}
	// Reservations whose cordon the count does not show, made before the
	// count or since, are not in its schedulable nodes. (Counting only
	// those made since it let a node reserved just before a refresh,
	// its cordon not yet written, count as schedulable: the floor was
	// broken by as many.)
	pending := 0
	for _, e := range entries {
		if b.pending(e) {
			pending++
		}
	}
	schedulable := counts.schedulable - pending
	limit := int(math.Floor(float64(counts.total) * b.cfg.MaxPercent / 100))
	if limit < 1 && b.cfg.MaxPercent > 0 {
		limit = 1
	}
	var reason string
	for i, r := range batch {
		v := breakerVerdict{Closed: r.record == closer, Total: counts.total, Limit: limit, ManualClose: i == 0 && manual, Dropped: dropped}
		slot := slotOf(r)
		// A node cordoned, lifted and failing again within the window
		// holds a slot from its first quarantine: this one is new, and
		// lowers the schedulable count again unless the count does not
		// show the first (still pending: subtracted already). The limit
		// counts distinct nodes: its slot stays one.
		lowers := r.schedulable && (slot < 0 || !b.pending(entries[slot]))
		switch {
		case slot >= 0 && entries[slot].again(r.record):
			v.Allowed = true // a retry of a reservation already taken
		case state == breakerOpen:
			v.Reason = reason
		case slot < 0 && len(entries)+1 > limit:
			reason = fmt.Sprintf("%d of %d nodes quarantined within %s reaches the %.4g%% limit (%d)",
				len(entries), counts.total, b.cfg.Window, b.cfg.MaxPercent, limit) + counts.note(b.cfg.GPUNodeSelector)
			state, openedAt, v.Opened, v.Reason = breakerOpen, now, true, reason
		case b.cfg.MinHealthy > 0 && lowers && schedulable-1 < b.cfg.MinHealthy:
			reason = fmt.Sprintf("quarantining would leave %d schedulable nodes, below the floor of %d",
				schedulable-1, b.cfg.MinHealthy) + counts.note(b.cfg.GPUNodeSelector)
			state, openedAt, v.Opened, v.Reason = breakerOpen, now, true, reason
		default:
			v.Allowed = true
			e := cordonEntry{Node: r.node, At: now, Record: r.record}
			if slot >= 0 {
				entries[slot] = e
			} else {
				entries = append(entries, e)
			}
			if lowers {
				schedulable--
			}
		}
		v.Count, v.Schedulable = len(entries), schedulable
		if v.Opened {
			opener = openedBy{Record: r.record, Count: v.Count, Limit: v.Limit, Total: v.Total, Schedulable: v.Schedulable}
		}
		r.verdict = v
	}
	for _, r := range batch {
		r.verdict.Open = state == breakerOpen
	}
	if state == breakerOpen {
		return b.write(ctx, cm, breakerOpen, entries, openedAt, reason, opener, closer)
	}
	return b.write(ctx, cm, breakerClosed, entries, time.Time{}, "", openedBy{}, closer)
}

// expired: an open breaker opened at openedAt closes by itself now (the
// next reservation closes it).
func (b *breaker) expired(openedAt, now time.Time) bool {
	return b.cfg.AutoClose && !openedAt.IsZero() && now.Sub(openedAt) >= b.cfg.Window
}

// isOpen reads whether the breaker holds new quarantines now, as its
// ConfigMap says (closed by an operator, or expired: not).
func (b *breaker) isOpen(ctx context.Context) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	cm, err := b.read(ctx, now)
	if err != nil {
		return false, err
	}
	state, _, openedAt := parseBreaker(cm)
	return state == breakerOpen && !b.expired(openedAt, now), nil
}

// read returns the ConfigMap; a missing one is an empty, closed breaker.
// It is the watch's copy, unless the watch has not delivered this
// replica's last write yet (then that write's copy, for recentWrite at
// most); without a synced watch, or after a conflict, it is read from the
// API (and reused for a second). A stale copy costs a conflict, never a
// wrong decision: every write is guarded by the resourceVersion read.
func (b *breaker) read(ctx context.Context, now time.Time) (*corev1.ConfigMap, error) {
	if b.watch != nil && !b.live {
		if w, ok := b.watch.get(now); ok {
			b.cm = nil
			if w == nil {
				return b.empty(), nil
			}
			return w, nil
		}
		if b.cm != nil && now.Sub(b.cmAt) < recentWrite {
			return b.cm, nil
		}
	}
	if b.cm != nil && !b.live && now.Sub(b.cmAt) < time.Second {
		return b.cm, nil
	}
	cm, err := b.kube.CoreV1().ConfigMaps(b.cfg.Namespace).Get(ctx, b.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = b.empty()
	} else if err != nil {
		return nil, err
	}
	b.cm, b.cmAt, b.live = cm, now, false
	return cm, nil
}

// empty is the breaker's ConfigMap before its first write.
func (b *breaker) empty() *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: b.cfg.Namespace, Name: b.cfg.Name,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline"}}}
}

// write stores the breaker's state; opener names the reservation that
// opened it (kept while it is open), closer the last that closed it.
func (b *breaker) write(ctx context.Context, cm *corev1.ConfigMap, state string, entries []cordonEntry, openedAt time.Time, reason string,
	opener openedBy, closer string) error {
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	raw, _ := json.Marshal(entries)
	cm.Data[breakerKeyState] = state
	cm.Data[breakerKeyCordons] = string(raw)
	if state == breakerOpen {
		if !openedAt.IsZero() {
			cm.Data[breakerKeyOpenedAt] = openedAt.UTC().Format(time.RFC3339Nano)
			cm.Data[breakerKeyReason] = reason
		}
		if opener.Record != "" {
			raw, _ := json.Marshal(opener)
			cm.Data[breakerKeyOpenedBy] = string(raw)
		}
	} else {
		delete(cm.Data, breakerKeyOpenedAt)
		delete(cm.Data, breakerKeyReason)
		delete(cm.Data, breakerKeyOpenedBy)
	}
	if closer != "" {
		cm.Data[breakerKeyClosedBy] = closer
	}
	var (
		out *corev1.ConfigMap
		err error
	)
	cms := b.kube.CoreV1().ConfigMaps(b.cfg.Namespace)
	if cm.ResourceVersion == "" {
		out, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsNotFound(err) {
			// Its namespace is missing: a configuration error an
			// operator fixes, as a Forbidden one — not an API status, so
			// clusters.Retriable holds the cluster's work for it instead
			// of recording a failed quarantine.
			return fmt.Errorf("%w: quarantine.breaker.namespace %q does not exist in the cluster: %v", errBreakerNamespace, b.cfg.Namespace, err)
		}
	} else {
		out, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	b.cm, b.cmAt = out, b.now()
	if b.watch != nil {
		b.watch.wrote(out.ResourceVersion, b.cmAt)
	}
	return nil
}

func parseBreaker(cm *corev1.ConfigMap) (state string, entries []cordonEntry, openedAt time.Time) {
	state = cm.Data[breakerKeyState]
	if state != breakerOpen {
		state = breakerClosed
	}
	_ = json.Unmarshal([]byte(cm.Data[breakerKeyCordons]), &entries)
	openedAt, _ = time.Parse(time.RFC3339Nano, cm.Data[breakerKeyOpenedAt])
	return state, entries, openedAt
}

// parseTransitions returns the reservations that last opened and closed
// the breaker (zero where none is recorded).
func parseTransitions(cm *corev1.ConfigMap) (opener openedBy, closer string) {
	_ = json.Unmarshal([]byte(cm.Data[breakerKeyOpenedBy]), &opener)
	return opener, cm.Data[breakerKeyClosedBy]
}

// note is what a breaker's reason adds when the counts are of every node
// because GPUNodeSelector matched none.
func (c nodeCounts) note(selector string) string {
	if !c.all {
		return ""
	}
	return fmt.Sprintf(" (quarantine.breaker.gpu_node_selector %q matched no node; counting all %d nodes)", selector, c.total)
}

// counts returns the cluster's GPU node count and how many are schedulable,
// from the node watch (else a list served by the apiserver's watch cache),
// cached for BreakerConfig.NodeCountTTL, and notes the nodes it shows
// unschedulable (cordonSeen). A GPUNodeSelector that matches no node of
// the cluster (a typo, GPU nodes labelled otherwise) counts every node,
// as without one, and says so (sayUnmatched): counted as 0 GPU nodes, the
// limit was 1 and the second quarantine of a window opened the breaker
// (with min_healthy, the first), every later fault held for good.
func (b *breaker) counts(ctx context.Context, now time.Time) (nodeCounts, error) {
	if !b.nodesAt.IsZero() && now.Sub(b.nodesAt) < b.cfg.NodeCountTTL {
		return b.nodes, nil
	}
	sel, err := labels.Parse(b.cfg.GPUNodeSelector)
	if err != nil {
		return nodeCounts{}, fmt.Errorf("quarantine.breaker.gpu_node_selector: %w", err)
	}
	nodes, err := b.list(ctx, sel)
	if err != nil {
		return nodeCounts{}, err
	}
	all := len(nodes) == 0 && !sel.Empty()
	if all {
		if nodes, err = b.list(ctx, labels.Everything()); err != nil {
			return nodeCounts{}, err
		}
	}
	b.sayUnmatched(all, len(nodes), now)
	c := nodeCounts{total: len(nodes), all: all, open: make(map[string]struct{}, len(nodes))}
	if b.cordonSeen == nil {
		b.cordonSeen = map[string]time.Time{}
	}
	for _, n := range nodes {
		if n.Spec.Unschedulable {
			b.cordonSeen[n.Name] = now
			continue
		}
		c.schedulable++
		c.open[n.Name] = struct{}{}
	}
	for node, at := range b.cordonSeen {
		if now.Sub(at) >= b.cfg.Window {
			delete(b.cordonSeen, node) // older than every reservation kept
		}
	}
	b.nodes, b.nodesAt = c, now
	return c, nil
}

// list returns the cluster's nodes sel matches, from the node watch (else
// a list served by the apiserver's watch cache).
func (b *breaker) list(ctx context.Context, sel labels.Selector) ([]*corev1.Node, error) {
	if b.listed != nil {
		if nodes, ok := b.listed(sel); ok {
			return nodes, nil
		}
	}
	list, err := b.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel.String(), ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	nodes := make([]*corev1.Node, 0, len(list.Items))
	for i := range list.Items {
		nodes = append(nodes, &list.Items[i])
	}
	return nodes, nil
}

// sayUnmatched logs, when GPUNodeSelector matches no node of the cluster,
// a warning naming the key, the selector and the cluster (when it starts,
// then every unmatchedEvery while it lasts), and sets the cluster's
// faultline_quarantine_breaker_selector_unmatched.
func (b *breaker) sayUnmatched(all bool, total int, now time.Time) {
	if b.unmatched != nil {
		b.unmatched(all)
	}
	if !all {
		b.unmatchedSaid = time.Time{}
		return
	}
	if b.log == nil || (!b.unmatchedSaid.IsZero() && now.Sub(b.unmatchedSaid) < unmatchedEvery) {
		return
	}
	b.unmatchedSaid = now
	b.log.Warn("quarantine.breaker.gpu_node_selector matched no node of the cluster; the circuit breaker counts all its nodes (fix the selector or label the GPU nodes)",
		"cluster", b.cluster, "selector", b.cfg.GPUNodeSelector, "nodes", total)
}

// checkSelector counts the cluster's nodes once, so that a GPUNodeSelector
// matching none is said at start-up rather than at the first fault.
func (b *breaker) checkSelector(ctx context.Context) error {
	if b.cfg.GPUNodeSelector == "" {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	_, err := b.counts(ctx, b.now())
	return err
}

func itoa(n int) string { return strconv.Itoa(n) }
