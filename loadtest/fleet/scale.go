package fleet

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// LatencyProxy is a plain-HTTP reverse proxy in front of a kube-apiserver
// that holds every request for a fixed delay before forwarding it: an
// apiserver far away or under load, so a role's work is I/O-bound.
type LatencyProxy struct {
	URL string
	ln  net.Listener
	srv *http.Server

	watches atomic.Int64 // watch requests received

	mu      sync.Mutex
	creates map[string]int // "resource answer": forwarded POSTs, e.g. "rebootnodes 409", "rebootnodes unanswered"
	objects map[string]int // "resource answer path": POSTs per parent object, e.g. "eviction 201 /api/v1/namespaces/n/pods/p"
}

// StartLatencyProxy proxies to k with delay per request until ctx ends.
func StartLatencyProxy(ctx context.Context, k *testenv.Kube, delay time.Duration) (*LatencyProxy, error) {
	target, err := url.Parse(k.RESTConfig().Host)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 1024} //nolint:gosec // a local test apiserver
	token := k.RESTConfig().BearerToken
	director := rp.Director
	rp.Director = func(r *http.Request) {
		director(r)
		r.Header.Set("Authorization", "Bearer "+token) // client-go sends no token over plain HTTP
	}
	rp.FlushInterval = -1 // watches stream
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &LatencyProxy{URL: "http://" + ln.Addr().String(), ln: ln, creates: map[string]int{}, objects: map[string]int{}}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query().Get("watch"); q == "true" || q == "1" {
			p.watches.Add(1)
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		rp.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	// Creates are counted by the apiserver's answer, whether or not the
	// client is still there to read it (a SIGKILLed replica's create may
	// be done without it knowing); one cut off before an answer counts as
	// unanswered: it may or may not have been done.
	rp.ModifyResponse = func(resp *http.Response) error {
		p.countCreate(resp.Request, strconv.Itoa(resp.StatusCode))
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		p.countCreate(r, "unanswered")
		w.WriteHeader(http.StatusBadGateway)
	}
	go p.srv.Serve(ln)
	go func() { <-ctx.Done(); p.srv.Close() }()
	return p, nil
}

func (p *LatencyProxy) countCreate(r *http.Request, answer string) {
	if r.Method != http.MethodPost {
		return
	}
	res := path.Base(r.URL.Path)
	p.mu.Lock()
	p.creates[res+" "+answer]++
	p.objects[res+" "+answer+" "+path.Dir(r.URL.Path)]++
	p.mu.Unlock()
}

// Watches returns the watch requests the proxy received (0 without a proxy).
func (p *LatencyProxy) Watches() int64 {
	if p == nil {
		return 0
	}
	return p.watches.Load()
}

// Answers returns the POSTs to resource (a subresource too: "eviction")
// the proxy forwarded, by the apiserver's answer ("201", "429", "404",
// "unanswered").
func (p *LatencyProxy) Answers(resource string) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, n := range p.creates {
		if res, answer, _ := strings.Cut(k, " "); res == resource {
			out[answer] += n
		}
	}
	return out
}

// Repeated returns the parent objects (for a subresource such as
// "eviction": the pods) that got more than one POST to resource answered
// answer ("201": a pod evicted twice).
func (p *LatencyProxy) Repeated(resource, answer string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return repeated(p.objects, resource+" "+answer+" ")
}

