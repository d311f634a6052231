package gateway

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		name, in, wantErr string
	}{
		{"ok", "# comment\n\n0123456789abcdef0123,alpha\nfedcba98765432100000, beta \n", ""},
		{"no comma", "0123456789abcdef0123 alpha\n", "line 1: want 'token,cluster[,role[,node]]', got 1 fields"},
		{"roles and nodes", "0123456789abcdef0123,alpha,operator\n0123456789abcdef0124,alpha,agent,gpu-node-1\n0123456789abcdef0125,alpha,,gpu-node-2\n", ""},
		{"bad role", "0123456789abcdef0123,alpha\n0123456789abcdef0124,alpha,admin\n", `line 2: role "admin" is not agent or operator`},
		{"bad node", "0123456789abcdef0123,alpha,agent,Node_1\n", `line 1: node "Node_1" is not a Kubernetes node name`},
		{"too many fields", "0123456789abcdef0123,alpha,agent,n1,x\n", "line 1: want 'token,cluster[,role[,node]]', got 5 fields"},
		{"control in token", "0123456789abcdef\x1b0123,alpha\n", "line 1: token must not contain spaces or control characters"},
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
	toks, err := ParseTokens(strings.NewReader("0123456789abcdef0123,alpha\nfedcba98765432100000,beta\n" +
		"# an operator, and an agent bound to one node\nopopopopopopopop0000,alpha,operator\nnodenodenodenode0042,alpha,agent,gpu-node-42\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := &Authenticator{Tokens: toks}
	bound := &Authenticator{Tokens: toks, CertBindsNode: true}
	cert := func(cn string, ou []string, org ...string) [][]*x509.Certificate {
		return [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn, Organization: org, OrganizationalUnit: ou}}}}
	}
	tests := []struct {
		name    string
		auth    *Authenticator
		authz   string
		chains  [][]*x509.Certificate
		want    Caller
		wantErr error
	}{
		{"token alpha", a, "Bearer 0123456789abcdef0123", nil, Caller{Cluster: "alpha", Name: "token:alpha#1", Role: RoleAgent}, nil},
		{"token beta, scheme case", a, "bearer fedcba98765432100000", nil, Caller{Cluster: "beta", Name: "token:beta#2", Role: RoleAgent}, nil},
		{"operator token", a, "Bearer opopopopopopopop0000", nil, Caller{Cluster: "alpha", Name: "token:alpha#4", Role: RoleOperator}, nil},
		{"node-bound token", a, "Bearer nodenodenodenode0042", nil, Caller{Cluster: "alpha", Name: "token:alpha#5", Role: RoleAgent, Node: "gpu-node-42"}, nil},
		{"wrong token", a, "Bearer 0123456789abcdef9999", nil, Caller{}, ErrBadCredential},
		{"basic scheme", a, "Basic abc", nil, Caller{}, ErrBadCredential},
		{"nothing", a, "", nil, Caller{}, ErrNoCredential},
		{"client cert", a, "", cert("node-agent", nil, "gamma"), Caller{Cluster: "gamma", Name: "cert:gamma/node-agent", Role: RoleAgent}, nil},
		{"same CN, other cluster: another bucket", a, "", cert("node-agent", nil, "delta"), Caller{Cluster: "delta", Name: "cert:delta/node-agent", Role: RoleAgent}, nil},
		{"client cert without org", a, "", cert("node-agent", nil), Caller{}, ErrBadCredential},
		{"token wins over cert", a, "Bearer 0123456789abcdef0123", cert("x", nil, "gamma"), Caller{Cluster: "alpha", Name: "token:alpha#1", Role: RoleAgent}, nil},
		{"operator cert", a, "", cert("alice", []string{"sre", OperatorOU}, "gamma"), Caller{Cluster: "gamma", Name: "cert:gamma/alice", Role: RoleOperator}, nil},
		{"OU operator without the prefix is an agent", a, "", cert("alice", []string{"operator"}, "gamma"), Caller{Cluster: "gamma", Name: "cert:gamma/alice", Role: RoleAgent}, nil},
		{"cert bound to its CN", bound, "", cert("gpu-node-7", nil, "gamma"), Caller{Cluster: "gamma", Name: "cert:gamma/gpu-node-7", Role: RoleAgent, Node: "gpu-node-7"}, nil},
		{"bound cert whose CN is no node name", bound, "", cert("Node Agent", nil, "gamma"), Caller{}, ErrBadCredential},
		{"CN with a newline", a, "", cert("agent\nforged", nil, "gamma"), Caller{}, ErrBadCredential},
		{"empty CN", a, "", cert("", nil, "gamma"), Caller{}, ErrBadCredential},
		{"operator cert is not bound", bound, "", cert("alice", []string{OperatorOU}, "gamma"), Caller{Cluster: "gamma", Name: "cert:gamma/alice", Role: RoleOperator}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.auth.Authenticate(tt.authz, tt.chains)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if c != tt.want {
				t.Fatalf("caller = %+v, want %+v", c, tt.want)
			}
		})
	}
}

// TestLoadTokensRefusesOpenFiles: a tokens file every user can read or
// write is refused, with the key's fix in the error.
func TestLoadTokensRefusesOpenFiles(t *testing.T) {
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o640, true}, {0o440, true}, {0o400, true}, {0o644, false}, {0o604, false}, {0o602, false}, {0o666, false}} {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte("0123456789abcdef0123,alpha\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tt.mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadTokens(path)
		if tt.ok && err != nil {
			t.Errorf("mode %#o: %v", tt.mode, err)
		}
		if !tt.ok && (err == nil || !strings.Contains(err.Error(), "chmod 0600") || !strings.Contains(err.Error(), "defaultMode: 0440")) {
			t.Errorf("mode %#o: got %v, want a refusal naming the fix", tt.mode, err)
		}
	}
}
