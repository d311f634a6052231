package janitor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

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
)

// drainSlack is how far a drain's finish may seem to precede the
// quarantine it drained for: the two times are two processors' clocks.
const drainSlack = time.Minute

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
	var d struct {
		ID         string    `json:"id"`
		FinishedAt time.Time `json:"finishedAt"`
	}
	if json.Unmarshal([]byte(n.Annotations[annotationDrainState]), &d) != nil || d.FinishedAt.IsZero() {
		return ""
	}
	if !qat.After(d.FinishedAt.Add(drainSlack)) {
		return ""
	}
	return fmt.Sprintf("its drain %s finished at %s, before its quarantine began at %s (the node was lifted and quarantined again since)",
		d.ID, d.FinishedAt.UTC().Format(time.RFC3339), qat.UTC().Format(time.RFC3339))
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
	leaseID   string // this process on the clusters' Leases (leader.go)
	// refusedAt: when the broker last refused an action (unix
	// nanoseconds; 0 once one is produced again); emit tries briefly and
	// resay waits, for resayAfter from it.
	refusedAt  atomic.Int64
	resayAfter time.Duration

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
		reg = clusters.NewRegistry(kube, opts.Now)
	}
	if cfg.HungAfter > 0 && cfg.HungAfter >= cfg.RebootTimeout {
		// Not refused: a reboot_timeout lowered before hung_after existed
		// would stop the janitor at an upgrade.
		opts.Log.Warn("janitor: hung_after is not below reboot_timeout: a reboot whose machine hung in shutdown times out before it is forced; lower hung_after, or set it to 0 (never)",
			"hung_after", cfg.HungAfter, "reboot_timeout", cfg.RebootTimeout)
	}
	return &Janitor{
		cfg: cfg, reg: reg, log: opts.Log.With("role", Role), now: opts.Now,
		providers: opts.Providers, prod: opts.Producer, emitTry: emitTry, resayAfter: resayAfter,
		lim: newLimiter(cfg.MaxConcurrent, cfg.MaxConcurrentPerRack, cfg.MaxConcurrentPerProvider),
		m:   newMetrics(opts.Registerer), leaseID: leaseIdentity(cfg.Identity), mem: map[types.UID]memory{}, running: map[string]*clusterRun{},
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
// its queue until ctx ends.
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
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cr := &clusterRun{name: name, cl: cl, res: map[string]cache.Indexer{},
		q: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[qkey](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[qkey]{Name: "janitor-" + name})}
	defer cr.q.ShutDown()

	nf, ninf := nodeWatch(cl.WatchKube)
	df := dynamicinformer.NewDynamicSharedInformerFactory(cl.WatchDynamic, 0)
	var syncs []cache.InformerSynced
	for _, k := range kinds {
		// A kind whose CRD is not installed is left out (its informer
		// would never sync).
		if _, err := cl.Dynamic.Resource(k.GVR).List(cctx, metav1.ListOptions{Limit: 1}); err != nil {
			if apierrors.IsNotFound(err) {
				j.log.Warn("janitor: CRD not installed; kind not watched", "cluster", name, "kind", k.Name)
				continue
			}
			return fmt.Errorf("list %s: %w", k.GVR.Resource, err)
		}
		inf := df.ForResource(k.GVR).Informer()
		if err := inf.AddIndexers(cache.Indexers{nodeIndex: indexByNode}); err != nil {
			return err
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
			return err
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
		return err
	}
	cr.nodes = ninf.GetIndexer()
	syncs = append(syncs, ninf.HasSynced)
	nf.Start(cctx.Done())
	df.Start(cctx.Done())
	if !cache.WaitForCacheSync(cctx.Done(), syncs...) {
		return ctx.Err()
	}
	j.mu.Lock()
	j.running[name] = cr
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		delete(j.running, name)
		j.mu.Unlock()
	}()
	// Operations in progress (a janitor restarted mid-operation) hold
	// their slots before any new one starts.
	for kn, idx := range cr.res {
		for _, o := range idx.List() {
			u := o.(*unstructured.Unstructured)
			if st := stateOf(u); st != nil && !finished(u) {
				nn, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
				n, err := cr.findNode(cctx, nn)
				if err != nil {
					return err
				}
				j.lim.acquire(cr.resKey(kn, u.GetName()), name, j.rack(n, nn), st.Provider, true)
			}
		}
	}
	j.log.Info("janitor: watching", "cluster", name, "kinds", len(cr.res))
	var wg sync.WaitGroup
	for range j.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j.work(cctx, cr) {
			}
		}()
	}
	<-cctx.Done()
	cr.q.ShutDown()
	wg.Wait()
	return nil
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
	if st := stateOf(op.u); st != nil {
		op.st = st
		wait, err = op.follow(ctx)
	} else {
		wait, err = op.start(ctx)
	}
	if again > 0 && (wait == 0 || again < wait) {
		wait = again
	}
	return wait, err
}

