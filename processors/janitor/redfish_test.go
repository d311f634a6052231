package janitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func bmcSecret(ns, name, user, pass string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data: map[string][]byte{"username": []byte(user), "password": []byte(pass)}}
}

func bmcNode(name, addr, uuid string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationBMC: addr}}}
	n.Status.NodeInfo.SystemUUID = uuid
	return n
}

// waitPower polls the emulator until the system's PowerState is want.
func waitPower(t *testing.T, s *testenv.Sushy, uuid, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		ps, err := s.PowerState(context.Background(), uuid)
		if err == nil && ps == want {
			return
		}
		last = ps
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("system %s PowerState %q, want %q within %v", uuid, last, want, within)
}

// waitResets waits until the emulator accepted n reset requests for the
// system.
func waitResets(t *testing.T, s *testenv.Sushy, uuid string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Resets(uuid) != n {
		if time.Now().After(deadline) {
			t.Fatalf("system %s: %d resets accepted, want %d", uuid, s.Resets(uuid), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedfishEmulator: the provider against sushy-tools' emulator over
// TLS with a configured CA and basic auth: a reboot resets the emulated
// system, which comes back On; two systems behind one BMC are told
// apart by the node's system UUID; wrong credentials, an unreachable BMC,
// a missing Secret and an untrusted certificate end with their reasons.
func TestRedfishEmulator(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t, "", "bmc")
	systems := []testenv.SushySystem{
		{UUID: "11111111-0000-4000-8000-000000000001", Name: "gpu-1"},
		{UUID: "11111111-0000-4000-8000-000000000002", Name: "gpu-2"},
	}
	s := testenv.StartSushy(t, testenv.SushyOptions{Systems: systems, Username: "admin", Password: "s3cret", TLS: ca})
	cfg := DefaultConfig().Redfish
	cfg.CAFile = ca.File
	cfg.AllowedNetworks, cfg.AllowedSecrets = []string{"127.0.0.0/8"}, []string{"wrong", "absent"}
	rf, err := NewRedfish(cfg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"),
		bmcSecret("faultline", "wrong", "admin", "nope"))
	ctx := context.Background()

	// Reboot of gpu-2 (picked by system UUID among two).
	n2 := bmcNode("gpu-2", s.URL, systems[1].UUID)
	if err := rf.Reboot(ctx, Target{Node: n2, Kube: kube}, Graceful); err != nil {
		t.Fatalf("reboot: %v", err)
	}
	waitResets(t, s, systems[1].UUID, 1)
	if n := s.Resets(systems[0].UUID); n != 0 {
		t.Fatalf("the other system got %d resets: the wrong system was reset", n)
	}
	waitPower(t, s, systems[1].UUID, "On", 20*time.Second)

	// Forced, with the system named in the annotation.
	n1 := bmcNode("gpu-1", s.URL+s.SystemPath(systems[0].UUID), "")
	if err := rf.Reboot(ctx, Target{Node: n1, Kube: kube}, Force); err != nil {
		t.Fatalf("force reboot: %v", err)
	}
	waitResets(t, s, systems[0].UUID, 1)

	// Terminate: ForceOff leaves it Off.
	waitPower(t, s, systems[0].UUID, "On", 20*time.Second)
	if err := rf.Terminate(ctx, Target{Node: n1, Kube: kube}); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	waitPower(t, s, systems[0].UUID, "Off", 20*time.Second)

	bad := func(n *corev1.Node, ann map[string]string) *corev1.Node {
		n = n.DeepCopy()
		for k, v := range ann {
			n.Annotations[k] = v
		}
		return n
	}
	ucfg := DefaultConfig().Redfish
	ucfg.AllowedNetworks = cfg.AllowedNetworks
	untrusted, _ := NewRedfish(ucfg, testLog)
	for _, tc := range []struct {
		name   string
		p      *Redfish
		node   *corev1.Node
		reason string
	}{
		{"wrong credentials", rf, bad(n2, map[string]string{AnnotationBMCSecret: "wrong"}), ReasonBMCAuthFailed},
		{"no secret", rf, bad(n2, map[string]string{AnnotationBMCSecret: "absent"}), ReasonNoBMCCredentials},
		{"unreachable", rf, bad(n2, map[string]string{AnnotationBMC: "https://127.0.0.1:1"}), ReasonBMCUnreachable},
		{"no annotation", rf, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, ReasonNoBMC},
		{"untrusted certificate", untrusted, n2, ReasonBMCUnreachable},
		{"system not found", rf, bad(n2, map[string]string{AnnotationBMC: s.URL + "/redfish/v1/Systems/nope"}), ReasonSystemNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Reboot(ctx, Target{Node: tc.node, Kube: kube}, Graceful)
			var pe *ProviderError
			if !errors.As(err, &pe) || pe.Reason != tc.reason {
				t.Fatalf("err %v, want reason %s", err, tc.reason)
			}
		})
	}

	// ca_file replaced in place (the BMCs' CA rotated): trusted by the
	// next operation, the provider unchanged. Before, it trusted the bundle
	// it read at start until the janitor restarted.
	caFile := filepath.Join(t.TempDir(), "bmc-ca.pem")
	testenv.Rotate(t, caFile, testenv.NewCA(t, "", "before-the-rotation").File)
	rcfg := cfg
	rcfg.CAFile = caFile
	rotated, err := NewRedfish(rcfg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	var pe *ProviderError
	if err := rotated.Reboot(ctx, Target{Node: n2, Kube: kube}, Graceful); !errors.As(err, &pe) || pe.Reason != ReasonBMCUnreachable {
		t.Fatalf("the file holding another CA: err %v, want reason %s", err, ReasonBMCUnreachable)
	}
	testenv.Rotate(t, caFile, ca.File)
	if err := rotated.Reboot(ctx, Target{Node: n2, Kube: kube}, Graceful); err != nil {
		t.Fatalf("the file holding the BMC's CA: %v", err)
	}
	waitResets(t, s, systems[1].UUID, 2)
}

// misbehavingBMC is a Redfish service over plain HTTP whose Systems
// collection and reset answers are the test's; it counts the requests
// it got and the bytes it wrote.
type misbehavingBMC struct {
	collection func(w http.ResponseWriter) // GET /redfish/v1/Systems
	reset      func(w http.ResponseWriter) // POST .../Actions/ComputerSystem.Reset
	power      string                      // the systems' PowerState ("": On)
	allowed    string                      // the systems' ResetType@Redfish.AllowableValues (a JSON array; "": none listed)
	uuid       string                      // the systems' UUID ("": 00000000-0000-0000-0000-<the path's length>)
	sent       atomic.Value                // the last reset's ResetType
	lists      atomic.Int32
	resets     atomic.Int32
	written    atomic.Int64
}

func (b *misbehavingBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &countingWriter{ResponseWriter: w, n: &b.written}
	w.Header().Set("Content-Type", "application/json")
	switch p := strings.TrimSuffix(r.URL.Path, "/"); {
	case p == "/redfish/v1":
		fmt.Fprint(cw, `{"@odata.id":"/redfish/v1/","Id":"RootService","Systems":{"@odata.id":"/redfish/v1/Systems"}}`)
	case p == "/redfish/v1/Systems":
		b.lists.Add(1)
		b.collection(cw)
	case strings.HasSuffix(p, "/Actions/ComputerSystem.Reset"):
		b.resets.Add(1)
		var body struct{ ResetType string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		b.sent.Store(body.ResetType)
		if b.reset == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		b.reset(cw)
	case strings.HasPrefix(p, "/redfish/v1/Systems/"):
		power := b.power
		if power == "" {
			power = "On"
		}
		allowed := ""
		if b.allowed != "" {
			allowed = `,"ResetType@Redfish.AllowableValues":` + b.allowed
		}
		uuid := b.uuid
		if uuid == "" {
			uuid = fmt.Sprintf("00000000-0000-0000-0000-%012d", len(p))
		}
		fmt.Fprintf(cw, `{"@odata.id":%q,"Id":"x","UUID":%q,"PowerState":%q,
			"Actions":{"#ComputerSystem.Reset":{"target":%q%s}}}`, p, uuid, power, p+"/Actions/ComputerSystem.Reset", allowed)
	default:
		http.NotFound(w, r)
	}
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// TestRedfishMisbehavingBMC: a BMC's answers cannot hold a worker or
// the process's memory: a Systems collection whose next page is itself
// is read once (gofish followed it for ever, recursing, every page's
// members fetched again, until the stack or the memory gave out — the
// whole janitor with it), and a huge answer is read only up to the
// bound (an error page of 64 MiB was read whole into the error, the
// status message and the log). A ForceOff refused for a system already
// Off terminated it (it failed ResetRejected, and the Node stayed).
func TestRedfishMisbehavingBMC(t *testing.T) {
	t.Parallel()
	const huge = 64 << 20
	for _, tc := range []struct {
		name       string
		system     string // the annotation's system path ("": found by listing)
		collection func(w http.ResponseWriter)
		reset      func(w http.ResponseWriter)
		power      string
		terminate  bool   // Terminate, not Reboot
		reason     string // "": no error
		maxLists   int32
		sent       string // the reset type sent ("": not checked)
	}{
		{name: "next page is itself",
			collection: func(w http.ResponseWriter) {
				fmt.Fprint(w, `{"@odata.id":"/redfish/v1/Systems","Members":[{"@odata.id":"/redfish/v1/Systems/1"},{"@odata.id":"/redfish/v1/Systems/2"}],
					"Members@odata.count":2,"Members@odata.nextLink":"/redfish/v1/Systems"}`)
			},
			reason: ReasonSystemNotFound, maxLists: 1},
		{name: "huge error page", system: "/redfish/v1/Systems/1",
			reset: func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusInternalServerError)
				chunk := []byte("<html>" + strings.Repeat("x", 64<<10) + "</html>\n")
				for n := 0; n < huge; n += len(chunk) {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			},
			reason: ReasonResetRejected},
		{name: "huge system list",
			collection: func(w http.ResponseWriter) {
				fmt.Fprint(w, `{"@odata.id":"/redfish/v1/Systems","Members":[`)
				for i := 0; i < huge/40; i++ {
					if i > 0 {
						fmt.Fprint(w, ",")
					}
					if _, err := fmt.Fprintf(w, `{"@odata.id":"/redfish/v1/Systems/%d"}`, i); err != nil {
						return
					}
				}
				fmt.Fprint(w, `]}`)
			},
			reason: ReasonFailed, maxLists: 1},
		// A machine to terminate is often a dead one, already Off; a BMC
		// answers ForceOff of it 409 (iDRAC: "Server is already powered
		// OFF"). It is terminated: its Node goes.
		{name: "terminate a system already off", system: "/redfish/v1/Systems/1", power: "Off", terminate: true,
			reset: func(w http.ResponseWriter) {
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"error":{"code":"Base.1.8.GeneralError","message":"Server is already powered OFF."}}`)
			}, sent: "ForceOff"},
		// A terminate sends its terminate_action to an Off machine as
		// configured: a reboot's On for a machine found off is not its.
		{name: "terminate a system that is off by power cycle", system: "/redfish/v1/Systems/1", power: "Off", terminate: true, sent: "PowerCycle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const nodeUUID = "11111111-0000-4000-8000-000000000009"
			bmc := &misbehavingBMC{collection: tc.collection, reset: tc.reset, power: tc.power}
			if tc.system != "" {
				bmc.uuid = nodeUUID // the node's own machine
			}
			srv := httptest.NewServer(bmc)
			t.Cleanup(srv.Close)
			cfg := DefaultConfig().Redfish
			cfg.Timeout = 5 * time.Second
			cfg.AllowedNetworks, cfg.AllowHTTP = []string{"127.0.0.0/8"}, true // an http fake BMC
			if tc.terminate && tc.sent != "" {
				cfg.TerminateAction = tc.sent
			}
			rf, err := NewRedfish(cfg, testLog)
			if err != nil {
				t.Fatal(err)
			}
			kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				tg := Target{Cluster: "c1", Node: bmcNode("n1", srv.URL+tc.system, nodeUUID), Kube: kube}
				if tc.terminate {
					done <- rf.Terminate(ctx, tg)
					return
				}
				done <- rf.Reboot(ctx, tg, Graceful)
			}()
			var err2 error
			select {
			case err2 = <-done:
			case <-time.After(10 * time.Second):
				cancel()
				<-done
				t.Fatalf("the reboot still runs after 10 s: the BMC listed its systems %d times, wrote %d bytes", bmc.lists.Load(), bmc.written.Load())
			}
			if tc.reason == "" && err2 != nil {
				t.Errorf("%v, want no error", err2)
			}
			if got := reasonOf(err2); tc.reason != "" && got != tc.reason {
				t.Errorf("reason %s (%v), want %s", got, events.Truncate(fmt.Sprint(err2), 300), tc.reason)
			}
			if sent, _ := bmc.sent.Load().(string); tc.sent != "" && sent != tc.sent {
				t.Errorf("reset %q sent, want %q", sent, tc.sent)
			}
			if tc.maxLists > 0 && bmc.lists.Load() > tc.maxLists {
				t.Errorf("the Systems collection was read %d times, want at most %d", bmc.lists.Load(), tc.maxLists)
			}
			if n := bmc.written.Load(); n >= huge/2 {
				t.Errorf("the BMC wrote %d MiB of its answer before the janitor stopped reading", n>>20)
			}
			if err2 != nil && len(err2.Error()) > 2*maxRedfishBody {
				t.Errorf("the error is %d bytes long", len(err2.Error()))
			}
		})
	}
}

// TestRedfishRefusesAnotherMachine: a system the node's BMC address leads
// to — named in it, or the BMC's only one — whose UUID is not the node's
// system UUID is refused SystemMismatch, nothing sent: the address is
// stale and the BMC another machine's. The UUIDs compare in any case and
// with their first three fields byte-swapped (SMBIOS order); a node or a
// system without a UUID is not compared. Before, the neighbour was reset.
func TestRedfishRefusesAnotherMachine(t *testing.T) {
	t.Parallel()
	const sys = "4c4c4544-0051-3510-8057-b4c04f4b4d32"
	one := func(w http.ResponseWriter) {
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/Systems","Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"Members@odata.count":1}`)
	}
	for _, tc := range []struct {
		name     string
		system   string // the annotation's system path ("": the BMC's only one)
		nodeUUID string
		reason   string // "": sent
	}{
		{name: "named, the node's", system: "/redfish/v1/Systems/1", nodeUUID: sys},
		{name: "named, upper case", system: "/redfish/v1/Systems/1", nodeUUID: strings.ToUpper(sys)},
		{name: "named, fields byte-swapped", system: "/redfish/v1/Systems/1", nodeUUID: "44454c4c-5100-1035-8057-b4c04f4b4d32"},
		{name: "named, the node reports none", system: "/redfish/v1/Systems/1"},
		{name: "named, another machine", system: "/redfish/v1/Systems/1", nodeUUID: "4c4c4544-0051-3510-8057-b4c04f4b4d33", reason: ReasonSystemMismatch},
		{name: "only one, the node's", nodeUUID: sys},
		{name: "only one, another machine", nodeUUID: "00000000-0000-4000-8000-000000000001", reason: ReasonSystemMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bmc := &misbehavingBMC{collection: one, uuid: sys}
			srv := httptest.NewServer(bmc)
			t.Cleanup(srv.Close)
			rf := httpBMCRedfish(t, 5*time.Second)
			kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
			err := rf.Reboot(context.Background(), Target{Node: bmcNode("n1", srv.URL+tc.system, tc.nodeUUID), Kube: kube}, Force)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("%v, want the reset sent", err)
			case tc.reason != "" && reasonOf(err) != tc.reason:
				t.Fatalf("%v (reason %s), want %s", err, reasonOf(err), tc.reason)
			case tc.reason == "" && bmc.resets.Load() != 1, tc.reason != "" && bmc.resets.Load() != 0:
				t.Fatalf("%d resets sent, want them sent: %v", bmc.resets.Load(), tc.reason == "")
			}
		})
	}
}

// TestRedfishResetTypeTheSystemAllows: a system whose Reset action lists
// its ResetType@Redfish.AllowableValues without GracefulRestart —
// iDRAC9 4.x and Lenovo TSM list On, ForceOff, GracefulShutdown,
// ForceRestart, … — gets the first reset of the reboot's that it allows:
// ForceRestart for a graceful reboot (what force_after would send after a
// graceful reset that did nothing), PowerCycle where ForceRestart is not
// listed either; one that allows none of them is refused ResetRejected,
// nothing sent. Before, gofish refused GracefulRestart locally ("reset
// type 'GracefulRestart' is not supported by this service"): every reboot
// of such a machine ended SignalSent=False/Failed and was escalated.
func TestRedfishResetTypeTheSystemAllows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		allowed string
		mode    RebootMode
		power   string // the system's PowerState ("": On)
		ifOff   bool   // PowerOnIfOff, not Reboot
		want    string // the ResetType sent ("": none)
		reason  string // ErrNotOff's: "NotOff"
	}{
		{name: "none listed: GracefulRestart", want: "GracefulRestart"},
		{name: "GracefulRestart listed", allowed: `["On","ForceOff","GracefulRestart","ForceRestart"]`, want: "GracefulRestart"},
		{name: "no GracefulRestart (iDRAC9 4.x)", allowed: `["On","ForceOff","ForceRestart","GracefulShutdown","PushPowerButton","Nmi"]`, want: "ForceRestart"},
		{name: "only PowerCycle", allowed: `["On","ForceOff","PowerCycle"]`, want: "PowerCycle"},
		{name: "forced, only PowerCycle", allowed: `["On","ForceOff","PowerCycle"]`, mode: Force, want: "PowerCycle"},
		{name: "no restart at all", allowed: `["On","ForceOff","GracefulShutdown"]`, reason: ReasonResetRejected},
		// A machine found off is powered on: BMCs refuse to restart what
		// is off. Before, it was sent GracefulRestart, and the reboot
		// failed ResetRejected.
		{name: "off: On", power: "Off", want: "On"},
		{name: "off, only ForceOn", power: "Off", allowed: `["ForceOn","ForceOff","ForceRestart"]`, want: "ForceOn"},
		{name: "forced, off: On", power: "Off", mode: Force, want: "On"},
		// A reboot whose node stays down: only a machine that is off is sent anything.
		{name: "power on if off, off", power: "Off", ifOff: true, want: "On"},
		{name: "power on if off, on", ifOff: true, reason: "NotOff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bmc := &misbehavingBMC{allowed: tc.allowed, power: tc.power}
			srv := httptest.NewServer(bmc)
			t.Cleanup(srv.Close)
			rf := httpBMCRedfish(t, 5*time.Second)
			kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
			tg := Target{Cluster: "c1", Node: bmcNode("n1", srv.URL+"/redfish/v1/Systems/1", ""), Kube: kube}
			var err error
			if tc.ifOff {
				err = rf.PowerOnIfOff(context.Background(), tg)
			} else {
				err = rf.Reboot(context.Background(), tg, tc.mode)
			}
			sent, _ := bmc.sent.Load().(string)
			reason := reasonOf(err)
			if errors.Is(err, ErrNotOff) {
				reason = "NotOff"
			}
			if sent != tc.want || tc.reason == "" && err != nil || tc.reason != "" && reason != tc.reason {
				t.Fatalf("sent %q, returned %v (reason %s); want %q, reason %q", sent, err, reasonOf(err), tc.want, tc.reason)
			}
		})
	}
}

