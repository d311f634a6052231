package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Roles a credential can have (the values of HealthEvent.submitter.role).
const (
	// RoleAgent reports events; overrides in its events are recorded but
	// the processors do not honour them.
	RoleAgent = datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT
	// RoleOperator may also override the safety policy's decisions
	// (quarantineOverrides, drainOverrides), never the circuit breaker.
	RoleOperator = datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR
)

// OperatorOU is the Subject OrganizationalUnit that makes a client
// certificate an operator credential; without it a certificate is an agent's.
const OperatorOU = "faultline:operator"

// Caller is an authenticated client.
type Caller struct {
	// Cluster every event of the caller belongs to.
	Cluster string
	// Name identifies the credential in logs, metrics, rate-limit buckets and
	// HealthEvent.submitter (never the token): "token:<cluster>#<the first
	// 16 hex digits of the token's SHA-256>", "cert:<cluster>/<CN>" or
	// "unix-socket".
	Name string
	// Role is RoleAgent or RoleOperator.
	Role datamodels.SubmitterRole
	// Node, when set, is the only node the caller may report for (and read
	// the history of).
	Node string
}

// Submitter is what the gateway stamps on the caller's events.
func (c Caller) Submitter() *datamodels.Submitter {
	return &datamodels.Submitter{Name: c.Name, Role: c.Role, Node: c.Node}
}

type callerKey struct{}

func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the authenticated caller of a request.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Authentication errors.
var (
	ErrNoCredential  = errors.New("missing credential: send 'Authorization: Bearer <token>' or a client certificate")
	ErrBadCredential = errors.New("invalid token")
)

// ErrNoTokens is ParseTokens's error for a file that parses but holds no
// token: a misconfiguration at start; once the gateway runs, the file
// emptied to revoke every token (FollowTokens).
var ErrNoTokens = errors.New("no tokens")

// Tokens maps bearer tokens to callers. Tokens are kept as SHA-256 digests:
// a lookup hashes the presented token and finds its entry in one map probe,
// however many per-node tokens the file holds; what the probe's timing can
// reveal is about digests, not about any token.
type Tokens struct {
	byDigest map[[sha256.Size]byte]Caller
}

// LoadTokens reads a tokens file (see ParseTokens). The file must not be
// readable, writable or executable by every user: it holds secrets.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	defer f.Close()
	if err := checkSecretFile(f, path); err != nil {
		return nil, err
	}
	t, err := ParseTokens(f)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return t, nil
}

// checkSecretFile refuses a file whose permissions let every user read or
// change it.
func checkSecretFile(f *os.File, path string) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o007 != 0 {
		return fmt.Errorf("tokens file %s has mode %#o, open to every user on the machine: chmod 0600 it "+
			"(or 0640 for a group), or mount the Kubernetes Secret with defaultMode: 0440", path, fs.FileMode(perm))
	}
	return nil
}

// ParseTokens parses the tokens file format, one credential per line:
//
//	token,cluster[,role[,node]]
//
// role is "agent" (the default when empty or absent) or "operator"; node,
// when set, binds the credential to that Kubernetes node: it may report
// events (and read the history) of that node only. Blank lines and lines
// starting with # are ignored. Tokens are at least 16 characters, with no
// space, control or format character, or byte that is not UTF-8
// (badTokenRune). A UTF-8
// byte-order mark starting the file (an editor on Windows) is ignored. A
// file with no token is ErrNoTokens.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{byDigest: map[[sha256.Size]byte]Caller{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		if n == 1 {
			text = strings.TrimPrefix(text, "\ufeff")
		}
		line := strings.TrimSpace(text)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ",")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if len(f) < 2 || len(f) > 4 {
			return nil, fmt.Errorf("line %d: want 'token,cluster[,role[,node]]', got %d fields", n, len(f))
		}
		token := f[0]
		d := sha256.Sum256([]byte(token))
		c := Caller{Cluster: f[1], Name: tokenName(f[1], d), Role: RoleAgent}
		switch {
		case len(token) < 16:
			return nil, fmt.Errorf("line %d: token must be at least 16 characters", n)
		case strings.IndexFunc(token, badTokenRune) >= 0:
			return nil, fmt.Errorf("line %d: token must not contain spaces, control or format characters (a byte-order mark, a zero-width space) or bytes that are not UTF-8", n)
		case !events.IsClusterName(c.Cluster):
			return nil, fmt.Errorf("line %d: cluster %q is not a lowercase DNS label", n, c.Cluster)
		}
		if len(f) > 2 {
			switch f[2] {
			case "", "agent":
			case "operator":
				c.Role = RoleOperator
			default:
				return nil, fmt.Errorf("line %d: role %q is not agent or operator", n, f[2])
			}
		}
		if len(f) > 3 && f[3] != "" {
			if len(f[3]) > maxNodeNameLen || !nodeNamePattern.MatchString(f[3]) {
				return nil, fmt.Errorf("line %d: node %q is not a Kubernetes node name", n, truncate(f[3]))
			}
			c.Node = f[3]
		}
		if _, dup := t.byDigest[d]; dup {
			return nil, fmt.Errorf("line %d: duplicate token", n)
		}
		t.byDigest[d] = c
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.byDigest) == 0 {
		return nil, ErrNoTokens
	}
	return t, nil
}