// operation is one reconcile of one resource.
type operation struct {
	j        *Janitor
	cr       *clusterRun
	kd       kind
	u        *unstructured.Unstructured
	key      string
	nodeName string
	node     *corev1.Node
	force    bool
	st       *opState
}

func (op *operation) res() dynamic.ResourceInterface { return op.cr.cl.Dynamic.Resource(op.kd.GVR) }

func (op *operation) ref() string { return op.kd.Name + "/" + op.u.GetName() }

// notDrained says why op.node may not be acted on under require_drained
// ("" when it may): faultline has not quarantined and drained it, or its
// drain is older than its quarantine. Not asked when spec.force is set.
func (op *operation) notDrained() string {
	if !op.j.cfg.RequireDrained || op.force {
		return ""
	}
	q, d := op.node.Labels[labelQuarantined], op.node.Labels[labelDrain]
	if q != "true" || (d != "succeeded" && d != "gave_up") {
		return fmt.Sprintf("node %s is not quarantined and drained by faultline (%s=%q, %s=%q) and spec.force is not set",
			op.nodeName, labelQuarantined, q, labelDrain, d)
	}
	if why := staleDrain(op.node); why != "" {
		return fmt.Sprintf("node %s is not drained for its current quarantine: %s; spec.force is not set", op.nodeName, why)
	}
	return ""
}

// awaitsBootID is a reboot of a node that reports no boot ID yet: its end
// could not be told.
func (op *operation) awaitsBootID() bool {
	return op.kd == kindReboot && op.node.Status.NodeInfo.BootID == ""
}

