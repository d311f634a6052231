package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
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
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		c.TLSCert, c.TLSKey, c.ClientCA = certPath, keyPath, p.caPath
		c.UnixSocket, c.UnixSocketCluster = sock, "gamma"
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
