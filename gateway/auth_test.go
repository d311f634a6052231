package gateway

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		name, in, wantErr string
	}{
		{"ok", "# comment\n\n0123456789abcdef0123,alpha\nfedcba98765432100000, beta \n", ""},
		{"no comma", "0123456789abcdef0123 alpha\n", "line 1: want 'token,cluster'"},
		{"short token", "short,alpha\n", "line 1: token must be at least 16"},
		{"bad cluster", "0123456789abcdef0123,Alpha_1\n", `line 1: cluster "Alpha_1" is not a lowercase DNS label`},
		{"duplicate", "0123456789abcdef0123,alpha\n0123456789abcdef0123,beta\n", "line 2: duplicate token"},
		{"empty", "# nothing\n", "no tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTokens(strings.NewReader(tt.in))
			if tt.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("want %q, got %v", tt.wantErr, err)
			}
		})
	}
}

func TestAuthenticate(t *testing.T) {
	toks, err := ParseTokens(strings.NewReader("0123456789abcdef0123,alpha\nfedcba98765432100000,beta\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := &Authenticator{Tokens: toks}
	cert := func(org ...string) [][]*x509.Certificate {
		return [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: "node-agent", Organization: org}}}}
	}
	tests := []struct {
		name        string
		authz       string
		chains      [][]*x509.Certificate
		wantCluster string
		wantErr     error
	}{
		{"token alpha", "Bearer 0123456789abcdef0123", nil, "alpha", nil},
		{"token beta, scheme case", "bearer fedcba98765432100000", nil, "beta", nil},
		{"wrong token", "Bearer 0123456789abcdef9999", nil, "", ErrBadCredential},
		{"basic scheme", "Basic abc", nil, "", ErrBadCredential},
		{"nothing", "", nil, "", ErrNoCredential},
		{"client cert", "", cert("gamma"), "gamma", nil},
		{"client cert without org", "", cert(), "", ErrBadCredential},
		{"token wins over cert", "Bearer 0123456789abcdef0123", cert("gamma"), "alpha", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := a.Authenticate(tt.authz, tt.chains)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if c.Cluster != tt.wantCluster {
				t.Fatalf("cluster = %q, want %q", c.Cluster, tt.wantCluster)
			}
		})
	}
}
