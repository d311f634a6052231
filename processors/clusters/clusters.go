// Package clusters maps the cluster names stamped on HealthEvents to the
// Kubernetes API servers that processors act on.
//
// One processor fleet serves many clusters. Each cluster is configured by
// name with a kubeconfig path (or in-cluster credentials), its own client
// rate limits and a dry-run switch. A kubeconfig's credentials that change
// on disk are followed without a restart. Clients are built lazily, on the first
// event for a cluster, so a processor starts even while some clusters are
// unreachable. Every cluster has a Gate that tracks its API health with an
// exponential backoff, so a cluster that fails is skipped quickly (its work
// deferred, never dropped) while the others proceed; one that cannot be
// reached at all is probed rather than backed off, so its work resumes as
// soon as it answers, and one that stops answering (a request that timed
// out) is probed before it is tried again, so it costs kube.timeout once,
// not at every end of its backoff. A probe is waited for at most 500ms;
// one slower goes on in the background (up to kube.timeout), so a slow
// API server is not taken for a silent one.
package clusters

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/schemas/events"
)

// InCluster is the kubeconfig value that selects the pod's service account.
const InCluster = "in-cluster"

// Default client rate limits. client-go's own default (5 QPS, burst 10) is
// the anchor's bottleneck (~2.5 cordons/s); a quarantine of one node costs
// 2-4 requests, and processors/quarantine/README.md has the measurement
// behind these numbers.
const (
	DefaultQPS   = 200
	DefaultBurst = 400
)

// Cluster is one cluster's connection settings.
type Cluster struct {
	// Name is the cluster name stamped on events by the gateway.
	Name string `toml:"name"`
	// Kubeconfig is a kubeconfig file path, or "in-cluster".
	Kubeconfig string `toml:"kubeconfig"`
	// Context is the kubeconfig context; default the file's current context.
	Context string `toml:"context"`
	// TokenFile is a file holding the bearer token the cluster's API
	// server is called with, instead of the kubeconfig's credentials (a
	// mounted service-account token); re-read as it changes (reloading).
	// Default none.
	TokenFile string `toml:"token_file"`
	// TokenEnv names an environment variable holding that token, read
	// when the client is built. Default none. The token is never printed
	// (config.Secret).
	TokenEnv string `toml:"token_env"`
	// DryRun decides and records actions for this cluster but applies none.
	DryRun bool `toml:"dry_run"`
	// QPS and Burst override the defaults of Config for this cluster (0: use them).
	QPS   float32 `toml:"qps"`
	Burst int     `toml:"burst"`
}

