package janitor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/faultline/faultline/internal/warnlimit"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Labels the quarantine and drain roles set on a node (their packages'
// LabelQuarantined and LabelDrain; a role reads another's marks by name,
// never through its package).
const (
	labelQuarantined = events.LabelQuarantined // "true" while quarantined
	labelDrain       = "faultline.io/drain"    // succeeded, gave_up when drained
	// annotationQuarantinedAt is when the node's quarantine began (RFC
	// 3339), annotationDrainState the drain's state (JSON, its finishedAt).
	annotationQuarantinedAt = "faultline.io/quarantined-at"
	annotationDrainState    = "faultline.io/drain-state"
	// annotationEscalated is the remediate role's mark of a node it
	// escalated to CONTACT_SUPPORT: "<RFC 3339> <why>".
	annotationEscalated = "faultline.io/remediation-escalated"
	// annotationCreated is when the remediate role created a resource, by
	// its clock (RFC 3339 with nanoseconds).
	annotationCreated = "faultline.io/created-at"
)

// drainSlack is how far a drain's finish may seem to precede the
// quarantine it drained for: the two times are two processors' clocks.
const drainSlack = time.Minute

// kindRecheckEvery is how often a cluster's kinds whose CRD was not
// installed when its watch started are listed again (awaitCRDs).
const kindRecheckEvery = time.Minute

// pollWarnKeys is how many GPU resets a minute are named in the warning of
// a failed poll (a reset's first, then once a minute); past it one line a
// minute says more failed, so that an outage of many agents (a fleet of
// clusters, each with its max_concurrent resets) stays a few lines.
const pollWarnKeys = 64

// drainMark is what the janitor reads of the node's drain state
// (annotationDrainState, written by the drain role).
type drainMark struct {
	ID         string    `json:"id"`
	FinishedAt time.Time `json:"finishedAt"`
	// GPUs is a partial drain's scope: only the pods using these GPUs
	// were evicted (COMPONENT_RESET). Empty: the whole node.
	GPUs []string `json:"gpus"`
}

// readDrainMark reads the node's drain state; false when it has none or
// it is unreadable.
func readDrainMark(n *corev1.Node) (drainMark, bool) {
	var d drainMark
	v, ok := n.Annotations[annotationDrainState]
	if !ok || json.Unmarshal([]byte(v), &d) != nil {
		return drainMark{}, false
	}
	return d, true
}

// staleDrain says why the node's finished drain is not one of its current
// quarantine ("" when it is, or when either mark has no time): the drain
// label stays after a lift, so a node lifted and quarantined again (by
// another fault, before the drain role started its new drain) still read
// "drained" — and a resource held meanwhile (a slot, the cooldown)
// rebooted the node with the pods scheduled since the lift on it.
func staleDrain(n *corev1.Node) string {
	qat, err := time.Parse(time.RFC3339, n.Annotations[annotationQuarantinedAt])
	if err != nil {
		return ""
	}
	d, ok := readDrainMark(n)
	if !ok || d.FinishedAt.IsZero() {
		return ""
	}
	if !qat.After(d.FinishedAt.Add(drainSlack)) {
		return ""
	}
	return fmt.Sprintf("its drain %s finished at %s, before its quarantine began at %s (the node was lifted and quarantined again since)",
		d.ID, d.FinishedAt.UTC().Format(time.RFC3339), qat.UTC().Format(time.RFC3339))
}

// partialDrain says why the node's drain does not make way for an
// operation on the whole node ("" when it does): a COMPONENT_RESET drain
// evicts only the pods of the faulty GPUs, so a reboot or terminate
// after it kills the node's other pods without eviction or their PDBs —
// a RebootNode held (a slot, the cooldown) while its node was lifted and
// quarantined again for a GPU's fault, say.
func partialDrain(n *corev1.Node) string {
	d, ok := readDrainMark(n)
	if !ok || len(d.GPUs) == 0 {
		return ""
	}
	gpus := strings.Join(d.GPUs[:min(len(d.GPUs), 4)], ",")
	if len(d.GPUs) > 4 {
		gpus += fmt.Sprintf(" and %d more", len(d.GPUs)-4)
	}
	return fmt.Sprintf("its drain %s evicted only the pods of GPUs %s (a partial drain, for a GPU reset), not the whole node's", d.ID, gpus)
}

