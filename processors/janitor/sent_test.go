package janitor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/agents/localaction"
	"github.com/faultline/faultline/schemas/events"
)

// signalSink is the machines' controllers in one httptest server: a
// Redfish BMC (one system per node, /redfish/v1/Systems/<node>), the
// nodes' agents (POST /v1/local/<action>) and EC2 (POST /, the instance
// named by the instances map). Every signal is counted per node and
// reaches onSignal (the machine reboots); its answer is the node's mode:
// "hang" reads the request and never answers, "close" reads it and closes
// the connection, anything else answers that it was done.
type signalSink struct {
	mu        sync.Mutex
	mode      map[string]string   // node → hang | close | ""
	instances map[string]string   // EC2 instance → node
	got       map[string]int      // node → signals received
	power     map[string]string   // node → its system's PowerState ("": On)
	resets    map[string][]string // node → the Redfish reset types received
	onSignal  func(node string)
	stop      chan struct{}
}

func newSignalSink(t *testing.T) (*signalSink, *httptest.Server) {
	s := &signalSink{mode: map[string]string{}, instances: map[string]string{}, got: map[string]int{}, power: map[string]string{},
		resets: map[string][]string{}, stop: make(chan struct{})}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(s.stop) }) // first: the hanging handlers return
	return s, srv
}

func (s *signalSink) set(node, mode, instance string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode[node] = mode
	if instance != "" {
		s.instances[instance] = node
	}
}

// setPower sets the PowerState node's system reads.
func (s *signalSink) setPower(node, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.power[node] = state
}

// resetTypes are the Redfish reset types node's system received.
func (s *signalSink) resetTypes(node string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resets[node])
}

func (s *signalSink) signals(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[node]
}

