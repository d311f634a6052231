package gateway_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// pki is a CA with helpers to issue server and client certificates.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPath string
	pool   *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "faultline test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), ca: ca, caKey: key, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caPath = p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue returns cert and key files and the tls.Certificate.
func (p *pki) issue(t *testing.T, name string, subject pkix.Name, server bool) (string, string, tls.Certificate) {
	t.Helper()
	return p.issueUntil(t, name, subject, server, time.Now().Add(time.Hour))
}

// issueUntil is issue, the certificate valid until notAfter.
func (p *pki) issueUntil(t *testing.T, name string, subject pkix.Name, server bool, notAfter time.Time) (string, string, tls.Certificate) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certPath := p.write(t, name+".pem", "CERTIFICATE", der)
	keyPath := p.write(t, name+"-key.pem", "EC PRIVATE KEY", kder)
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, pair
}

// testTLSAndUnixSocket: mTLS clients get the cluster of their certificate,
// tokens still work over TLS, a certificate from another CA is refused, and
// the node-local unix socket stamps its configured cluster.
func testTLSAndUnixSocket(t *testing.T, k *testenv.Kafka) {
	p := newPKI(t)
	certPath, keyPath, _ := p.issue(t, "server", pkix.Name{CommonName: "gateway"}, true)
	sock := filepath.Join(t.TempDir(), "faultline.sock")
	socketGroup := "1" // daemon on Debian; any group the test may give a file
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		c.TLSCert, c.TLSKey, c.ClientCA = certPath, keyPath, p.caPath
		c.UnixSocket, c.UnixSocketCluster, c.UnixSocketGroup, c.UnixSocketNode = sock, "gamma", socketGroup, "tls-node"
	}, gateway.Options{})

	submit := func(creds credentials.TransportCredentials, addr string, token string) (string, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx := context.Background()
		if token != "" {
			ctx = withToken(ctx, token)
		}
		resp, err := faultlinev1.NewEventsClient(conn).SubmitEvents(ctx,
			&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("tls-node")}})
		if err != nil {
			return "", err
		}
		return resp.Ids[0], nil
	}
	_, _, client := p.issue(t, "client", pkix.Name{CommonName: "agent-7", Organization: []string{"beta"}}, false)
	mtls := credentials.NewTLS(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{client}})
	certID, err := submit(mtls, gw.GRPCAddr(), "")
	if err != nil {
		t.Fatalf("mTLS: %v", err)
	}
	tokenID, err := submit(credentials.NewTLS(&tls.Config{RootCAs: p.pool}), gw.GRPCAddr(), gw.Token("alpha"))
	if err != nil {
		t.Fatalf("token over TLS: %v", err)
	}
	other := newPKI(t)
	_, _, stranger := other.issue(t, "stranger", pkix.Name{CommonName: "x", Organization: []string{"alpha"}}, false)
	if _, err := submit(credentials.NewTLS(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{stranger}}), gw.GRPCAddr(), ""); err == nil {
		t.Fatal("a certificate from another CA was accepted")
	}
	if _, err := submit(credentials.NewTLS(&tls.Config{RootCAs: p.pool}), gw.GRPCAddr(), ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("TLS without credential: %v", err)
	}
	if _, err := submit(insecure.NewCredentials(), gw.GRPCAddr(), gw.Token("alpha")); err == nil {
		t.Fatal("plaintext accepted on a TLS listener")
	}
	unixID, err := submit(insecure.NewCredentials(), "unix://"+sock, "")
	if err != nil {
		t.Fatalf("unix socket: %v", err)
	}
	// The socket is mode 0660 with the configured group, and serves ingest
	// only: the cluster's history is not readable there.
	st, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o660 || st.Mode().Type() != os.ModeSocket {
		t.Errorf("unix socket mode %v, want a socket with 0660", st.Mode())
	}
	if gid := st.Sys().(*syscall.Stat_t).Gid; strconv.Itoa(int(gid)) != socketGroup {
		t.Errorf("unix socket group %d, want %s", gid, socketGroup)
	}
	uconn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer uconn.Close()
	_, err = faultlinev1.NewEventsClient(uconn).ListEvents(context.Background(), &faultlinev1.ListEventsRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "accepts events only") {
		t.Errorf("history read on the unix socket: %v", err)
	}
	_, err = faultlinev1.NewEventsClient(uconn).SubmitEvents(context.Background(),
		&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("another-node")}})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"another-node" is not "tls-node"`) {
		t.Errorf("unix socket bound to tls-node, event for another node: %v", err)
	}

	// TLS 1.2 offers ECDHE with AEAD ciphers only.
	for _, tt := range []struct {
		suite uint16
		ok    bool
	}{{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, true}, {tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, true},
		{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, false}, {tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, false}} {
		c, err := tls.Dial("tcp", gw.HTTPAddr(), &tls.Config{RootCAs: p.pool, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tt.suite}})
		if err == nil {
			c.Close()
		}
		if (err == nil) != tt.ok {
			t.Errorf("TLS 1.2 with %s: err %v, want accepted %v", tls.CipherSuiteName(tt.suite), err, tt.ok)
		}
	}

	// The REST door over the same TLS: a client certificate or a token
	// names the cluster; without either, 401; plain HTTP is refused.
	rest := func(tc *tls.Config, scheme, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, scheme+"://"+gw.HTTPAddr()+"/v1/events",
			strings.NewReader(`{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"tls-node"}]}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ids struct{ Ids []string }
		if resp.StatusCode == http.StatusOK && (json.Unmarshal(b, &ids) != nil || len(ids.Ids) != 1) {
			t.Fatalf("REST answer %s", b)
		}
		if len(ids.Ids) == 1 {
			return resp.StatusCode, ids.Ids[0]
		}
		return resp.StatusCode, string(b)
	}
	code, restCertID := rest(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{client}}, "https", "")
	if code != http.StatusOK {
		t.Fatalf("REST with a client certificate: %d %s", code, restCertID)
	}
	code, restTokenID := rest(&tls.Config{RootCAs: p.pool}, "https", gw.Token("alpha"))
	if code != http.StatusOK {
		t.Fatalf("REST with a token over TLS: %d %s", code, restTokenID)
	}
	if code, out := rest(&tls.Config{RootCAs: p.pool}, "https", ""); code != http.StatusUnauthorized {
		t.Fatalf("REST over TLS without credential: %d %s", code, out)
	}
	if code, out := rest(nil, "http", gw.Token("alpha")); code == http.StatusOK {
		t.Fatalf("plain HTTP accepted on the TLS REST listener: %s", out)
	}

	want := map[string]string{certID: "beta", tokenID: "alpha", unixID: "gamma", restCertID: "beta", restTokenID: "alpha"}
	cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(want) > 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			ev, err := events.Unmarshal(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if c, ok := want[ev.Id]; ok {
				if ev.Cluster != c || string(r.Key) != c+"/tls-node" {
					t.Errorf("event %s: cluster %q key %q, want %s", ev.Id, ev.Cluster, r.Key, c)
				}
				delete(want, ev.Id)
			}
		})
	}
	if len(want) > 0 {
		t.Fatalf("events not found in Kafka: %v", want)
	}
}