// start checks the safety rules and sends the signal.
func (op *operation) start(ctx context.Context) (time.Duration, error) {
	j := op.j
	if op.cr.cl.DryRun {
		if !j.remember(op.u.GetUID(), func(m *memory) { m.dryRun = true }).dryRun {
			a := op.action(events.OutcomeDryRun, fmt.Sprintf("would carry out %s on node %s (cluster is dry-run)", op.ref(), op.nodeName), "dry_run", nil)
			a.DryRun = true
			op.emit(ctx, a)
		}
		return 0, nil
	}
	var err error
	if op.node, err = op.cr.findNode(ctx, op.nodeName); err != nil {
		return 0, err
	}
	if op.node != nil && (op.notDrained() != "" || op.awaitsBootID()) {
		// The watch's copy may be behind a write made just before the
		// resource: the drain role's label, the kubelet's boot ID. A node
		// the checks below would refuse or wait for is read from the API
		// server first (a GET on that path only).
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err != nil {
			return 0, err
		}
	}
	if op.node == nil {
		return 0, op.fail(ctx, ReasonNodeNotFound, fmt.Sprintf("node %s not found", op.nodeName), false)
	}
	if why := op.notDrained(); why != "" {
		return 0, op.fail(ctx, ReasonNotDrained, why, false)
	}
	pname, nodeKey, err := j.cfg.providerName(op.node)
	if err != nil {
		return 0, op.fail(ctx, ReasonNoProvider, err.Error(), false)
	}
	prov := j.providers[pname]
	if prov == nil {
		why := "no provider for node " + op.nodeName + " (label " + LabelProvider + ", annotation/label " + AnnotationProvider +
			", providerID " + op.node.Spec.ProviderID + ", default_provider)"
		if pname != "" {
			why = fmt.Sprintf("provider %q of node %s is not configured", pname, op.nodeName)
		}
		return 0, op.fail(ctx, ReasonNoProvider, why, false)
	}
	if op.awaitsBootID() {
		// A reboot is over at a boot ID other than the one recorded with
		// its signal: recorded empty, the first one the kubelet reports
		// (of the same boot) would read as the reboot done. Waited for up
		// to reboot_timeout, then failed: not left to the remediate
		// role's completion_timeout.
		if created := op.u.GetCreationTimestamp().Time; !created.IsZero() && j.now().Sub(created) > j.cfg.RebootTimeout {
			return 0, op.fail(ctx, ReasonNoBootID, fmt.Sprintf("node %s reported no boot ID (status.nodeInfo.bootID) within %v: a reboot's end could not be told, so none was sent",
				op.nodeName, j.cfg.RebootTimeout), false)
		}
		op.deferOnce(ctx, fmt.Sprintf("node %s reports no boot ID (status.nodeInfo.bootID) yet: a reboot's end could not be told; waiting for its kubelet (up to %v)", op.nodeName, j.cfg.RebootTimeout))
		return j.cfg.PollInterval, nil
	}
	if wait := op.claimNode(); wait > 0 {
		op.deferOnce(ctx, fmt.Sprintf("node %s is in its cooldown (%v) for %v more", op.nodeName, j.cfg.Cooldown, wait.Round(time.Second)))
		return wait, nil
	}
	if lim := j.lim.acquire(op.key, op.cr.name, j.rack(op.node, op.nodeName), pname, false); lim != "" {
		op.unclaimNode()
		op.deferOnce(ctx, "waiting for a slot: "+lim+" reached")
		return time.Second, nil
	}
	// Record the signal before sending it.
	err = op.record(ctx, opState{Step: "signal", At: j.now().UTC(), BootID: op.node.Status.NodeInfo.BootID, Provider: pname, By: j.cfg.Identity})
	if apierrors.IsConflict(err) {
		j.lim.release(op.key)
		op.unclaimNode()
		return time.Second, nil // re-read; another janitor may have it
	}
	if err != nil {
		j.lim.release(op.key)
		op.unclaimNode()
		return 0, fmt.Errorf("record %s state: %w", op.ref(), err)
	}
	j.m.started.WithLabelValues(op.cr.name, op.kd.ActionKind, pname).Inc()
	named := op.nodeNamed(pname, nodeKey)
	t := Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/signal"}
	switch op.kd {
	case kindGPUReset:
		return op.resetGPUs(ctx, prov, t)
	case kindTerminate:
		err = prov.Terminate(ctx, t)
	default:
		err = prov.Reboot(ctx, t, Graceful)
	}
	if err != nil && ctx.Err() != nil {
		// Stopping mid-signal: the state is recorded; whoever resumes it
		// does not send it again.
		return 0, ctx.Err()
	}
	if errors.Is(err, ErrMaybeSent) {
		// Written, never answered: the machine may be doing it. Followed
		// as a sent signal (a new boot ID, else reboot_timeout), never sent
		// again; not a failed signal, which the remediate role escalates.
		msg := fmt.Sprintf("%s signal may have been sent via %s, not sent again: %v", op.kd.ActionKind, pname, err)
		j.remember(op.u.GetUID(), func(m *memory) { m.maybeSentMsg = msg })
		op.emit(ctx, op.action(events.OutcomeApplied, msg+" (node "+op.nodeName+")", "signal", named))
		if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonMaybeSent, msg}, cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
			return 0, err
		}
		return j.cfg.PollInterval, nil
	}
	if err != nil {
		reason, msg := reasonOf(err), fmt.Sprintf("%s via %s: %v", op.kd.ActionKind, pname, err)
		j.remember(op.u.GetUID(), func(m *memory) { m.failReason, m.failMsg = reason, msg })
		return 0, op.fail(ctx, reason, msg, true)
	}
	j.remember(op.u.GetUID(), func(m *memory) { m.signalSent = true })
	if created := op.u.GetCreationTimestamp().Time; !created.IsZero() {
		j.m.signalLatency.WithLabelValues(op.cr.name).Observe(j.now().Sub(created).Seconds())
	}
	msg := fmt.Sprintf("%s signal sent via %s", op.kd.ActionKind, pname)
	if keys := named[events.DetailNodeNamed]; keys != "" {
		msg += " following the node's own " + keys + " (its kubelet may write it)"
	}
	// The action before the status it reports, here and at every step: a
	// janitor that stops in between finds the step not written and does it
	// again, producing the same action (same id) again.
	op.emit(ctx, op.action(events.OutcomeApplied, msg+" to node "+op.nodeName, "signal", named))
	if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonSucceeded, msg}, cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
		return 0, err
	}
	return j.cfg.PollInterval, nil
}

// nodeNamed accounts for the node's own keys (its kubelet may write them)
// that the signal about to be sent through pname follows: each counted
// in faultline_janitor_node_named_total and warned of (one signal, one
// warning: no set of nodes warned of to grow with the fleet), and
// returned as the signal action's details (nil when none). A compromised
// node can point them elsewhere: another node's BMC, another provider
// (SECURITY.md, "What a node may say about itself").
func (op *operation) nodeNamed(pname, nodeKey string) map[string]string {
	j := op.j
	keys := j.cfg.nodeNamed(op.node, pname, nodeKey)
	if len(keys) == 0 {
		return nil
	}
	for _, k := range keys {
		j.m.nodeNamed.WithLabelValues(op.cr.name, k).Inc()
		j.log.Warn("janitor: a signal follows the node's own "+k+" (its kubelet may write it); name it with a "+
			corev1.LabelNamespaceNodeRestriction+"/ label and set janitor.redfish.labels_only",
			"cluster", op.cr.name, "node", op.nodeName, "key", k, "value", op.node.Annotations[k]+op.node.Labels[k], "provider", pname)
	}
	return map[string]string{events.DetailNodeNamed: strings.Join(keys, ",")}
}