// tokenName names a token by its cluster and the first 8 bytes of its
// SHA-256 (16 hex digits): stable while lines are added to or removed from
// the tokens file (a line number was not: every token below an edit took
// another's name, its submitter, audit entries, rate-limit bucket and
// read share), unique among any realistic number of tokens, and never the
// token itself.
func tokenName(cluster string, digest [sha256.Size]byte) string {
	return fmt.Sprintf("token:%s#%x", cluster, digest[:8])
}

// badTokenRune reports a character no token holds: a space (Unicode's,
// the non-breaking space included), a control character (C0, DEL, C1), a
// format character (zero-width space, word joiner, soft hyphen, byte-order
// mark) or a byte that is not UTF-8 (a file saved as Latin-1), invisible
// when copied into the file with a token: it made one no client sends, its
// caller refused for ever, nothing logged. Other non-ASCII characters are
// kept: Go's HTTP client sends such a token as its UTF-8 bytes, and a
// tokens file holding one must keep loading (gRPC metadata, the agents'
// door, carries printable ASCII only).
func badTokenRune(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
}

// Lookup returns the caller of a bearer token.
func (t *Tokens) Lookup(token string) (Caller, bool) {
	if t == nil {
		return Caller{}, false
	}
	c, ok := t.byDigest[sha256.Sum256([]byte(token))]
	return c, ok
}

// Authenticator resolves a request's credential to a Caller.
type Authenticator struct {
	// Tokens are the bearer tokens, unless LoadTokensFile loaded a file.
	Tokens *Tokens
	// CertBindsNode binds every agent client certificate to the node named
	// by its Subject CommonName (gateway.client_cert_binds_node).
	CertBindsNode bool

	// live: the tokens file's tokens as last loaded; file: the file
	// (LoadTokensFile).
	live atomic.Pointer[Tokens]
	file *tokensFile
}

// LoadTokensFile makes the tokens file at path (LoadTokens) a's tokens;
// FollowTokens then keeps them in step with the file.
func (a *Authenticator) LoadTokensFile(path string) error {
	// Looked at before it is read: a change in between is seen by the
	// first look of FollowTokens.
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	t, err := LoadTokens(path)
	if err != nil {
		return err
	}
	a.live.Store(t)
	a.file = &tokensFile{path: path, seen: st}
	return nil
}

// TokensEvery is how often FollowTokens looks at the tokens file.
const TokensEvery = time.Second

// FollowTokens looks at the tokens file (LoadTokensFile) every `every`
// until ctx ends and, when it changed, loads it again: its new tokens are
// accepted from then on, and those it no longer holds refused. A
// Kubernetes Secret mounted as a volume is rewritten in place when the
// Secret changes (within a minute or so), so a token added for a new
// cluster, rotated or revoked takes effect without a restart. A changed
// file that cannot be loaded (a line that does not parse, a mode open to
// every user, unreadable to the gateway) leaves the tokens as they were,
// says why once, and is tried again at every look until it loads: fixing
// its mode or owner, which changes neither its modification time nor its
// size, is enough. A file that loads with no token (every line deleted or
// commented out), unchanged at two looks in a row a second or more apart,
// revokes every token, with a warning: one look may catch a file rewritten
// in place truncated and not yet written. A file that is gone
// keeps the tokens, with an error: a volume's transient trouble must not
// refuse every caller; deleting the file does not revoke, emptying it does.
func (a *Authenticator) FollowTokens(ctx context.Context, every time.Duration, log *slog.Logger) {
	if a.file == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.file.look(a, log)
	}
}

// tokensFile is the tokens file an Authenticator follows, as last seen.
type tokensFile struct {
	path string
	// seen is the file as last loaded (nil: it could not be looked at);
	// refused, the file as last refused, its error said once.
	seen, refused os.FileInfo
	// empty is the file as a look found it with no tokens, at emptyAt,
	// not yet taken (see look).
	empty   os.FileInfo
	emptyAt time.Time
	// now is the clock (nil: time.Now).
	now func() time.Time
}

// emptyFor is how long a tokens file must have no tokens, unchanged, before
// it revokes every token: one look may find a file rewritten in place
// truncated and not yet written.
const emptyFor = time.Second

