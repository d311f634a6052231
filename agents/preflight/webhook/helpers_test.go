package webhook_test

import (
	"crypto/x509"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

func runtimeRaw(b []byte) runtime.RawExtension { return runtime.RawExtension{Raw: b} }

func x509Pool(t *testing.T, pem []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatal("no CA in the caBundle")
	}
	return p
}