func (s *signalSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimSuffix(r.URL.Path, "/")
	var node string
	switch {
	case r.Method == http.MethodGet && p == "/redfish/v1":
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/","Id":"RootService","Systems":{"@odata.id":"/redfish/v1/Systems"}}`)
		return
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/redfish/v1/Systems/"):
		s.mu.Lock()
		power := cmp.Or(s.power[strings.TrimPrefix(p, "/redfish/v1/Systems/")], "On")
		s.mu.Unlock()
		fmt.Fprintf(w, `{"@odata.id":%q,"Id":"x","PowerState":%q,"Actions":{"#ComputerSystem.Reset":{"target":%q}}}`, p, power, p+"/Actions/ComputerSystem.Reset")
		return
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/Actions/ComputerSystem.Reset"):
		node = strings.Split(strings.TrimPrefix(p, "/redfish/v1/Systems/"), "/")[0]
		var body struct{ ResetType string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		s.mu.Lock()
		s.resets[node] = append(s.resets[node], body.ResetType)
		s.mu.Unlock()
	case r.Method == http.MethodPost && strings.HasPrefix(p, "/v1/local/"):
		var req localaction.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		node = req.Node
	case r.Method == http.MethodPost && p == "":
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		node = s.instances[r.PostForm.Get("InstanceId.1")]
		s.mu.Unlock()
	}
	if node == "" {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.got[node]++
	mode, on := s.mode[node], s.onSignal
	s.mu.Unlock()
	if on != nil {
		go on(node)
	}
	switch mode {
	case "hang": // a BMC slow to answer the reset it carries out
		select {
		case <-r.Context().Done():
		case <-s.stop:
		}
	case "close": // the agent killed by the reboot it started
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	default:
		switch {
		case strings.HasPrefix(p, "/v1/local/"):
			_ = json.NewEncoder(w).Encode(localaction.Answer{OK: true})
		case p == "":
			w.Header().Set("Content-Type", "text/xml")
			fmt.Fprint(w, `<RebootInstancesResponse><requestId>x</requestId><return>true</return></RebootInstancesResponse>`)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}
}

// bmcSinkNode is a quarantined, drained node (not yet created) whose BMC is
// the sink's Redfish system of its name.
func bmcSinkNode(sink *signalSink, srv *httptest.Server, name string) *corev1.Node {
	sink.set(name, "", "")
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels:      map[string]string{AnnotationProvider: ProviderRedfish, events.LabelQuarantined: "true", labelDrain: "succeeded"},
		Annotations: map[string]string{AnnotationBMC: srv.URL + "/redfish/v1/Systems/" + name}}}
}

// refusedAddr is an address where nothing listens (connections refused).
func refusedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestProvidersTellUnansweredFromUnsent: each provider tells a signal
// whose request was written and never answered — the controller hangs
// after reading it, or closes the connection — from one that did not go
// out (connections refused): the first is ErrMaybeSent (with the
// provider's reason kept), sent once (the AWS SDK does not try again);
// the second is not. Before, all of them were plain failures ("no signal
// went out"), and the SDK sent RebootInstances three times.
func TestProvidersTellUnansweredFromUnsent(t *testing.T) {
	t.Parallel()
	sink, srv := newSignalSink(t)
	dir := t.TempDir()
	signingKey, _ := writeKeyPair(t, dir, "janitor")
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
	cfg := DefaultConfig()
	cfg.Redfish.Timeout, cfg.Local.Timeout, cfg.AWS.Timeout = time.Second, time.Second, time.Second
	cfg.Redfish.AllowedNetworks, cfg.Local.AllowedNetworks = []string{"127.0.0.0/8"}, []string{"127.0.0.0/8"}
	cfg.Redfish.AllowHTTP = true // the sink is an http BMC
	cfg.Local.SigningKeyFile = signingKey
	host := strings.TrimPrefix(srv.URL, "http://")
	off := refusedAddr(t)
	provider := func(name string, endpoint string) Provider {
		switch name {
		case ProviderRedfish:
			p, err := NewRedfish(cfg.Redfish, testLog)
			if err != nil {
				t.Fatal(err)
			}
			return p
		case ProviderLocal:
			p, err := NewLocal(cfg.Local)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		c := cfg.AWS
		c.Endpoint = endpoint
		return NewAWS(c, testLog)
	}
	for i, tc := range []struct {
		provider, mode string
		gpuReset       bool
		maybe          bool
		reason         string
		signals        int
	}{
		{provider: ProviderRedfish, mode: "hang", maybe: true, reason: ReasonBMCUnreachable, signals: 1},
		{provider: ProviderRedfish, mode: "close", maybe: true, reason: ReasonBMCUnreachable, signals: 1},
		{provider: ProviderRedfish, mode: "refused", reason: ReasonBMCUnreachable},
		{provider: ProviderLocal, mode: "hang", maybe: true, reason: ReasonAgentUnreachable, signals: 1},
		{provider: ProviderLocal, mode: "close", maybe: true, reason: ReasonAgentUnreachable, signals: 1},
		{provider: ProviderLocal, mode: "close", gpuReset: true, maybe: true, reason: ReasonAgentUnreachable, signals: 1},
		{provider: ProviderLocal, mode: "refused", reason: ReasonAgentUnreachable},
		{provider: ProviderAWS, mode: "hang", maybe: true, reason: ReasonCloudUnreachable, signals: 1},
		{provider: ProviderAWS, mode: "close", maybe: true, reason: ReasonCloudUnreachable, signals: 1},
		{provider: ProviderAWS, mode: "refused", reason: ReasonCloudUnreachable},
	} {
		name := fmt.Sprintf("%s-%s", tc.provider, tc.mode)
		if tc.gpuReset {
			name += "-gpureset"
		}
		t.Run(name, func(t *testing.T) {
			node := fmt.Sprintf("sig-%d", i)
			instance := fmt.Sprintf("i-%017d", i)
			sink.set(node, tc.mode, instance)
			at := host
			if tc.mode == "refused" {
				at = off
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{
				AnnotationBMC:   "http://" + at + "/redfish/v1/Systems/" + node,
				AnnotationAgent: at,
			}}, Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/" + instance}}
			p := provider(tc.provider, "http://"+at)
			tg := Target{Cluster: "c1", Node: n, Kube: kube, RequestID: node + "/signal"}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var err error
			if tc.gpuReset {
				err = p.ResetGPUs(ctx, tg, nil)
			} else {
				err = p.Reboot(ctx, tg, Graceful)
			}
			if err == nil || errors.Is(err, ErrMaybeSent) != tc.maybe || reasonOf(err) != tc.reason {
				t.Fatalf("err %v: may have been sent %v, reason %s; want %v, %s", err, errors.Is(err, ErrMaybeSent), reasonOf(err), tc.maybe, tc.reason)
			}
			if got := sink.signals(node); got != tc.signals {
				t.Fatalf("%d signals received, want %d", got, tc.signals)
			}
		})
	}
}

// TestSignalSentUnanswered: on a real kube-apiserver, a signal whose
// request reached its target and got no answer — a BMC that hangs after
// reading the reset, an agent or EC2 endpoint that closes the connection
// after reading it — is written SignalSent=True/MaybeSent, sent once, and
// followed: the node back with a new boot ID completes NodeReady=True; a
// node that never comes back ends NodeReady=False/Timeout (a genuine
// failure). A signal that did not go out (connections refused) stays
// SignalSent=False with the provider's reason. Before, every one of them
// was written SignalSent=False/<reason> ("no signal went out"): the
// remediate role escalated a node that was rebooting, and that node's
// every later fault with it.
func TestSignalSentUnanswered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	sink, srv := newSignalSink(t)
	signingKey, _ := writeKeyPair(t, t.TempDir(), "janitor")
	cfg := e.config()
	cfg.Redfish.Timeout, cfg.Local.Timeout, cfg.AWS.Timeout = time.Second, time.Second, time.Second
	cfg.Redfish.AllowHTTP = true // the sink is an http BMC
	cfg.Local.SigningKeyFile = signingKey
	cfg.AWS.Endpoint = srv.URL
	cfg.RebootTimeout, cfg.ForceAfter = 10*time.Second, 0
	host := strings.TrimPrefix(srv.URL, "http://")
	off := refusedAddr(t)
	provs := e.providers(cfg)
	awsOff := cfg.AWS
	awsOff.Endpoint = "http://" + off
	provs["aws-refused"] = NewAWS(awsOff, testLog)

	// The machines: one that got its signal reboots (a new boot ID, Ready)
	// unless it is one that never comes back.
	var mu sync.Mutex
	stays := map[string]bool{}
	sink.mu.Lock()
	sink.onSignal = func(node string) {
		mu.Lock()
		s := stays[node]
		mu.Unlock()
		if s {
			return
		}
		time.Sleep(300 * time.Millisecond)
		e.m.setNode(ctx, node, corev1.ConditionTrue, uuid.NewString())
	}
	sink.mu.Unlock()

	cases := []struct {
		name, provider, mode string
		staysDown            bool
		signalSent, result   string // condOf SignalSent, NodeReady
		signals              int
	}{
		{name: "redfish-hang", provider: ProviderRedfish, mode: "hang", signalSent: "True/MaybeSent", result: "True/Succeeded", signals: 1},
		{name: "redfish-close", provider: ProviderRedfish, mode: "close", signalSent: "True/MaybeSent", result: "True/Succeeded", signals: 1},
		{name: "redfish-refused", provider: ProviderRedfish, mode: "refused", signalSent: "False/BMCUnreachable", result: "False/BMCUnreachable"},
		{name: "redfish-close-never-back", provider: ProviderRedfish, mode: "close", staysDown: true, signalSent: "True/MaybeSent", result: "False/Timeout", signals: 1},
		{name: "local-hang", provider: ProviderLocal, mode: "hang", signalSent: "True/MaybeSent", result: "True/Succeeded", signals: 1},
		{name: "local-close", provider: ProviderLocal, mode: "close", signalSent: "True/MaybeSent", result: "True/Succeeded", signals: 1},
		{name: "local-refused", provider: ProviderLocal, mode: "refused", signalSent: "False/AgentUnreachable", result: "False/AgentUnreachable"},
		{name: "aws-hang", provider: ProviderAWS, mode: "hang", signalSent: "True/MaybeSent", result: "True/Succeeded", signals: 1},
		{name: "aws-close", provider: ProviderAWS, mode: "close", signalSent: "True/MaybeSent", result: "True/Succeeded", signals: 1},
		{name: "aws-refused", provider: "aws-refused", mode: "refused", signalSent: "False/CloudUnreachable", result: "False/CloudUnreachable"},
	}
	j, rec := e.janitor(cfg, false, provs)
	run(t, j)
	for i, tc := range cases {
		node := "unans-" + tc.name
		instance := fmt.Sprintf("i-%017d", 100+i)
		sink.set(node, tc.mode, instance)
		mu.Lock()
		stays[node] = tc.staysDown
		mu.Unlock()
		at := host
		if tc.mode == "refused" {
			at = off
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
			Labels: map[string]string{AnnotationProvider: tc.provider, events.LabelQuarantined: "true", labelDrain: "succeeded"},
			Annotations: map[string]string{
				AnnotationBMC:   "http://" + at + "/redfish/v1/Systems/" + node,
				AnnotationAgent: at,
			}}, Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/" + instance}}
		if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.create(kindReboot, node, node, false)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := "unans-" + tc.name
			o := e.wait(kindReboot, node, 60*time.Second)
			if got, res := condOf(o, CondSignalSent), condOf(o, CondNodeReady); got != tc.signalSent || res != tc.result {
				t.Fatalf("SignalSent %s, NodeReady %s; want %s, %s (status %v)", got, res, tc.signalSent, tc.result, o.Object["status"])
			}
			if got := sink.signals(node); got != tc.signals {
				t.Fatalf("%d signals received, want %d", got, tc.signals)
			}
			if tc.signals > 0 {
				want := []string{"reboot/applied", "reboot/succeeded"}
				if tc.staysDown {
					want = []string{"reboot/applied", "reboot/failed"}
				}
				rec.expect(t, node, want)
			}
		})
	}
}