// Config is the set of clusters a processor acts on.
type Config struct {
	// Clusters by name. Events of a cluster not listed here are decided and
	// recorded as dry-run.
	Clusters []Cluster `toml:"clusters"`
	// DryRunClusters are clusters decided but never changed: each is
	// Clusters' entry of that name with dry_run set (or a new entry without
	// a kubeconfig). Default none.
	DryRunClusters []string `toml:"dry_run_clusters"`
	// QPS is the client-side request rate limit per cluster. Default DefaultQPS.
	QPS float32 `toml:"qps"`
	// Burst is the client-side burst per cluster. Default DefaultBurst.
	Burst int `toml:"burst"`
	// Timeout bounds one API request. Default 10s.
	Timeout time.Duration `toml:"timeout"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{QPS: DefaultQPS, Burst: DefaultBurst, Timeout: 10 * time.Second}
}

// RegisterFlags adds the config's flags with the given prefix ("kube.").
// --<prefix>clusters takes "name=kubeconfig,name2=in-cluster";
// --<prefix>dry-run-clusters takes "name,name2".
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Func(prefix+"clusters", "comma-separated cluster=kubeconfig-path (or cluster=in-cluster)", func(s string) error {
		cls, err := ParseClusters(s)
		if err != nil {
			return err
		}
		c.Clusters = append(c.Clusters, cls...)
		return nil
	})
	fs.Func(prefix+"dry-run-clusters", "comma-separated clusters that are decided but never changed", func(s string) error {
		for _, name := range strings.Split(s, ",") {
			if name = strings.TrimSpace(name); name != "" {
				c.DryRunClusters = append(c.DryRunClusters, name)
			}
		}
		return nil
	})
	fs.Func(prefix+"qps", fmt.Sprintf("client-side API request rate per cluster (default %d)", DefaultQPS), func(s string) error {
		var v float32
		if _, err := fmt.Sscan(s, &v); err != nil {
			return fmt.Errorf("qps %q: %w", s, err)
		}
		c.QPS = v
		return nil
	})
	fs.IntVar(&c.Burst, prefix+"burst", c.Burst, "client-side API burst per cluster")
	fs.DurationVar(&c.Timeout, prefix+"timeout", c.Timeout, "timeout of one Kubernetes API request")
}

// ParseClusters parses "name=kubeconfig,name2=in-cluster".
func ParseClusters(s string) ([]Cluster, error) {
	var out []Cluster
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, path, ok := strings.Cut(part, "=")
		if !ok || strings.TrimSpace(name) == "" || strings.TrimSpace(path) == "" {
			return nil, fmt.Errorf("cluster %q: want name=kubeconfig-path or name=%s", part, InCluster)
		}
		out = append(out, Cluster{Name: strings.TrimSpace(name), Kubeconfig: strings.TrimSpace(path)})
	}
	return out, nil
}

// resolved is c with DryRunClusters applied to Clusters.
func (c Config) resolved() Config {
	if len(c.DryRunClusters) == 0 {
		return c
	}
	c.Clusters = slices.Clone(c.Clusters)
	for _, name := range c.DryRunClusters {
		i := c.index(name)
		if i < 0 {
			c.Clusters = append(c.Clusters, Cluster{Name: name})
			i = len(c.Clusters) - 1
		}
		c.Clusters[i].DryRun = true
	}
	c.DryRunClusters = nil
	return c
}

func (c Config) index(name string) int {
	for i, cl := range c.Clusters {
		if cl.Name == name {
			return i
		}
	}
	return -1
}

// nameForm says what a cluster name is (events.IsClusterName): the
// gateway stamps no other on events, and a cluster configured under
// another name would never be found, its events all decided as dry-run.
const nameForm = "lower-case letters, digits, '-' and '.', at most 63 characters, as the gateway stamps them on events"

// Validate names the first bad key, with the given prefix ("kube.").
func (c Config) Validate(prefix string) error {
	if q := float64(c.QPS); math.IsNaN(q) || math.IsInf(q, 0) || q <= 0 {
		return fmt.Errorf("%sqps: must be a finite number above 0, got %v", prefix, c.QPS)
	}
	if c.Burst < 1 {
		return fmt.Errorf("%sburst: must be at least 1, got %d", prefix, c.Burst)
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("%stimeout: must be positive, got %v", prefix, c.Timeout)
	}
	seen := map[string]bool{}
	for i, cl := range c.Clusters {
		key := fmt.Sprintf("%sclusters[%d]", prefix, i)
		if !events.IsClusterName(cl.Name) {
			return fmt.Errorf("%s.name: %q is not a cluster name (%s)", key, cl.Name, nameForm)
		}
		if seen[cl.Name] {
			return fmt.Errorf("%s.name: cluster %q is listed twice", key, cl.Name)
		}
		seen[cl.Name] = true
		if cl.Kubeconfig == "" && !cl.DryRun && !slices.Contains(c.DryRunClusters, cl.Name) {
			return fmt.Errorf("%s.kubeconfig: cluster %q needs a kubeconfig path or %q (or dry_run)", key, cl.Name, InCluster)
		}
		if q := float64(cl.QPS); math.IsNaN(q) || math.IsInf(q, 0) || q < 0 {
			return fmt.Errorf("%s.qps: cluster %q: must be a finite number not below 0, got %v", key, cl.Name, cl.QPS)
		}
		if cl.Burst < 0 {
			return fmt.Errorf("%s.burst: cluster %q: must not be negative, got %d", key, cl.Name, cl.Burst)
		}
		if _, err := cl.token(key + "."); err != nil {
			return err
		}
	}
	for i, name := range c.DryRunClusters {
		if !events.IsClusterName(name) {
			return fmt.Errorf("%sdry_run_clusters[%d]: %q is not a cluster name (%s)", prefix, i, name, nameForm)
		}
	}
	return nil
}

// Names returns the configured cluster names, sorted.
func (c Config) Names() []string {
	c = c.resolved()
	out := make([]string, 0, len(c.Clusters))
	for _, cl := range c.Clusters {
		out = append(out, cl.Name)
	}
	sort.Strings(out)
	return out
}

// ErrUnknownCluster is returned by Registry.Get for a cluster that is not
// configured.
var ErrUnknownCluster = errors.New("cluster not configured")

// Client is one cluster's API clients and health.
type Client struct {
	// Name of the cluster.
	Name string
	// Kube and Dynamic are the typed and dynamic clients for requests,
	// each bounded by kube.timeout; nil when the cluster is dry-run
	// without a kubeconfig.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// WatchKube and WatchDynamic are the same clients for informers,
	// without kube.timeout: client-go makes rest.Config.Timeout the
	// http.Client's, which ends a watch's response too, so every watch
	// would be cut and opened again each kube.timeout. A watch's life is
	// bounded by the reflector's own timeoutSeconds (5-10 min), a dead
	// connection by client-go's HTTP/2 pings.
	WatchKube    kubernetes.Interface
	WatchDynamic dynamic.Interface
	// DryRun: decide and record, never change the cluster.
	DryRun bool
	// Gate tracks the cluster's API health.
	Gate *Gate
}

// Registry builds clients lazily and keeps one per cluster.
type Registry struct {
	cfg   Config
	now   func() time.Time
	build func(Cluster, *Client) error

	mu      sync.Mutex
	clients map[string]*Client
}

// NewRegistry returns a registry for cfg; now is the clock (nil: time.Now).
func NewRegistry(cfg Config, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	r := &Registry{cfg: cfg.resolved(), now: now, clients: map[string]*Client{}}
	r.build = r.buildClient
	return r
}

// newGate is a cluster's gate: its probes may take kube.timeout, as its
// requests may.
func (r *Registry) newGate() *Gate {
	g := NewGate(r.now)
	if r.cfg.Timeout > 0 {
		g.ProbeTimeout = r.cfg.Timeout
	}
	return g
}

// SetClient installs a prebuilt typed client for a cluster, for requests
// and watches (tests, and the all-in-one dev mode).
func (r *Registry) SetClient(name string, kube kubernetes.Interface, dryRun bool) *Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &Client{Name: name, Kube: kube, WatchKube: kube, DryRun: dryRun, Gate: r.newGate()}
	c.Gate.Probe = readyz(kube)
	r.clients[name] = c
	return c
}

// SetDynamic installs a prebuilt dynamic client, for requests and watches,
// on a cluster that SetClient installed (tests).
func (r *Registry) SetDynamic(name string, d dynamic.Interface) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.clients[name]; ok {
		c.Dynamic, c.WatchDynamic = d, d
	}
}

// Get returns the cluster's client, building it on first use. A cluster
// that is not configured gives ErrUnknownCluster. A kubeconfig that cannot
// be loaded is an error each time (the file may appear later).
func (r *Registry) Get(name string) (*Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.clients[name]; ok {
		return c, nil
	}
	i := r.cfg.index(name)
	if i < 0 {
		return nil, fmt.Errorf("cluster %q: %w", name, ErrUnknownCluster)
	}
	cl := r.cfg.Clusters[i]
	c := &Client{Name: name, DryRun: cl.DryRun, Gate: r.newGate()}
	if cl.Kubeconfig != "" {
		if err := r.build(cl, c); err != nil {
			return nil, err
		}
	}
	r.clients[name] = c
	return c, nil
}

// Several reports whether the registry serves more than one cluster
// (configured, or installed by SetClient or SetConfig).
func (r *Registry) Several() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.clients)
	for _, c := range r.cfg.Clusters {
		if _, ok := r.clients[c.Name]; !ok {
			n++
		}
	}
	return n > 1
}

// Ready reports whether work on the named cluster may be tried now: its
// client is live and its Gate ready (an unreachable cluster probed, when a
// probe is due).
func (r *Registry) Ready(ctx context.Context, name string) bool {
	cl, err := r.Get(name)
	if err != nil || cl.Kube == nil {
		return false
	}
	ready, _ := cl.Gate.Ready(ctx)
	return ready
}

// restConfig returns the rest.Config of a configured cluster, with the
// registry's rate limits applied.
func (r *Registry) restConfig(cl Cluster) (*rest.Config, error) {
	var (
		rc  *rest.Config
		err error
	)
	if cl.Kubeconfig == InCluster {
		rc, err = rest.InClusterConfig()
	} else {
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: cl.Kubeconfig}
		over := &clientcmd.ConfigOverrides{CurrentContext: cl.Context}
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, over).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("cluster %q: load kubeconfig %s: %w", cl.Name, cl.Kubeconfig, err)
	}
	switch tok, err := cl.token(fmt.Sprintf("kube.clusters[%s].", cl.Name)); {
	case err != nil:
		return nil, err
	case (cl.TokenFile != "" || !tok.IsZero()) && !rest.IsConfigTransportTLS(*rc):
		// As client-go does with a kubeconfig's own credentials: never
		// in clear.
		return nil, fmt.Errorf("cluster %q: kube.clusters[%s].token_file/token_env: the API server %s is not reached over TLS; a token is never sent in clear",
			cl.Name, cl.Name, rc.Host)
	case cl.TokenFile != "":
		rc.BearerToken, rc.BearerTokenFile = "", cl.TokenFile
		rc.Username, rc.Password, rc.ExecProvider, rc.AuthProvider = "", "", nil, nil
	case !tok.IsZero():
		rc.BearerToken, rc.BearerTokenFile = tok.Reveal(), ""
		rc.Username, rc.Password, rc.ExecProvider, rc.AuthProvider = "", "", nil, nil
	}
	rc.QPS, rc.Burst = r.cfg.QPS, r.cfg.Burst
	if cl.QPS > 0 {
		rc.QPS = cl.QPS
	}
	if cl.Burst > 0 {
		rc.Burst = cl.Burst
	}
	rc.Timeout = r.cfg.Timeout
	rc.UserAgent = "faultline-processor"
	return rc, nil
}

// token reads the cluster's bearer token from TokenFile or TokenEnv (zero
// when neither is set); errors name the key (prefix + token_file or
// token_env), never the value.
func (cl Cluster) token(prefix string) (config.Secret, error) {
	if cl.TokenFile == "" && cl.TokenEnv == "" {
		return config.Secret{}, nil
	}
	s, err := config.ReadSecret(cl.TokenFile, cl.TokenEnv)
	if err != nil {
		key := "token_file"
		if cl.TokenFile == "" {
			key = "token_env"
		}
		return config.Secret{}, fmt.Errorf("%s%s: %w", prefix, key, err)
	}
	return s, nil
}

// buildClient builds c's clients for requests from the cluster's
// rest.Config, and its clients for watches from the same without the
// timeout. A kubeconfig file's clients follow its changes (reloading).
func (r *Registry) buildClient(cl Cluster, c *Client) error {
	var k *reloading
	if cl.Kubeconfig != InCluster {
		k = &reloading{paths: []string{cl.Kubeconfig}, checked: time.Now(),
			load: func() (*rest.Config, error) { return r.restConfig(cl) }}
		if cl.TokenFile != "" {
			k.paths = append(k.paths, cl.TokenFile)
		}
		// Read before the config is loaded: a change in between is seen
		// by the first look.
		k.content, _ = k.read()
	}
	rc, err := r.restConfig(cl)
	if err != nil {
		return err
	}
	if k != nil {
		rc.WrapTransport = func(own http.RoundTripper) http.RoundTripper { return reloadingRT{own: own, k: k} }
	}
	if err := c.connect(rc); err != nil {
		return fmt.Errorf("cluster %q: client: %w", cl.Name, err)
	}
	return nil
}

// connect builds c's clients from rc: for requests, each bounded by rc's
// timeout and its writes timed into c.Gate (Gate.Observe), and for
// watches, the same without the timeout.
func (c *Client) connect(rc *rest.Config) error {
	wc := rest.CopyConfig(rc)
	wc.Timeout = 0
	rc = rest.CopyConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return timedRT{own: rt, g: c.Gate} })
	var err error
	if c.Kube, err = kubernetes.NewForConfig(rc); err == nil {
		c.WatchKube, err = kubernetes.NewForConfig(wc)
	}
	if err == nil {
		c.Dynamic, err = dynamic.NewForConfig(rc)
	}
	if err == nil {
		c.WatchDynamic, err = dynamic.NewForConfig(wc)
	}
	if err != nil {
		return err
	}
	c.Gate.Probe = readyz(c.Kube)
	return nil
}

// SetConfig installs a cluster's clients built from rc as a configured
// cluster's are (its requests timed into its Gate), for tests whose
// API server sits behind a wrapper of their own (rc.WrapTransport).
func (r *Registry) SetConfig(name string, rc *rest.Config) (*Client, error) {
	c := &Client{Name: name, Gate: r.newGate()}
	if err := c.connect(rc); err != nil {
		return nil, fmt.Errorf("cluster %q: client: %w", name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clients[name] = c
	return c, nil
}

// timedRT is a cluster's request transport that times each write (POST,
// PUT, PATCH, DELETE), from the moment it is sent to its answer (or
// error), into the cluster's Gate: what the API server takes to change
// something — its admission, its etcd commit — without the client's own
// rate limiter. Reads are not timed: a list takes as long as the
// collection is large (a breaker's count of 10,000 nodes), and a read
// served from the API server's cache says little of its writes.
type timedRT struct {
	own http.RoundTripper
	g   *Gate
}

func (t timedRT) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return t.own.RoundTrip(req)
	}
	done := t.g.Sent()
	resp, err := t.own.RoundTrip(req)
	done()
	return resp, err
}

// WrappedRoundTripper lets client-go reach the transport below.
func (t timedRT) WrappedRoundTripper() http.RoundTripper { return t.own }

// ReloadEvery is the least time between two looks at a cluster's
// kubeconfig file for a change (made by a request).
const ReloadEvery = time.Second

// reloading keeps a cluster's kubeconfig file (and token_file) in step
// with its clients. A kubeconfig mounted from a Secret is rewritten in
// place when the Secret changes — a token or client certificate rotated, a
// CA renewed — and a client built from the file's first content would send
// the old credentials (every request refused, 401, until a restart);
// client-go re-reads a token_file only once a minute. At most once per
// ReloadEvery a request reads the files; when their content changed, the
// config is loaded again and requests go through a transport built from
// it (its credentials, CA and client certificate) from then on. Files that
// cannot be loaded (half written, broken) leave the transport as it was
// and are read again at the next look. The API server's address is the one
// the clients were built with: a change of it takes a restart.
type reloading struct {
	paths []string
	load  func() (*rest.Config, error)

	mu      sync.Mutex
	checked time.Time
	content [][]byte          // the files as last loaded
	rt      http.RoundTripper // the reloaded config's transport; nil: the client's own
}

// read returns the files' content.
func (k *reloading) read() ([][]byte, error) {
	out := make([][]byte, len(k.paths))
	for i, p := range k.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// current returns the transport of the files' latest content that loaded
// (nil: the one the client was built with).
func (k *reloading) current() http.RoundTripper {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now := time.Now(); now.Sub(k.checked) >= ReloadEvery {
		k.checked = now
		if b, err := k.read(); err == nil && !slices.EqualFunc(b, k.content, bytes.Equal) {
			if rc, err := k.load(); err == nil {
				if rt, err := rest.TransportFor(rc); err == nil {
					if k.rt != nil {
						utilnet.CloseIdleConnectionsFor(k.rt)
					}
					k.rt, k.content = rt, b
				}
			}
		}
	}
	return k.rt
}

// reloadingRT is a client's transport (own, with the credentials the
// client was built with) that sends through the reloaded one once the
// kubeconfig changed.
type reloadingRT struct {
	own http.RoundTripper
	k   *reloading
}

func (t reloadingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	rt := t.k.current()
	if rt == nil {
		return t.own.RoundTrip(req)
	}
	// The client's wrappers set the old credentials; the reloaded
	// transport sets its own only on a request without any.
	req = req.Clone(req.Context())
	req.Header.Del("Authorization")
	return rt.RoundTrip(req)
}

// WrappedRoundTripper lets client-go reach the client's own transport
// (utilnet.CloseIdleConnectionsFor).
func (t reloadingRT) WrappedRoundTripper() http.RoundTripper { return t.own }

// Gate tracks one cluster's API health: after a failure the cluster is
// backed off exponentially (MinBackoff doubling to MaxBackoff, with jitter);
// a success resets it. Callers ask Ready (or Wait) before talking to the
// cluster and report the outcome with Fail or OK. A cluster that cannot be
// reached at all (Unreachable) is not tried again until it answers a
// probe (Probe, at most once per ProbeInterval, made by whoever asks): the
// work resumes as soon as the API server answers, not at the end of a
// backoff of up to MaxBackoff. A cluster whose request got no answer in
// time (TimedOut: its network dropping packets, its API server frozen or
// overloaded) is not tried again until it answers a probe either, and its
// backoff stands then (an overloaded server is not pressed harder): each
// try in between costs a probe of at most ProbeInterval, not another
// request's whole timeout — the batch that holds its work beside other
// clusters' is not held that long at every end of its backoff.
type Gate struct {
	now func() time.Time
	// MinBackoff is the first backoff. Default 200ms.
	MinBackoff time.Duration
	// MaxBackoff caps the backoff. Default 30s.
	MaxBackoff time.Duration
	// Probe asks the API server whether it answers at all (GET /readyz:
	// any answer counts); nil: the backoff alone decides. Set before the
	// gate is shared.
	Probe func(context.Context) error
	// ProbeInterval is the least time between two probes, and the longest
	// a caller waits for one. Default 500ms.
	ProbeInterval time.Duration
	// ProbeTimeout is the longest a probe may take: one that has not
	// answered within ProbeInterval goes on in the background (no caller
	// waits for it, none starts another) and opens the gate if it answers
	// by then — an API server that answers, but slowly (its /readyz
	// waiting on a slow etcd), is not taken for a silent one for good.
	// Default 10s; a Registry's gates use kube.timeout.
	ProbeTimeout time.Duration

	mu       sync.Mutex
	failures int
	next     time.Time
	lastErr  error
	probing  bool
	probed   time.Time // when the last probe ended
	answered bool      // a probe answered since the last failure

	latency time.Duration // of the writes, each weighing as much as all before it (Observe); 0: none yet
	// inflight: when each write in flight was sent (Sent), by number.
	inflight map[uint64]time.Time
	sent     uint64
}

// NewGate returns a healthy gate.
func NewGate(now func() time.Time) *Gate {
	if now == nil {
		now = time.Now
	}
	return &Gate{now: now, MinBackoff: 200 * time.Millisecond, MaxBackoff: 30 * time.Second,
		ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 10 * time.Second}
}

// Ready reports whether the cluster may be tried now, and if not, when to
// ask again (the end of its backoff). An unreachable cluster is probed
// first, when a probe is due.
func (g *Gate) Ready(ctx context.Context) (bool, time.Time) {
	ready, next, _ := g.state(ctx)
	return ready, next
}

// state probes an unreachable cluster when due and reports whether it may
// be tried, when to ask again, and whether it is still unreachable.
func (g *Gate) state(ctx context.Context) (ready bool, next time.Time, unreachable bool) {
	g.probe(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	unreachable = g.unreachable()
	return !unreachable && !g.now().Before(g.next), g.next, unreachable
}

// Failures is the number of consecutive failures.
func (g *Gate) Failures() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failures
}

// LastError is the error of the last failure (nil when healthy).
func (g *Gate) LastError() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr
}

// Fail records a failure and pushes the next try out.
func (g *Gate) Fail(err error) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastErr, g.answered = err, false
	g.backOff()
	return g.next
}

// backOff counts a failure and pushes next out; g.mu held.
func (g *Gate) backOff() {
	g.failures++
	d := g.MinBackoff << min(g.failures-1, 20)
	if d > g.MaxBackoff || d <= 0 {
		d = g.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	if n := g.now().Add(d); n.After(g.next) {
		g.next = n
	}
}

// OK records a success.
func (g *Gate) OK() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failures, g.lastErr, g.next, g.answered = 0, nil, time.Time{}, false
}

// Observe records how long one of the cluster's writes took to answer (or
// fail). The latency Slow judges is their moving average, each write
// weighing as much as all before it: one write turns a fast cluster slow
// when it takes more than twice the limit, and two answered at less than
// half the limit make a slow one fast again.
func (g *Gate) Observe(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.latency > 0 {
		d = (g.latency + d) / 2
	}
	g.latency = d
}

// Sent notes a write sent now, in flight until done is called, which
// observes how long it took (Observe). While in flight it counts for Slow
// once its answer could only make the cluster slow.
func (g *Gate) Sent() (done func()) {
	start := time.Now()
	g.mu.Lock()
	if g.inflight == nil {
		g.inflight = map[uint64]time.Time{}
	}
	g.sent++
	n := g.sent
	g.inflight[n] = start
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		delete(g.inflight, n)
		g.mu.Unlock()
		g.Observe(time.Since(start))
	}
}

// Latency is the moving average of the cluster's writes (Observe); zero
// before the first.
func (g *Gate) Latency() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.latency
}

// Slow reports whether the cluster's writes take longer than limit on
// average (Observe; never with limit 0), or a write is in flight for
// longer than twice limit (Sent): its answer, whenever it comes, makes the
// average slow (Observe), so a newly slow cluster is known as such within
// twice limit, not only after its first slow answer. The average moves
// only with the cluster's own writes — no probe stands in for them: an API
// server slow at writes alone (a slow admission webhook, etcd slow to
// commit) answers /readyz at once — so work deferred for being slow must
// be tried somewhere (a retry consumer) for it to turn fast again.
func (g *Gate) Slow(limit time.Duration) bool {
	if limit <= 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.latency > limit {
		return true
	}
	for _, at := range g.inflight {
		if time.Since(at) > 2*limit {
			return true
		}
	}
	return false
}

// FastContexts are a batch's contexts by cluster, each ending once its
// cluster turns slow (Gate.WhileFast at Limit), made as the batch first
// works for the cluster; with Limit 0, the batch's context.
type FastContexts struct {
	ctx   context.Context
	limit time.Duration

	mu     sync.Mutex
	byName map[string]context.Context
	stops  []func()
}

// NewFastContexts returns the contexts of a batch run under ctx.
func NewFastContexts(ctx context.Context, limit time.Duration) *FastContexts {
	return &FastContexts{ctx: ctx, limit: limit, byName: map[string]context.Context{}}
}

// Get returns the batch's context for cl.
func (f *FastContexts) Get(cl *Client) context.Context {
	if f.limit <= 0 || cl == nil {
		return f.ctx
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, ok := f.byName[cl.Name]
	if !ok {
		var stop func()
		ctx, stop = cl.Gate.WhileFast(f.ctx, f.limit)
		f.byName[cl.Name] = ctx
		f.stops = append(f.stops, stop)
	}
	return ctx
}

// Stop ends the batch's contexts.
func (f *FastContexts) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, stop := range f.stops {
		stop()
	}
}

// TurnedSlow reports whether ctx (from FastContexts or WhileFast) ended
// because its cluster turned slow.
func TurnedSlow(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrSlow) }

// ErrSlow is the cause of a context WhileFast cancelled.
var ErrSlow = errors.New("cluster turned slow")

// WhileFast returns a context cancelled (cause ErrSlow) once the cluster
// is Slow by limit, checked every limit/2, and its stop. Work for a
// cluster served beside others is done under it so that the work of a
// cluster turning slow is handed on, not waited for: its requests in
// flight are abandoned, and the work they were for is to be redone where
// the cluster's pace holds no one (every step faultline makes is
// idempotent: redone, it finds what landed). With limit 0, ctx itself.
func (g *Gate) WhileFast(ctx context.Context, limit time.Duration) (context.Context, func()) {
	if limit <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(limit / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if g.Slow(limit) {
					cancel(ErrSlow)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}

// Wait reports whether the cluster may be tried, waiting out a backoff
// that ends by until (false when ctx ends first). It does not wait for one
// ending later, nor for an unreachable cluster: that one's probe (Ready)
// decides at once.
func (g *Gate) Wait(ctx context.Context, until time.Time) bool {
	ready, next, unreachable := g.state(ctx)
	switch {
	case ready:
		return true
	case unreachable || next.After(until):
		return false
	}
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// unreachable reports whether the cluster's last failure was not being
// able to reach it, or getting no answer in time, with no probe answered
// since; g.mu held.
func (g *Gate) unreachable() bool {
	return g.Probe != nil && (Unreachable(g.lastErr) || TimedOut(g.lastErr)) && !g.answered
}

// probe asks an unreachable cluster once, unless another caller does or
// one did in the last ProbeInterval, and waits for the answer at most
// ProbeInterval (or until ctx ends): a probe still unanswered then goes on
// in the background, up to ProbeTimeout, and its answer counts when it
// comes. Any answer (even "not ready": an API server restarting says so
// for seconds while it serves) opens the gate — for one that could not be
// reached, with its backoff begun afresh: the cluster is back, its work is
// tried and a failure of it backs off from MinBackoff again; for one that
// timed out, at the end of its backoff; silence keeps the gate shut, its
// backoff grown once over.
func (g *Gate) probe(ctx context.Context) {
	g.mu.Lock()
	if !g.unreachable() || g.probing || g.now().Sub(g.probed) < g.ProbeInterval {
		g.mu.Unlock()
		return
	}
	g.probing = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The caller's values, not its end: a batch that ends does not
		// cut the probe it started.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(g.ProbeTimeout, g.ProbeInterval))
		err := g.Probe(pctx)
		cancel()
		var st apierrors.APIStatus
		answered := err == nil || errors.As(err, &st)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.probing, g.probed = false, g.now()
		switch {
		case answered && TimedOut(g.lastErr):
			g.answered = true
		case answered:
			g.answered, g.failures, g.next = true, 0, g.probed
		case !g.probed.Before(g.next):
			g.backOff() // so that callers that come back at the backoff's end are spaced too
		}
	}()
	t := time.NewTimer(g.ProbeInterval)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Unreachable reports whether err means the API server could not be
// reached at all — a connection refused or cut, a name that does not
// resolve — rather than an answer (an API status, however bad) or a slow
// one (a timeout): a cluster worth probing cheaply until it answers.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// TimedOut reports whether err is a request that got no answer in time
// (kube.timeout, a dial or TLS handshake that timed out) — not an API
// status (a 504 is an answer).
func TimedOut(err error) bool {
	var st apierrors.APIStatus
	if err == nil || errors.As(err, &st) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// readyz returns a probe of kube's API server (GET /readyz), or nil for a
// client without a REST client (a fake).
func readyz(kube kubernetes.Interface) func(context.Context) error {
	rc := kube.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	return func(ctx context.Context) error {
		return rc.Get().AbsPath("/readyz").Do(ctx).Error()
	}
}

// Retriable reports whether an API error means the cluster (not the
// request) is in trouble, so the work must be retried later: transport
// errors, timeouts, 5xx, 429, and a context deadline. Conflicts are not
// (callers re-read and retry them at once); NotFound, Invalid and the like
// are permanent for the request.
func Retriable(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsInvalid(err),
		apierrors.IsBadRequest(err), apierrors.IsAlreadyExists(err):
		return false
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err),
		apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		// Forbidden/Unauthorized are configuration errors an operator fixes;
		// the work waits for them rather than being lost.
		return true
	case errors.Is(err, context.DeadlineExceeded):
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Code >= 500
	}
	// Unknown transport-level errors (connection refused wrapped by url.Error
	// is a net.Error; others like EOF) are treated as the cluster's trouble.
	return true
}

// Attempt is the outcome of one try of a unit of work on a cluster
// (Registry.Try).
type Attempt struct {
	// Client is the cluster's client: nil for a cluster that is not
	// configured (the work was decided as dry-run) or whose client could
	// not be built.
	Client *Client
	// Ran reports whether the step was called.
	Ran bool
	// Err is the step's error; or, when the step was not called, why: the
	// client could not be built, or the cluster is backing off (its last
	// error).
	Err error
	// Retriable: the work must be tried again later — the trouble is the
	// cluster's (see Retriable) or the time's (ctx ended), not the work's.
	// Otherwise Err is the work's own failure, to be recorded.
	Retriable bool
	// RetryAt is when the cluster may be tried again: the end of its
	// backoff. Zero when the client could not be built or ctx ended (the
	// caller picks when).
	RetryAt time.Time
}

// Live reports whether the attempt had a client that changes the cluster
// or reads it: configured, with a kubeconfig.
func (a Attempt) Live() bool { return a.Client != nil && a.Client.Kube != nil }

// Try runs one unit of work on the named cluster, the way every role that
// acts on Kubernetes does: get the cluster's client (a cluster that is not
// configured runs step with a nil client, to decide as dry-run); for a
// live cluster check its Gate (one backing off is not called); run step;
// report the outcome to the Gate: a success resets it, an error that is
// the cluster's (Retriable) backs it off. An error while ctx is done (the
// batch ran out of time, the processor is stopping) is nobody's: the Gate
// is left as it was and the work is retriable.
func (r *Registry) Try(ctx context.Context, name string, step func(ctx context.Context, cl *Client) error) Attempt {
	cl, err := r.Get(name)
	switch {
	case errors.Is(err, ErrUnknownCluster):
		cl = nil
	case err != nil:
		return Attempt{Err: err, Retriable: true}
	}
	a := Attempt{Client: cl}
	if a.Live() {
		if ready, next := cl.Gate.Ready(ctx); !ready {
			a.Err, a.Retriable, a.RetryAt = cl.Gate.LastError(), true, next
			if a.Err == nil {
				a.Err = errors.New("backing off")
			}
			return a
		}
	}
	a.Ran, a.Err = true, step(ctx, cl)
	switch {
	case a.Err == nil:
		if a.Live() {
			cl.Gate.OK()
		}
	case ctx.Err() != nil:
		a.Retriable = true
	case a.Live() && Retriable(a.Err):
		a.Retriable, a.RetryAt = true, cl.Gate.Fail(a.Err)
	}
	return a
}
