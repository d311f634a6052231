package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/certfile"
)

// certSource serves the webhook's certificate and the CA the API server
// must trust.
type certSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// CABundle is the PEM the webhook configuration's caBundle gets, given
	// the one published there now (nil if none); nil leaves it as it is
	// (an external injector owns it).
	CABundle(published []byte) []byte
	// Refresh renews or reloads the certificate when needed.
	Refresh(ctx context.Context) error
}

// Secret keys of the self-signed mode.
const (
	keyCACert = "ca.crt"
	keyCAKey  = "ca.key"
	// keyCAPrev is the CA before the last rotation, kept while it is
	// valid: until then a replica may serve a certificate it issued, and
	// the caBundle trusts both.
	keyCAPrev = "ca.prev.crt"
)

// caSubject is the self-signed CA's common name.
const caSubject = "faultline-preflight webhook CA"

// selfSigned keeps a CA and a serving certificate in a Secret shared by
// every replica: the first creates it, the others read it; a replica that
// finds the serving certificate near expiry (or missing a name) issues a
// new one from the same CA and writes it back, conditional on the
// resourceVersion it read. When the CA is rotated the previous one stays
// in the Secret (keyCAPrev) and the caBundle, until it expires, so the
// certificates it issued that other replicas still serve keep verifying.
type selfSigned struct {
	kc          kubernetes.Interface
	ns, name    string
	dnsNames    []string
	ips         []net.IP
	validity    time.Duration
	renewBefore time.Duration
	log         *slog.Logger
	now         func() time.Time

	mu   sync.RWMutex
	cert *tls.Certificate
	ca   []byte // the CA, then the previous one while it is valid
}

func newSelfSigned(kc kubernetes.Interface, ns string, cfg TLSConfig, svc ServerConfig, log *slog.Logger) (*selfSigned, error) {
	names := []string{svc.ServiceName, svc.ServiceName + "." + ns, svc.ServiceName + "." + ns + ".svc", svc.ServiceName + "." + ns + ".svc.cluster.local"}
	names = append(names, cfg.DNSNames...)
	var ips []net.IP
	for _, s := range cfg.IPAddresses {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, fmt.Errorf("tls.ip_addresses: %q is not an IP address", s)
		}
		ips = append(ips, ip)
	}
	return &selfSigned{kc: kc, ns: ns, name: cfg.SecretName, dnsNames: names, ips: ips,
		validity: cfg.Validity, renewBefore: cfg.RenewBefore, log: log, now: time.Now}, nil
}

func (s *selfSigned) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.cert == nil {
		return nil, errors.New("no serving certificate yet")
	}
	return s.cert, nil
}

// CABundle is the CAs of the Secret as last read (the CA and, while
// valid, the previous one) and, of the published ones, those valid and
// newer than its CA: another replica read a Secret rotated since, and
// serves a certificate of that CA. So a replica never takes away the CA of
// a certificate served, its own or another's; a CA older than its own that
// the Secret no longer holds is dropped. Newest first, so replicas agree.
func (s *selfSigned) CABundle(published []byte) []byte {
	s.mu.RLock()
	own := s.ca
	s.mu.RUnlock()
	if own == nil {
		return nil
	}
	now := s.now()
	cas := validCAs(own, now)
	if len(cas) == 0 {
		return bytes.Clone(own)
	}
	newest := slices.MaxFunc(cas, func(x, y *x509.Certificate) int { return x.NotBefore.Compare(y.NotBefore) }).NotBefore
	for _, c := range validCAs(published, now) {
		if c.Subject.CommonName == caSubject && c.NotBefore.After(newest) &&
			!slices.ContainsFunc(cas, func(o *x509.Certificate) bool { return o.Equal(c) }) {
			cas = append(cas, c)
		}
	}
	slices.SortStableFunc(cas, func(x, y *x509.Certificate) int {
		if c := y.NotBefore.Compare(x.NotBefore); c != 0 {
			return c
		}
		return bytes.Compare(x.Raw, y.Raw)
	})
	var out []byte
	for _, c := range cas {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// validCAs parses the CA certificates of a PEM bundle valid at now.
func validCAs(bundle []byte, now time.Time) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, bundle = pem.Decode(bundle); blk == nil {
			return out
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil || !c.IsCA || now.Before(c.NotBefore) || now.After(c.NotAfter) {
			continue
		}
		out = append(out, c)
	}
}

// Refresh makes sure the Secret holds a valid CA and serving certificate
// and loads them.
func (s *selfSigned) Refresh(ctx context.Context) error {
	for attempt := 0; attempt < 5; attempt++ {
		sec, err := s.kc.CoreV1().Secrets(s.ns).Get(ctx, s.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			caPEM, caKeyPEM, err := newCA(s.now(), 10*s.validity)
			if err != nil {
				return err
			}
			certPEM, keyPEM, err := s.issue(caPEM, caKeyPEM)
			if err != nil {
				return err
			}
			sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline-preflight"}},
				Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{keyCACert: caPEM, keyCAKey: caKeyPEM, corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
			if _, err := s.kc.CoreV1().Secrets(s.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
				if apierrors.IsAlreadyExists(err) {
					continue // another replica was first
				}
				return fmt.Errorf("tls.secret_name: create %s/%s: %w", s.ns, s.name, err)
			}
			s.log.Info("created the webhook's CA and serving certificate", "secret", s.ns+"/"+s.name)
			return s.load(caPEM, nil, certPEM, keyPEM)
		}
		if err != nil {
			return fmt.Errorf("tls.secret_name: get %s/%s: %w", s.ns, s.name, err)
		}
		caPEM, caKeyPEM := sec.Data[keyCACert], sec.Data[keyCAKey]
		certPEM, keyPEM := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
		prevPEM := sec.Data[keyCAPrev]
		why := s.needsRenewal(caPEM, caKeyPEM, certPEM, keyPEM)
		if why == "" {
			return s.load(caPEM, prevPEM, certPEM, keyPEM)
		}
		if !validCA(caPEM, caKeyPEM, s.now(), s.now().Add(s.validity)) {
			// The replaced CA, still valid, may have issued what another
			// replica serves until its next resync: kept as the previous.
			if len(validCAs(caPEM, s.now())) > 0 {
				prevPEM = caPEM
			}
			if caPEM, caKeyPEM, err = newCA(s.now(), 10*s.validity); err != nil {
				return err
			}
			why += "; new CA"
		}
		if certPEM, keyPEM, err = s.issue(caPEM, caKeyPEM); err != nil {
			return err
		}
		sec.Data = map[string][]byte{keyCACert: caPEM, keyCAKey: caKeyPEM, corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
		if len(validCAs(prevPEM, s.now())) > 0 {
			sec.Data[keyCAPrev] = prevPEM
		}
		if _, err := s.kc.CoreV1().Secrets(s.ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				continue
			}
			return fmt.Errorf("tls.secret_name: update %s/%s: %w", s.ns, s.name, err)
		}
		s.log.Info("renewed the webhook's serving certificate", "secret", s.ns+"/"+s.name, "why", why)
		return s.load(caPEM, sec.Data[keyCAPrev], certPEM, keyPEM)
	}
	return fmt.Errorf("tls.secret_name: %s/%s kept changing under us", s.ns, s.name)
}

// needsRenewal says why the stored certificate cannot be used ("" if it
// can).
func (s *selfSigned) needsRenewal(caPEM, caKeyPEM, certPEM, keyPEM []byte) string {
	if len(caPEM) == 0 || len(caKeyPEM) == 0 || len(certPEM) == 0 || len(keyPEM) == 0 {
		return "incomplete secret"
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return "unreadable certificate"
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return "unreadable certificate"
	}
	ca, err := parseCert(caPEM)
	if err != nil {
		return "unreadable CA"
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return "certificate not signed by the CA"
	}
	if s.now().Add(s.renewBefore).After(cert.NotAfter) {
		return "expires " + cert.NotAfter.Format(time.RFC3339)
	}
	// Issued by a replica whose clock ran ahead (an NTP step, a bad RTC
	// after a power cut): the API server refuses it until then, every
	// admission failing — reissued, not waited for.
	for _, c := range []*x509.Certificate{ca, cert} {
		if s.now().Before(c.NotBefore) {
			return "not valid before " + c.NotBefore.Format(time.RFC3339) + " (issued by a clock ahead)"
		}
	}
	for _, n := range s.dnsNames {
		if !slices.Contains(cert.DNSNames, n) {
			return "lacks name " + n
		}
	}
	for _, ip := range s.ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return "lacks address " + ip.String()
		}
	}
	return ""
}