// sessionBMC is a Redfish service with a SessionService that counts the
// sessions logged in and not yet logged out; the system GET and the
// reset POST behave as the test's hold says ("" answers at once).
type sessionBMC struct {
	mu      sync.Mutex
	live    map[string]bool // token → session not logged out
	next    int
	hold    string        // "login", "system", "reset": that request waits for its client to go
	arrived chan struct{} // closed when the held request arrived
	once    sync.Once
	reset   int  // status of the reset's answer (0: 204)
	basic   bool // basic auth accepted (else 401: sessions only)
	resets  int  // resets carried out
}

func (b *sessionBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	p := strings.TrimSuffix(r.URL.Path, "/")
	b.mu.Lock()
	authed := b.live[r.Header.Get("X-Auth-Token")] || b.basic && r.Header.Get("Authorization") != ""
	b.mu.Unlock()
	wait := func(what string) {
		if b.hold == what {
			_, _ = io.Copy(io.Discard, r.Body) // read whole: the server then sees the client go
			b.once.Do(func() { close(b.arrived) })
			<-r.Context().Done()
		}
	}
	switch {
	case p == "/redfish/v1":
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/","Id":"RootService","Systems":{"@odata.id":"/redfish/v1/Systems"},
			"SessionService":{"@odata.id":"/redfish/v1/SessionService"},"Links":{"Sessions":{"@odata.id":"/redfish/v1/SessionService/Sessions"}}}`)
	case p == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost:
		b.mu.Lock()
		b.next++
		tok := fmt.Sprintf("tok-%d", b.next)
		b.live[tok] = true
		b.mu.Unlock()
		wait("login") // logged in, the answer lost
		w.Header().Set("X-Auth-Token", tok)
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/"+tok)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"@odata.id":"/redfish/v1/SessionService/Sessions/%s","Id":%q}`, tok, tok)
	case !authed:
		w.WriteHeader(http.StatusUnauthorized)
	case p == "/redfish/v1/SessionService" && r.Method == http.MethodGet:
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/SessionService","Id":"SessionService","Sessions":{"@odata.id":"/redfish/v1/SessionService/Sessions"}}`)
	case strings.HasPrefix(p, "/redfish/v1/SessionService/Sessions/") && r.Method == http.MethodDelete:
		b.mu.Lock()
		delete(b.live, strings.TrimPrefix(p, "/redfish/v1/SessionService/Sessions/"))
		b.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case p == "/redfish/v1/Systems/1" && r.Method == http.MethodGet:
		wait("system")
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/Systems/1","Id":"1","PowerState":"On",
			"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"}}}`)
	case p == "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset":
		wait("reset")
		b.mu.Lock()
		b.resets++
		b.mu.Unlock()
		if b.reset != 0 {
			w.WriteHeader(b.reset)
			fmt.Fprint(w, `{"error":{"code":"Base.1.8.GeneralError","message":"no"}}`)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func (b *sessionBMC) sessions() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.live)
}

// TestRedfishBasicAuthFirst: the provider resets with basic auth and
// logs in a session (redfish.session) only when the BMC refuses basic
// auth. A BMC has a handful of session slots, and a session whose login
// answer was lost — the login POST written, the answer timed out or cut
// off — is one the janitor cannot log out of: the BMC holds it until its
// session timeout, and a few such and every later login to that BMC is
// refused. Before, every reset logged in a session when the BMC offered
// one: a login whose answer was lost failed the reboot (BMCUnreachable)
// and left its session on the BMC, though the BMC took basic auth.
func TestRedfishBasicAuthFirst(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		basic     bool
		session   bool   // redfish.session
		hold      string // the request whose answer is lost
		reason    string // "": no error
		loggedIn  int    // sessions logged in
		left      int    // sessions left on the BMC
		wantReset int
	}{
		{name: "basic auth accepted: no session", basic: true, session: true, wantReset: 1},
		{name: "basic auth accepted, a login's answer would be lost: no login", basic: true, session: true, hold: "login", wantReset: 1},
		{name: "basic auth refused: a session, logged out", session: true, loggedIn: 1, wantReset: 1},
		{name: "basic auth refused, the login's answer lost", session: true, hold: "login", reason: ReasonBMCUnreachable, loggedIn: 1, left: 1},
		{name: "basic auth refused, redfish.session off", reason: ReasonBMCAuthFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &sessionBMC{live: map[string]bool{}, hold: tc.hold, arrived: make(chan struct{}), basic: tc.basic}
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			cfg := DefaultConfig().Redfish
			cfg.Timeout, cfg.AllowedNetworks, cfg.Session = time.Second, []string{"127.0.0.0/8"}, tc.session
			cfg.AllowHTTP = true // an http fake BMC
			rf, err := NewRedfish(cfg, testLog)
			if err != nil {
				t.Fatal(err)
			}
			kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
			err = rf.Reboot(context.Background(), Target{Cluster: "c1", Node: bmcNode("n1", srv.URL+"/redfish/v1/Systems/1", ""), Kube: kube}, Graceful)
			if tc.reason == "" && err != nil || tc.reason != "" && reasonOf(err) != tc.reason || errors.Is(err, ErrMaybeSent) {
				t.Fatalf("%v (reason %s), want %q", err, reasonOf(err), tc.reason)
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.next != tc.loggedIn || len(b.live) != tc.left || b.resets != tc.wantReset {
				t.Fatalf("%d sessions logged in, %d left on the BMC, %d resets; want %d, %d, %d", b.next, len(b.live), b.resets, tc.loggedIn, tc.left, tc.wantReset)
			}
		})
	}
}

// TestRedfishSessionLoggedOut: a session the provider logged in with is
// logged out on every path — the reset answered or refused, the
// operation cancelled while it read the system or waited for the reset's
// answer (the janitor stopping mid-signal), the reset unanswered past
// redfish.timeout. BMCs allow a handful of sessions (iDRAC, iLO); before,
// a cancelled operation's logout was made with its cancelled context, so
// nothing was sent, and each one left a session on the BMC until it
// timed out: a few, and every reset on that BMC failed to log in.
func TestRedfishSessionLoggedOut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		hold   string // the request that waits until the test cancels ("": none)
		cancel bool   // cancel the operation once the held request arrived
		status int    // the reset's answer (0: 204)
		reason string // "": no error
		maybe  bool   // ErrMaybeSent
	}{
		{name: "reset answered"},
		{name: "reset refused", status: http.StatusConflict, reason: ReasonResetRejected},
		{name: "cancelled while reading the system", hold: "system", cancel: true, reason: ReasonBMCUnreachable},
		{name: "cancelled while the reset is unanswered", hold: "reset", cancel: true, reason: ReasonBMCUnreachable, maybe: true},
		{name: "reset unanswered past the timeout", hold: "reset", reason: ReasonBMCUnreachable, maybe: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A BMC that refuses basic auth: the provider logs in a session.
			b := &sessionBMC{live: map[string]bool{}, hold: tc.hold, arrived: make(chan struct{}), reset: tc.status}
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			rf := httpBMCRedfish(t, time.Second)
			kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() {
					<-b.arrived
					cancel()
				}()
			}
			began := time.Now()
			err := rf.Reboot(ctx, Target{Cluster: "c1", Node: bmcNode("n1", srv.URL+"/redfish/v1/Systems/1", ""), Kube: kube}, Graceful)
			if tc.reason == "" && err != nil || tc.reason != "" && reasonOf(err) != tc.reason || errors.Is(err, ErrMaybeSent) != tc.maybe {
				t.Fatalf("%v (reason %s, may have been sent %v), want %q, %v", err, reasonOf(err), errors.Is(err, ErrMaybeSent), tc.reason, tc.maybe)
			}
			if n := b.sessions(); n != 0 || b.next != 1 {
				t.Fatalf("%d of the %d sessions logged in left on the BMC, want 1 logged in and out", n, b.next)
			}
			if d := time.Since(began); d > 3*time.Second {
				t.Fatalf("the reboot took %v", d)
			}
		})
	}
}

// TestRebootPowersOnAnOffMachine: a RebootNode for a machine that is Off
// (it crashed, or powered itself off) powers it on through the emulated
// BMC, and the reboot ends at the boot ID it comes back with. (BMCs refuse
// to restart what is off; TestRedfishResetTypeTheSystemAllows shows the
// reset type sent. sushy's fake driver takes any, so this one shows the
// path end to end.)
func TestRebootPowersOnAnOffMachine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	cfg := e.config()
	cfg.ForceAfter = 0
	j, rec := e.janitor(cfg, false, nil)
	run(t, j)
	const node = "powered-off"
	e.node(node, sysID(0), true, nil)
	if err := e.bmc.Reset(ctx, sysID(0), "ForceOff"); err != nil {
		t.Fatal(err)
	}
	waitPower(t, e.bmc, sysID(0), "Off", 30*time.Second)
	e.create(kindReboot, node, node, false)
	o := e.wait(kindReboot, node, 60*time.Second)
	if got, res := condOf(o, CondSignalSent), condOf(o, CondNodeReady); got != "True/Succeeded" || res != "True/Succeeded" {
		t.Fatalf("SignalSent %s, NodeReady %s; want True/Succeeded both (status %v)", got, res, o.Object["status"])
	}
	if ps, err := e.bmc.PowerState(ctx, sysID(0)); err != nil || ps != "On" {
		t.Fatalf("PowerState %q (%v), want On", ps, err)
	}
	rec.expect(t, node, []string{"reboot/applied", "reboot/succeeded"})
}

// httpBMCRedfish is a Redfish provider for a fake BMC on 127.0.0.1 that
// serves http, with timeout.
func httpBMCRedfish(t *testing.T, timeout time.Duration) *Redfish {
	t.Helper()
	cfg := DefaultConfig().Redfish
	cfg.Timeout, cfg.AllowedNetworks, cfg.AllowHTTP = timeout, []string{"127.0.0.0/8"}, true
	rf, err := NewRedfish(cfg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	return rf
}
