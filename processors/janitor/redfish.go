package janitor

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	"github.com/stmcginnis/gofish/redfish"
	"golang.org/x/net/http2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/internal/certfile"
)

// Reasons the Redfish provider writes.
const (
	ReasonNoBMC            = "NoBMC"
	ReasonNoBMCCredentials = "NoBMCCredentials"
	ReasonBMCUnreachable   = "BMCUnreachable"
	ReasonBMCAuthFailed    = "BMCAuthFailed"
	ReasonSystemNotFound   = "SystemNotFound"
	ReasonResetRejected    = "ResetRejected"
	// ReasonSystemMismatch: the system the node's BMC address leads to
	// has another UUID than the node's status.nodeInfo.systemUUID (a
	// stale address: the BMC of another machine).
	ReasonSystemMismatch = "SystemMismatch"
)

// Bounds on what a BMC's answers make the provider read: a Redfish
// resource is a few KiB, a chassis holds a few systems.
const (
	// maxRedfishBody bounds what is read of one answer (past it the
	// answer reads as cut off: a JSON error, an error page's start).
	maxRedfishBody = 1 << 20
	// maxSystemPages and maxSystems bound the listing of a BMC's systems.
	maxSystemPages = 16
	maxSystems     = 256
)

// boundedBodies reads at most max bytes of each answer's body.
type boundedBodies struct {
	rt  *http.Transport
	max int64
}

func (b boundedBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(r)
	if resp != nil && resp.Body != nil {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, b.max), resp.Body}
	}
	return resp, err
}

// CloseIdleConnections is the transport's (http.Client's reaches it).
func (b boundedBodies) CloseIdleConnections() { b.rt.CloseIdleConnections() }

// Redfish carries operations out through a node's BMC with gofish:
// ComputerSystem.Reset GracefulRestart (Force: ForceRestart) for a
// reboot, terminate_action (ForceOff or PowerCycle) for a terminate. GPU
// resets are not a BMC's (ErrUnsupported).
type Redfish struct {
	cfg    RedfishConfig
	tr     *http.Transport // cloned for each operation (client)
	cas    *certfile.Pool  // ca_file, re-read when it changes; nil: none
	log    *slog.Logger
	nets   networks
	lookup lookupFunc
}

// keyBMCNetworks names the BMC allowlist in refusals.
const keyBMCNetworks = "janitor.redfish.allowed_networks"

// NewRedfish builds the provider; the CA file is checked here, and read
// again by an operation that finds it changed (a CA rotated in place).
func NewRedfish(cfg RedfishConfig, log *slog.Logger) (*Redfish, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // an operator's explicit choice
	var cas *certfile.Pool
	if cfg.CAFile != "" {
		cas = certfile.NewPool(cfg.CAFile, "janitor.redfish.ca_file")
		pool, err := cas.Get()
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	nets, err := parseNetworks(keyBMCNetworks, cfg.AllowedNetworks)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	tr.Proxy = nil
	// Every connection's address is checked, not only the annotation's
	// host: a name that resolves otherwise now, or a redirect, stays in
	// the BMC networks.
	tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: nets.control(keyBMCNetworks)}).DialContext
	return &Redfish{cfg: cfg, tr: tr, cas: cas, log: log, nets: nets, lookup: defaultLookup}, nil
}

// client is one operation's HTTP client, on a transport of its own: what
// its HTTP/2 connections report (a stream the BMC refused) is that
// operation's, noted in p. Its connections are closed when it is done.
// (net/http's HTTP2Config.CountError does not reach its transport's
// stream resets; x/net's Transport.CountError does.)
func (r *Redfish) client(p *sendProbe) *http.Client {
	tr := r.tr.Clone()
	if r.cas != nil {
		if pool, err := r.cas.Get(); err == nil { // once checked, the last good bundle
			tr.TLSClientConfig.RootCAs = pool
		}
	}
	if h2, err := http2.ConfigureTransports(tr); err == nil {
		h2.CountError = p.countH2Error
	} else {
		// Not reached (tr has no h2 of its own yet); net/http's h2 then
		// serves it, and a refused stream reads as unanswered.
		r.log.Warn("janitor: redfish HTTP/2 transport not configured", "err", err)
	}
	return &http.Client{Transport: sendTracker{boundedBodies{tr, maxRedfishBody}}, Timeout: r.cfg.Timeout, CheckRedirect: r.checkRedirect}
}