// repeated counts the keys of counts with prefix counted more than once.
func repeated(counts map[string]int, prefix string) int {
	n := 0
	for k, c := range counts {
		if c > 1 && strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// Creates returns the creates (POSTs) of resource ("rebootnodes") the
// proxy forwarded, by the apiserver's answer: 201 Created, 409
// AlreadyExists, and those cut off before an answer (their client gone):
// every create attempt of every replica that reached the apiserver.
func (p *LatencyProxy) Creates(resource string) (created, exists, unanswered int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creates[resource+" 201"], p.creates[resource+" 409"], p.creates[resource+" unanswered"]
}

// Kubeconfig writes a kubeconfig for the proxy with k's admin token.
func (p *LatencyProxy) Kubeconfig(dir string, k *testenv.Kube) (string, error) {
	file := filepath.Join(dir, fmt.Sprintf("kubeconfig-proxy-%d", time.Now().UnixNano()))
	y := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: %s\nusers:\n- name: admin\n  user:\n    token: %s\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: admin\ncurrent-context: proxy\n",
		p.URL, k.RESTConfig().BearerToken)
	return file, os.WriteFile(file, []byte(y), 0o600)
}

// Replica is a processors.Run in its own process (the command's -replica
// mode), so it can be killed with SIGKILL.
type Replica struct {
	cmd *exec.Cmd
}

// StartReplica starts exe -replica with the flags the replica mode reads.
func StartReplica(exe string, args []string, logTo *os.File) (*Replica, error) {
	cmd := exec.Command(exe, append([]string{"-replica"}, args...)...)
	cmd.Stdout, cmd.Stderr = logTo, logTo
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Replica{cmd: cmd}, nil
}

// Kill sends SIGKILL and reaps the process (once).
func (r *Replica) Kill() {
	if r.cmd.ProcessState == nil {
		r.cmd.Process.Signal(syscall.SIGKILL)
		r.cmd.Wait()
	}
}

// PeakRSS is the process's peak resident set so far (VmHWM), in bytes.
func (r *Replica) PeakRSS() (uint64, error) {
	p, err := procfs.NewProc(r.cmd.Process.Pid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("replica %d status: %w", r.cmd.Process.Pid, err)
	}
	return st.VmHWM, nil
}

// peakRSS is reps' PeakRSS for a figure, e.g. "peak RSS 41/44 MiB".
func peakRSS(reps []*Replica) string {
	mib := make([]string, 0, len(reps))
	for _, rep := range reps {
		b, err := rep.PeakRSS()
		if err != nil {
			return "peak RSS unknown (" + err.Error() + ")"
		}
		mib = append(mib, strconv.FormatUint(b>>20, 10))
	}
	return "peak RSS " + strings.Join(mib, "/") + " MiB"
}

// Stop sends SIGTERM and waits up to 30s, then kills.
func (r *Replica) Stop() {
	if r.cmd.ProcessState != nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		r.Kill()
	}
}

// ScaleParams configure RunScale.
type ScaleParams struct {
	Exe      string        // the fleetload binary (its -replica mode)
	Role     string        // the replicas' role: quarantine (default), remediate, drain, store or correlate
	Replicas []int         // replica counts, e.g. 1, 2, 4
	Nodes    int           // nodes failing per round (store: events per round)
	Latency  time.Duration // per apiserver request
	Kill     bool          // a SIGKILL round: 2 replicas, one killed at a third
}

// scaleTarget is what the rounds of one role send and count.
type scaleTarget struct {
	prefix, noun, unit, done, twice string // the figures' words ("" twice: not counted)
	item                            string // what a round's Nodes are; "" is "nodes"
	// probe sends one node's work and reports whether it was done.
	probe func(ctx context.Context, node string) (bool, error)
	blast func(ctx context.Context, from, n int) LoadResult
	count func() (done, twice int)
	// progress, if not nil, is what the SIGKILL waits for (a third of
	// Nodes, in killUnit) instead of count's done: for a role whose
	// results come in bursts, the kill must land mid-work.
	progress func() int
	killUnit string
	// prepare, if not nil, sets up a round's nodes from..from+n before its
	// replicas start (outside the clock).
	prepare func(ctx context.Context, from, n int) error
	// mark, if not nil, is called before a round's blast; detail after
	// it (done: the round's nodes done) says more for the figure; settle,
	// if not nil, after the figure (the replicas still up) checks more.
	mark   func()
	detail func(done int) string
	settle func(ctx context.Context, r *Report, done int) error
	// proxy, if not nil, is the replicas' way to the apiserver: a round's
	// figure counts the watch requests opened during it.
	proxy *LatencyProxy
	// ceiling, if not nil, measures after the rounds (no replica up) what
	// the proxied apiserver sustains for n nodes' work without the role.
	ceiling func(ctx context.Context, r *Report, n int) error
}