// Janitor carries out the janitor resources of every configured cluster.
type Janitor struct {
	cfg       Config
	reg       *clusters.Registry
	log       *slog.Logger
	now       func() time.Time
	providers map[string]Provider
	prod      pipeline.Producer
	emitTry   time.Duration // bound of one try to produce an action
	lim       *limiter
	m         *metrics
	// pollWarned spaces the warning of a running GPU reset's failed
	// polls: each reset's first, then at most once a minute.
	pollWarned *warnlimit.Limit
	leaseID    string // this process on the clusters' Leases (leader.go)
	// refusedAt: when the broker last refused an action (unix
	// nanoseconds; 0 once one is produced again); emit tries briefly and
	// resay waits, for resayAfter from it.
	refusedAt  atomic.Int64
	resayAfter time.Duration
	// kindRecheck: how often a cluster's kinds whose CRD was not
	// installed when its watch started are listed again (kindRecheckEvery;
	// tests shorten it).
	kindRecheck time.Duration

	mu      sync.Mutex
	mem     map[types.UID]memory // by resource UID; forgotten when it is deleted
	running map[string]*clusterRun
}

// memory is what this process did to a resource that its watch's copy may
// not show yet, or that is written once.
type memory struct {
	signalSent bool // this process sent its signal
	ended      bool // this process wrote its end
	dryRun     bool // its dry-run action was written
	deferred   bool // its deferred action was written
	forced     bool // this process recorded its forced reboot, or wrote the forced reboot's resumed action
	// offChecked: when this process last asked whether the machine of a
	// reboot whose node stays down is off (offCheckEvery).
	offChecked time.Time
	// failReason and failMsg: the provider refused the signal this process
	// sent; written failed again should the first write have failed.
	failReason, failMsg string
	// maybeSentMsg: the signal this process sent went out unanswered
	// (ErrMaybeSent); written SignalSent=True/MaybeSent again should the
	// first write have failed.
	maybeSentMsg string
	// unsent: the records (of a signal, of a forced reboot) this process
	// wrote whose write answered an error — a timeout, a cut connection,
	// after which the apiserver may have stored it — and whose signal it
	// did not send (takeUnsent).
	unsent []unsentRecord
}

// unsentRecord is a record whose write's answer was lost, with what its
// signal needs when it is found stored.
type unsentRecord struct {
	cluster string
	state   string // opState.encode
	nodeKey string // the node's own key that picked its provider (Config.providerName)
	why     string // a forced reboot's: what the graceful one did not do
}

// keepUnsent remembers r, whose write answered an error, as a record of
// this process's that it did not send.
func (j *Janitor) keepUnsent(uid types.UID, r unsentRecord) {
	j.remember(uid, func(m *memory) { m.unsent = append(slices.Clone(m.unsent), r) })
}

// isUnsent is whether st is a record this process wrote and did not send.
func (j *Janitor) isUnsent(uid types.UID, st *opState) bool {
	_, ok := j.unsentOf(uid, st, false)
	return ok
}

// takeUnsent is isUnsent, and forgets st: whoever takes it sends its
// signal, once. A record this process did not write (another janitor's,
// or its own before a restart) is never one: it may have been sent.
func (j *Janitor) takeUnsent(uid types.UID, st *opState) (unsentRecord, bool) {
	return j.unsentOf(uid, st, true)
}

func (j *Janitor) unsentOf(uid types.UID, st *opState, take bool) (unsentRecord, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	m := j.mem[uid]
	if st == nil {
		return unsentRecord{}, false
	}
	enc := st.encode()
	for i, r := range m.unsent {
		if r.state == enc {
			if take {
				m.unsent = slices.Delete(slices.Clone(m.unsent), i, i+1)
				j.mem[uid] = m
			}
			return r, true
		}
	}
	return unsentRecord{}, false
}

// dropUnsent forgets the cluster's unsent records when its watch stops
// (the Lease lost): the next watch may come much later, its node lifted
// since; such a record is then taken as maybe sent (Recorded), as after
// a restart.
func (j *Janitor) dropUnsent(cluster string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for uid, m := range j.mem {
		if len(m.unsent) == 0 {
			continue
		}
		m.unsent = slices.DeleteFunc(slices.Clone(m.unsent), func(r unsentRecord) bool { return r.cluster == cluster })
		j.mem[uid] = m
	}
}

