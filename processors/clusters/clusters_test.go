package clusters

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestFlagsAndValidate(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.RegisterFlags(fs, "kube.")
	if err := fs.Parse([]string{"--kube.clusters=a=/etc/a.yaml,b=in-cluster", "--kube.dry-run-clusters=b,c", "--kube.qps=150"}); err != nil {
		t.Fatal(err)
	}
	if got := c.UnlistedDryRun(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("unlisted dry-run clusters %v, want [c]", got)
	}
	if got := c.Names(); strings.Join(got, ",") != "a,b,c" || c.QPS != 150 {
		t.Fatalf("names %v qps %v", got, c.QPS)
	}
	if r := c.resolved(); len(r.Clusters) != 3 || !r.Clusters[1].DryRun || r.Clusters[0].DryRun || r.Clusters[1].Kubeconfig != InCluster ||
		!r.Clusters[2].DryRun || r.Clusters[2].Name != "c" {
		t.Fatalf("clusters %+v", r.Clusters)
	}
	if err := c.Validate("kube."); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.QPS = 0 }, "kube.qps"},
		// NaN compares false with every bound.
		{func(c *Config) { c.QPS = float32(math.NaN()) }, "kube.qps: must be a finite number above 0, got NaN"},
		{func(c *Config) { c.QPS = float32(math.Inf(1)) }, "kube.qps: must be a finite number above 0, got +Inf"},
		{func(c *Config) { c.Clusters[0].QPS = float32(math.NaN()) }, `kube.clusters[0].qps: cluster "a": must be a finite number not below 0, got NaN`},
		{func(c *Config) { c.Clusters[0].QPS = -1 }, `kube.clusters[0].qps: cluster "a": must be a finite number not below 0, got -1`},
		{func(c *Config) { c.Clusters[0].Burst = -1 }, `kube.clusters[0].burst: cluster "a": must not be negative, got -1`},
		{func(c *Config) { c.Burst = 0 }, "kube.burst"},
		{func(c *Config) { c.Clusters = append(c.Clusters, Cluster{Name: "a", Kubeconfig: "x"}) }, "kube.clusters[2].name"},
		{func(c *Config) { c.Clusters = append(c.Clusters, Cluster{Name: "d"}) }, "kube.clusters[2].kubeconfig"},
		{func(c *Config) { c.DryRunClusters = append(c.DryRunClusters, "x/y") }, "kube.dry_run_clusters[2]"},
		{func(c *Config) { c.Clusters[1].Context = "gpu-east" }, `kube.clusters[1].context: cluster "b": a context names an entry of a kubeconfig file`},
		{func(c *Config) { c.Clusters[0].Name = "a/b" }, "kube.clusters[0].name"},
		// Names the gateway never stamps (tokens and certificates name
		// lowercase DNS labels): no event would ever match, and the
		// cluster's events would all be decided as dry-run.
		{func(c *Config) { c.Clusters[0].Name = "Prod" }, `kube.clusters[0].name: "Prod" is not a cluster name`},
		{func(c *Config) { c.Clusters[0].Name = "prod_east" }, `kube.clusters[0].name: "prod_east" is not a cluster name`},
		{func(c *Config) { c.DryRunClusters = append(c.DryRunClusters, "Staging") }, `kube.dry_run_clusters[2]: "Staging" is not a cluster name`},
	} {
		cc := c
		cc.Clusters = append([]Cluster(nil), c.Clusters...)
		cc.DryRunClusters = append([]string(nil), c.DryRunClusters...)
		tc.mut(&cc)
		if err := cc.Validate("kube."); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want it to name %s", err, tc.want)
		}
	}
	if _, err := ParseClusters("novalue"); err == nil {
		t.Fatal("ParseClusters accepted a pair without '='")
	}
}

// TestQPSFlag: --kube.qps is one number; trailing text is refused, not
// dropped ("5,10" was 5, "100 200" was 100).
func TestQPSFlag(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want float32 // 0: refused
	}{
		{"150", 150},
		{"2.5", 2.5},
		{"1e3", 1000},
		{"5,10", 0},
		{"100 200", 0},
		{"100qps", 0},
		{"", 0},
		{"1e39", 0}, // out of float32's range
	} {
		c := DefaultConfig()
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs, "kube.")
		err := fs.Parse([]string{"--kube.qps=" + tc.arg})
		switch {
		case tc.want == 0 && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.arg))):
			t.Errorf("--kube.qps=%s: %v (qps %v), want an error naming the value", tc.arg, err, c.QPS)
		case tc.want != 0 && (err != nil || c.QPS != tc.want):
			t.Errorf("--kube.qps=%s: %v, qps %v, want %v", tc.arg, err, c.QPS, tc.want)
		}
	}
}