// resetGPUs asks for a GPU reset and completes the resource once the
// provider says it ran; while it runs (ErrInProgress) the resource says
// so and the janitor asks again each poll, within gpu_reset_timeout.
func (op *operation) resetGPUs(ctx context.Context, prov Provider, t Target) (time.Duration, error) {
	j := op.j
	var uuids []string
	if raw, ok, _ := unstructured.NestedStringSlice(op.u.Object, "spec", "selector", "uuids"); ok {
		uuids = raw
	}
	what := "every GPU"
	if len(uuids) > 0 {
		what = strings.Join(uuids, ",")
	}
	err := prov.ResetGPUs(ctx, t, uuids)
	// Sent unanswered (ErrMaybeSent): the agent may be resetting; asked
	// again at the next poll (the same request id gets the first answer).
	if errors.Is(err, ErrInProgress) || errors.Is(err, ErrMaybeSent) {
		if !condIs(op.u, CondResetJobCreated, "True") {
			msg := fmt.Sprintf("reset of %s sent via %s; the node is resetting", what, op.st.Provider)
			op.emit(ctx, op.action(events.OutcomeInProgress, msg+" (node "+op.nodeName+")", "signal", nil))
			if err := op.writeStatus(ctx, false, cond{CondReady, "True", ReasonSucceeded, "accepted"},
				cond{CondResetJobCreated, "True", ReasonSucceeded, msg}); err != nil {
				return 0, err
			}
		}
		return j.cfg.PollInterval, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		reason := reasonOf(err)
		if reason == ReasonFailed {
			reason = ReasonResetJobFailed
		}
		return 0, op.fail(ctx, reason, fmt.Sprintf("reset of %s via %s: %v", what, op.st.Provider, err), true)
	}
	msg := fmt.Sprintf("reset %s of node %s via %s", what, op.nodeName, op.st.Provider)
	op.emit(ctx, op.action(events.OutcomeSucceeded, msg, "complete", nil))
	if err := op.writeStatus(ctx, true, cond{CondReady, "True", ReasonSucceeded, "accepted"},
		cond{CondResetJobCreated, "True", ReasonSucceeded, "sent via " + op.st.Provider},
		cond{CondComplete, "True", ReasonGPUResetSucceeded, msg}); err != nil {
		return 0, err
	}
	j.lim.release(op.key)
	j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeSucceeded).Inc()
	return 0, nil
}