// TestRebootWaitsForABootID: a node whose kubelet has reported no boot ID
// yet (or a watch copy from before it did) gets no reboot signal: its end
// is a boot ID other than the one recorded with the signal, and recorded
// empty, the node's first report of its unchanged boot read as the reboot
// done (seen in TestSignalSentUnanswered under load: "Ready with a new
// boot ID boot-0-… (was )" for a machine that never came back). The
// signal goes once the boot ID is there, and the reboot ends only at
// another one. A node that reports none within reboot_timeout fails
// NoBootID, no signal sent (before, it waited for the remediate role's
// completion_timeout, an hour by default).
func TestRebootWaitsForABootID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	sink, srv := newSignalSink(t)
	cfg := e.config()
	cfg.RebootTimeout, cfg.ForceAfter, cfg.PollInterval = 5*time.Second, 0, 200*time.Millisecond
	cfg.Redfish.AllowHTTP = true // the sink is an http BMC
	j, rec := e.janitor(cfg, false, e.providers(cfg))
	run(t, j)
	const node = "no-boot-id"
	n := bmcSinkNode(sink, srv, node)
	setReady(n, corev1.ConditionTrue) // Ready, no boot ID
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(kindReboot, node, node, false)
	time.Sleep(2 * time.Second)
	if got := sink.signals(node); got != 0 {
		t.Fatalf("%d reboot signals sent to a node with no boot ID, want none yet", got)
	}
	e.m.setNode(ctx, node, corev1.ConditionTrue, "boot-0")
	o := e.wait(kindReboot, node, 30*time.Second)
	if got, res := condOf(o, CondSignalSent), condOf(o, CondNodeReady); got != "True/Succeeded" || res != "False/Timeout" {
		t.Fatalf("SignalSent %s, NodeReady %s; want True/Succeeded, False/Timeout: the machine kept boot-0 (status %v)", got, res, o.Object["status"])
	}
	if got := sink.signals(node); got != 1 {
		t.Fatalf("%d reboot signals, want 1 once the boot ID was there", got)
	}
	rec.expect(t, node, []string{"reboot/deferred", "reboot/applied", "reboot/failed"})

	const never = "never-boot-id"
	n = bmcSinkNode(sink, srv, never)
	setReady(n, corev1.ConditionTrue)
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(kindReboot, never, never, false)
	o = e.wait(kindReboot, never, 30*time.Second)
	if got, res := condOf(o, CondSignalSent), condOf(o, CondNodeReady); got != "False/"+ReasonNoBootID || res != "False/"+ReasonNoBootID {
		t.Fatalf("SignalSent %s, NodeReady %s; want False/%s for a node that never reported a boot ID (status %v)", got, res, ReasonNoBootID, o.Object["status"])
	}
	if got := sink.signals(never); got != 0 {
		t.Fatalf("%d reboot signals sent to a node with no boot ID, want none", got)
	}
	rec.expect(t, never, []string{"reboot/deferred", "reboot/failed"})
	if msgs := nodeEvents(t, e.kube, never, "Warning/RebootNodeFailed"); !strings.Contains(msgs[0], ReasonNoBootID) {
		t.Errorf("node Event %q, want it to say %s", msgs[0], ReasonNoBootID)
	}
}