// recall is what this process remembers of a resource.
func (j *Janitor) recall(uid types.UID) memory {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.mem[uid]
}

// remember applies set to what this process remembers of a resource and
// returns what it remembered before.
func (j *Janitor) remember(uid types.UID, set func(*memory)) memory {
	j.mu.Lock()
	defer j.mu.Unlock()
	before := j.mem[uid]
	m := before
	set(&m)
	j.mem[uid] = m
	return before
}

// Options are a Janitor's collaborators.
type Options struct {
	Log        *slog.Logger
	Now        func() time.Time
	Registerer prometheus.Registerer
	// Providers by name; Open builds redfish, aws and local from the
	// config. Tests install their own.
	Providers map[string]Provider
	// Producer gets the audit actions (the actions topic). nil: actions
	// are only logged.
	Producer pipeline.Producer
}

// New returns a janitor for the clusters of kube.
func New(cfg Config, kube clusters.Config, reg *clusters.Registry, opts Options) (*Janitor, error) {
	if err := cfg.Validate("janitor."); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if reg == nil {
		reg = clusters.NewRegistry(kube, opts.Now).WithLog(opts.Log)
	}
	if cfg.HungAfter > 0 && cfg.HungAfter >= cfg.RebootTimeout {
		// Not refused: a reboot_timeout lowered before hung_after existed
		// would stop the janitor at an upgrade.
		opts.Log.Warn("janitor: hung_after is not below reboot_timeout: a reboot whose machine hung in shutdown times out before it is forced; lower hung_after, or set it to 0 (never)",
			"hung_after", cfg.HungAfter, "reboot_timeout", cfg.RebootTimeout)
	}
	if cfg.ForceAfter > 0 && cfg.ForceAfter >= cfg.RebootTimeout {
		// Not refused either: a configuration that worked (its forced
		// reboot never needed) would stop the janitor.
		opts.Log.Warn("janitor: force_after is not below reboot_timeout: a reboot the graceful signal did not take down times out before it is forced; lower force_after, or set it to 0 (never)",
			"force_after", cfg.ForceAfter, "reboot_timeout", cfg.RebootTimeout)
	}
	return &Janitor{
		cfg: cfg, reg: reg, log: opts.Log.With("role", Role), now: opts.Now,
		providers: opts.Providers, prod: opts.Producer, emitTry: emitTry, resayAfter: resayAfter, kindRecheck: kindRecheckEvery,
		lim:        newLimiter(cfg.MaxConcurrent, cfg.MaxConcurrentPerRack, cfg.MaxConcurrentPerProvider),
		pollWarned: warnlimit.New(time.Minute, pollWarnKeys),
		m:          newMetrics(opts.Registerer), leaseID: leaseIdentity(cfg.Identity), mem: map[types.UID]memory{}, running: map[string]*clusterRun{},
	}, nil
}

// Run watches the named clusters until ctx ends; each cluster runs on its
// own (one that is down never stalls another), while this janitor holds
// its Lease (lead), and is retried while it cannot be reached.
func (j *Janitor) Run(ctx context.Context, names []string) error {
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				err := j.lead(ctx, name)
				if ctx.Err() != nil {
					return
				}
				j.log.Warn("janitor: cluster watch stopped; retrying", "cluster", name, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
				}
			}
		}()
	}
	wg.Wait()
	<-ctx.Done() // no clusters: the role still runs until it is stopped
	return nil
}

// qkey is one resource in a cluster's queue.
type qkey struct{ kind, name string }

// clusterRun is one cluster's watch and queue.
type clusterRun struct {
	name  string
	cl    *clusters.Client
	nodes cache.Indexer
	res   map[string]cache.Indexer // by kind name
	q     workqueue.TypedRateLimitingInterface[qkey]

	// claims: the node whose cooldown a resource's signal started, by node
	// name, until the cooldown passes (operation.claimNode).
	claimMu sync.Mutex
	claims  map[string]nodeClaim
}

// nodeClaim is the resource that claimed a node, and when.
type nodeClaim struct {
	uid types.UID
	at  time.Time
}

const nodeIndex = "node"

func indexByNode(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	n, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	if n == "" {
		return nil, nil
	}
	return []string{n}, nil
}

