package gateway

import (
	"bufio"
	"context"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Caller is an authenticated client.
type Caller struct {
	// Cluster every event of the caller belongs to.
	Cluster string
	// Name identifies the credential in logs and metrics (never the token).
	Name string
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

var clusterName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`)

// Tokens maps bearer tokens to callers.
type Tokens struct {
	byToken map[string]Caller
}

// LoadTokens reads a tokens file: one "token,cluster" per line, blank lines
// and # comments ignored.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	defer f.Close()
	t, err := ParseTokens(f)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return t, nil
}

// ParseTokens parses the tokens file format.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{byToken: map[string]Caller{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		token, cluster, ok := strings.Cut(line, ",")
		token, cluster = strings.TrimSpace(token), strings.TrimSpace(cluster)
		switch {
		case !ok:
			return nil, fmt.Errorf("line %d: want 'token,cluster'", n)
		case len(token) < 16:
			return nil, fmt.Errorf("line %d: token must be at least 16 characters", n)
		case !clusterName.MatchString(cluster):
			return nil, fmt.Errorf("line %d: cluster %q is not a lowercase DNS label", n, cluster)
		}
		if _, dup := t.byToken[token]; dup {
			return nil, fmt.Errorf("line %d: duplicate token", n)
		}
		t.byToken[token] = Caller{Cluster: cluster, Name: fmt.Sprintf("token:%s#%d", cluster, n)}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.byToken) == 0 {
		return nil, errors.New("no tokens")
	}
	return t, nil
}

// Lookup returns the caller of a bearer token, in constant time per entry.
func (t *Tokens) Lookup(token string) (Caller, bool) {
	if t == nil {
		return Caller{}, false
	}
	var found Caller
	ok := false
	for k, c := range t.byToken {
		if subtle.ConstantTimeCompare([]byte(k), []byte(token)) == 1 {
			found, ok = c, true
		}
	}
	return found, ok
}

// Authenticator resolves a request's credential to a Caller.
type Authenticator struct {
	Tokens *Tokens
}

// Authenticate checks the Authorization header value and the verified
// client certificate chain (either may be empty) and returns the caller.
// A bearer token wins over a certificate when both are present.
func (a *Authenticator) Authenticate(authorization string, verified [][]*x509.Certificate) (Caller, error) {
	if authorization != "" {
		scheme, token, _ := strings.Cut(authorization, " ")
		if !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
			return Caller{}, fmt.Errorf("%w: authorization header is not 'Bearer <token>'", ErrBadCredential)
		}
		c, ok := a.Tokens.Lookup(strings.TrimSpace(token))
		if !ok {
			return Caller{}, ErrBadCredential
		}
		return c, nil
	}
	if len(verified) > 0 && len(verified[0]) > 0 {
		leaf := verified[0][0]
		if len(leaf.Subject.Organization) == 0 || !clusterName.MatchString(leaf.Subject.Organization[0]) {
			return Caller{}, fmt.Errorf("%w: client certificate %q has no valid cluster in Organization", ErrBadCredential, leaf.Subject.CommonName)
		}
		return Caller{Cluster: leaf.Subject.Organization[0], Name: "cert:" + leaf.Subject.CommonName}, nil
	}
	return Caller{}, ErrNoCredential
}
