// Package coordination is ADR-026's gang controller: for every gang the
// webhook labelled, it keeps a ConfigMap "preflight-<gangID>" in the gang's
// namespace with the gang's expected size, its members ("pod:ip" lines,
// sorted by pod name: the pods running or done with the gang-wide check),
// the ones done with it, the ones whose check failed and runs again, and
// the rank-0 pod's address, which the webhook mounts into the
// nccl-allreduce init containers at /etc/preflight.
//
// It touches nothing else: it reads pods (and the scheduler objects that
// give a gang's size) and writes only ConfigMaps named "preflight-*" that
// carry its managed-by label, refusing any other ConfigMap of that name.
// Each ConfigMap is owned by the gang's pods (ownerReferences), so
// Kubernetes' garbage collector removes it with the last of them and the
// controller needs no delete permission. Its state is the pods and the
// ConfigMaps themselves, so several replicas can run: each computes the
// same ConfigMap, and writes are conditional on the resourceVersion read.
package coordination

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/faultline/faultline/agents/preflight/gang"
)

// Keys of the gang ConfigMap (ADR-026's structure, plus gang_id).
const (
	KeyExpected = "expected_count"
	KeyMaster   = "master_addr"
	KeyPeers    = "peers"
	KeyGangID   = "gang_id"
	// KeyExcluded lists the gang's pods that run no gang-wide check
	// ("pod: reason" lines): counted by the scheduler, not in
	// expected_count.
	KeyExcluded = "excluded"
	// KeyFinished lists the peers whose check ended (pod names, one a
	// line; absent when none): the rendezvous is over for them, so a
	// peer still waiting cannot run it with them.
	KeyFinished = "finished"
	// KeyRerun lists the gang pods whose gang-wide check failed in the
	// pod and runs, or will run, again (pod names, one a line; absent
	// when none): a finished peer does not end such a pod's wait, so the
	// pod whose check failed is not passed on its rerun.
	KeyRerun = "rerun"
)

// LabelManagedBy marks the ConfigMaps the controller owns.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "faultline-preflight"
)

// ErrNotOurs is returned for a "preflight-*" ConfigMap the controller did
// not create.
var ErrNotOurs = errors.New("ConfigMap exists but was not created by faultline-preflight; not touching it")

// Options configure the controller.
type Options struct {
	// Workers reconcile gangs in parallel (default 2).
	Workers int
	// Resync re-reads every gang this often (default 5m).
	Resync time.Duration
	// RetryUnknownSize re-asks for a gang's size this often while its
	// scheduler object does not say it (default 10s).
	RetryUnknownSize time.Duration
	// Registry receives the controller's metrics (nil: none).
	Registry prometheus.Registerer
}

// Controller keeps the gang ConfigMaps.
type Controller struct {
	kc      kubernetes.Interface
	disc    *gang.Discovery
	log     *slog.Logger
	opt     Options
	pods    corelisters.PodLister
	factory informers.SharedInformerFactory
	// excluded lists the gang pods the webhook marked gang.LabelExcluded.
	excluded  corelisters.PodLister
	exFactory informers.SharedInformerFactory
	queue     workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	size map[string]int // gang key -> expected size once known

	reconciles *prometheus.CounterVec
}

// New builds the controller; Run starts it.
func New(kc kubernetes.Interface, disc *gang.Discovery, log *slog.Logger, opt Options) *Controller {
	if opt.Workers <= 0 {
		opt.Workers = 2
	}
	if opt.Resync <= 0 {
		opt.Resync = 5 * time.Minute
	}
	if opt.RetryUnknownSize <= 0 {
		opt.RetryUnknownSize = 10 * time.Second
	}
	f := informers.NewSharedInformerFactoryWithOptions(kc, opt.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = gang.LabelGang }))
	fx := informers.NewSharedInformerFactoryWithOptions(kc, opt.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = gang.LabelExcluded }))
	c := &Controller{kc: kc, disc: disc, log: log, opt: opt, factory: f, exFactory: fx,
		pods:     f.Core().V1().Pods().Lister(),
		excluded: fx.Core().V1().Pods().Lister(),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		size:     map[string]int{},
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "preflight_gang_reconciles_total",
			Help: "Gang ConfigMap reconciliations by result (created, updated, unchanged, error)."}, []string{"result"}),
	}
	if opt.Registry != nil {
		opt.Registry.MustRegister(c.reconciles)
	}
	handler := func(label string) cache.ResourceEventHandlerFuncs {
		enqueue := func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok && p.Labels[label] != "" {
				c.queue.Add(p.Namespace + "/" + p.Labels[label])
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue}
	}
	_, _ = f.Core().V1().Pods().Informer().AddEventHandler(handler(gang.LabelGang))
	_, _ = fx.Core().V1().Pods().Informer().AddEventHandler(handler(gang.LabelExcluded))
	return c
}

// GangPods lists a gang's pods from the informer (gang.PodLister).
func (c *Controller) GangPods(namespace, id string) ([]*corev1.Pod, error) {
	return c.pods.Pods(namespace).List(labels.SelectorFromSet(labels.Set{gang.LabelGang: id}))
}