// checkRedirect refuses a redirect from https to http (unless
// janitor.redfish.allow_http): net/http sends the Authorization header on
// to the same host, so the BMC credentials would go in cleartext; and
// more than 10 redirects, as net/http's default does.
func (r *Redfish) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Scheme != "https" && !r.cfg.AllowHTTP {
		return fmt.Errorf("redirected to %s, not https: the BMC credentials are not sent in cleartext (janitor.redfish.allow_http)", req.URL.Redacted())
	}
	return nil
}

// bmcRef is a node's BMC: its endpoint (its host in the BMC networks),
// the system's path ("" when not named), the credentials' Secret ("":
// default_secret), and what named them, for messages.
type bmcRef struct {
	endpoint, system, secret string
	from, secretFrom         string
}

// bmc reads a node's BMC from its node-restriction labels when it has
// LabelBMCHost, else (unless labels_only) from its annotations.
func (r *Redfish) bmc(ctx context.Context, t Target) (bmcRef, error) {
	n := t.Node
	if _, ok := n.Labels[LabelBMCHost]; ok {
		return r.bmcFromLabels(ctx, t)
	}
	for _, k := range []string{LabelBMCPort, LabelBMCSystem, LabelBMCSecret} {
		if _, ok := n.Labels[k]; ok {
			return bmcRef{}, perr(ReasonNoBMC, "node %s has the label %s but not %s", n.Name, k, LabelBMCHost)
		}
	}
	raw := n.Annotations[AnnotationBMC]
	switch {
	case raw == "" && r.cfg.LabelsOnly:
		return bmcRef{}, perr(ReasonNoBMC, "node %s has no %s label", n.Name, LabelBMCHost)
	case raw == "":
		return bmcRef{}, perr(ReasonNoBMC, "node %s has no %s label nor %s annotation", n.Name, LabelBMCHost, AnnotationBMC)
	case r.cfg.LabelsOnly:
		return bmcRef{}, perr(ReasonBMCAnnotationNotAllowed, "node %s: %s %q refused, nothing sent: janitor.redfish.labels_only is set "+
			"and the annotation is the node's own (its kubelet may edit it); label the node %s (kubelets cannot set it)", n.Name, AnnotationBMC, raw, LabelBMCHost)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return bmcRef{}, perr(ReasonNoBMC, "node %s: %s %q is not an http(s) URL", n.Name, AnnotationBMC, raw)
	}
	if u.Scheme == "http" && !r.cfg.AllowHTTP {
		return bmcRef{}, perr(ReasonBMCHTTPNotAllowed, "node %s: %s %q refused, nothing sent: http sends the BMC credentials in cleartext "+
			"and janitor.redfish.allow_http is not set; use https", n.Name, AnnotationBMC, raw)
	}
	if err := r.nets.check(ctx, r.lookup, keyBMCNetworks, u.Hostname()); err != nil {
		return bmcRef{}, perr(ReasonBMCAddressNotAllowed, "node %s: %s %q refused, no credential sent: %v", n.Name, AnnotationBMC, raw, err)
	}
	ref := bmcRef{endpoint: u.Scheme + "://" + u.Host, secret: n.Annotations[AnnotationBMCSecret], from: AnnotationBMC, secretFrom: AnnotationBMCSecret}
	if strings.Contains(u.Path, "/redfish/v1/Systems/") {
		ref.system = strings.TrimSuffix(u.Path, "/")
	}
	return ref, nil
}

// bmcFromLabels reads a node's BMC from its LabelBMC* labels (HTTPS).
func (r *Redfish) bmcFromLabels(ctx context.Context, t Target) (bmcRef, error) {
	n := t.Node
	host := n.Labels[LabelBMCHost]
	if _, err := netip.ParseAddr(host); err != nil && len(validation.IsDNS1123Subdomain(strings.ToLower(host))) > 0 {
		return bmcRef{}, perr(ReasonNoBMC, "node %s: label %s %q is not an IPv4 address or a DNS name", n.Name, LabelBMCHost, host)
	}
	hostPort := host
	if p, ok := n.Labels[LabelBMCPort]; ok {
		if port, err := strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return bmcRef{}, perr(ReasonNoBMC, "node %s: label %s %q is not a port (1-65535)", n.Name, LabelBMCPort, p)
		}
		hostPort = net.JoinHostPort(host, p)
	}
	if err := r.nets.check(ctx, r.lookup, keyBMCNetworks, host); err != nil {
		return bmcRef{}, perr(ReasonBMCAddressNotAllowed, "node %s: label %s %q refused, no credential sent: %v", n.Name, LabelBMCHost, host, err)
	}
	ref := bmcRef{endpoint: "https://" + hostPort, secret: n.Labels[LabelBMCSecret], from: LabelBMCHost, secretFrom: LabelBMCSecret}
	if id := n.Labels[LabelBMCSystem]; id != "" {
		ref.system = "/redfish/v1/Systems/" + url.PathEscape(id)
	}
	return ref, nil
}