// cooldown is how long the node must still wait: another resource of the
// node recorded a signal within Config.Cooldown.
func (op *operation) cooldown() time.Duration {
	j := op.j
	if j.cfg.Cooldown <= 0 {
		return 0
	}
	var last time.Time
	for _, idx := range op.cr.res {
		objs, _ := idx.ByIndex(nodeIndex, op.nodeName)
		for _, o := range objs {
			u := o.(*unstructured.Unstructured)
			if u.GetUID() == op.u.GetUID() {
				continue
			}
			if st := stateOf(u); st != nil && st.At.After(last) {
				last = st.At
			}
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Add(j.cfg.Cooldown).Sub(j.now())
}

// claimNode is cooldown, and when it is over, claims the node for this
// resource until Config.Cooldown passes; a resource of the node that
// another worker claimed meanwhile waits for it. The watch's copy of the
// node's other resources shows their state records only some time after
// they were written: two resources of a node taken by two workers at once
// both passed the cooldown read from it, and the node got both signals.
// Nothing to claim without a cooldown.
func (op *operation) claimNode() time.Duration {
	j, cr := op.j, op.cr
	if j.cfg.Cooldown <= 0 {
		return 0
	}
	cr.claimMu.Lock()
	defer cr.claimMu.Unlock()
	now := j.now()
	for n, c := range cr.claims { // the expired go: the map follows the nodes signalled within a cooldown
		if now.Sub(c.at) >= j.cfg.Cooldown {
			delete(cr.claims, n)
		}
	}
	if c, ok := cr.claims[op.nodeName]; ok && c.uid != op.u.GetUID() {
		return c.at.Add(j.cfg.Cooldown).Sub(now)
	}
	if wait := op.cooldown(); wait > 0 {
		return wait
	}
	if cr.claims == nil {
		cr.claims = map[string]nodeClaim{}
	}
	cr.claims[op.nodeName] = nodeClaim{uid: op.u.GetUID(), at: now}
	return 0
}

// unclaimNode drops the resource's claim on its node: its signal was not
// recorded.
func (op *operation) unclaimNode() {
	cr := op.cr
	cr.claimMu.Lock()
	defer cr.claimMu.Unlock()
	if c, ok := cr.claims[op.nodeName]; ok && c.uid == op.u.GetUID() {
		delete(cr.claims, op.nodeName)
	}
}

// deferOnce writes a deferred action the first time a resource waits.
func (op *operation) deferOnce(ctx context.Context, why string) {
	j := op.j
	if !j.remember(op.u.GetUID(), func(m *memory) { m.deferred = true }).deferred {
		j.m.deferred.WithLabelValues(op.cr.name).Inc()
		op.emit(ctx, op.action(events.OutcomeDeferred, why, "deferred", nil))
	}
}

// follow observes an operation whose signal was recorded.
func (op *operation) follow(ctx context.Context) (time.Duration, error) {
	j := op.j
	var err error
	if op.node, err = op.cr.findNode(ctx, op.nodeName); err != nil {
		return 0, err
	}
	j.lim.acquire(op.key, op.cr.name, j.rack(op.node, op.nodeName), op.st.Provider, true)
	if !condIs(op.u, CondSignalSent, "True") && op.kd != kindGPUReset {
		// Read it fresh: the cache may be behind our own write.
		fresh, err := op.res().Get(ctx, op.u.GetName(), metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("get %s: %w", op.ref(), err)
		}
		op.u = fresh
		if finished(fresh) {
			j.lim.release(op.key)
			return 0, nil
		}
		if m := j.recall(op.u.GetUID()); !condIs(fresh, CondSignalSent, "True") && m.failReason != "" {
			// This janitor's provider refused the signal; writing the
			// failure failed: write it now (not "recorded, may have gone out").
			return 0, op.fail(ctx, m.failReason, m.failMsg, true)
		}
		if m := j.recall(op.u.GetUID()); !condIs(fresh, CondSignalSent, "True") && m.maybeSentMsg != "" {
			// Sent unanswered by this janitor; writing it failed: now.
			op.emit(ctx, op.action(events.OutcomeApplied, m.maybeSentMsg+" (node "+op.nodeName+")", "signal", nil))
			if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonMaybeSent, m.maybeSentMsg},
				cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
				return 0, err
			}
			return j.cfg.PollInterval, nil
		}
		if !condIs(fresh, CondSignalSent, "True") && j.recall(op.u.GetUID()).signalSent {
			// This janitor sent it; writing SignalSent failed: write it now
			// (else the resource waits here for ever, holding its slot).
			msg := fmt.Sprintf("%s signal sent via %s", op.kd.ActionKind, op.st.Provider)
			op.emit(ctx, op.action(events.OutcomeApplied, msg+" to node "+op.nodeName, "signal", nil))
			if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonSucceeded, msg},
				cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
				return 0, err
			}
			return j.cfg.PollInterval, nil
		}
		if !condIs(fresh, CondSignalSent, "True") {
			// Recorded by a janitor that stopped before it wrote
			// SignalSent: it may have been sent. Never twice.
			msg := fmt.Sprintf("the signal was recorded at %s by %s, which stopped before confirming it; not sent again",
				op.st.At.Format(time.RFC3339), op.st.By)
			op.emit(ctx, op.action(events.OutcomeInProgress, "resumed "+op.ref()+": "+msg, "resumed", nil))
			if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonRecorded, msg},
				cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
				return 0, err
			}
			return j.cfg.PollInterval, nil
		}
	}
	switch op.kd {
	case kindGPUReset:
		// The cache may be behind the Complete this janitor just wrote.
		fresh, err := op.res().Get(ctx, op.u.GetName(), metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("get %s: %w", op.ref(), err)
		}
		if op.u = fresh; finished(fresh) {
			j.lim.release(op.key)
			return 0, nil
		}
		// Recorded but not completed: the reset is running, or was
		// interrupted. Only the node-local agent resets GPUs, and it
		// answers a repeated request id with the first answer (or
		// in_progress), so sending it again is safe.
		prov := j.providers[op.st.Provider]
		if prov == nil {
			return 0, op.fail(ctx, ReasonNoProvider, "provider "+op.st.Provider+" is not configured", true)
		}
		if j.now().Sub(op.st.At) > j.cfg.GPUResetTimeout {
			return 0, op.fail(ctx, ReasonTimeout, fmt.Sprintf("not completed within %v", j.cfg.GPUResetTimeout), true)
		}
		if op.node == nil {
			// Deleted while its GPUs reset: there is no agent to ask.
			return 0, op.fail(ctx, ReasonNodeNotFound, fmt.Sprintf("node %s is gone; its GPU reset cannot be followed", op.nodeName), true)
		}
		return op.resetGPUs(ctx, prov, Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/signal"})
	case kindTerminate:
		return op.followTerminate(ctx)
	}
	return op.followReboot(ctx)
}