// Run runs until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	c.exFactory.Start(ctx.Done())
	for _, f := range []informers.SharedInformerFactory{c.factory, c.exFactory} {
		for t, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok { // the wait ends early only when ctx does: a stop, not a failure
				c.log.Info("gang controller stopped before its cache synced", "type", fmt.Sprint(t))
				c.factory.Shutdown()
				c.exFactory.Shutdown()
				return nil
			}
		}
	}
	c.log.Info("gang controller running", "workers", c.opt.Workers)
	var wg sync.WaitGroup
	for range c.opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	c.factory.Shutdown()
	c.exFactory.Shutdown()
	return nil
}

func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	ns, id, _ := strings.Cut(key, "/")
	retry, err := c.Reconcile(ctx, ns, id)
	switch {
	case err != nil:
		c.reconciles.WithLabelValues("error").Inc()
		c.log.Warn("gang ConfigMap not reconciled; will retry", "namespace", ns, "gang", id, "err", err)
		c.queue.AddRateLimited(key)
	case retry > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, retry)
	default:
		c.queue.Forget(key)
	}
	return true
}

// live are the pods not terminating and not finished, sorted by name.
func live(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// peerState says whether a gang pod takes part in the gang-wide run: it
// has an IP and its gang.AllreduceContainer is running (waiting for its
// peers or in the rendezvous), or terminated successfully in the pod's
// current attempt (finished: the rendezvous is over for it). A pod gets
// its IP before its init containers run, so the IP alone listed pods still
// pulling the check's image or running dcgm-diag, and their peers'
// torchrun timed out waiting for them. Not peers: a pod whose container
// waits (for its image, its earlier init containers, or to run again after
// a failure), and one whose check failed (the kubelet runs it again, or the
// pod fails).
func peerState(p *corev1.Pod) (peer, finished bool) {
	if p.Status.PodIP == "" {
		return false, false
	}
	status := func(name string) *corev1.ContainerStatus {
		for i := range p.Status.InitContainerStatuses {
			if p.Status.InitContainerStatuses[i].Name == name {
				return &p.Status.InitContainerStatuses[i]
			}
		}
		return nil
	}
	s := status(gang.AllreduceContainer)
	switch {
	case s == nil:
		return false, false
	case s.State.Running != nil:
		return true, false
	case s.State.Terminated == nil || s.State.Terminated.ExitCode != 0:
		return false, false
	}
	// Terminated successfully: in this attempt only if every init
	// container before it (sidecars aside) has terminated since it
	// started. One running, waiting or finished after it means the pod's
	// init containers run again (its sandbox was recreated) and the
	// status is the previous attempt's: it will run the check again.
	for _, c := range p.Spec.InitContainers {
		if c.Name == gang.AllreduceContainer {
			break
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			continue
		}
		e := status(c.Name)
		if e == nil || e.State.Terminated == nil || e.State.Terminated.FinishedAt.After(s.State.Terminated.StartedAt.Time) {
			return false, false
		}
	}
	return true, true
}

// rerun says whether a gang pod's gang.AllreduceContainer runs, or will
// run, again after failing in this pod: its latest termination (the
// current state's, else the last state's) has a non-zero exit. Not one
// whose check passed and runs again because the sandbox was recreated
// (its last exit is 0), nor a replacement pod (no termination).
func rerun(p *corev1.Pod) bool {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name != gang.AllreduceContainer {
			continue
		}
		t := s.State.Terminated
		if t == nil {
			t = s.LastTerminationState.Terminated
		}
		return t != nil && t.ExitCode != 0
	}
	return false
}

// Desired computes the ConfigMap of a gang from its pods: members are the
// pods not terminating and not finished, peers those running the
// gang-wide check or done with it (peerState), sorted by name, the ones
// done also listed as finished, the ones whose check failed and runs
// again as rerun; the master is the first peer's address.
// A peer stays listed, with its name and IP, until its pod ends or its
// check runs again: the list only grows until the gang is complete, so
// every pod that sees it complete sees the same peers and master. expected is the
// scheduler's size of the gang, 0 when unknown; the live excluded pods
// (gang pods that run no gang-wide check) are taken off it and listed.
func Desired(ns, id string, pods, excluded []*corev1.Pod, expected int) *corev1.ConfigMap {
	members := live(pods)
	var ex []string
	for _, p := range live(excluded) {
		ex = append(ex, p.Name+": "+p.Annotations[gang.AnnotationExcluded])
	}
	if expected > 0 {
		expected = max(expected-len(ex), 1)
	}
	var lines, finished, reruns []string
	master := ""
	var owners []metav1.OwnerReference
	for _, p := range members {
		owners = append(owners, metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID})
		if rerun(p) {
			reruns = append(reruns, p.Name)
		}
		peer, done := peerState(p)
		if !peer {
			continue
		}
		if master == "" {
			master = p.Status.PodIP
		}
		lines = append(lines, p.Name+":"+p.Status.PodIP)
		if done {
			finished = append(finished, p.Name)
		}
	}
	data := map[string]string{KeyGangID: id, KeyMaster: master, KeyPeers: strings.Join(lines, "\n")}
	if len(lines) > 0 {
		data[KeyPeers] += "\n"
	}
	if len(finished) > 0 {
		data[KeyFinished] = strings.Join(finished, "\n") + "\n"
	}
	if len(reruns) > 0 {
		data[KeyRerun] = strings.Join(reruns, "\n") + "\n"
	}
	if len(ex) > 0 {
		data[KeyExcluded] = strings.Join(ex, "\n") + "\n"
	}
	if expected > 0 {
		data[KeyExpected] = strconv.Itoa(expected)
	} else {
		data[KeyExpected] = ""
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: gang.ConfigMapPrefix + id, Namespace: ns,
			Labels:          map[string]string{LabelManagedBy: ManagedBy, gang.LabelGang: id},
			OwnerReferences: owners},
		Data: data,
	}
}