// runCluster watches one cluster's nodes and janitor resources and works
// its queue until ctx ends. A kind whose CRD is installed after the watch
// started restarts it (watchCluster), with the Lease kept.
func (j *Janitor) runCluster(ctx context.Context, name string) error {
	cl, err := j.reg.Get(name)
	if err != nil {
		return err
	}
	// Exported from the start (at 0), so an alert on their increase sees
	// the first signal that follows a node's own key.
	for _, k := range []string{AnnotationProvider, AnnotationBMC} {
		j.m.nodeNamed.WithLabelValues(name, k)
	}
	if cl.Kube == nil {
		j.log.Info("janitor: cluster has no kubeconfig (dry-run); nothing to watch", "cluster", name)
		<-ctx.Done()
		return nil
	}
	if cl.Dynamic == nil {
		return fmt.Errorf("cluster %q: no dynamic client", name)
	}
	// Not at a restart for a new kind: no other janitor worked the
	// cluster in between.
	defer j.dropUnsent(name)
	for {
		restart, err := j.watchCluster(ctx, name, cl)
		if !restart || ctx.Err() != nil {
			return err
		}
	}
}

// watchCluster is one watch of the cluster (runCluster), until ctx ends
// (restart false) or a kind left out for want of its CRD can be listed
// (restart true: awaitCRDs), once its workers have stopped.
func (j *Janitor) watchCluster(ctx context.Context, name string, cl *clusters.Client) (restart bool, err error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cr := &clusterRun{name: name, cl: cl, res: map[string]cache.Indexer{},
		q: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[qkey](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[qkey]{Name: "janitor-" + name})}
	defer cr.q.ShutDown()

	// Exported from the start (at 0): 1 once the kind is watched.
	for _, k := range kinds {
		j.m.kindWatched.WithLabelValues(name, k.Name).Set(0)
	}
	defer func() {
		for _, k := range kinds {
			j.m.kindWatched.WithLabelValues(name, k.Name).Set(0)
		}
	}()
	nf, ninf := nodeWatch(cl.WatchKube)
	df := dynamicinformer.NewDynamicSharedInformerFactory(cl.WatchDynamic, 0)
	var (
		syncs   []cache.InformerSynced
		missing []kind
	)
	for _, k := range kinds {
		// A kind whose CRD is not installed is left out (its informer
		// would never sync), and listed again until it is (awaitCRDs).
		if _, err := cl.Dynamic.Resource(k.GVR).List(cctx, metav1.ListOptions{Limit: 1}); err != nil {
			if apierrors.IsNotFound(err) {
				j.log.Warn("janitor: CRD not installed; kind not watched until it is (listed again every minute)", "cluster", name, "kind", k.Name)
				missing = append(missing, k)
				continue
			}
			return false, fmt.Errorf("list %s: %w", k.GVR.Resource, err)
		}
		inf := df.ForResource(k.GVR).Informer()
		if err := inf.AddIndexers(cache.Indexers{nodeIndex: indexByNode}); err != nil {
			return false, err
		}
		kn := k.Name
		enq := func(obj any) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				cr.q.Add(qkey{kn, u.GetName()})
			}
		}
		gone := func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if u, ok := o.(*unstructured.Unstructured); ok {
				j.forget(u.GetUID())
				enq(u) // its reconcile releases its limiter slot
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enq, UpdateFunc: func(_, o any) { enq(o) }, DeleteFunc: gone}); err != nil {
			return false, err
		}
		cr.res[kn] = inf.GetIndexer()
		syncs = append(syncs, inf.HasSynced)
	}
	if _, err := ninf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, o any) { cr.enqueueNode(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			cr.enqueueNode(o)
		},
	}); err != nil {
		return false, err
	}
	cr.nodes = ninf.GetIndexer()
	syncs = append(syncs, ninf.HasSynced)
	nf.Start(cctx.Done())
	df.Start(cctx.Done())
	if !cache.WaitForCacheSync(cctx.Done(), syncs...) {
		return false, ctx.Err()
	}
	j.mu.Lock()
	j.running[name] = cr
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		delete(j.running, name)
		j.mu.Unlock()
	}()
	// The cluster's slots are given back when its watch stops (run after
	// its workers have stopped): a resource deleted until the next watch
	// would hold its slot for ever, as no reconcile of this watch frees it.
	defer j.lim.releaseCluster(name)
	// Operations in progress (a janitor restarted mid-operation, or one
	// that works the cluster again) hold their slots before any new one
	// starts.
	for kn, idx := range cr.res {
		for _, o := range idx.List() {
			u := o.(*unstructured.Unstructured)
			if st := stateOf(u); st != nil && !finished(u) {
				nn, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
				n, err := cr.findNode(cctx, nn)
				if err != nil {
					return false, err
				}
				j.lim.acquire(cr.resKey(kn, u.GetName()), name, j.rack(n, nn), st.Provider, true)
			}
		}
	}
	for kn := range cr.res {
		j.m.kindWatched.WithLabelValues(name, kn).Set(1)
	}
	j.log.Info("janitor: watching", "cluster", name, "kinds", len(cr.res))
	// The workers run on ctx, not cctx: a restart for a CRD installed
	// meanwhile (awaitCRDs) lets a step in flight finish — a signal cut
	// there was recorded, never sent, and followed as if sent.
	var wg sync.WaitGroup
	for range j.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j.work(ctx, cr) {
			}
		}()
	}
	var found atomic.Bool
	if len(missing) > 0 {
		go func() {
			if j.awaitCRDs(cctx, cl, name, missing) {
				found.Store(true)
				cancel()
			}
		}()
	}
	<-cctx.Done()
	cr.q.ShutDown()
	wg.Wait()
	return found.Load() && ctx.Err() == nil, nil
}