func TestRegistryLazyAndUnknown(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Clusters = []Cluster{{Name: "a", Kubeconfig: kc, QPS: 42}, {Name: "missing", Kubeconfig: filepath.Join(dir, "nope")}, {Name: "dry", DryRun: true}}
	r := NewRegistry(cfg, nil)
	c, err := r.Get("a")
	if err != nil || c.Kube == nil {
		t.Fatalf("Get(a) = %v, %v", c, err)
	}
	if c2, _ := r.Get("a"); c2 != c {
		t.Fatal("client not reused")
	}
	rc, err := r.restConfig(cfg.Clusters[0])
	if err != nil || rc.QPS != 42 || rc.Burst != DefaultBurst {
		t.Fatalf("rest config qps %v burst %v err %v", rc.QPS, rc.Burst, err)
	}
	if _, err := r.Get("missing"); err == nil {
		t.Fatal("a kubeconfig that does not exist must be an error")
	}
	if d, err := r.Get("dry"); err != nil || d.Kube != nil || !d.DryRun {
		t.Fatalf("dry-run cluster without kubeconfig: %+v %v", d, err)
	}
	if _, err := r.Get("other"); !errors.Is(err, ErrUnknownCluster) {
		t.Fatalf("unknown cluster: %v", err)
	}
}

// TestRegistrySeveral: one cluster configured is alone, however often it
// is built; a second, configured or installed, makes several.
func TestRegistrySeveral(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Clusters = []Cluster{{Name: "a", DryRun: true}}
	r := NewRegistry(cfg, nil)
	if r.Several() {
		t.Fatal("one configured cluster is several")
	}
	if _, err := r.Get("a"); err != nil || r.Several() {
		t.Fatalf("one cluster, built: several %v, %v", r.Several(), err)
	}
	r.SetClient("b", fake.NewClientset(), true)
	if !r.Several() {
		t.Fatal("a configured cluster and an installed one are not several")
	}
	cfg.Clusters = append(cfg.Clusters, Cluster{Name: "b", DryRun: true})
	if r := NewRegistry(cfg, nil); !r.Several() {
		t.Fatal("two configured clusters are not several")
	}
}

func TestGateBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	g := NewGate(func() time.Time { return now })
	if ok, _ := g.Ready(context.Background()); !ok {
		t.Fatal("new gate not ready")
	}
	var last time.Duration
	for i := range 12 {
		next := g.Fail(errors.New("down"))
		d := next.Sub(now)
		if d < g.MinBackoff/2 || d > g.MaxBackoff {
			t.Fatalf("failure %d: backoff %v out of range", i+1, d)
		}
		last = d
	}
	if last < g.MaxBackoff/2 {
		t.Fatalf("backoff did not grow to the cap: %v", last)
	}
	if ok, _ := g.Ready(context.Background()); ok {
		t.Fatal("ready during backoff")
	}
	g.OK()
	if ok, _ := g.Ready(context.Background()); !ok || g.Failures() != 0 {
		t.Fatal("OK did not reset the gate")
	}
}

// TestGateSlow: a cluster is slow while its requests' moving average is
// over the limit, never with limit 0.
func TestGateSlow(t *testing.T) {
	const limit = 500 * time.Millisecond
	g := NewGate(nil)
	if g.Slow(limit) {
		t.Fatal("slow before any request")
	}
	for i, step := range []struct {
		observe time.Duration
		slow    bool
	}{
		{100 * time.Millisecond, false}, // the first sets the average
		{2 * time.Second, true},         // 1.05 s: one request past twice the limit
		{100 * time.Millisecond, true},  // 575 ms
		{100 * time.Millisecond, false}, // 337 ms
		{900 * time.Millisecond, true},  // 618 ms
	} {
		g.Observe(step.observe)
		if got := g.Slow(limit); got != step.slow {
			t.Fatalf("step %d: after %v, average %v: slow %v, want %v", i, step.observe, g.Latency(), got, step.slow)
		}
		if g.Slow(0) {
			t.Fatalf("step %d: slow with no limit", i)
		}
	}
}