func (s *selfSigned) issue(caPEM, caKeyPEM []byte) ([]byte, []byte, error) {
	ca, err := parseCert(caPEM)
	if err != nil {
		return nil, nil, err
	}
	caKey, err := parseKey(caKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := s.now()
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: s.dnsNames[2]},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(s.validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: s.dnsNames, IPAddresses: s.ips}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issue the serving certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// load serves the certificate; the caBundle is the CA, then the previous
// one (kept while valid, CABundle drops it once expired).
func (s *selfSigned) load(caPEM, prevPEM, certPEM, keyPEM []byte) error {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	ca := bytes.Clone(caPEM)
	if len(prevPEM) > 0 && !bytes.Equal(prevPEM, caPEM) {
		ca = append(append(ca, '\n'), prevPEM...)
	}
	s.mu.Lock()
	s.cert, s.ca = &c, ca
	s.mu.Unlock()
	return nil
}

func newCA(now time.Time, validity time.Duration) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: caSubject},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(validity), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create the webhook CA: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// validCA: the CA is valid from now until until.
func validCA(caPEM, caKeyPEM []byte, now, until time.Time) bool {
	ca, err := parseCert(caPEM)
	if err != nil || !ca.IsCA || now.Before(ca.NotBefore) || until.After(ca.NotAfter) {
		return false
	}
	_, err = parseKey(caKeyPEM)
	return err == nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// fileCerts serves a certificate written by another issuer (cert-manager),
// re-read whenever its files change (certfile.Pair).
type fileCerts struct {
	*certfile.Pair
	caFile string

	mu sync.Mutex
	ca []byte // the CA file as Refresh checked it
}

func newFileCerts(certFile, keyFile, caFile string) *fileCerts {
	return &fileCerts{Pair: certfile.New(certFile, keyFile, "tls.cert_file, tls.key_file"), caFile: caFile}
}

// CABundle is the CA file as the last Refresh read and checked it (read
// again here, a rotation rewriting it in between could publish an empty
// caBundle, every admission failing until the next resync).
func (f *fileCerts) CABundle([]byte) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ca
}

func (f *fileCerts) Refresh(context.Context) error {
	if _, err := f.GetCertificate(nil); err != nil {
		return err
	}
	if f.caFile != "" {
		b, err := os.ReadFile(f.caFile)
		if err != nil {
			return fmt.Errorf("tls.ca_file: %w", err)
		}
		if blk, _ := pem.Decode(b); blk == nil {
			return fmt.Errorf("tls.ca_file: no PEM certificate in %s", f.caFile)
		}
		f.mu.Lock()
		f.ca = b
		f.mu.Unlock()
	}
	return nil
}