// RunScale measures a role's throughput with 1, 2, 4 ... replicas as
// separate processes against one kube-apiserver behind a latency proxy,
// each round failing its own Nodes nodes at once; then a round in which
// one of two replicas is SIGKILLed a third of the way in: every node must
// be done exactly once. Quarantine (breaker off): cordons/s, flips counted
// on the watch, the Node writes per node must not grow. Remediate:
// RebootNodes/s for drain/succeeded actions produced to the actions topic
// (scaleRemediate). Drain: nodes drained/s for quarantine/applied actions
// produced to the actions topic, each node's pods evicted (scaleDrain).
// Store: Nodes events per round produced to the events topic, events
// stored/s counted as distinct ids in ClickHouse (scaleStore; no
// apiserver). Correlate: Nodes nodes per round with a pair of events that
// one rule judges, verdicts/s read back from the events topic
// (scaleCorrelate; no apiserver).
func RunScale(ctx context.Context, e *Env, sp ScaleParams, r *Report) error {
	if sp.Role == "" {
		sp.Role = "quarantine"
	}
	tg, args, setting, err := e.scaleRole(ctx, sp)
	if err != nil {
		return err
	}
	if tg.item == "" {
		tg.item = "nodes"
	}
	logf := os.Stderr // the replicas' warnings, with the command's
	args = append([]string{"-replica.brokers", e.brokers(), "-replica.role", sp.Role}, args...)
	adm, group := kadm.NewClient(e.KafkaClient()), pipeline.DefaultGroup(sp.Role)
	rounds := append([]int(nil), sp.Replicas...)
	if sp.Kill {
		rounds = append(rounds, -2)
	}
	var base float64
	var all []*Replica
	defer func() { // every replica ends with the run, whatever happened
		for _, rep := range all {
			rep.Kill()
		}
	}()
	for ri, n := range rounds {
		kill := n < 0
		if kill {
			n = -n
		}
		from := ri * sp.Nodes
		if tg.prepare != nil {
			if err := tg.prepare(ctx, from, sp.Nodes); err != nil {
				return err
			}
		}
		var reps []*Replica
		for i := range n {
			rep, err := StartReplica(sp.Exe, append(args, "-replica.identity", fmt.Sprintf("replica-%d-%d", ri, i)), logf)
			if err != nil {
				return err
			}
			reps = append(reps, rep)
			all = append(all, rep)
		}
		// Wait for the group to settle (every replica consuming) and a
		// probe node done: a round that starts while a late replica still
		// joins measures the rebalance, which waits for every replica's
		// batch in flight (BlockRebalanceOnPoll), not the replicas.
		if err := waitGroupSettled(ctx, adm, group, n); err != nil {
			return err
		}
		ok, err := tg.probe(ctx, fmt.Sprintf("probe-%d", ri))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("scale: %d replicas never %s the probe node", n, tg.done)
		}
		if tg.mark != nil {
			tg.mark()
		}
		c0, _ := tg.count()
		progress, killUnit := func() int { c, _ := tg.count(); return c }, tg.unit
		if tg.progress != nil {
			progress, killUnit = tg.progress, tg.killUnit
		}
		p0, w0 := progress(), tg.proxy.Watches()
		t0 := time.Now()
		res := tg.blast(ctx, from, sp.Nodes)
		killed := false
		ok = waitFor(ctx, 5*time.Minute, func() bool {
			c, _ := tg.count()
			if kill && !killed && progress()-p0 >= sp.Nodes/3 {
				reps[0].Kill()
				killed = true
			}
			return c-c0 >= sp.Nodes
		})
		took := time.Since(t0)
		time.Sleep(3 * time.Second) // a replayed batch would write now
		c1, twice := tg.count()
		rate := float64(c1-c0) / took.Seconds()
		if base == 0 {
			base = rate
		}
		if kill {
			tw := ""
			if tg.twice != "" {
				tw = fmt.Sprintf(" (%d %s)", twice, tg.twice)
			}
			r.Figure("%s SIGKILL: 2 replicas, one SIGKILLed after %d %s; %d of %d %s %s in %s%s%s",
				tg.prefix, sp.Nodes/3, killUnit, c1-c0, sp.Nodes, tg.item, tg.done, took.Round(time.Millisecond), tw, tg.detail(c1-c0))
			r.Check(ok && c1-c0 == sp.Nodes && twice == 0 && res.Failed == 0, "SIGKILL round: %d of %d %s, %d twice, %d events failed", c1-c0, sp.Nodes, tg.done, twice, res.Failed)
		} else {
			r.Figure("%s %d replica(s), %s: %d %s in %s = %.1f %s/s (%.2fx of 1 replica, %.0f%% of linear)%s; %s",
				tg.prefix, n, setting, c1-c0, tg.noun, took.Round(time.Millisecond), rate, tg.unit, rate/base, 100*rate/base/float64(n), tg.detail(c1-c0)+tg.watchesSince(w0), peakRSS(reps))
			r.Check(ok && c1-c0 == sp.Nodes && twice == 0, "%d replicas: %d of %d %s, %d twice", n, c1-c0, sp.Nodes, tg.done, twice)
		}
		if tg.settle != nil {
			if err := tg.settle(ctx, r, c1-c0); err != nil {
				return err
			}
		}
		for _, rep := range reps {
			rep.Stop()
		}
	}
	if tg.ceiling != nil {
		return tg.ceiling(ctx, r, sp.Nodes)
	}
	return nil
}