// look loads the file again into a when it changed since it was last
// loaded: another file (a Secret volume's update swaps a link to new
// files), another modification time, size or mode. A file that could
// not be loaded is tried again at every look, since what made it fail
// may change without a trace in its stat (its owner, its directory's
// permissions).
func (f *tokensFile) look(a *Authenticator, log *slog.Logger) {
	st, err := os.Stat(f.path)
	if err != nil {
		if f.seen != nil {
			// Not a revocation (emptying the file is): a Secret volume's
			// update swaps its files atomically, and a mount's transient
			// trouble must not refuse every caller of every replica.
			log.Error("tokens file cannot be looked at; the tokens stay as they were", "path", f.path, "err", err)
		}
		f.seen, f.refused, f.empty = nil, nil, nil
		return
	}
	if sameStat(st, f.seen) {
		return
	}
	t, err := LoadTokens(f.path)
	if errors.Is(err, ErrNoTokens) {
		// Emptied (comments left at most): every token revoked, once two
		// looks in a row, emptyFor apart, found it so unchanged — not
		// when one look caught a rewrite in place (cat > tokens, an
		// editor) truncated and not yet written.
		now := time.Now
		if f.now != nil {
			now = f.now
		}
		if !sameStat(st, f.empty) {
			f.empty, f.emptyAt = st, now()
			return
		}
		if now().Sub(f.emptyAt) < emptyFor {
			return
		}
		f.seen, f.refused, f.empty = st, nil, nil
		a.live.Store(&Tokens{byDigest: map[[sha256.Size]byte]Caller{}})
		log.Warn("tokens file has no tokens: every caller is refused", "path", f.path)
		return
	}
	f.empty = nil
	if err != nil {
		if !sameStat(st, f.refused) {
			log.Error("tokens file changed but cannot be loaded; the tokens stay as they were", "path", f.path, "err", err)
		}
		f.refused = st
		return
	}
	f.seen, f.refused = st, nil
	a.live.Store(t)
	log.Info("tokens file loaded again", "path", f.path, "tokens", len(t.byDigest))
}

// sameStat reports whether st is the file was, unchanged (false when was
// is nil).
func sameStat(st, was os.FileInfo) bool {
	return was != nil && os.SameFile(st, was) && st.ModTime().Equal(was.ModTime()) &&
		st.Size() == was.Size() && st.Mode() == was.Mode()
}

// tokens are the tokens in use: the file's as last loaded, or Tokens.
func (a *Authenticator) tokens() *Tokens {
	if t := a.live.Load(); t != nil {
		return t
	}
	return a.Tokens
}

// Authenticate checks the Authorization header value and the verified
// client certificate chain (either may be empty) and returns the caller.
// A bearer token wins over a certificate when both are present.
//
// A certificate's cluster is its first Subject Organization; it is an
// operator credential when its OrganizationalUnits include OperatorOU, an
// agent credential otherwise; with CertBindsNode an agent certificate is
// bound to the node its CommonName names.
func (a *Authenticator) Authenticate(authorization string, verified [][]*x509.Certificate) (Caller, error) {
	if authorization != "" {
		scheme, token, _ := strings.Cut(authorization, " ")
		if !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
			return Caller{}, fmt.Errorf("%w: authorization header is not 'Bearer <token>'", ErrBadCredential)
		}
		c, ok := a.tokens().Lookup(strings.TrimSpace(token))
		if !ok {
			return Caller{}, ErrBadCredential
		}
		return c, nil
	}
	if len(verified) > 0 && len(verified[0]) > 0 {
		leaf := verified[0][0]
		cn := leaf.Subject.CommonName
		if cn == "" || len(cn) > 256 || strings.IndexFunc(cn, unicode.IsControl) >= 0 {
			return Caller{}, fmt.Errorf("%w: client certificate CommonName %q must be 1 to 256 characters, no control characters", ErrBadCredential, truncate(cn))
		}
		if len(leaf.Subject.Organization) == 0 || !events.IsClusterName(leaf.Subject.Organization[0]) {
			return Caller{}, fmt.Errorf("%w: client certificate %q has no valid cluster in Organization", ErrBadCredential, truncate(cn))
		}
		c := Caller{Cluster: leaf.Subject.Organization[0], Name: "cert:" + leaf.Subject.Organization[0] + "/" + cn, Role: RoleAgent}
		if slices.Contains(leaf.Subject.OrganizationalUnit, OperatorOU) {
			c.Role = RoleOperator
		} else if a.CertBindsNode {
			if len(cn) > maxNodeNameLen || !nodeNamePattern.MatchString(cn) {
				return Caller{}, fmt.Errorf("%w: client certificate CommonName %q is not a node name (gateway.client_cert_binds_node is on)", ErrBadCredential, truncate(cn))
			}
			c.Node = cn
		}
		return c, nil
	}
	return Caller{}, ErrNoCredential
}