// TestRebootPowersOnAMachineLeftOff: a graceful reset that left the
// machine off (taken as a shutdown; a BMC that did not power it back on)
// is followed, once the node has stayed down with its old boot ID past
// force_after, by an On, and the reboot ends at the boot ID it comes back
// with. A machine that is on while its node stays down (shutting down, a
// long POST) is sent nothing more: the reboot ends Timeout. Before, both
// waited for reboot_timeout.
func TestRebootPowersOnAMachineLeftOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	sink, srv := newSignalSink(t)
	cfg := e.config()
	cfg.RebootTimeout, cfg.ForceAfter, cfg.PollInterval = 15*time.Second, time.Second, 200*time.Millisecond // the timeout leaves room for a loaded machine
	cfg.Redfish.AllowHTTP = true                                                                            // the sink is an http BMC
	prov, err := BuildProviders(cfg, testLog)                                                               // not observed: the janitor asks redfish itself whether a machine is off
	if err != nil {
		t.Fatal(err)
	}
	j, rec := e.janitor(cfg, false, prov)
	run(t, j)
	const off, on = "left-off", "stays-on"
	for _, node := range []string{off, on} {
		if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(bmcSinkNode(sink, srv, node)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The reset takes each node down; the first machine stays off.
	sink.mu.Lock()
	sink.onSignal = func(node string) {
		if node == off && sink.signals(node) == 1 {
			sink.setPower(node, "Off")
		}
		e.m.setNode(ctx, node, corev1.ConditionFalse, "")
	}
	sink.mu.Unlock()
	e.create(kindReboot, off, off, false)
	e.create(kindReboot, on, on, false)
	for deadline := time.Now().Add(20 * time.Second); !slices.Equal(sink.resetTypes(off), []string{"GracefulRestart", "On"}); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s received %q, want GracefulRestart then On", off, sink.resetTypes(off))
		}
	}
	sink.setPower(off, "On")
	e.m.setNode(ctx, off, corev1.ConditionTrue, "boot-1")
	if o := e.wait(kindReboot, off, 30*time.Second); condOf(o, CondNodeReady) != "True/Succeeded" {
		t.Fatalf("%s: NodeReady %s, want True/Succeeded (status %v)", off, condOf(o, CondNodeReady), o.Object["status"])
	}
	rec.expect(t, off, []string{"reboot/applied", "reboot/applied", "reboot/succeeded"})
	if o := e.wait(kindReboot, on, 30*time.Second); condOf(o, CondNodeReady) != "False/Timeout" {
		t.Fatalf("%s: NodeReady %s, want False/Timeout (status %v)", on, condOf(o, CondNodeReady), o.Object["status"])
	}
	if got := sink.resetTypes(on); !slices.Equal(got, []string{"GracefulRestart"}) {
		t.Fatalf("%s (on, its node down) received %q, want only its GracefulRestart", on, got)
	}
}