// watchesSince says, for a round's figure, how many watches the replicas
// opened since w0 (their first ones are older: a watch cut and opened
// again counts).
func (tg *scaleTarget) watchesSince(w0 int64) string {
	if tg.proxy == nil {
		return ""
	}
	return fmt.Sprintf(", %d watch requests", tg.proxy.Watches()-w0)
}

// waitGroupSettled waits until group is stable with n members, each
// consuming (testenv.GroupsSettled).
func waitGroupSettled(ctx context.Context, adm *kadm.Client, group string, n int) error {
	var last string
	if waitFor(ctx, 2*time.Minute, func() bool {
		var ok bool
		ok, last = testenv.GroupsSettled(ctx, adm, n, group)
		return ok
	}) {
		return nil
	}
	return fmt.Errorf("scale: group %s never settled with %d replicas consuming (last: %s)", group, n, last)
}

// scaleRole is sp.Role's target, the replicas' flags that reach its
// servers, and the rounds' setting for the figures. The roles that act
// on Kubernetes reach one kube-apiserver through a latency proxy; the
// store reaches ClickHouse directly.
func (e *Env) scaleRole(ctx context.Context, sp ScaleParams) (tg *scaleTarget, args []string, setting string, err error) {
	switch sp.Role {
	case "store", "correlate":
		if e.CHServer == nil {
			return nil, nil, "", fmt.Errorf("scale: role %s needs ClickHouse", sp.Role)
		}
		args = []string{"-replica.clickhouse", e.CHServer.Addr()}
		if sp.Role == "correlate" {
			tg, err = e.scaleCorrelate(ctx)
			return tg, args, "shipped defaults, the store role writing the events", err
		}
		bc := store.DefaultConfig()
		return e.scaleStore(ctx), args, fmt.Sprintf("shipped batches (%d records or %s)", bc.BatchRecords, bc.BatchLinger), nil
	}
	cluster := e.Clusters[0]
	k := e.Kubes[cluster]
	proxy, err := StartLatencyProxy(ctx, k, sp.Latency)
	if err != nil {
		return nil, nil, "", err
	}
	kc, err := proxy.Kubeconfig(e.TB.TempDir(), k)
	if err != nil {
		return nil, nil, "", err
	}
	switch sp.Role {
	case "quarantine":
		tg = e.scaleQuarantine(cluster, k, proxy)
	case "remediate":
		tg, err = e.scaleRemediate(ctx, cluster, k, proxy)
	case "drain":
		tg, err = e.scaleDrain(ctx, cluster, k, proxy)
	default:
		err = fmt.Errorf("scale: role %q: want quarantine, remediate, drain, store or correlate", sp.Role)
	}
	if tg != nil {
		tg.proxy = proxy
	}
	return tg, []string{"-replica.kube", cluster + "=" + kc}, sp.Latency.String() + " apiserver latency", err
}

// scaleQuarantine: Xid 79 events through the gateway, cordons seen on the
// Node watch.
func (e *Env) scaleQuarantine(cluster string, k *testenv.Kube, proxy *LatencyProxy) *scaleTarget {
	var w0 int
	return &scaleTarget{prefix: "scale", noun: "nodes cordoned", unit: "cordons", done: "cordoned", twice: "cordoned twice",
		probe: func(ctx context.Context, probe string) (bool, error) {
			if err := createNamedNode(k, probe); err != nil {
				return false, err
			}
			if err := e.Send(ctx, GRPC, cluster, []*datamodels.HealthEvent{fleetsim.Xid(probe, 0, 79)}); err != nil {
				return false, err
			}
			return waitFor(ctx, 120*time.Second, func() bool { _, ok := e.Cordons.At(cluster, probe); return ok }), nil
		},
		blast: func(ctx context.Context, from, n int) LoadResult { return e.blastRange(ctx, cluster, from, n) },
		count: e.Cordons.Count,
		mark:  func() { _, w0 = e.Cordons.NodeWrites() },
		detail: func(done int) string {
			_, w1 := e.Cordons.NodeWrites()
			return fmt.Sprintf(", %.2f Node writes per node", float64(w1-w0)/float64(max(1, done)))
		},
		ceiling: func(ctx context.Context, r *Report, m int) error {
			return e.quarantineCeiling(ctx, k, proxy, r, m)
		},
	}
}