// testNodeBoundCertificates: with client_cert_binds_node an agent
// certificate reports for the node its CommonName names only; an operator
// certificate (OU faultline:operator) is not bound; both are stamped as
// the submitter of their events.
func testNodeBoundCertificates(t *testing.T, k *testenv.Kafka) {
	p := newPKI(t)
	certPath, keyPath, _ := p.issue(t, "server", pkix.Name{CommonName: "gateway"}, true)
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		c.TLSCert, c.TLSKey, c.ClientCA, c.ClientCertBindsNode = certPath, keyPath, p.caPath, true
	}, gateway.Options{})
	_, _, agent := p.issue(t, "agent", pkix.Name{CommonName: "gpu-node-7", Organization: []string{"beta"}}, false)
	_, _, operator := p.issue(t, "operator", pkix.Name{CommonName: "alice", Organization: []string{"beta"}, OrganizationalUnit: []string{gateway.OperatorOU}}, false)
	_, _, misnamed := p.issue(t, "misnamed", pkix.Name{CommonName: "Agent 7", Organization: []string{"beta"}}, false)
	submit := func(cert tls.Certificate, node string) (string, error) {
		conn, err := grpc.NewClient(gw.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		resp, err := faultlinev1.NewEventsClient(conn).SubmitEvents(context.Background(),
			&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event(node)}})
		if err != nil {
			return "", err
		}
		return resp.Ids[0], nil
	}
	agentID, err := submit(agent, "gpu-node-7")
	if err != nil {
		t.Fatalf("agent certificate, its own node: %v", err)
	}
	if _, err := submit(agent, "gpu-node-8"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "events[0].nodeName") {
		t.Fatalf("agent certificate, another node: %v", err)
	}
	opID, err := submit(operator, "gpu-node-8")
	if err != nil {
		t.Fatalf("operator certificate: %v", err)
	}
	if _, err := submit(misnamed, "gpu-node-7"); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "is not a node name") {
		t.Fatalf("a certificate whose CN is no node name: %v", err)
	}
	want := map[string]*datamodels.Submitter{
		agentID: {Name: "cert:beta/gpu-node-7", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT, Node: "gpu-node-7"},
		opID:    {Name: "cert:beta/alice", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR},
	}
	cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(want) > 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			ev, err := events.Unmarshal(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if w, ok := want[ev.Id]; ok {
				if !proto.Equal(ev.GetSubmitter(), w) {
					t.Errorf("event %s: submitter %v, want %v", ev.Id, ev.GetSubmitter(), w)
				}
				delete(want, ev.Id)
			}
		})
	}
	if len(want) > 0 {
		t.Fatalf("events not found in Kafka: %v", want)
	}
}