// credentials reads the node's BMC Secret from its cluster.
func (r *Redfish) credentials(ctx context.Context, t Target, ref bmcRef) (user, pass string, err error) {
	name := ref.secret
	if name == "" {
		name = r.cfg.DefaultSecret
	}
	if name != r.cfg.DefaultSecret && !secretAllowed(r.cfg.AllowedSecrets, name) {
		return "", "", perr(ReasonBMCSecretNotAllowed, "node %s: %s names Secret %q, which janitor.redfish.allowed_secrets does not list; nothing read",
			t.Node.Name, ref.secretFrom, name)
	}
	if t.Kube == nil {
		return "", "", perr(ReasonNoBMCCredentials, "no cluster client to read Secret %s/%s", r.cfg.SecretNamespace, name)
	}
	s, err := t.Kube.CoreV1().Secrets(r.cfg.SecretNamespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", "", perr(ReasonNoBMCCredentials, "Secret %s/%s not found", r.cfg.SecretNamespace, name)
	}
	if err != nil {
		return "", "", fmt.Errorf("read Secret %s/%s: %w", r.cfg.SecretNamespace, name, err)
	}
	user, pass = string(s.Data["username"]), string(s.Data["password"])
	if user == "" || pass == "" {
		return "", "", perr(ReasonNoBMCCredentials, "Secret %s/%s lacks username or password", r.cfg.SecretNamespace, name)
	}
	return user, pass, nil
}

// classify turns a BMC error into its reason.
func classify(endpoint string, err error) error {
	if na := notAllowed(err); na != nil {
		return perr(ReasonBMCAddressNotAllowed, "BMC %s: %s", endpoint, na.msg)
	}
	var ce *common.CollectionError
	if errors.As(err, &ce) {
		for _, f := range ce.Failures {
			if c := classify(endpoint, f); reasonOf(c) != ReasonFailed {
				return c
			}
		}
	}
	var ge *common.Error
	if errors.As(err, &ge) {
		switch ge.HTTPReturnedStatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return perr(ReasonBMCAuthFailed, "BMC %s refused the credentials (%d)", endpoint, ge.HTTPReturnedStatusCode)
		case http.StatusNotFound:
			return perr(ReasonSystemNotFound, "BMC %s: %v", endpoint, err)
		}
		return perr(ReasonResetRejected, "BMC %s: %v", endpoint, err)
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) {
		return perr(ReasonBMCUnreachable, "BMC %s: %v", endpoint, err)
	}
	return fmt.Errorf("BMC %s: %w", endpoint, err)
}

// connect reaches the node's BMC with basic auth (gofish reads its
// service root, which needs none). The one reset is three or four
// requests: basic auth holds none of the BMC's few session slots
// (often 4-16) and leaves nothing to log out of — a session whose login
// answer was lost (a timeout, a connection cut after the POST) is one
// the janitor cannot log out of, held until the BMC's session timeout.
// login is the fallback for a BMC that refuses basic auth.
func (r *Redfish) connect(ctx context.Context, t Target, hc *http.Client) (*gofish.APIClient, bmcRef, gofish.ClientConfig, error) {
	ref, err := r.bmc(ctx, t)
	if err != nil {
		return nil, bmcRef{}, gofish.ClientConfig{}, err
	}
	user, pass, err := r.credentials(ctx, t, ref)
	if err != nil {
		return nil, bmcRef{}, gofish.ClientConfig{}, err
	}
	cfg := gofish.ClientConfig{Endpoint: ref.endpoint, Username: user, Password: pass, BasicAuth: true, HTTPClient: hc}
	c, err := gofish.ConnectContext(ctx, cfg)
	if err != nil {
		return nil, bmcRef{}, gofish.ClientConfig{}, classify(ref.endpoint, err)
	}
	return c, ref, cfg, nil
}

// basicRefused: err is the BMC's 401 to a request with basic auth.
func basicRefused(err error) bool {
	var ge *common.Error
	return errors.As(err, &ge) && ge.HTTPReturnedStatusCode == http.StatusUnauthorized
}