// record writes st as the resource's state annotation (optimistic
// concurrency: a second janitor, or a stale cache, gets a conflict).
func (op *operation) record(ctx context.Context, st opState) error {
	obj := op.u.DeepCopy()
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationState] = st.encode()
	obj.SetAnnotations(ann)
	upd, err := op.res().Update(ctx, obj, metav1.UpdateOptions{FieldManager: "faultline-janitor"})
	if err != nil {
		return err
	}
	op.u, op.st = upd, &st
	return nil
}

// rebooted is whether op.node is Ready with another boot ID than the one
// recorded with the signal: the reboot is over.
func (op *operation) rebooted() bool {
	n := op.node
	return n != nil && nodeReady(n) && n.Status.NodeInfo.BootID != "" && n.Status.NodeInfo.BootID != op.st.BootID
}

func (op *operation) followReboot(ctx context.Context) (time.Duration, error) {
	j := op.j
	if !op.st.ForcedAt.IsZero() && !j.remember(op.u.GetUID(), func(m *memory) { m.forced = true }).forced {
		// A forced reboot recorded before this janitor started: its
		// recorder may have stopped before it produced the action. Not
		// sent again, but audited (the same id at each restart).
		op.emit(ctx, op.action(events.OutcomeInProgress, fmt.Sprintf("resumed %s: a forced reboot was recorded at %s; not sent again",
			op.ref(), op.st.ForcedAt.Format(time.RFC3339)), "force-resumed", nil))
	}
	elapsed := j.now().Sub(op.st.At)
	if op.node != nil && !op.rebooted() && (elapsed > j.cfg.RebootTimeout || (op.st.ForcedAt.IsZero() &&
		((j.cfg.ForceAfter > 0 && elapsed > j.cfg.ForceAfter) || (j.cfg.HungAfter > 0 && op.downFor() > j.cfg.HungAfter)))) {
		// Past the point where the watch's copy would have the reboot
		// forced or failed: a watch behind the kubelet's new boot ID would
		// start a machine that came back over, or fail a reboot that
		// worked. The node is read from the apiserver first (on this path
		// only: abnormal reboots, one GET a poll; a node the watch lacks
		// was read from it already).
		var err error
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err != nil {
			return 0, err
		}
	}
	if op.rebooted() {
		n := op.node
		msg := fmt.Sprintf("node %s is Ready with a new boot ID %s (was %s) after %v", op.nodeName, n.Status.NodeInfo.BootID, op.st.BootID, elapsed.Round(time.Second))
		op.emit(ctx, op.action(events.OutcomeSucceeded, msg, "complete", nil))
		if err := op.writeStatus(ctx, true, cond{CondNodeReady, "True", ReasonSucceeded, msg}); err != nil {
			return 0, err
		}
		j.lim.release(op.key)
		j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeSucceeded).Inc()
		return 0, nil
	}
	if elapsed > j.cfg.RebootTimeout {
		why := fmt.Sprintf("node %s did not come back Ready with a new boot ID within %v", op.nodeName, j.cfg.RebootTimeout)
		if op.node == nil {
			why = fmt.Sprintf("node %s is gone and did not come back within %v", op.nodeName, j.cfg.RebootTimeout)
		}
		return 0, op.fail(ctx, ReasonTimeout, why, true)
	}
	// A graceful reboot that has not taken the node down: force it, once.
	if j.cfg.ForceAfter > 0 && op.st.ForcedAt.IsZero() && elapsed > j.cfg.ForceAfter && op.node != nil && nodeReady(op.node) &&
		op.node.Status.NodeInfo.BootID == op.st.BootID {
		if prov := j.providers[op.st.Provider]; prov != nil {
			if next, done, err := op.forceReboot(ctx, prov, fmt.Sprintf("the graceful one did not take node %s down within %v", op.nodeName, j.cfg.ForceAfter)); done {
				return next, err
			}
		}
	}
	if next, done, err := op.followDownMachine(ctx, elapsed); done {
		return next, err
	}
	return j.cfg.PollInterval, nil
}

// forceReboot sends the forced reboot of a graceful one that did not do its
// work, once: ForcedAt is recorded first, like the signal. why says what
// it did not do. done: followReboot returns next and err.
func (op *operation) forceReboot(ctx context.Context, prov Provider, why string) (next time.Duration, done bool, err error) {
	j := op.j
	st := *op.st
	st.Step, st.ForcedAt = "force", j.now().UTC()
	err = op.record(ctx, st)
	if apierrors.IsConflict(err) {
		return time.Second, true, nil
	}
	if err != nil {
		return 0, true, fmt.Errorf("record %s force: %w", op.ref(), err)
	}
	j.remember(op.u.GetUID(), func(m *memory) { m.forced = true })
	t := Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/force"}
	switch err := prov.Reboot(ctx, t, Force); {
	case errors.Is(err, ErrUnsupported):
	case errors.Is(err, ErrMaybeSent):
		// Followed as sent: a new boot ID, else reboot_timeout.
		op.emit(ctx, op.action(events.OutcomeApplied, fmt.Sprintf("forced reboot may have been sent via %s (%s): %v",
			op.st.Provider, why, err), "force", nil))
	case err != nil:
		return 0, true, op.fail(ctx, reasonOf(err), fmt.Sprintf("forced reboot via %s (%s): %v", op.st.Provider, why, err), true)
	default:
		op.emit(ctx, op.action(events.OutcomeApplied, fmt.Sprintf("forced reboot via %s: %s", op.st.Provider, why), "force", nil))
	}
	return 0, false, nil
}