// TestRebootForcesAMachineHungInShutdown: a node down with its old boot ID
// for hung_after while its machine reads On (a shutdown that hung) gets
// one ForceRestart, force_after off notwithstanding, and its reboot then
// completes on the new boot ID. Before, such a machine was sent nothing
// and its reboot ended Timeout at reboot_timeout.
func TestRebootForcesAMachineHungInShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	sink, srv := newSignalSink(t)
	cfg := e.config()
	cfg.RebootTimeout, cfg.ForceAfter, cfg.HungAfter, cfg.PollInterval = 30*time.Second, 0, 2*time.Second, 200*time.Millisecond
	cfg.Redfish.AllowHTTP = true              // the sink is an http BMC
	prov, err := BuildProviders(cfg, testLog) // not observed: the janitor asks redfish itself whether a machine is off
	if err != nil {
		t.Fatal(err)
	}
	j, rec := e.janitor(cfg, false, prov)
	run(t, j)
	const node = "hung"
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(bmcSinkNode(sink, srv, node)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The graceful reset takes the node down; the machine stays on.
	sink.mu.Lock()
	sink.onSignal = func(node string) {
		if sink.signals(node) == 1 {
			e.m.setNode(ctx, node, corev1.ConditionFalse, "")
		}
	}
	sink.mu.Unlock()
	e.create(kindReboot, node, node, false)
	for deadline := time.Now().Add(20 * time.Second); !slices.Equal(sink.resetTypes(node), []string{"GracefulRestart", "ForceRestart"}); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s received %q, want GracefulRestart then ForceRestart", node, sink.resetTypes(node))
		}
	}
	e.m.setNode(ctx, node, corev1.ConditionTrue, "boot-1")
	if o := e.wait(kindReboot, node, 30*time.Second); condOf(o, CondNodeReady) != "True/Succeeded" {
		t.Fatalf("NodeReady %s, want True/Succeeded (status %v)", condOf(o, CondNodeReady), o.Object["status"])
	}
	rec.expect(t, node, []string{"reboot/applied", "reboot/applied", "reboot/succeeded"})
	if got := sink.resetTypes(node); !slices.Equal(got, []string{"GracefulRestart", "ForceRestart"}) {
		t.Fatalf("%s received %q, want one ForceRestart after its GracefulRestart", node, got)
	}
}