// login logs in through the BMC's SessionService (redfish.session; it
// refused basic auth): the session client and its logout, or ok false
// when the BMC offers no session (then basic auth's refusal stands).
func (r *Redfish) login(ctx context.Context, cfg gofish.ClientConfig, probe *sendProbe) (*gofish.APIClient, func(), bool, error) {
	if !r.cfg.Session {
		return nil, nil, false, nil
	}
	// The SessionService resource itself needs authentication: the login
	// is tried at the service root's Links.Sessions.
	cfg.BasicAuth = false
	probe.arm() // the login: a written one is not sent again, an unanswered one noted
	sc, err := gofish.ConnectContext(ctx, cfg)
	lost := probe.disarm()
	if err == nil {
		return sc, func() { r.logout(ctx, sc, cfg.Endpoint) }, true, nil
	}
	if lost {
		r.log.Warn("janitor: redfish session login sent and not answered: the BMC may hold a session the janitor cannot log out of until it times out",
			"bmc", cfg.Endpoint, "err", err)
	}
	// A BMC without a Sessions collection to log in to (some older
	// firmware): basic auth's refusal stands; refused credentials are
	// refused either way.
	if cerr := classify(cfg.Endpoint, err); reasonOf(cerr) == ReasonBMCAuthFailed || lost {
		return nil, nil, true, cerr
	}
	r.log.Debug("janitor: redfish session login failed", "bmc", cfg.Endpoint, "err", err)
	return nil, nil, false, nil
}

// logout deletes the session c logged in with, with a context of its
// own: the operation's may be cancelled (the janitor stopping mid-reset)
// or spent, and gofish's Logout makes its request with it — so it sent
// nothing, and the BMC kept the session until its timeout. BMCs allow a
// handful of sessions (iDRAC, iLO): a few leaked ones and every login to
// that BMC fails. Bounded by redfish.timeout; a failure is logged.
func (r *Redfish) logout(ctx context.Context, c *gofish.APIClient, endpoint string) {
	defer c.HTTPClient.CloseIdleConnections()
	s, err := c.GetSession()
	if err != nil || s.ID == "" {
		r.log.Warn("janitor: redfish session without a location to log out of; the BMC keeps it until it times out", "bmc", endpoint)
		return
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(lctx, http.MethodDelete, endpoint+s.ID, nil)
	if err == nil {
		req.Header.Set("X-Auth-Token", s.Token)
		var resp *http.Response
		if resp, err = c.HTTPClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 300 && resp.StatusCode != http.StatusNotFound {
				err = fmt.Errorf("answered %s", resp.Status)
			}
		}
	}
	if err != nil {
		r.log.Warn("janitor: redfish logout failed; the BMC keeps the session until it times out", "bmc", endpoint, "session", s.ID, "err", err)
	}
}

// system finds the node's ComputerSystem: the one its label or
// annotation names, else the BMC's only system, else (unless labels_only:
// the node reports its own system UUID) the one whose UUID is the node's
// SystemUUID.
func (r *Redfish) system(c *gofish.APIClient, t Target, ref bmcRef) (*redfish.ComputerSystem, error) {
	nameIn := AnnotationBMC
	if ref.from == LabelBMCHost {
		nameIn = LabelBMCSystem
	}
	if ref.system != "" {
		s, err := redfish.GetComputerSystem(c, ref.system)
		if err != nil {
			return nil, err
		}
		return s, theNodes(s, t, "named in "+nameIn)
	}
	links, err := systemLinks(c)
	if err != nil {
		return nil, err
	}
	if len(links) == 1 {
		s, err := redfish.GetComputerSystem(c, links[0])
		if err != nil {
			return nil, err
		}
		return s, theNodes(s, t, "the BMC's only one")
	}
	if r.cfg.LabelsOnly {
		return nil, perr(ReasonSystemNotFound, "BMC has %d systems: name node %s's in the label %s (janitor.redfish.labels_only: "+
			"the system UUID the node reports is not followed)", len(links), t.Node.Name, LabelBMCSystem)
	}
	want := strings.ToLower(t.Node.Status.NodeInfo.SystemUUID)
	if want != "" {
		for _, l := range links {
			s, err := redfish.GetComputerSystem(c, l)
			if err != nil {
				return nil, err
			}
			if sameSystemUUID(s.UUID, want) {
				return s, nil
			}
		}
	}
	return nil, perr(ReasonSystemNotFound, "BMC has %d systems and none has node %s's system UUID %q (name one in %s)",
		len(links), t.Node.Name, want, nameIn)
}