// Reconcile brings one gang's ConfigMap up to date. A positive retry asks
// to be called again (the gang's size is not known yet).
func (c *Controller) Reconcile(ctx context.Context, ns, id string) (retry time.Duration, err error) {
	pods, err := c.GangPods(ns, id)
	if err != nil {
		return 0, err
	}
	key := ns + "/" + id
	if len(pods) == 0 {
		// The gang is over: its size is forgotten (learned again should
		// its pods come back), the garbage collector removes its
		// ConfigMap with its owners.
		c.mu.Lock()
		delete(c.size, key)
		c.mu.Unlock()
		return 0, nil
	}
	c.mu.Lock()
	expected := c.size[key]
	c.mu.Unlock()
	if expected == 0 {
		expected = c.expected(ctx, pods)
		if expected > 0 {
			c.mu.Lock()
			c.size[key] = expected
			c.mu.Unlock()
		} else {
			retry = c.opt.RetryUnknownSize
		}
	}
	excluded, err := c.excluded.Pods(ns).List(labels.SelectorFromSet(labels.Set{gang.LabelExcluded: id}))
	if err != nil {
		return 0, err
	}
	want := Desired(ns, id, pods, excluded, expected)
	if len(want.OwnerReferences) == 0 {
		return retry, nil
	}
	cms := c.kc.CoreV1().ConfigMaps(ns)
	cur, err := cms.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := cms.Create(ctx, want, metav1.CreateOptions{FieldManager: ManagedBy}); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return time.Millisecond, nil // another replica was first: look again
			}
			return 0, fmt.Errorf("create ConfigMap %s/%s: %w", ns, want.Name, err)
		}
		c.reconciles.WithLabelValues("created").Inc()
		c.log.Info("gang ConfigMap created", "namespace", ns, "configmap", want.Name, "expected", expected, "peers", strings.Count(want.Data[KeyPeers], "\n"))
		return retry, nil
	case err != nil:
		return 0, fmt.Errorf("get ConfigMap %s/%s: %w", ns, want.Name, err)
	}
	if cur.Labels[LabelManagedBy] != ManagedBy {
		return 0, fmt.Errorf("%s/%s: %w", ns, want.Name, ErrNotOurs)
	}
	if maps.Equal(cur.Data, want.Data) && slices.EqualFunc(cur.OwnerReferences, want.OwnerReferences, func(a, b metav1.OwnerReference) bool {
		return a.UID == b.UID && a.Name == b.Name && a.Kind == b.Kind
	}) {
		c.reconciles.WithLabelValues("unchanged").Inc()
		return retry, nil
	}
	patch, err := mergePatch(cur.ResourceVersion, cur.Data, want)
	if err != nil {
		return 0, err
	}
	if _, err := cms.Patch(ctx, want.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: ManagedBy}); err != nil {
		if apierrors.IsConflict(err) {
			return time.Millisecond, nil
		}
		return 0, fmt.Errorf("patch ConfigMap %s/%s: %w", ns, want.Name, err)
	}
	c.reconciles.WithLabelValues("updated").Inc()
	c.log.Info("gang ConfigMap updated", "namespace", ns, "configmap", want.Name, "expected", expected, "peers", strings.Count(want.Data[KeyPeers], "\n"))
	return retry, nil
}

// expected asks the gang's method for its size.
func (c *Controller) expected(ctx context.Context, pods []*corev1.Pod) int {
	var member *corev1.Pod
	for _, p := range pods {
		if p.Annotations[gang.AnnotationMethod] != "" {
			member = p
			break
		}
	}
	if member == nil {
		return 0
	}
	m, ok := c.disc.Method(member.Annotations[gang.AnnotationMethod])
	if !ok {
		c.log.Warn("gang method not configured here", "method", member.Annotations[gang.AnnotationMethod], "pod", member.Namespace+"/"+member.Name)
		return 0
	}
	g := gang.Gang{Method: m.Name(), Namespace: member.Namespace, Name: member.Annotations[gang.AnnotationName], ID: member.Labels[gang.LabelGang]}
	n, err := m.Expected(ctx, g, member)
	if err != nil {
		c.log.Info("gang size not known yet", "namespace", g.Namespace, "gang", g.ID, "err", err)
		return 0
	}
	return n
}