// offCheckEvery is how often the machine of a reboot whose node stays
// down is asked about (one BMC read while it is not off).
const offCheckEvery = time.Minute

// followDownMachine asks the provider, where it can tell (offPowerer),
// about the machine of a reboot whose node is down (NotReady) with its
// old boot ID, at most every offCheckEvery, once the reboot is older than
// force_after or the node has been down for hung_after:
//   - off (a graceful reset the machine took as a shutdown, a BMC that did
//     not power it back on): powered on; sending On only to a machine that
//     is off makes it safe to repeat;
//   - on, the node down for hung_after (a shutdown that hung: a driver
//     unload, an unmount that never returns): forced, once.
//
// Otherwise nothing is sent to a machine that is on: it is shutting down
// or in a long POST, and a forced reset would start that over. Before,
// both machines waited for reboot_timeout. done: followReboot returns
// next and err.
func (op *operation) followDownMachine(ctx context.Context, elapsed time.Duration) (next time.Duration, done bool, err error) {
	j := op.j
	prov := j.providers[op.st.Provider]
	p, ok := prov.(offPowerer)
	if !ok || op.node == nil || nodeReady(op.node) || op.node.Status.NodeInfo.BootID != op.st.BootID {
		return 0, false, nil
	}
	down := op.downFor()
	hung := j.cfg.HungAfter > 0 && down > j.cfg.HungAfter && op.st.ForcedAt.IsZero()
	if !hung && (j.cfg.ForceAfter == 0 || elapsed <= j.cfg.ForceAfter) {
		return 0, false, nil
	}
	now := j.now()
	if last := j.remember(op.u.GetUID(), func(m *memory) {
		if now.Sub(m.offChecked) >= offCheckEvery {
			m.offChecked = now
		}
	}).offChecked; now.Sub(last) < offCheckEvery {
		return 0, false, nil
	}
	t := Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/power-on"}
	switch err := p.PowerOnIfOff(ctx, t); {
	case err == nil:
		op.emit(ctx, op.action(events.OutcomeApplied, fmt.Sprintf("powered on via %s: node %s was still down with its old boot ID after %v, and its machine was off",
			op.st.Provider, op.nodeName, elapsed.Round(time.Second)), "power-on", nil))
	case errors.Is(err, ErrNotOff) && hung:
		return op.forceReboot(ctx, prov, fmt.Sprintf("node %s has been down with its old boot ID for %v while its machine is on: its shutdown hung",
			op.nodeName, down.Round(time.Second)))
	case errors.Is(err, ErrNotOff), ctx.Err() != nil:
	default:
		j.log.Warn("janitor: could not tell whether a rebooting machine is off", "cluster", op.cr.name, "node", op.nodeName,
			"provider", op.st.Provider, "err", err)
	}
	return 0, false, nil
}

// downFor is how long the node of a reboot has been down: since its Ready
// condition last changed, or since the reboot was recorded if that is
// later (a node already NotReady when it was signalled).
func (op *operation) downFor() time.Duration {
	since := op.st.At
	for _, c := range op.node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.LastTransitionTime.After(since) {
			since = c.LastTransitionTime.Time
		}
	}
	return op.j.now().Sub(since)
}