// awaitCRDs lists the kinds left out of the cluster's watch for want of
// their CRD (missing) every kindRecheck, until one can be listed (true:
// its CRD is installed, and the watch is restarted with it) or ctx ends
// (false). Before, such a kind was left out for the watch's life — a CRD
// installed after the janitor started (a central janitor upgraded before
// its member clusters got the new CRD) was never watched, and its
// resources waited, unseen, until the janitor was restarted.
func (j *Janitor) awaitCRDs(ctx context.Context, cl *clusters.Client, name string, missing []kind) bool {
	t := time.NewTicker(j.kindRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		for _, k := range missing {
			// NotFound: still not installed; any other error: asked again
			// at the next tick.
			if _, err := cl.Dynamic.Resource(k.GVR).List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
				j.log.Info("janitor: CRD installed; restarting the cluster's watch with its kind", "cluster", name, "kind", k.Name)
				return true
			}
		}
	}
}

func (cr *clusterRun) enqueueNode(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return
	}
	for kn, idx := range cr.res {
		objs, _ := idx.ByIndex(nodeIndex, n.Name)
		for _, obj := range objs {
			if u, ok := obj.(*unstructured.Unstructured); ok && !finished(u) {
				cr.q.Add(qkey{kn, u.GetName()})
			}
		}
	}
}

// nodeWatch is the janitor's watch of a cluster's nodes, keeping of each
// what the janitor reads (nodeCopy).
func nodeWatch(kc kubernetes.Interface) (informers.SharedInformerFactory, cache.SharedIndexInformer) {
	nf := informers.NewSharedInformerFactory(kc, 0)
	ninf := nf.Core().V1().Nodes().Informer()
	_ = ninf.SetTransform(nodeCopy)
	return nf, ninf
}

// nodeCopy is what the node watch keeps of a node: its metadata but the
// managedFields, its spec (providerID), and of its status the conditions
// (Ready), the addresses (the local provider's InternalIP) and the node
// info (boot ID, system UUID), labels and annotations interned. A
// kubelet's images, capacity and volumes, most of a GPU node's size, are
// dropped: the janitor is one replica watching every node of every
// cluster.
func nodeCopy(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	c := &corev1.Node{ObjectMeta: n.ObjectMeta, Spec: n.Spec,
		Status: corev1.NodeStatus{Conditions: n.Status.Conditions, Addresses: n.Status.Addresses, NodeInfo: n.Status.NodeInfo}}
	c.ManagedFields = nil
	c.Labels, c.Annotations = clusters.Interned(n.Labels), clusters.Interned(n.Annotations)
	return c, nil
}

func (cr *clusterRun) resKey(kind, name string) string { return cr.name + "/" + kind + "/" + name }

// findNode is node name as the watch has it, or, when the watch's copy
// lacks it, as the API server has it: a node created just before a
// resource for it may not have reached the watch yet (CI saw a
// TerminateNode fail NodeNotFound for a node that existed). nil: the API
// server has no such node.
func (cr *clusterRun) findNode(ctx context.Context, name string) (*corev1.Node, error) {
	if o, ok, _ := cr.nodes.GetByKey(name); ok {
		return o.(*corev1.Node), nil
	}
	if name == "" {
		return nil, nil
	}
	return cr.readNode(ctx, name)
}

