package gateway

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		{"control in token", "0123456789abcdef\x1b0123,alpha\n", "line 1: token must not contain spaces, control or format characters (a byte-order mark, a zero-width space) or bytes that are not UTF-8"},
		{"DEL in token", "0123456789abcdef\x7f0123,alpha\n", "line 1: token must not contain spaces"},
		{"C1 control in token", "0123456789abcdef\u009b0123,alpha\n", "line 1: token must not contain spaces"},
		{"non-breaking space in token", "0123456789abcdef\u00a00123,alpha\n", "line 1: token must not contain spaces"},
		{"line separator in token", "0123456789abcdef\u20280123,alpha\n", "line 1: token must not contain spaces"},
		{"non-ASCII in token", "0123456789abcdef0123,alpha\n0123456789abcdef\u00e90123,alpha\n0123456789abcdef\u4e2d0123,alpha\n", ""},
		{"a zero-width space in a token", "0123456789abcdef\u200b0123,alpha\n", "line 1: token must not contain spaces, control or format characters"},
		{"a Latin-1 byte in a token", "0123456789abcdef\xa00123,alpha\n", "line 1: token must not contain spaces, control or format characters"},
		{"a byte-order mark inside the file", "0123456789abcdef0123,alpha\n\ufeff0123456789abcdef0124,alpha\n", "line 2: token must not contain spaces, control or format characters (a byte-order mark, a zero-width space) or bytes that are not UTF-8"},
		{"a byte-order mark inside a token", "0123456789abcdef\ufeff0124,alpha\n", "line 1: token must not contain spaces"},
		{"a byte-order mark, then a token", "\ufeff0123456789abcdef0123,alpha\n", ""},
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