// testReadyz: /readyz is unauthenticated, so it says "not ready" and
// nothing about why (that goes to the log).
func testReadyz(t *testing.T, k *testenv.Kafka) {
	gw := gatewaytest.Start(t, k.Addr(), nil, gateway.Options{Ready: []gateway.ReadyCheck{{Name: "clickhouse",
		Check: func(context.Context) error {
			return errors.New("clickhouse ping clickhouse://default@10.9.8.7:9000/faultline: connection refused")
		}}}})
	resp, err := http.Get(gw.URL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Equal(b, []byte("not ready\n")) {
		t.Fatalf("/readyz: %d %q, want 503 \"not ready\" and no details", resp.StatusCode, b)
	}
}

// testTLSRotation: a server certificate rotated in place (cert-manager
// renewing the Secret behind the gateway's volume) is served by both doors
// from the next handshake on, without a restart; a rotation caught half
// written (a key that does not load) keeps the last good one served.
// Before, the gateway served the certificate it loaded at start until it
// expired.
func testTLSRotation(t *testing.T, k *testenv.Kafka) {
	p := newPKI(t)
	certPath, keyPath, first := p.issue(t, "rotated", pkix.Name{CommonName: "gateway"}, true)
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) { c.TLSCert, c.TLSKey = certPath, keyPath }, gateway.Options{})
	served := func(addr, proto string) string {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: p.pool, NextProtos: []string{proto}})
		if err != nil {
			t.Fatalf("handshake with %s: %v", addr, err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	serial := func(c tls.Certificate) string {
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.SerialNumber.String()
	}
	for _, door := range []struct{ addr, proto string }{{gw.GRPCAddr(), "h2"}, {gw.HTTPAddr(), "http/1.1"}} {
		if got := served(door.addr, door.proto); got != serial(first) {
			t.Fatalf("%s serves %s, want the first certificate %s", door.addr, got, serial(first))
		}
	}
	// The expiry metric says when the certificate served expires.
	expiry := func() string {
		return scrape(t, gw, &tls.Config{RootCAs: p.pool}, "faultline_gateway_tls_certificate_expiry_timestamp_seconds")
	}
	notAfter := func(c tls.Certificate) string { return strconv.FormatInt(c.Leaf.NotAfter.Unix(), 10) }
	if got := expiry(); got != notAfter(first) {
		t.Fatalf("expiry metric %s, want the first certificate's %s", got, notAfter(first))
	}
	time.Sleep(time.Second) // a distinct modification time, and expiry
	_, _, second := p.issue(t, "rotated", pkix.Name{CommonName: "gateway"}, true)
	for _, door := range []struct{ addr, proto string }{{gw.GRPCAddr(), "h2"}, {gw.HTTPAddr(), "http/1.1"}} {
		if got := served(door.addr, door.proto); got != serial(second) {
			t.Fatalf("%s serves %s after the rotation, want the new certificate %s", door.addr, got, serial(second))
		}
	}
	if got := expiry(); got != notAfter(second) || got == notAfter(first) {
		t.Fatalf("expiry metric %s after the rotation, want the new certificate's %s", got, notAfter(second))
	}
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(keyPath, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := served(gw.GRPCAddr(), "h2"); got != serial(second) {
		t.Fatalf("mid-rotation the gateway serves %s, want the last good certificate %s", got, serial(second))
	}
}

// scrape is the value of series in the gateway's /metrics, read over TLS
// tc, as a whole number.
func scrape(t *testing.T, gw *gatewaytest.Server, tc *tls.Config, series string) string {
	t.Helper()
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := cl.Get("https://" + gw.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return strconv.FormatInt(int64(f), 10)
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return ""
}

// startClientCAGateway starts a gateway serving TLS (server's
// certificate) whose gateway.client_ca, caFile, holds oldCA; newCA is one
// to rotate in.
func startClientCAGateway(t *testing.T, k *testenv.Kafka) (server *pki, gw *gatewaytest.Server, caFile string, oldCA, newCA *pki) {
	t.Helper()
	server = newPKI(t)
	certPath, keyPath, _ := server.issue(t, "server", pkix.Name{CommonName: "gateway"}, true)
	caFile = filepath.Join(t.TempDir(), "client-ca.pem")
	oldCA = newPKI(t)
	time.Sleep(time.Second) // a later expiry for the new CA
	newCA = newPKI(t)
	testenv.Rotate(t, caFile, oldCA.caPath)
	gw = gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		c.TLSCert, c.TLSKey, c.ClientCA = certPath, keyPath, caFile
	}, gateway.Options{})
	return server, gw, caFile, oldCA, newCA
}

// submitter returns a function that submits one event through door
// (grpc, or REST over HTTP/2.0 or HTTP/1.1) with TLS tc, on one
// connection kept open between calls, and one that closes it.
func submitter(t *testing.T, gw *gatewaytest.Server, door string, tc *tls.Config) (submit func() error, done func()) {
	t.Helper()
	once, done := submitOnce(t, gw, door, tc)
	// The gateway's "retry later" (the event log unavailable for a
	// moment, overloaded: gRPC Unavailable from the service, or
	// ResourceExhausted; HTTP 503 or 429) is sent again, as an agent
	// does: on a loaded machine the broker may be slow to take a produce,
	// and that is not the refusal these tests look for.
	return func() error {
		for try := 1; ; try++ {
			err := once()
			if try == 5 || !retryLater(err) {
				return err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}, done
}

// retryLater reports whether err is the gateway's own "retry later".
func retryLater(err error) bool {
	if err == nil {
		return false
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.ResourceExhausted ||
			st.Code() == codes.Unavailable && strings.HasPrefix(st.Message(), "events not accepted:")
	}
	return strings.HasPrefix(err.Error(), "503 ") || strings.HasPrefix(err.Error(), "429 ")
}

// submitOnce returns a func that submits one event through door once.
func submitOnce(t *testing.T, gw *gatewaytest.Server, door string, tc *tls.Config) (submit func() error, done func()) {
	t.Helper()
	if door == "grpc" {
		conn, err := grpc.NewClient(gw.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc.Clone())))
		if err != nil {
			t.Fatal(err)
		}
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := faultlinev1.NewEventsClient(conn).SubmitEvents(ctx,
				&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("ca-node")}})
			return err
		}, func() { conn.Close() }
	}
	tr := &http.Transport{TLSClientConfig: tc.Clone(), ForceAttemptHTTP2: door == "HTTP/2.0"}
	if door == "HTTP/1.1" {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	return func() error {
		req, _ := http.NewRequest(http.MethodPost, "https://"+gw.HTTPAddr()+"/v1/events",
			strings.NewReader(`{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"ca-node"}]}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body) // read to its end: the connection is kept
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Proto != door {
			return fmt.Errorf("%s over %s", resp.Status, resp.Proto)
		}
		return nil
	}, tr.CloseIdleConnections
}

// testOpenConnectionsReverified: a connection open when its client
// certificate stops being trusted is closed within PeerCertsEvery — its
// certificate expired, or its CA removed from gateway.client_ca — and its
// client's next call is refused. Before, a handshake checked the bundle,
// and a connection kept the trust it was admitted with until it closed
// (gRPC: max_connection_age, 30m; a busy REST keep-alive: never).
func testOpenConnectionsReverified(t *testing.T, k *testenv.Kafka) {
	server, gw, caFile, oldCA, newCA := startClientCAGateway(t, k)
	subject := pkix.Name{CommonName: "agent-1", Organization: []string{"beta"}}
	_, _, cert := oldCA.issue(t, "held", subject, false)
	_, _, brief := oldCA.issueUntil(t, "brief", subject, false, time.Now().Add(3*time.Second))
	tc := func(c tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: server.pool, Certificates: []tls.Certificate{c}}
	}
	type client struct {
		name   string
		submit func() error
	}
	var clients []client
	for _, door := range []string{"grpc", "HTTP/2.0", "HTTP/1.1"} {
		submit, done := submitter(t, gw, door, tc(cert))
		t.Cleanup(done)
		clients = append(clients, client{door, submit})
	}
	briefSubmit, done := submitter(t, gw, "grpc", tc(brief))
	t.Cleanup(done)
	for _, c := range append(clients, client{"grpc, brief", briefSubmit}) {
		if err := c.submit(); err != nil {
			t.Fatalf("%s: refused before any change: %v", c.name, err)
		}
	}
	// refusedWithin calls submit until it fails, for at most d.
	refusedWithin := func(submit func() error, d time.Duration) error {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if err := submit(); err != nil {
				return err
			}
		}
		return nil
	}
	bound := gateway.PeerCertsEvery + 5*time.Second
	if refusedWithin(briefSubmit, 3*time.Second+bound) == nil {
		t.Fatal("a connection whose client certificate expired still admitted calls")
	}
	for _, c := range clients {
		if err := c.submit(); err != nil {
			t.Fatalf("%s: refused while its certificate is still valid: %v", c.name, err)
		}
	}
	testenv.Rotate(t, caFile, newCA.caPath)
	for _, c := range clients {
		if err := refusedWithin(c.submit, bound); err == nil {
			t.Errorf("%s: its connection still admitted calls %s after its CA left gateway.client_ca", c.name, bound)
		} else {
			t.Logf("%s: refused: %v", c.name, err)
		}
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: server.pool}}}
	resp, err := cl.Get("https://" + gw.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metrics := string(b)
	for _, want := range []string{`faultline_gateway_untrusted_connections_closed_total{door="grpc"} 2`,
		`faultline_gateway_untrusted_connections_closed_total{door="rest"} 2`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// testClientCARotation: the client CA file replaced in place (a CA rotated)
// is used from the next handshake on, by both doors and both HTTP versions:
// a certificate of the new CA is admitted and one of the removed CA is
// refused, even resuming a session it began before the change. Before, the
// gateway verified against the bundle it read at start until a restart.
// faultline_tls_ca_expiry_timestamp_seconds{key="gateway.client_ca"} says
// when the bundle's CA expires: the old one's, then the new one's.
func testClientCARotation(t *testing.T, k *testenv.Kafka) {
	server, gw, caFile, oldCA, newCA := startClientCAGateway(t, k)
	subject := pkix.Name{CommonName: "agent-1", Organization: []string{"beta"}}
	_, _, oldCert := oldCA.issue(t, "old", subject, false)
	_, _, newCert := newCA.issue(t, "new", subject, false)
	resumed := tls.NewLRUClientSessionCache(4) // the old certificate's sessions

	// admitted submits one event with cert through each door: gRPC, REST
	// over HTTP/2 and over HTTP/1.1, each on a new connection; it returns
	// the doors that refused it.
	admitted := func(cert tls.Certificate, cache tls.ClientSessionCache) []string {
		t.Helper()
		var refused []string
		tc := &tls.Config{RootCAs: server.pool, Certificates: []tls.Certificate{cert}, ClientSessionCache: cache}
		for _, door := range []string{"grpc", "HTTP/2.0", "HTTP/1.1"} {
			submit, done := submitter(t, gw, door, tc)
			if err := submit(); err != nil {
				refused = append(refused, door+": "+err.Error())
			}
			done()
		}
		return refused
	}
	if r := admitted(oldCert, resumed); len(r) > 0 {
		t.Fatalf("before the rotation the old CA's certificate was refused: %v", r)
	}
	if r := admitted(newCert, nil); len(r) != 3 {
		t.Fatalf("before the rotation the new CA's certificate was admitted by a door: refused only by %v", r)
	}
	caExpiry := func(cert tls.Certificate) string {
		return scrape(t, gw, &tls.Config{RootCAs: server.pool, Certificates: []tls.Certificate{cert}},
			`faultline_tls_ca_expiry_timestamp_seconds{key="gateway.client_ca"}`)
	}
	notAfter := func(ca *pki) string { return strconv.FormatInt(ca.ca.NotAfter.Unix(), 10) }
	if got := caExpiry(oldCert); got != notAfter(oldCA) {
		t.Fatalf("CA expiry metric %s, want the old CA's %s", got, notAfter(oldCA))
	}
	testenv.Rotate(t, caFile, newCA.caPath)
	if r := admitted(newCert, nil); len(r) > 0 {
		t.Fatalf("after the rotation the new CA's certificate was refused: %v", r)
	}
	if got := caExpiry(newCert); got != notAfter(newCA) || got == notAfter(oldCA) {
		t.Fatalf("CA expiry metric %s after the rotation, want the new CA's %s", got, notAfter(newCA))
	}
	if r := admitted(oldCert, resumed); len(r) != 3 {
		t.Fatalf("after the rotation the removed CA's certificate was admitted by a door: refused only by %v", r)
	}
	// A rotation caught half written keeps the last good bundle.
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(caFile, []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := admitted(newCert, nil); len(r) > 0 {
		t.Fatalf("mid-rotation the last good CA's certificate was refused: %v", r)
	}
}