// theNodes refuses a system, named or the BMC's only one (how: which),
// whose UUID is not the node's system UUID: the node's BMC address is
// stale (a machine replaced, a DHCP lease reassigned, a typo) and leads to
// another machine's BMC, which a reset would take down. Not compared when
// either is unknown.
func theNodes(s *redfish.ComputerSystem, t Target, which string) error {
	want := t.Node.Status.NodeInfo.SystemUUID
	if want == "" || s.UUID == "" || sameSystemUUID(s.UUID, want) {
		return nil
	}
	return perr(ReasonSystemMismatch, "system %s (%s) has UUID %s, not node %s's system UUID %s: its BMC address leads to another machine; nothing sent",
		s.ODataID, which, s.UUID, t.Node.Name, want)
}

// sameSystemUUID is whether two SMBIOS system UUIDs are one, in any case,
// and with the first three fields byte-swapped (SMBIOS stores them
// little-endian; some BMCs report them as stored, others as the OS does).
func sameSystemUUID(a, b string) bool {
	a, b = strings.ToLower(strings.TrimSpace(a)), strings.ToLower(strings.TrimSpace(b))
	if a == b {
		return true
	}
	sa := swapUUIDFields(a)
	return sa != "" && sa == b
}

// swapUUIDFields is u (8-4-4-4-12 hex) with its first three fields'
// bytes reversed; "" if u is not of that form.
func swapUUIDFields(u string) string {
	f := strings.Split(u, "-")
	if len(f) != 5 || len(f[0]) != 8 || len(f[1]) != 4 || len(f[2]) != 4 {
		return ""
	}
	for i := range 3 {
		b := []byte(f[i])
		for l, r := 0, len(b)-2; l < r; l, r = l+2, r-2 {
			b[l], b[l+1], b[r], b[r+1] = b[r], b[r+1], b[l], b[l+1]
		}
		f[i] = string(b)
	}
	return strings.Join(f, "-")
}

// systemLinks lists the BMC's systems: at most maxSystems over at most
// maxSystemPages pages, each page read once. (gofish's Service.Systems
// followed Members@odata.nextLink without end — a collection whose next
// page was itself recursed until the process died — and fetched every
// member of every page.)
func systemLinks(c *gofish.APIClient) ([]string, error) {
	resp, err := c.Get(common.DefaultServiceRoot)
	if err != nil {
		return nil, err
	}
	var root struct {
		Systems common.Link `json:"Systems"`
	}
	err = json.NewDecoder(resp.Body).Decode(&root)
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("service root: %w", err)
	}
	if root.Systems == "" {
		return nil, perr(ReasonSystemNotFound, "the BMC's service root lists no Systems collection")
	}
	var links []string
	seen := map[string]bool{}
	for page := root.Systems.String(); page != "" && !seen[page]; {
		if len(seen) == maxSystemPages {
			return nil, perr(ReasonSystemNotFound, "the BMC's Systems collection has more than %d pages (name the system in %s)", maxSystemPages, AnnotationBMC)
		}
		seen[page] = true
		col, err := common.GetCollection(c, page)
		if err != nil {
			return nil, err
		}
		links = append(links, col.ItemLinks...)
		if len(links) > maxSystems {
			return nil, perr(ReasonSystemNotFound, "the BMC lists more than %d systems (name the system in %s)", maxSystems, AnnotationBMC)
		}
		page = col.MembersNextLink
	}
	return links, nil
}

// resetType is the first of want the system allows (its
// ResetType@Redfish.AllowableValues; none listed: any). gofish refuses
// locally a type the system does not list.
func resetType(s *redfish.ComputerSystem, want ...redfish.ResetType) (redfish.ResetType, error) {
	for _, rt := range want {
		if len(s.SupportedResetTypes) == 0 || slices.Contains(s.SupportedResetTypes, rt) {
			return rt, nil
		}
	}
	return "", perr(ReasonResetRejected, "system %s allows the reset types %v, none of %v; nothing sent", s.ODataID, s.SupportedResetTypes, want)
}