// TestGateSlowInFlight: a write in flight for longer than twice the limit
// makes the cluster slow before it is answered (its answer would); a
// shorter one does not, nor once answered fast.
func TestGateSlowInFlight(t *testing.T) {
	const limit = 20 * time.Millisecond
	g := NewGate(nil)
	g.Observe(time.Millisecond)
	// The gate times in-flight writes by the wall clock: a check that
	// the gate is not slow yet only holds while under twice the limit
	// has passed (a loaded machine wakes the sleep late).
	sent := time.Now()
	done := g.Sent()
	if g.Slow(limit) && time.Since(sent) <= 2*limit {
		t.Fatal("slow at once")
	}
	time.Sleep(limit)
	if g.Slow(limit) && time.Since(sent) <= 2*limit {
		t.Fatal("slow after one limit in flight")
	}
	time.Sleep(limit + 5*time.Millisecond)
	if !g.Slow(limit) {
		t.Fatal("not slow after twice the limit in flight")
	}
	done()
	if !g.Slow(limit) {
		t.Fatalf("its answer did not make the average slow: %v", g.Latency())
	}
	fast := NewGate(nil)
	fast.Sent()()
	time.Sleep(3 * limit)
	if fast.Slow(limit) {
		t.Fatal("an answered write counted as in flight")
	}
}

// TestWhileFast: the context ends (cause ErrSlow) once a write has been in
// flight for twice the limit, not while the cluster is fast, and not
// after its stop.
func TestWhileFast(t *testing.T) {
	const limit = 20 * time.Millisecond
	g := NewGate(nil)
	ctx, stop := g.WhileFast(context.Background(), limit)
	time.Sleep(3 * limit)
	if ctx.Err() != nil {
		t.Fatal("cancelled while fast")
	}
	done := g.Sent()
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), ErrSlow) {
			t.Fatalf("cause %v, want ErrSlow", context.Cause(ctx))
		}
	case <-time.After(time.Second):
		t.Fatal("not cancelled with a write in flight for twice the limit")
	}
	stop()
	done()

	ctx, stop = g.WhileFast(context.Background(), 0)
	if ctx != context.Background() {
		t.Fatal("limit 0: not ctx itself")
	}
	stop()
	ctx, stop = NewGate(nil).WhileFast(context.Background(), limit)
	stop()
	if !errors.Is(ctx.Err(), context.Canceled) || errors.Is(context.Cause(ctx), ErrSlow) {
		t.Fatalf("after stop: %v (cause %v)", ctx.Err(), context.Cause(ctx))
	}
}

// TestWhileFastTinyLimit: a limit under 2ns (slow_cluster = "1ns": the
// roles refuse only negative ones) checks every millisecond; it made a
// ticker of interval 0, whose panic took the processor down at every
// batch mixing clusters.
func TestWhileFastTinyLimit(t *testing.T) {
	g := NewGate(nil)
	done := g.Sent()
	defer done()
	ctx, stop := g.WhileFast(context.Background(), time.Nanosecond)
	defer stop()
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), ErrSlow) {
			t.Fatalf("cause %v, want ErrSlow", context.Cause(ctx))
		}
	case <-time.After(time.Second):
		t.Fatal("not cancelled with a write in flight for twice the limit")
	}
}