// TestParseTokensBOM: a tokens file saved with a UTF-8 byte-order mark
// (an editor on Windows) has its first token as written, not with the mark
// in front of it (that caller was refused for ever, nothing logged).
func TestParseTokensBOM(t *testing.T) {
	const a = "0123456789abcdef0123"
	toks, err := ParseTokens(strings.NewReader("\ufeff" + a + ",alpha\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := toks.Lookup(a); !ok {
		t.Fatal("the first token, after a byte-order mark, is refused")
	}
	toks, err = ParseTokens(strings.NewReader("\ufeff# tokens\n" + a + ",alpha\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := toks.Lookup(a); !ok {
		t.Fatal("a token after a commented first line with a byte-order mark is refused")
	}
}

// TestParseTokensUTF8: a token with non-ASCII characters (Go's HTTP client
// sends it as its UTF-8 bytes) loads and is looked up: a tokens file that
// held one was refused after an upgrade, and the gateway did not start.
func TestParseTokensUTF8(t *testing.T) {
	const a = "0123456789abcdef\u00e9\u4e2d0123"
	toks, err := ParseTokens(strings.NewReader(a + ",alpha\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := toks.Lookup(a); !ok {
		t.Fatal("a UTF-8 token is refused")
	}
}

// TestTokenNamesSurviveEdits: a token's name (submitter, audit, rate-limit
// bucket, read share) is the same after lines are added or removed above
// it in the tokens file, and never holds the token.
func TestTokenNamesSurviveEdits(t *testing.T) {
	const (
		agent = "0123456789abcdef0123"
		op    = "opopopopopopopop0000"
		bound = "nodenodenodenode0042"
	)
	files := []struct{ name, in string }{
		{"first", agent + ",alpha\n" + op + ",alpha,operator\n" + bound + ",alpha,agent,gpu-node-42\n"},
		{"a line added on top", "# new\nfedcba98765432100000,alpha\n" + agent + ",alpha\n" + op + ",alpha,operator\n" + bound + ",alpha,agent,gpu-node-42\n"},
		{"a line removed", op + ",alpha,operator\n\n" + agent + ",alpha\n" + bound + ",alpha,agent,gpu-node-42\n"},
	}
	var first map[string]string
	for _, f := range files {
		toks, err := ParseTokens(strings.NewReader(f.in))
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		names := map[string]string{}
		for _, tok := range []string{agent, op, bound} {
			c, ok := toks.Lookup(tok)
			if !ok {
				t.Fatalf("%s: token %s not found", f.name, tok[:4])
			}
			if strings.Contains(c.Name, tok) || !strings.HasPrefix(c.Name, "token:alpha#") {
				t.Fatalf("%s: name %q, want token:alpha#<digest> without the token", f.name, c.Name)
			}
			names[tok] = c.Name
		}
		if first == nil {
			first = names
			continue
		}
		for tok, n := range names {
			if n != first[tok] {
				t.Errorf("%s: token %s… named %q, was %q before the edit", f.name, tok[:4], n, first[tok])
			}
		}
	}
	if first[agent] == first[op] || first[op] == first[bound] || first[agent] == first[bound] {
		t.Errorf("two tokens share a name: %v", first)
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
		{"token alpha", a, "Bearer 0123456789abcdef0123", nil, Caller{Cluster: "alpha", Name: "token:alpha#1bd8fd47297046f9", Role: RoleAgent}, nil},
		{"token beta, scheme case", a, "bearer fedcba98765432100000", nil, Caller{Cluster: "beta", Name: "token:beta#0f62ab7a5a093353", Role: RoleAgent}, nil},
		{"operator token", a, "Bearer opopopopopopopop0000", nil, Caller{Cluster: "alpha", Name: "token:alpha#9d5c05fe9e03d848", Role: RoleOperator}, nil},
		{"node-bound token", a, "Bearer nodenodenodenode0042", nil, Caller{Cluster: "alpha", Name: "token:alpha#66e3813cd557c463", Role: RoleAgent, Node: "gpu-node-42"}, nil},
		{"wrong token", a, "Bearer 0123456789abcdef9999", nil, Caller{}, ErrBadCredential},
		{"basic scheme", a, "Basic abc", nil, Caller{}, ErrBadCredential},
		{"nothing", a, "", nil, Caller{}, ErrNoCredential},
		{"client cert", a, "", cert("node-agent", nil, "gamma"), Caller{Cluster: "gamma", Name: "cert:gamma/node-agent", Role: RoleAgent}, nil},
		{"same CN, other cluster: another bucket", a, "", cert("node-agent", nil, "delta"), Caller{Cluster: "delta", Name: "cert:delta/node-agent", Role: RoleAgent}, nil},
		{"client cert without org", a, "", cert("node-agent", nil), Caller{}, ErrBadCredential},
		{"token wins over cert", a, "Bearer 0123456789abcdef0123", cert("x", nil, "gamma"), Caller{Cluster: "alpha", Name: "token:alpha#1bd8fd47297046f9", Role: RoleAgent}, nil},
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

// TestTokensFileFollowed: the gateway follows its tokens file as
// Kubernetes updates a Secret volume (the file is a link into a directory
// that the kubelet swaps for a new one) or as a person edits it in place:
// a token added is accepted and one removed refused, without a restart —
// so neither a token added for a new cluster nor one revoked waits for a
// rollout, and the chart's pod template needs no hash of the tokens. A
// changed file that cannot be loaded leaves the tokens as they were.
func TestTokensFileFollowed(t *testing.T) {
	const (
		a = "aaaaaaaaaaaaaaaa0001"
		b = "bbbbbbbbbbbbbbbb0002"
		c = "cccccccccccccccc0003"
	)
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens")
	// As a Secret volume: tokens -> ..data/tokens, ..data -> ..<version>.
	gen := 0
	secret := func(content string) {
		gen++
		v := filepath.Join(dir, fmt.Sprintf("..v%d", gen))
		if err := os.Mkdir(v, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v, "tokens"), []byte(content), 0o440); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(v), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	secret(a + ",alpha\n")
	if err := os.Symlink(filepath.Join("..data", "tokens"), path); err != nil {
		t.Fatal(err)
	}
	auth := &Authenticator{}
	if err := auth.LoadTokensFile(path); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go auth.FollowTokens(ctx, 10*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	inPlace := func(content string, mode os.FileMode) {
		// Through the links, as an editor writes the file it opened.
		f := filepath.Join(dir, fmt.Sprintf("..v%d", gen), "tokens")
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		change   func()
		accepted []string
		refused  []string
	}{
		{"as loaded", func() {}, []string{a}, []string{b, c}},
		{"the Secret updated: b added", func() { secret(a + ",alpha\n" + b + ",beta\n") }, []string{a, b}, []string{c}},
		{"the Secret updated: a revoked", func() { secret(b + ",beta\n") }, []string{b}, []string{a, c}},
		{"a broken line: kept as they were", func() { secret(b + ",beta\n" + c + ",Not_A_Cluster\n") }, []string{b}, []string{a, c}},
		{"edited in place: c added", func() { inPlace(b+",beta\n"+c+",gamma\n", 0o600) }, []string{b, c}, []string{a}},
		{"open to every user: kept as they were", func() { inPlace(a+",alpha\n", 0o644) }, []string{b, c}, []string{a}},
		{"its mode fixed: loaded", func() { chmod(t, filepath.Join(dir, fmt.Sprintf("..v%d", gen), "tokens"), 0o600) }, []string{a}, []string{b, c}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.change()
			time.Sleep(100 * time.Millisecond) // ten looks: a change kept out has been seen
			deadline := time.Now().Add(5 * time.Second)
			for {
				var wrong []string
				for _, tok := range tc.accepted {
					if _, err := auth.Authenticate("Bearer "+tok, nil); err != nil {
						wrong = append(wrong, tok[:4]+"… refused")
					}
				}
				for _, tok := range tc.refused {
					if _, err := auth.Authenticate("Bearer "+tok, nil); err == nil {
						wrong = append(wrong, tok[:4]+"… accepted")
					}
				}
				if len(wrong) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("5s after the change: %v", wrong)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestTokensFileRefusedThenFixed: a tokens file refused for its mode is
// loaded once its mode is fixed, though chmod changes neither its
// modification time nor its size (a token added in the refused edit was
// refused until a restart, and one revoked in it accepted); the refusal
// is said once, not at every look.
func TestTokensFileRefusedThenFixed(t *testing.T) {
	const (
		a = "aaaaaaaaaaaaaaaa0001"
		b = "bbbbbbbbbbbbbbbb0002"
	)
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(a+",alpha\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth := &Authenticator{}
	if err := auth.LoadTokensFile(path); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	// Rewritten, as an operator's editor may leave it: open to every user.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b+",beta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	chmod(t, path, 0o644) // whatever the umask
	for range 3 {
		auth.file.look(auth, log)
	}
	if _, err := auth.Authenticate("Bearer "+b, nil); err == nil {
		t.Fatal("a file open to every user was loaded")
	}
	if n := strings.Count(logged.String(), "cannot be loaded"); n != 1 {
		t.Errorf("the refusal said %d times in 3 looks, want once:\n%s", n, logged.String())
	}
	chmod(t, path, 0o600)
	auth.file.look(auth, log)
	if _, err := auth.Authenticate("Bearer "+b, nil); err != nil {
		t.Errorf("mode fixed: b refused: %v", err)
	}
	if _, err := auth.Authenticate("Bearer "+a, nil); err == nil {
		t.Error("mode fixed: a, revoked in the edit, still accepted")
	}
}

// TestTokensFileEmptied: emptying the tokens file (only comments left)
// revokes every token, with a warning, and tokens written back are
// accepted again; at start the same file is an error. A file that
// disappears keeps the tokens (a transient mount problem must not lock
// the fleet out) and says so at ERROR.
func TestTokensFileEmptied(t *testing.T) {
	const (
		a = "aaaaaaaaaaaaaaaa0001"
		b = "bbbbbbbbbbbbbbbb0002"
	)
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		// Each content below has another size than the one before: seen
		// as a change whatever the file system's clock resolution.
	}
	write("# revoked\n")
	if err := (&Authenticator{}).LoadTokensFile(path); err == nil || !strings.Contains(err.Error(), "no tokens") {
		t.Fatalf("at start, a file with no tokens: %v", err)
	}
	write(a + ",alpha\n")
	auth := &Authenticator{}
	if err := auth.LoadTokensFile(path); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	auth.file.now = func() time.Time { return now }
	write("# every token revoked\n")
	auth.file.look(auth, log)
	now = now.Add(time.Second)
	auth.file.look(auth, log)
	now = now.Add(time.Second)
	auth.file.look(auth, log)
	if _, err := auth.Authenticate("Bearer "+a, nil); err == nil {
		t.Fatal("emptied: a still accepted")
	}
	if n := strings.Count(logged.String(), `level=WARN msg="tokens file has no tokens: every caller is refused"`); n != 1 {
		t.Errorf("the warning said %d times in 3 looks, want once:\n%s", n, logged.String())
	}
	write(b + ",beta\n")
	auth.file.look(auth, log)
	if _, err := auth.Authenticate("Bearer "+b, nil); err != nil {
		t.Fatalf("tokens written back: b refused: %v", err)
	}
	logged.Reset()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	auth.file.look(auth, log)
	auth.file.look(auth, log)
	if _, err := auth.Authenticate("Bearer "+b, nil); err != nil {
		t.Fatalf("the file gone: b refused: %v", err)
	}
	if n := strings.Count(logged.String(), "level=ERROR"); n != 1 {
		t.Errorf("the file gone: %d errors in 2 looks, want one:\n%s", n, logged.String())
	}
}

// TestTokensFileEmptyOnlyOnce: a tokens file rewritten in place without a
// rename (cat > tokens, an editor truncating then writing) can be seen
// empty by one look; that revoked every token until the next look. A file
// with no tokens revokes only when two looks in a row, a second or more
// apart, find it so and unchanged.
func TestTokensFileEmptyOnlyOnce(t *testing.T) {
	const (
		a = "aaaaaaaaaaaaaaaa0001"
		b = "bbbbbbbbbbbbbbbb0002"
	)
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(a + ",alpha\n")
	auth := &Authenticator{}
	if err := auth.LoadTokensFile(path); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	auth.file.now = func() time.Time { return now }
	accepted := func(what, tok string, want bool) {
		t.Helper()
		if _, err := auth.Authenticate("Bearer "+tok, nil); (err == nil) != want {
			t.Errorf("%s: %s… accepted %v, want %v", what, tok[:4], err == nil, want)
		}
	}

	write("") // truncated, not written yet
	auth.file.look(auth, log)
	accepted("seen truncated once", a, true)
	now = now.Add(time.Second)
	write(a + ",alpha\n" + b + ",beta\n") // written
	auth.file.look(auth, log)
	accepted("written", a, true)
	accepted("written", b, true)

	write("")
	auth.file.look(auth, log)
	now = now.Add(500 * time.Millisecond)
	auth.file.look(auth, log)
	accepted("empty at two looks half a second apart", a, true)
	now = now.Add(500 * time.Millisecond)
	auth.file.look(auth, log)
	accepted("empty for a second", a, false)
	accepted("empty for a second", b, false)
	now = now.Add(time.Second)
	auth.file.look(auth, log)
	if n := strings.Count(logged.String(), `level=WARN msg="tokens file has no tokens: every caller is refused"`); n != 1 {
		t.Errorf("the warning said %d times, want once:\n%s", n, logged.String())
	}
	write(b + ",beta\n")
	auth.file.look(auth, log)
	accepted("written back", b, true)
}
