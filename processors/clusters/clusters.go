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
	"log/slog"
	"math"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

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
	// QPS and Burst override the defaults of Config for this cluster (0:
	// use them); like them, they bound each client of a role on its own.
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
	// QPS is the client-side request rate limit per cluster, for each
	// client a role builds (typed, dynamic, and their watch clients, each
	// its own bucket): a role using both its typed and dynamic clients
	// (remediate, janitor) can send up to twice QPS to a cluster.
	// Default DefaultQPS.
	QPS float32 `toml:"qps"`
	// Burst is the client-side burst per cluster, for each client as QPS.
	// Default DefaultBurst.
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
		v, err := strconv.ParseFloat(s, 32)
		if err != nil {
			return fmt.Errorf("qps %q: not a number (or out of range)", s)
		}
		c.QPS = float32(v)
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
		if cl.Context != "" && cl.Kubeconfig == InCluster {
			return fmt.Errorf("%s.context: cluster %q: a context names an entry of a kubeconfig file; %q has none", key, cl.Name, InCluster)
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

// UnlistedDryRun returns the names of DryRunClusters that Clusters does
// not list, sorted: each is dry-run as any unlisted cluster is, and a
// misspelt one leaves the cluster it meant live (worth a warning at start).
func (c Config) UnlistedDryRun() []string {
	var out []string
	for _, name := range c.DryRunClusters {
		if c.index(name) < 0 {
			out = append(out, name)
		}
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
	log   *slog.Logger

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

// WithLog sets where the registry reports a cluster's kubeconfig that
// changed on disk and cannot be followed (default slog.Default()), and
// returns r. Call it before the first Get.
func (r *Registry) WithLog(log *slog.Logger) *Registry {
	r.log = log
	return r
}

func (r *Registry) logger() *slog.Logger {
	if r.log == nil {
		return slog.Default()
	}
	return r.log
}

// Now is the registry's clock, the one its gates' times are on.
func (r *Registry) Now() time.Time { return r.now() }

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
		dropCredentials(rc)
	case !tok.IsZero():
		rc.BearerToken, rc.BearerTokenFile = tok.Reveal(), ""
		dropCredentials(rc)
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

// dropCredentials removes the kubeconfig's own credentials where a
// token_file or token_env replaces them: the client certificate too, or the
// API server, which checks it before any bearer token, would act as the
// certificate's user (kubeadm's admin.conf: system:masters) and the
// token's least-privileged RBAC would never apply. The CA stays.
func dropCredentials(rc *rest.Config) {
	rc.Username, rc.Password, rc.ExecProvider, rc.AuthProvider = "", "", nil, nil
	rc.CertFile, rc.KeyFile, rc.CertData, rc.KeyData = "", "", nil, nil
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
		k = &reloading{name: cl.Name, paths: []string{cl.Kubeconfig}, checked: time.Now(), log: r.logger(),
			load: func() (*rest.Config, error) { return r.restConfig(cl) }}
		if cl.TokenFile != "" {
			k.paths = append(k.paths, cl.TokenFile)
		}
		// Read before the config is loaded: a change in between is seen
		// by the first look.
		k.seen, _ = k.read()
	}
	rc, err := r.restConfig(cl)
	if err != nil {
		return err
	}
	if k != nil {
		k.server = serverOf(rc)
		rc.WrapTransport = func(own http.RoundTripper) http.RoundTripper { return reloadingRT{own: own, k: k} }
	}
	if err := c.connect(rc); err != nil {
		return fmt.Errorf("cluster %q: client: %w", cl.Name, err)
	}
	return nil
}

// connect builds c's clients from rc: for requests, each bounded by rc's
// timeout and its writes timed into c.Gate (Gate.Observe), and for
// watches, the same without the timeout. Each client has client-go's own
// rate limiter of rc's QPS and Burst: a role using both its typed and
// dynamic clients can send up to twice the cluster's rate, and neither
// client's requests wait behind the other's burst.
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
// cannot be loaded (half written, broken, naming a CA or client
// certificate file not written yet) leave the transport as it was, are
// logged once, and are loaded again at every look until they load. The API server's
// address is the one the clients were built with (client-go fixes it): files
// that name another one are logged once and the cluster's requests fail,
// none sent, until the files name the first server again or the processor
// is restarted — its new credentials are never sent to the old server,
// nor its work done on a server the files no longer name.
type reloading struct {
	name   string // the cluster's
	paths  []string
	load   func() (*rest.Config, error)
	server string // serverOf the config the clients were built with
	log    *slog.Logger

	mu      sync.Mutex
	checked time.Time
	seen    [][]byte          // the files' content last followed (loaded, or found naming another server)
	failed  string            // the last error reading or loading them, reported once
	rt      http.RoundTripper // the reloaded config's transport; nil: the client's own
	moved   error             // the files name another API server: every request's error
}

// serverOf is rc's API server as the clients address it: scheme, host and
// path, without a trailing slash, the host in lower case and without its
// scheme's default port (https://h and https://h:443 are one server). An
// IP and a DNS name of the same server differ: that cannot be told here.
func serverOf(rc *rest.Config) string {
	u, _, err := rest.DefaultServerUrlFor(rc)
	if err != nil {
		return rc.Host
	}
	host := strings.ToLower(u.Host)
	if p := u.Port(); (u.Scheme == "https" && p == "443") || (u.Scheme == "http" && p == "80") {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return u.Scheme + "://" + host + strings.TrimRight(u.Path, "/")
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
// (nil: the one the client was built with), or the error every request
// fails with while the files name another API server.
func (k *reloading) current() (http.RoundTripper, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now := time.Now(); now.Sub(k.checked) >= ReloadEvery {
		k.checked = now
		switch b, err := k.read(); {
		case err != nil:
			k.fail("cluster kubeconfig cannot be read; requests go on with the credentials last loaded", err)
		case slices.EqualFunc(b, k.seen, bytes.Equal):
			k.failed = ""
		case k.reload():
			k.failed, k.seen = "", b
		}
	}
	return k.rt, k.moved
}

// fail logs msg and err unless err is the failure last logged: content
// that cannot be loaded is loaded again at every look (a file it names
// may land a moment later) and reported once.
func (k *reloading) fail(msg string, err error) {
	if err.Error() != k.failed {
		k.failed = err.Error()
		k.log.Error(msg, "cluster", k.name, "err", err)
	}
}

// reload follows the files' new content and reports whether it did (or
// found them naming another API server); false: they cannot be loaded yet,
// and the next look tries again.
func (k *reloading) reload() bool {
	rc, err := k.load()
	if err != nil {
		k.fail("cluster kubeconfig changed and cannot be loaded; requests go on with the credentials last loaded", err)
		return false
	}
	if server := serverOf(rc); server != k.server {
		k.moved = fmt.Errorf("cluster %q: its kubeconfig %s now names the API server %s, not %s that its clients were built for: no request is sent until the processor is restarted (a restart follows the new server)",
			k.name, k.paths[0], server, k.server)
		k.log.Error("cluster kubeconfig names another API server (or the same one by another name, an IP for a DNS name); the cluster's requests fail: restart the processor to follow the new server",
			"cluster", k.name, "kubeconfig", k.paths[0], "server", server, "built_for", k.server)
		return true
	}
	rt, err := rest.TransportFor(rc)
	if err != nil {
		k.fail("cluster kubeconfig changed and its transport cannot be built; requests go on with the credentials last loaded", err)
		return false
	}
	if k.rt != nil {
		utilnet.CloseIdleConnectionsFor(k.rt)
	}
	k.rt, k.moved = rt, nil
	return true
}

// reloadingRT is a client's transport (own, with the credentials the
// client was built with) that sends through the reloaded one once the
// kubeconfig changed.
type reloadingRT struct {
	own http.RoundTripper
	k   *reloading
}

func (t reloadingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	rt, err := t.k.current()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
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
	// backoff, or a probe's interval on while an unreachable cluster's
	// probe goes on (Gate.Ready), never a time already past. Zero when the
	// client could not be built, ctx ended or the client's rate limiter
	// would have waited past it (the caller picks when).
	RetryAt time.Time
}

// Live reports whether the attempt had a client that changes the cluster
// or reads it: configured, with a kubeconfig.
func (a Attempt) Live() bool { return a.Client != nil && a.Client.Kube != nil }

// Throttled reports whether err is the client's own rate limiter refusing
// to wait past ctx's deadline ("client rate limiter Wait returned an
// error: rate: Wait(n=1) would exceed context deadline"): the request was
// never sent, and ctx is not done yet. client-go builds that error with
// fmt.Errorf around golang.org/x/time/rate's untyped one (neither wraps
// context.DeadlineExceeded), so it is known by its text.
func Throttled(err error) bool {
	return err != nil && strings.Contains(err.Error(), "client rate limiter Wait returned an error")
}

// Try runs one unit of work on the named cluster, the way every role that
// acts on Kubernetes does: get the cluster's client (a cluster that is not
// configured runs step with a nil client, to decide as dry-run); for a
// live cluster check its Gate (one backing off is not called); run step;
// report the outcome to the Gate: a success resets it, an error that is
// the cluster's (Retriable) backs it off. An error while ctx is done (the
// batch ran out of time, the processor is stopping) is nobody's, and so is
// the client's own rate limiter refusing to wait past ctx's deadline
// (Throttled: more of the batch's requests for the cluster than its QPS
// lets through in time): the Gate is left as it was and the work is
// retriable.
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
	case ctx.Err() != nil, Throttled(a.Err):
		a.Retriable = true
	case a.Live() && Retriable(a.Err):
		a.Retriable, a.RetryAt = true, cl.Gate.Fail(a.Err)
	}
	return a
}