// reset sends the first of want the node's system allows; with ifOff, only
// to a system that is Off (ErrNotOff otherwise, nothing sent).
func (r *Redfish) reset(ctx context.Context, t Target, ifOff bool, want ...redfish.ResetType) error {
	// gofish makes every request with the context it connected with: the
	// probe is armed for the reset's POST (and, apart, a session login).
	ctx, probe := withSendProbe(ctx, false)
	hc := r.client(probe)
	defer hc.CloseIdleConnections()
	c, ref, cfg, err := r.connect(ctx, t, hc)
	if err != nil {
		return err
	}
	s, err := r.system(c, t, ref)
	if basicRefused(err) {
		sc, logout, ok, lerr := r.login(ctx, cfg, probe)
		if lerr != nil {
			return lerr
		}
		if ok {
			defer logout()
			c = sc
			s, err = r.system(c, t, ref)
		}
	}
	if err != nil {
		var pe *ProviderError
		if errors.As(err, &pe) {
			return err
		}
		return classify(c.GetService().ODataID, err)
	}
	if ifOff && s.PowerState != redfish.OffPowerState {
		return fmt.Errorf("system %s reads PowerState %q: %w", s.ODataID, s.PowerState, ErrNotOff)
	}
	if s.PowerState == redfish.OffPowerState && (want[0] == redfish.GracefulRestartResetType || want[0] == redfish.ForceRestartResetType) {
		// A machine to reboot that is Off (it crashed, or powered itself
		// off): BMCs refuse to restart what is off (409), and powering it
		// on is its reboot.
		r.log.Info("janitor: redfish system to reboot is Off; powering it on", "node", t.Node.Name, "system", s.ODataID)
		want = []redfish.ResetType{redfish.OnResetType, redfish.ForceOnResetType}
	}
	rt, err := resetType(s, want...)
	if err != nil {
		return err
	}
	if rt != want[0] {
		r.log.Info("janitor: redfish system does not allow "+string(want[0])+"; sending "+string(rt),
			"node", t.Node.Name, "system", s.ODataID, "allowed", s.SupportedResetTypes)
	}
	probe.arm()
	if err := s.Reset(rt); err != nil {
		if probe.sentUnanswered() {
			// The BMC took the reset and did not answer (slow to answer a
			// reset it carried out; the connection cut): it may be done.
			return maybeSent(classify(s.ODataID, err))
		}
		if rt == redfish.ForceOffResetType && s.PowerState == redfish.OffPowerState {
			// A machine to terminate is often a dead one, already Off, and
			// BMCs refuse to power off what is off (409): it is terminated.
			r.log.Info("janitor: redfish ForceOff refused for a system already Off; terminated", "node", t.Node.Name, "system", s.ODataID, "err", err)
			return nil
		}
		return classify(s.ODataID, err)
	}
	r.log.Info("janitor: redfish reset sent", "node", t.Node.Name, "system", s.ODataID, "reset", rt)
	return nil
}

// Reboot sends GracefulRestart, or ForceRestart when forced. A system
// that allows no GracefulRestart (iDRAC9 4.x, Lenovo TSM list On,
// ForceOff, GracefulShutdown, ForceRestart …) gets ForceRestart at once —
// what force_after would send after a graceful reset that did nothing;
// one that allows no ForceRestart, PowerCycle. A system that is Off gets On
// (ForceOn where On is not allowed).
func (r *Redfish) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if mode == Force {
		return r.reset(ctx, t, false, redfish.ForceRestartResetType, redfish.PowerCycleResetType)
	}
	return r.reset(ctx, t, false, redfish.GracefulRestartResetType, redfish.ForceRestartResetType, redfish.PowerCycleResetType)
}

// Terminate sends terminate_action (ForceOff or PowerCycle).
func (r *Redfish) Terminate(ctx context.Context, t Target) error {
	return r.reset(ctx, t, false, redfish.ResetType(r.cfg.TerminateAction))
}

// PowerOnIfOff sends On (ForceOn where only that is allowed) to a system
// that reads PowerState Off; ErrNotOff, nothing sent, to any other.
func (r *Redfish) PowerOnIfOff(ctx context.Context, t Target) error {
	return r.reset(ctx, t, true, redfish.OnResetType, redfish.ForceOnResetType)
}

// ResetGPUs is not a BMC's.
func (r *Redfish) ResetGPUs(context.Context, Target, []string) error { return ErrUnsupported }

// BuildProviders builds the providers of cfg.
func BuildProviders(cfg Config, log *slog.Logger) (map[string]Provider, error) {
	rf, err := NewRedfish(cfg.Redfish, log)
	if err != nil {
		return nil, err
	}
	local, err := NewLocal(cfg.Local)
	if err != nil {
		return nil, err
	}
	out := map[string]Provider{ProviderRedfish: rf, ProviderAWS: NewAWS(cfg.AWS, log), ProviderLocal: local}
	return out, nil
}