func (op *operation) followTerminate(ctx context.Context) (time.Duration, error) {
	j := op.j
	gone := op.node == nil // read live where the watch's copy lacks it (follow)
	// A signal this janitor's provider confirmed: the Node goes at once. A
	// resumed one (Recorded: the janitor that recorded it stopped before
	// it knew) may never have gone out: the Node goes only once the node
	// is down (NotReady), else a running machine would lose its Node and
	// the terminate be reported done; a node still Ready ends in Timeout.
	// So may one sent unanswered (MaybeSent).
	reason := condition(op.u, CondSignalSent)["reason"]
	confirmed := reason != ReasonRecorded && reason != ReasonMaybeSent
	if !gone && j.cfg.DeleteNodeOnTerminate && (confirmed || !nodeReady(op.node)) {
		err := op.cr.cl.Kube.CoreV1().Nodes().Delete(ctx, op.nodeName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("delete node %s: %w", op.nodeName, err)
		}
		gone = true
	}
	if gone {
		msg := fmt.Sprintf("node %s terminated via %s and its Node object is gone", op.nodeName, op.st.Provider)
		op.emit(ctx, op.action(events.OutcomeSucceeded, msg, "complete", nil))
		if err := op.writeStatus(ctx, true, cond{CondNodeTerminated, "True", ReasonSucceeded, msg}); err != nil {
			return 0, err
		}
		j.lim.release(op.key)
		j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeSucceeded).Inc()
		return 0, nil
	}
	if j.now().Sub(op.st.At) > j.cfg.TerminateTimeout {
		return 0, op.fail(ctx, ReasonTimeout, fmt.Sprintf("node %s still exists %v after the terminate signal", op.nodeName, j.cfg.TerminateTimeout), true)
	}
	return j.cfg.PollInterval, nil
}

// fail ends the resource failed: the result condition (or SignalSent when
// no signal went out) False with the reason, completionTime set.
func (op *operation) fail(ctx context.Context, reason, msg string, signalled bool) error {
	j := op.j
	var cs []cond
	switch {
	case op.kd == kindGPUReset:
		cs = []cond{{CondComplete, "True", reason, msg}}
	case !signalled || !condIs(op.u, CondSignalSent, "True"):
		cs = []cond{{CondSignalSent, "False", reason, msg}, {op.kd.Result, "False", reason, msg}}
	default:
		cs = []cond{{op.kd.Result, "False", reason, msg}}
	}
	outcome := events.OutcomeFailed
	if reason == ReasonNotDrained {
		outcome = events.OutcomeRefused
	}
	op.emit(ctx, op.action(outcome, reason+": "+msg, "failed", map[string]string{"reason": reason}))
	if err := op.writeStatus(ctx, true, cs...); err != nil {
		return err
	}
	j.lim.release(op.key)
	j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeFailed).Inc()
	j.log.Warn("janitor: operation failed", "cluster", op.cr.name, "resource", op.ref(), "node", op.nodeName, "reason", reason, "msg", msg)
	return nil
}

// writeStatus merges conditions (and startTime, and completionTime when
// done) into the resource's status.
func (op *operation) writeStatus(ctx context.Context, done bool, cs ...cond) error {
	now := op.j.now()
	status := map[string]any{"conditions": setConditions(op.u, now, cs...)}
	if v, _, _ := unstructured.NestedString(op.u.Object, "status", "startTime"); v == "" {
		at := now
		if op.st != nil {
			at = op.st.At
		}
		status["startTime"] = at.UTC().Format(time.RFC3339)
	}
	if done {
		status["completionTime"] = now.UTC().Format(time.RFC3339)
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	out, err := op.res().Patch(ctx, op.u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "faultline-janitor"}, "status")
	if err != nil {
		return fmt.Errorf("write %s status: %w", op.ref(), err)
	}
	op.u = out
	if done {
		op.j.remember(out.GetUID(), func(m *memory) { m.ended = true })
	}
	return nil
}

// action is one audit record of the operation.
func (op *operation) action(outcome, reason, step string, details map[string]string) *faultlinev1.Action {
	j := op.j
	j.m.actions.WithLabelValues(op.cr.name, op.kd.ActionKind, outcome).Inc()
	d := map[string]string{events.DetailResource: op.ref(), events.DetailStep: step}
	if op.st != nil {
		d[events.DetailProvider] = op.st.Provider
	}
	if op.force {
		d[events.DetailForce] = "true"
	}
	for k, v := range details {
		d[k] = v
	}
	// The id is the resource's, the step's, the outcome's and a failure's
	// reason: a step done again (by a janitor that restarted before it
	// wrote the step's status) produces the same id, and the store keeps
	// one; two different failures of one resource keep two.
	return &faultlinev1.Action{
		Id:      shortHash(strings.Join([]string{op.cr.name, string(op.u.GetUID()), op.u.GetName(), step, outcome, details["reason"]}, "\x00"), 32),
		Cluster: op.cr.name, Node: op.nodeName, Role: Role, Kind: op.kd.ActionKind, Outcome: outcome,
		Reason: events.Truncate(reason, 1024), Timestamp: timestamppb.New(j.now()), Details: d,
	}
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
	leader                                           *prometheus.GaugeVec
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
			Help: "1 while this janitor works the cluster (it holds the cluster's Lease, or leader election is off), 0 while another does."}, []string{"cluster"}),
	}
	if reg != nil {
		reg.MustRegister(m.actions, m.started, m.completed, m.apiErrors, m.deferred, m.auditErrors, m.signalLatency, m.nodeNamed, m.leader)
	}
	return m
}