// readNode is node name as the API server has it; nil: no such node.
func (cr *clusterRun) readNode(ctx context.Context, name string) (*corev1.Node, error) {
	n, err := cr.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read node %s: %w", name, err)
	}
	return n, nil
}

// work handles one queue item; false when the queue is shut down.
func (j *Janitor) work(ctx context.Context, cr *clusterRun) bool {
	k, quit := cr.q.Get()
	if quit {
		return false
	}
	defer cr.q.Done(k)
	again, err := func() (again time.Duration, err error) {
		// A panic is this resource's failed step (retried with backoff),
		// not the end of every cluster's janitor.
		defer func() {
			if p := recover(); p != nil {
				err = pipeline.Panic(p)
			}
		}()
		return j.reconcile(ctx, cr, k)
	}()
	switch {
	case err != nil && ctx.Err() == nil:
		j.m.apiErrors.WithLabelValues(cr.name).Inc()
		j.log.Warn("janitor: step failed; retrying", "cluster", cr.name, "kind", k.kind, "name", k.name, "err", err)
		cr.q.AddRateLimited(k)
	case again > 0:
		cr.q.Forget(k)
		cr.q.AddAfter(k, again)
	default:
		cr.q.Forget(k)
	}
	return true
}

func kindByName(name string) kind {
	for _, k := range kinds {
		if k.Name == name {
			return k
		}
	}
	return kind{}
}

// rack is node n's rack label ("node:<name>" without one, or without n).
func (j *Janitor) rack(n *corev1.Node, name string) string {
	if n != nil {
		if r := n.Labels[j.cfg.RackLabel]; r != "" {
			return r
		}
	}
	return "node:" + name
}

// forget drops what this process remembers of a deleted resource (the
// remediate role prunes finished ones), so a long-running janitor's memory
// follows the resources that exist.
func (j *Janitor) forget(uid types.UID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.mem, uid)
}

// reconcile takes one resource a step further. It returns when to look
// again (0: only on its or its node's next change).
func (j *Janitor) reconcile(ctx context.Context, cr *clusterRun, k qkey) (time.Duration, error) {
	idx := cr.res[k.kind]
	key := cr.resKey(k.kind, k.name)
	o, ok, _ := idx.GetByKey(k.name)
	if !ok {
		j.lim.release(key)
		return 0, nil
	}
	u := o.(*unstructured.Unstructured)
	op := &operation{j: j, cr: cr, kd: kindByName(k.kind), u: u, key: key}
	op.nodeName, _, _ = unstructured.NestedString(u.Object, "spec", "nodeName")
	// The actions kept on the resource first (finished or not), in order.
	again := op.resay(ctx)
	if finished(op.u) || j.recall(u.GetUID()).ended {
		j.lim.release(key)
		return again, nil
	}
	op.force, _, _ = unstructured.NestedBool(u.Object, "spec", "force")
	var (
		wait time.Duration
		err  error
	)
	op.st = stateOf(op.u)
	switch {
	case cr.cl.DryRun:
		op.dryRun(ctx)
	case op.st != nil:
		wait, err = op.follow(ctx)
	default:
		wait, err = op.start(ctx)
	}
	if again > 0 && (wait == 0 || again < wait) {
		wait = again
	}
	return wait, err
}

// emitTry bounds the try to produce an action (the producer retries
// within it): it outlasts a broker's restart, and a worker blocked longer
// would stop following the reboots in progress (their timeouts, the
// forced reboot). An action not produced by then is kept on its resource.
// While the broker refused one within resayAfter, a try is bounded by
// emitTryRefused instead: a Kafka outage costs each worker one to three
// seconds per action, not 30, and an action produced again means the broker
// is back. (A try ends up to a retry backoff of the client after its bound:
// see actionsProducer.)
const (
	emitTry        = 30 * time.Second
	emitTryRefused = time.Second
)