// quarantineCeiling: a cordon's two Node writes alone, made by the test
// through the latency proxy for m fresh nodes — a status patch with the
// condition, then a patch of the metadata and spec (unschedulable, the
// taint, the label and annotations): the fields the role writes —
// quarantineCeilingInFlight nodes at once and no client rate limit: what
// the apiserver behind the proxy sustains on this machine without the
// role's client QPS, its decisions, the gateway or the broker.
func (e *Env) quarantineCeiling(ctx context.Context, k *testenv.Kube, proxy *LatencyProxy, r *Report, m int) error {
	const quarantineCeilingInFlight = 1024
	nodes, kc, err := ceilingNodes(k, proxy, m)
	if err != nil {
		return err
	}
	c0, _ := e.Cordons.Count()
	t0 := time.Now()
	var g errgroup.Group
	g.SetLimit(quarantineCeilingInFlight)
	for _, node := range nodes {
		g.Go(func() error {
			at := time.Now().UTC().Format(time.RFC3339)
			status := fmt.Sprintf(`{"status":{"conditions":[{"type":"GpuHealthy","status":"False","reason":"XidError79","message":"GPU has fallen off the bus (Xid 79)","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`, at, at)
			if _, err := kc.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{FieldManager: "ceiling"}, "status"); err != nil {
				return err
			}
			object := fmt.Sprintf(`{"metadata":{"labels":{"faultline.io/quarantined":"true"},"annotations":{"faultline.io/quarantined-by":"ceiling","faultline.io/quarantined-at":%q,"faultline.io/quarantine-reason":"rule gpu-fatal: XID_ERROR_79 on GPU 0","faultline.io/quarantine-state":"{\"faults\":{\"XID_ERROR_79/GPU=0\":{\"rule\":\"gpu-fatal\",\"at\":\"%s\",\"cordon\":true,\"taints\":[\"faultline.io/unhealthy\"]}}}"}},"spec":{"unschedulable":true,"taints":[{"key":"faultline.io/unhealthy","value":"gpu-fatal","effect":"NoSchedule"}]}}`, at, at)
			_, err := kc.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(object), metav1.PatchOptions{FieldManager: "ceiling"})
			return err
		})
	}
	err = g.Wait()
	took := time.Since(t0)
	waitFor(ctx, 30*time.Second, func() bool { c, _ := e.Cordons.Count(); return c-c0 >= m })
	c1, _ := e.Cordons.Count()
	r.Figure("scale ceiling: the test's own two Node patches per node through the proxy, %d nodes in flight, no client rate limit: %d nodes in %s = %.1f cordons/s; %d cordons seen on the watch",
		quarantineCeilingInFlight, m, took.Round(time.Millisecond), float64(m)/took.Seconds(), c1-c0)
	r.Check(err == nil && c1-c0 == m, "ceiling: %d of %d nodes cordoned (%v)", c1-c0, m, err)
	return nil
}

// ceilingNodes creates m fresh nodes for a ceiling (ceiling-00000, ...)
// and returns them with a client that reaches the apiserver through the
// proxy without a client rate limit.
func ceilingNodes(k *testenv.Kube, proxy *LatencyProxy, m int) ([]string, kubernetes.Interface, error) {
	nodes := make([]string, m)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("ceiling-%05d", i)
	}
	if err := createNodesNamed(k, nodes); err != nil {
		return nil, nil, err
	}
	kc, err := kubernetes.NewForConfig(unthrottled(k, proxy))
	return nodes, kc, err
}

// unthrottled is a client config that reaches k's apiserver through the
// proxy without a client rate limit (the ceilings' client).
func unthrottled(k *testenv.Kube, proxy *LatencyProxy) *rest.Config {
	return &rest.Config{Host: proxy.URL, BearerToken: k.RESTConfig().BearerToken, QPS: -1}
}

func (e *Env) blastRange(ctx context.Context, cluster string, from, n int) LoadResult {
	var res LoadResult
	const batch = 50
	for i := 0; i < n; i += batch {
		var evs []*datamodels.HealthEvent
		for j := i; j < min(n, i+batch); j++ {
			evs = append(evs, fleetsim.Xid(NodeName(from+j), 0, 79))
		}
		if err := e.Send(ctx, GRPC, cluster, evs); err != nil {
			res.Failed += int64(len(evs))
			continue
		}
		res.Sent += int64(len(evs))
	}
	return res
}

func createNamedNode(k *testenv.Kube, name string) error {
	return createNodesNamed(k, []string{name})
}