// TestTimedWrites: a cluster's writes are timed into its gate, its reads
// are not (a list of 10,000 nodes says nothing of how fast a patch is).
func TestTimedWrites(t *testing.T) {
	g := NewGate(nil)
	rt := timedRT{g: g, own: roundTrip(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet {
			time.Sleep(300 * time.Millisecond)
		} else {
			time.Sleep(30 * time.Millisecond)
		}
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})}
	for _, method := range []string{http.MethodPatch, http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodGet} {
		req, _ := http.NewRequest(method, "https://apiserver.invalid/api/v1/nodes", nil)
		if _, err := rt.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	if l := g.Latency(); l < 30*time.Millisecond || l > 150*time.Millisecond {
		t.Fatalf("the writes took 30ms each, the reads 300ms: average %v", l)
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestGateWait: a backoff ending by until is waited out, one ending after
// it is not; a cluster that cannot be reached is not tried again until it
// answers a probe, and not waited for.
func TestGateWait(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	unavailable := apierrors.NewServiceUnavailable("down")
	forbidden := apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("rbac"))
	timedOut := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/nodes", Err: context.DeadlineExceeded}
	for _, tc := range []struct {
		name     string
		err      error
		backoff  time.Duration
		until    time.Duration
		probe    []error // the probe's answers in turn (the last repeated); nil: no probe
		want     []bool  // one Wait each, ProbeInterval after the failure and apart
		probes   int
		failures int // after the Waits
	}{
		{"backoff past until", unavailable, time.Minute, time.Second, []error{nil}, []bool{false}, 0, 1},
		{"backoff by until waited out", unavailable, 100 * time.Millisecond, time.Minute, []error{nil}, []bool{true}, 0, 1},
		{"unreachable, no probe: backoff waited out", refused, 100 * time.Millisecond, time.Minute, nil, []bool{true}, 0, 1},
		{"unreachable, silent: not waited for", refused, time.Second, time.Minute, []error{refused}, []bool{false}, 1, 1},
		{"unreachable, answers: backoff afresh", refused, time.Minute, 0, []error{nil}, []bool{true}, 1, 0},
		{"unreachable, answers the second probe", refused, time.Minute, 0, []error{refused, nil}, []bool{false, true}, 2, 0},
		{"unreachable, answers not ready: it serves", refused, time.Minute, 0, []error{unavailable}, []bool{true}, 1, 0},
		{"unreachable, answers forbidden: it serves", refused, time.Minute, 0, []error{forbidden}, []bool{true}, 1, 0},
		{"unreachable past its backoff: probed first, backed off again", refused, time.Millisecond, 0, []error{refused}, []bool{false, false}, 2, 3},
		// A request that got no answer in time: probed before it is
		// tried again; once it answers, its backoff stands.
		{"timed out, silent: not waited for", timedOut, time.Millisecond, time.Minute, []error{timedOut}, []bool{false, false}, 2, 3},
		{"timed out, answers: its backoff stands", timedOut, time.Minute, time.Second, []error{nil}, []bool{false}, 1, 1},
		{"timed out, answers: its backoff waited out", timedOut, 100 * time.Millisecond, time.Minute, []error{nil}, []bool{true}, 1, 1},
		{"timed out, no probe: backoff waited out", timedOut, 100 * time.Millisecond, time.Minute, nil, []bool{true}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGate(nil)
			g.MinBackoff, g.MaxBackoff, g.ProbeInterval = tc.backoff, tc.backoff, 20*time.Millisecond
			probes := 0
			if tc.probe != nil {
				g.Probe = func(context.Context) error {
					probes++
					return tc.probe[min(probes, len(tc.probe))-1]
				}
			}
			g.Fail(tc.err)
			var got []bool
			for range tc.want {
				time.Sleep(g.ProbeInterval)
				start := time.Now()
				got = append(got, g.Wait(context.Background(), start.Add(tc.until)))
				if took := time.Since(start); took > time.Second {
					t.Fatalf("Wait took %v", took)
				}
			}
			if !reflect.DeepEqual(got, tc.want) || probes != tc.probes || g.Failures() != tc.failures {
				t.Fatalf("Wait = %v after %d probes, %d failures; want %v, %d, %d", got, probes, g.Failures(), tc.want, tc.probes, tc.failures)
			}
			if ready, _ := g.Ready(context.Background()); ready != tc.want[len(tc.want)-1] {
				t.Fatalf("after Wait: ready %v", ready)
			}
		})
	}
}