// emit produces an action to the actions topic (bounded by emitTry, or
// emitTryRefused while the broker refuses) and reports whether it is done
// with it: false when it could not be produced (operation.emit keeps it on
// its resource and marks the refusal).
func (j *Janitor) emit(ctx context.Context, a *faultlinev1.Action) bool {
	j.log.Info("janitor: action", "cluster", a.Cluster, "node", a.Node, "kind", a.Kind, "outcome", a.Outcome, "reason", a.Reason)
	if j.prod == nil {
		return true
	}
	rec, err := pipeline.ActionRecord(a)
	if err != nil {
		j.log.Error("janitor: action not encoded", "err", err, "id", a.Id)
		return true
	}
	try := j.emitTry
	if j.refusedFor() > 0 {
		try = min(try, emitTryRefused)
	}
	tctx, cancel := context.WithTimeout(ctx, try)
	err = j.prod.ProduceSync(tctx, rec).FirstErr()
	cancel()
	if err != nil {
		j.log.Warn("janitor: action not produced", "err", err, "id", a.Id, "cluster", a.Cluster, "node", a.Node,
			"kind", a.Kind, "outcome", a.Outcome)
		return false
	}
	j.refusedAt.Store(0) // the broker is back: the next emits try for emitTry again
	return true
}

// refusedFor is how much longer the broker's last refusal holds (the
// rest of resayAfter from refusedAt; 0 or less: none holds).
func (j *Janitor) refusedFor() time.Duration {
	return time.Unix(0, j.refusedAt.Load()).Add(j.resayAfter).Sub(j.now())
}

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

type metrics struct {
	actions, started, completed, apiErrors, deferred *prometheus.CounterVec
	auditErrors                                      prometheus.Counter
	signalLatency                                    *prometheus.HistogramVec
	nodeNamed                                        *prometheus.CounterVec
	leader, watchable, kindWatched                   *prometheus.GaugeVec
	maintenancePolls                                 *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		actions:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_actions_total", Help: "Janitor actions written."}, []string{"cluster", "kind", "outcome"}),
		started:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_started_total", Help: "Operations whose signal was sent."}, []string{"cluster", "kind", "provider"}),
		completed:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_completed_total", Help: "Operations ended."}, []string{"cluster", "kind", "outcome"}),
		apiErrors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_step_errors_total", Help: "Steps retried after an error."}, []string{"cluster"}),
		deferred:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_deferred_total", Help: "Operations that waited for a limit or cooldown."}, []string{"cluster"}),
		auditErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "faultline_janitor_audit_errors_total", Help: "Actions lost: neither produced nor kept on their resource."}),
		signalLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faultline_janitor_signal_seconds", Help: "Resource created to SignalSent.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"cluster"}),
		nodeNamed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_node_named_total",
			Help: "Signals sent that followed a key of the node's own (its kubelet may write it): its provider's or its BMC's annotation."}, []string{"cluster", "key"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_janitor_leader",
			Help: "1 while this janitor works the cluster (it holds the cluster's Lease, or leader election is off), 0 while another does or none can (a dry-run cluster without a kubeconfig: faultline_janitor_cluster_watchable 0)."}, []string{"cluster"}),
		watchable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_janitor_cluster_watchable",
			Help: "1 when this janitor has a client for the cluster (a kubeconfig), which it works while it holds the cluster's Lease; 0 for a dry-run cluster without a kubeconfig, which it has nothing to watch for (faultline_janitor_leader 0)."}, []string{"cluster"}),
		kindWatched: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_janitor_kind_watched",
			Help: "1 while this janitor watches the kind's resources (RebootNode, TerminateNode, GPUReset) in the cluster; 0 while its watch leaves the kind out, its CRD not installed there when the watch started (listed again every minute, watched once it is), and once this janitor stopped working the cluster."}, []string{"cluster", "kind"}),
		maintenancePolls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_janitor_maintenance_polls_total",
			Help: "Polls of EC2's scheduled events by the janitor that works janitor.aws.maintenance_cluster: ok, or failed (a region's read, the maintenance state's read or write, or the produce; tried again at the next poll)."}, []string{"outcome"}),
	}
	// Exported from the start (at 0), so that an alert sees the first failure.
	for _, o := range []string{"ok", "failed"} {
		m.maintenancePolls.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.actions, m.started, m.completed, m.apiErrors, m.deferred, m.auditErrors, m.signalLatency, m.nodeNamed, m.leader, m.watchable, m.kindWatched, m.maintenancePolls)
	}
	return m
}
