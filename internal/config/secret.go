package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// Redacted is what a Secret prints instead of its value.
const Redacted = "[redacted]"

// Secret holds a password, token or key that must never be printed. Every
// way of formatting or encoding it — fmt's %s, %v, %+v, %#v and %q, slog,
// encoding/json, TOML and any other encoding.TextMarshaler user — yields
// "[redacted]"; only Reveal returns the value, so each place that sends the
// secret somewhere is visible in the code. The zero Secret is empty.
//
// A Secret never comes from a flag default or a TOML value: read it with
// ReadSecret from a file or an environment variable named in the config.
type Secret struct {
	// p points at the value: when a Secret sits in an unexported field,
	// fmt prints it by reflection without calling its methods, and then
	// shows only this pointer's address, never the value.
	p *string
}

// NewSecret wraps v.
func NewSecret(v string) Secret {
	if v == "" {
		return Secret{}
	}
	return Secret{p: &v}
}

// Reveal returns the secret's value, to hand to the library that sends it.
func (s Secret) Reveal() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.p == nil }

// String returns "[redacted]" (or "" for an empty secret, so that a missing
// secret is not mistaken for a set one when printed).
func (s Secret) String() string {
	if s.p == nil {
		return ""
	}
	return Redacted
}

// GoString makes %#v print the redacted form as well.
func (s Secret) GoString() string { return "config.Secret(" + fmt.Sprintf("%q", s.String()) + ")" }

// Format covers every fmt verb (%x and %q included), which would otherwise
// reach the unexported field.
func (s Secret) Format(f fmt.State, verb rune) {
	switch verb {
	case 'v':
		if f.Flag('#') {
			_, _ = f.Write([]byte(s.GoString()))
			return
		}
	case 'q':
		fmt.Fprintf(f, "%q", s.String())
		return
	}
	_, _ = f.Write([]byte(s.String()))
}

// MarshalText makes JSON, TOML and other text encoders print the redacted
// form.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// LogValue makes log/slog print the redacted form.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// ErrNoSecret is returned by ReadSecret when neither a file nor an
// environment variable is named.
var ErrNoSecret = errors.New("no secret configured")

// ReadSecret returns the secret in the file at path (surrounding white space,
// such as the trailing newline of `echo pw > file`, is trimmed) when path is
// set, else in the environment variable named env. Naming both is an error,
// as is an empty file or an unset or empty variable: a secret that is
// configured must be there. Errors name the file or the variable, never
// the value; the caller adds the config key.
func ReadSecret(path, env string) (Secret, error) {
	switch {
	case path != "" && env != "":
		return Secret{}, fmt.Errorf("both a file (%s) and an environment variable (%s) are named; set only one", path, env)
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			return Secret{}, err
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return Secret{}, fmt.Errorf("%s is empty", path)
		}
		return NewSecret(v), nil
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok {
			return Secret{}, fmt.Errorf("environment variable %s is not set", env)
		}
		if v = strings.TrimSpace(v); v == "" {
			return Secret{}, fmt.Errorf("environment variable %s is empty", env)
		}
		return NewSecret(v), nil
	}
	return Secret{}, ErrNoSecret
}