// TestGateWaitShared: callers of Wait on one unreachable cluster probe it
// one at a time, at most once per ProbeInterval, and all may go on once
// it answers.
func TestGateWaitShared(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	g := NewGate(nil)
	g.MinBackoff, g.MaxBackoff, g.ProbeInterval = time.Minute, time.Minute, 10*time.Millisecond
	var (
		mu               sync.Mutex
		probes, at, peak int
		answer           bool
	)
	g.Probe = func(context.Context) error {
		mu.Lock()
		probes, at = probes+1, at+1
		peak = max(peak, at)
		ok := answer
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		at--
		mu.Unlock()
		if ok {
			return nil
		}
		return refused
	}
	g.Fail(refused)
	start := time.Now()
	var wg sync.WaitGroup
	var opened sync.Map // caller -> whether its Wait reported the gate open
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 10*time.Second {
				if g.Wait(context.Background(), time.Now()) {
					opened.Store(i, true)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	// Refused a few times first (a loaded machine schedules the waiters
	// late: a fixed 100ms saw two probes).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := probes
		mu.Unlock()
		if n >= 3 {
			break
		}
	}
	mu.Lock()
	answer = true
	mu.Unlock()
	wg.Wait()
	took := time.Since(start)
	for i := range 20 {
		if _, ok := opened.Load(i); !ok {
			t.Fatalf("caller %d never found the gate open", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if peak != 1 || probes > int(took/g.ProbeInterval)+1 || probes < 3 {
		t.Fatalf("%d probes in %v, %d at once", probes, took, peak)
	}
}

// TestGateReadyWhileProbing: while a cluster that timed out is probed in
// the background (its probe unanswered after ProbeInterval, its backoff
// over), Ready reports a time to ask again that is still ahead, not the
// past end of the backoff: a caller that rests until then does not come
// straight back.
func TestGateReadyWhileProbing(t *testing.T) {
	g := NewGate(nil)
	g.MinBackoff, g.MaxBackoff, g.ProbeInterval, g.ProbeTimeout = 10*time.Millisecond, 10*time.Millisecond, 200*time.Millisecond, 5*time.Second // a stall under 200ms cannot pass the time it gives
	silent := make(chan struct{})
	defer close(silent)
	probes := make(chan struct{}, 10)
	g.Probe = func(ctx context.Context) error {
		probes <- struct{}{}
		select {
		case <-ctx.Done():
		case <-silent:
		}
		return ctx.Err()
	}
	g.Fail(context.DeadlineExceeded)
	time.Sleep(30 * time.Millisecond) // past the backoff
	for i := range 3 {
		ready, next := g.Ready(context.Background())
		if now := time.Now(); ready || !next.After(now) {
			t.Fatalf("ask %d while probing: ready %v, ask again at %v (now %v); want later", i, ready, next, now)
		}
	}
	if len(probes) != 1 {
		t.Fatalf("%d probes, want 1", len(probes))
	}
}

func TestRetriable(t *testing.T) {
	gr := schema.GroupResource{Resource: "nodes"}
	refused := &url.Error{Op: "Patch", URL: "https://127.0.0.1:6443/api/v1/nodes/n",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}
	for _, tc := range []struct {
		err                              error
		retriable, unreachable, timedOut bool
	}{
		{nil, false, false, false},
		{apierrors.NewConflict(gr, "n", errors.New("x")), false, false, false},
		{apierrors.NewNotFound(gr, "n"), false, false, false},
		{apierrors.NewServiceUnavailable("down"), true, false, false},
		{apierrors.NewTooManyRequests("slow", 1), true, false, false},
		{apierrors.NewForbidden(gr, "n", errors.New("rbac")), true, false, false},
		{apierrors.NewTimeoutError("slow", 1), true, false, false}, // a 504 is an answer
		{refused, true, true, false},
		{&url.Error{Op: "Get", URL: "https://127.0.0.1:6443/readyz", Err: io.EOF}, true, true, false},
		{fmt.Errorf("patch: %w", errors.New("read tcp: connection reset by peer")), true, true, false},
		{context.DeadlineExceeded, true, false, true},
		{&url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api", Err: timeoutErr{}}, true, false, true},
	} {
		if got := Retriable(tc.err); got != tc.retriable {
			t.Errorf("Retriable(%v) = %v, want %v", tc.err, got, tc.retriable)
		}
		if got := Unreachable(tc.err); got != tc.unreachable {
			t.Errorf("Unreachable(%v) = %v, want %v", tc.err, got, tc.unreachable)
		}
		if got := TimedOut(tc.err); got != tc.timedOut {
			t.Errorf("TimedOut(%v) = %v, want %v", tc.err, got, tc.timedOut)
		}
	}
}

// timeoutErr is a transport's timeout (net/http's "Client.Timeout exceeded").
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "Client.Timeout exceeded while awaiting headers" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestTry: the per-cluster step every Kubernetes-facing role takes — the
// Gate decides whether the step runs, the step's error decides the Gate.
func TestTry(t *testing.T) {
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := DefaultConfig()
	cfg.Clusters = []Cluster{{Name: "broken", Kubeconfig: "/does/not/exist"}}
	reg := NewRegistry(cfg, func() time.Time { return now })
	live := reg.SetClient("live", kube, false)
	unavailable := apierrors.NewServiceUnavailable("down")
	invalid := apierrors.NewBadRequest("bad")
	ok := func(context.Context, *Client) error { return nil }

	a := reg.Try(context.Background(), "live", ok)
	if a.Err != nil || !a.Ran || !a.Live() || a.Client != live {
		t.Fatalf("healthy: %+v", a)
	}
	// The cluster's error backs the cluster off and is retriable.
	a = reg.Try(context.Background(), "live", func(context.Context, *Client) error { return unavailable })
	if !a.Ran || !a.Retriable || a.RetryAt.IsZero() || live.Gate.Failures() != 1 {
		t.Fatalf("503: %+v failures %d", a, live.Gate.Failures())
	}
	// While backing off, the step is not run.
	ran := false
	a = reg.Try(context.Background(), "live", func(context.Context, *Client) error { ran = true; return nil })
	if ran || a.Ran || !a.Retriable || a.RetryAt != live.Gate.next || !errors.Is(a.Err, unavailable) {
		t.Fatalf("backing off: ran %v %+v", ran, a)
	}
	// After the backoff a success resets the gate.
	now = now.Add(time.Minute)
	if a = reg.Try(context.Background(), "live", ok); a.Err != nil || live.Gate.Failures() != 0 {
		t.Fatalf("recovered: %+v failures %d", a, live.Gate.Failures())
	}
	// The work's own error is not retriable and leaves the gate alone.
	a = reg.Try(context.Background(), "live", func(context.Context, *Client) error { return invalid })
	if !a.Ran || a.Retriable || live.Gate.Failures() != 0 {
		t.Fatalf("400: %+v", a)
	}
	// An error after ctx ended is nobody's: retriable, gate untouched.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	a = reg.Try(ctx, "live", func(ctx context.Context, _ *Client) error { return ctx.Err() })
	if !a.Retriable || !a.RetryAt.IsZero() || live.Gate.Failures() != 0 {
		t.Fatalf("ctx ended: %+v failures %d", a, live.Gate.Failures())
	}
	// A cluster that is not configured runs the step without a client.
	var got *Client = live
	a = reg.Try(context.Background(), "elsewhere", func(_ context.Context, cl *Client) error { got = cl; return unavailable })
	if got != nil || !a.Ran || a.Live() || a.Retriable {
		t.Fatalf("unknown cluster: client %v %+v", got, a)
	}
	// A client that cannot be built: not run, retriable, when is the caller's.
	a = reg.Try(context.Background(), "broken", func(context.Context, *Client) error { t.Fatal("ran"); return nil })
	if a.Ran || !a.Retriable || !a.RetryAt.IsZero() || a.Client != nil || a.Err == nil {
		t.Fatalf("unavailable client: %+v", a)
	}
}

// TestTryThrottledNotTheClusters: the client's own rate limiter refusing
// to wait past the batch's deadline (more requests for one cluster than its
// QPS lets through in time) is the caller's timing, not the cluster's
// trouble: retriable, the gate untouched. client-go's error does not wrap
// context.DeadlineExceeded, and a healthy cluster was backed off.
func TestTryThrottledNotTheClusters(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	defer srv.Close()
	reg := NewRegistry(DefaultConfig(), nil)
	cl, err := reg.SetConfig("c", &rest.Config{Host: srv.URL, QPS: 1, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	list := func(ctx context.Context, cl *Client) error {
		_, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err
	}
	if a := reg.Try(ctx, "c", list); a.Err != nil {
		t.Fatalf("first request: %v", a.Err)
	}
	a := reg.Try(ctx, "c", list)
	if a.Err == nil || !Throttled(a.Err) || ctx.Err() != nil {
		t.Fatalf("second request: %v (ctx %v), want the client rate limiter's refusal before the deadline", a.Err, ctx.Err())
	}
	if !a.Retriable || !a.RetryAt.IsZero() || cl.Gate.Failures() != 0 {
		t.Fatalf("throttled: %+v failures %d, want retriable, no RetryAt, the gate untouched", a, cl.Gate.Failures())
	}
}

// TestClientsOwnRateLimit: kube.qps and kube.burst bound each client a
// role builds, client-go's own bucket per client: a burst on the dynamic
// client (the janitor's and remediate's writes) does not queue the typed
// one's requests (their node GETs and Events), so a role using both can
// send up to twice kube.qps to the cluster. One shared bucket took the
// janitor's 300 reboots' tail from 1.04 s to 2.56 s.
func TestClientsOwnRateLimit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	defer srv.Close()
	// One request per client, then none for 1000s.
	cl, err := NewRegistry(DefaultConfig(), nil).SetConfig("c", &rest.Config{Host: srv.URL, QPS: 0.001, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	for _, pair := range []struct {
		name  string
		typed kubernetes.Interface
		dyn   dynamic.Interface
	}{{"requests", cl.Kube, cl.Dynamic}, {"watches", cl.WatchKube, cl.WatchDynamic}} {
		if _, err := pair.typed.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("%s: typed list: %v", pair.name, err)
		}
		if _, err := pair.dyn.Resource(nodes).List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("%s: dynamic list after the typed one used its burst of 1: %v; want the dynamic client's own bucket", pair.name, err)
		}
	}
}

// TestClusterToken: a token_file or token_env replaces the kubeconfig's
// credentials; a token that cannot be read stops start-up naming the key,
// never showing a value.
func TestClusterToken(t *testing.T) {
	const planted = "planted-kube-token-3f9a"
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: kubeconfig-token, client-certificate-data: YWRtaW4tY2VydA==, client-key-data: YWRtaW4ta2V5}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(planted+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAULTLINE_TEST_KUBE_TOKEN", planted)
	r := NewRegistry(DefaultConfig(), nil)
	rc, err := r.restConfig(Cluster{Name: "f", Kubeconfig: kc, TokenFile: tokFile})
	if err != nil || rc.BearerTokenFile != tokFile || rc.BearerToken != "" {
		t.Fatalf("token_file: %v token %q file %q", err, rc.BearerToken, rc.BearerTokenFile)
	}
	// The kubeconfig's client certificate goes with its token: the API
	// server would take the certificate's user (an admin.conf's
	// system:masters) before the token.
	if len(rc.CertData) != 0 || len(rc.KeyData) != 0 || rc.CertFile != "" || rc.KeyFile != "" {
		t.Fatalf("token_file keeps the kubeconfig's client certificate: %q", rc.CertData)
	}
	rc, err = r.restConfig(Cluster{Name: "e", Kubeconfig: kc, TokenEnv: "FAULTLINE_TEST_KUBE_TOKEN"})
	if err != nil || rc.BearerToken != planted || rc.BearerTokenFile != "" || len(rc.CertData) != 0 || len(rc.KeyData) != 0 {
		t.Fatalf("token_env: %v (client certificate %q)", err, rc.CertData)
	}
	if s := fmt.Sprintf("%v %+v %s", rc, rc, rc); strings.Contains(s, planted) {
		t.Fatalf("the rest config prints the token: %s", s)
	}
	rc, err = r.restConfig(Cluster{Name: "k", Kubeconfig: kc})
	if err != nil || rc.BearerToken != "kubeconfig-token" || string(rc.CertData) != "admin-cert" {
		t.Fatalf("kubeconfig credentials: %v", err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.restConfig(Cluster{Name: "p", Kubeconfig: plain, TokenFile: tokFile}); err == nil || !strings.Contains(err.Error(), "never sent in clear") {
		t.Fatalf("token over http: %v", err)
	}
	cfg := DefaultConfig()
	cfg.Clusters = []Cluster{{Name: "a", Kubeconfig: kc, TokenEnv: "FAULTLINE_TEST_KUBE_TOKEN_UNSET"}}
	if err := cfg.Validate("kube."); err == nil || !strings.HasPrefix(err.Error(), "kube.clusters[0].token_env: environment variable FAULTLINE_TEST_KUBE_TOKEN_UNSET is not set") {
		t.Fatalf("unset token_env: %v", err)
	}
	cfg.Clusters[0].TokenEnv, cfg.Clusters[0].TokenFile = "FAULTLINE_TEST_KUBE_TOKEN", tokFile
	if err := cfg.Validate("kube."); err == nil || !strings.HasPrefix(err.Error(), "kube.clusters[0].token_file: both") || strings.Contains(err.Error(), planted) {
		t.Fatalf("both: %v", err)
	}
}

// TestReloadedKubeconfigOtherServer: a cluster's kubeconfig rewritten to
// name another API server is not followed (client-go fixed the host when
// the clients were built): no request is sent — neither the new
// credentials to the old server nor anything to a server the file no
// longer names — the cluster's requests fail saying a restart is needed,
// and that is logged once. The file put back on the first server with a
// rotated token is followed again; a broken file is logged once and the
// credentials last loaded go on. Before, the old server got the new
// server's token, silently.
func TestReloadedKubeconfigOtherServer(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	server := func(name string) *httptest.Server {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, name+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	oldSrv, newSrv := server("old"), server("new")
	rcOf := func(srv *httptest.Server) *rest.Config {
		return &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{
			CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}}
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	writeAtomic(t, kc, kubeconfigWith(t, rcOf(oldSrv), "A"))
	var logs bytes.Buffer
	cfg := DefaultConfig()
	cfg.Clusters = []Cluster{{Name: "c", Kubeconfig: kc}}
	cl, err := NewRegistry(cfg, nil).WithLog(slog.New(slog.NewTextHandler(&logs, nil))).Get("c")
	if err != nil {
		t.Fatal(err)
	}
	list := func() error {
		_, err := cl.Kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		return err
	}
	// rewrite puts b in the file and lets the next request look at it.
	rewrite := func(b []byte) {
		writeAtomic(t, kc, b)
		time.Sleep(ReloadEvery + 100*time.Millisecond)
	}
	if err := list(); err != nil {
		t.Fatal(err)
	}

	rewrite(kubeconfigWith(t, rcOf(newSrv), "B"))
	for i := range 2 {
		if err := list(); err == nil || !strings.Contains(err.Error(), "restart") {
			t.Fatalf("request %d after the kubeconfig moved to another server: %v; want an error saying a restart is needed", i, err)
		}
		time.Sleep(ReloadEvery + 100*time.Millisecond)
	}
	if n := strings.Count(logs.String(), newSrv.URL); n != 1 {
		t.Fatalf("the move was logged %d times, want once:\n%s", n, logs.String())
	}

	rewrite(kubeconfigWith(t, rcOf(oldSrv), "C")) // back, the token rotated
	if err := list(); err != nil {
		t.Fatalf("the kubeconfig back on its server, a new token: %v", err)
	}
	logs.Reset()
	rewrite([]byte("{not a kubeconfig"))
	for range 2 {
		if err := list(); err != nil {
			t.Fatalf("a broken kubeconfig: %v; want the credentials last loaded", err)
		}
		time.Sleep(ReloadEvery + 100*time.Millisecond)
	}
	if n := strings.Count(logs.String(), "cluster=c"); n != 1 {
		t.Fatalf("the broken kubeconfig was logged %d times, want once:\n%s", n, logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"old Bearer A", "old Bearer C", "old Bearer C", "old Bearer C"}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("requests seen %q, want %q", seen, want)
	}
}

// TestReloadedKubeconfigSameServerSpelledOtherwise: a kubeconfig rewritten
// with the same API server spelled with its scheme's default port (or
// without it), or in other letter case, is the same server: its new
// credentials are followed, not refused as another server. Another host
// (an IP for the DNS name of the same server, which cannot be recognised)
// is refused, the error and the log saying a restart follows it.
func TestReloadedKubeconfigSameServerSpelledOtherwise(t *testing.T) {
	for _, tc := range []struct {
		built, now string
		moved      bool
	}{
		{"https://h", "https://h:443", false},
		{"https://h:443", "https://H/", false},
		{"http://h", "http://h:80", false},
		{"https://[fd00::1]:443", "https://[fd00::1]", false},
		{"https://h", "https://h:6443", true},
		{"http://h", "http://h:443", true},
		{"https://h", "https://10.0.0.1", true},
	} {
		t.Run(tc.built+" "+tc.now, func(t *testing.T) {
			var logs bytes.Buffer
			k := &reloading{
				name:   "c",
				paths:  []string{"kubeconfig"},
				server: serverOf(&rest.Config{Host: tc.built}),
				log:    slog.New(slog.NewTextHandler(&logs, nil)),
				load:   func() (*rest.Config, error) { return &rest.Config{Host: tc.now, BearerToken: "B"}, nil },
			}
			if !k.reload() {
				t.Fatalf("not reloaded: %s", logs.String())
			}
			if tc.moved != (k.moved != nil) {
				t.Fatalf("moved %v, want moved %t", k.moved, tc.moved)
			}
			if !tc.moved {
				if k.rt == nil {
					t.Fatal("the new credentials are not followed")
				}
				return
			}
			if !strings.Contains(k.moved.Error(), "a restart follows the new server") || !strings.Contains(logs.String(), "restart the processor to follow the new server") {
				t.Fatalf("error %v, logged %s: want both saying a restart follows the new server", k.moved, logs.String())
			}
		})
	}
}

// TestReloadedKubeconfigRetriedUntilItLoads: a rotated kubeconfig that
// names a file arriving after it (a certificate-authority written a
// second later) fails to load at the first look; it is logged once and
// loaded again at every look, so the new token is used as soon as the file
// lands. Before, the content was marked seen before the load and never
// tried again: the old token went on until the kubeconfig changed again or
// a restart (and the cluster failed once that token was revoked).
func TestReloadedKubeconfigRetriedUntilItLoads(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	defer srv.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	dir := t.TempDir()
	kc, caFile := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "ca.crt")
	writeAtomic(t, kc, kubeconfigWith(t, &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}}, "A"))
	var logs bytes.Buffer
	cfg := DefaultConfig()
	cfg.Clusters = []Cluster{{Name: "c", Kubeconfig: kc}}
	cl, err := NewRegistry(cfg, nil).WithLog(slog.New(slog.NewTextHandler(&logs, nil))).Get("c")
	if err != nil {
		t.Fatal(err)
	}
	list := func() {
		t.Helper()
		if _, err := cl.Kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list()

	// Token C, its CA a file not written yet.
	rotated := clientcmdapi.NewConfig()
	rotated.Clusters["c"] = &clientcmdapi.Cluster{Server: srv.URL, CertificateAuthority: caFile}
	rotated.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "C"}
	rotated.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	rotated.CurrentContext = "c"
	b, err := clientcmd.Write(*rotated)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, kc, b)
	for range 2 {
		time.Sleep(ReloadEvery + 100*time.Millisecond)
		list() // the old credentials go on
	}
	if n := strings.Count(logs.String(), "cluster=c"); n != 1 {
		t.Fatalf("the kubeconfig that cannot be loaded was logged %d times, want once:\n%s", n, logs.String())
	}
	writeAtomic(t, caFile, caPEM)
	for range 2 {
		time.Sleep(ReloadEvery + 100*time.Millisecond)
		list()
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"Bearer A", "Bearer A", "Bearer A", "Bearer C", "Bearer C"}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("requests seen %q, want %q", seen, want)
	}
}
