package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/tlsclient"
)

// TLSConfig is TLS to the brokers (a Kafka SSL or SASL_SSL listener).
type TLSConfig = tlsclient.Config

// SASL mechanisms SASLConfig.Mechanism accepts.
const (
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
	MechanismOAuthBearer = "OAUTHBEARER"
	MechanismPlain       = "PLAIN"
)

// mechanisms lists the accepted mechanisms, for errors and help.
var mechanisms = []string{MechanismScramSHA256, MechanismScramSHA512, MechanismOAuthBearer, MechanismPlain}

// SASLConfig is SASL authentication to the brokers. The password or token
// is never a value in the config: it is read from a file or an
// environment variable named here, at start (to fail early) and again at
// every authentication (so a rotated secret is picked up). It never
// appears in flags' help, logs, errors or metrics.
type SASLConfig struct {
	// Mechanism is SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or PLAIN
	// (case-insensitive). PLAIN and OAUTHBEARER send the password or token
	// itself, so they require TLS. Default "": no SASL.
	Mechanism string `toml:"mechanism"`
	// Username is the SCRAM or PLAIN user. Default "".
	Username string `toml:"username"`
	// PasswordFile is a file holding the SCRAM or PLAIN password
	// (surrounding white space trimmed). Default "".
	PasswordFile string `toml:"password_file"`
	// PasswordEnv names an environment variable holding the password, as an
	// alternative to PasswordFile. Default "".
	PasswordEnv string `toml:"password_env"`
	// TokenFile is a file holding the OAUTHBEARER token (a JWT), re-read at
	// every authentication so that whatever refreshes the file refreshes
	// the client. Default "".
	TokenFile string `toml:"token_file"`
	// TokenEnv names an environment variable holding the OAUTHBEARER token,
	// as an alternative to TokenFile. Default "".
	TokenEnv string `toml:"token_env"`
}

func (c *SASLConfig) registerFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Mechanism, prefix+"mechanism", c.Mechanism, "Kafka SASL mechanism: "+strings.Join(mechanisms, ", ")+" (default: none)")
	fs.StringVar(&c.Username, prefix+"username", c.Username, "Kafka SASL user (SCRAM, PLAIN)")
	fs.StringVar(&c.PasswordFile, prefix+"password-file", c.PasswordFile, "file holding the Kafka SASL password")
	fs.StringVar(&c.PasswordEnv, prefix+"password-env", c.PasswordEnv, "environment variable holding the Kafka SASL password")
	fs.StringVar(&c.TokenFile, prefix+"token-file", c.TokenFile, "file holding the Kafka OAUTHBEARER token, re-read at every login")
	fs.StringVar(&c.TokenEnv, prefix+"token-env", c.TokenEnv, "environment variable holding the Kafka OAUTHBEARER token")
}

// mechanism is Mechanism in upper case.
func (c SASLConfig) mechanism() string { return strings.ToUpper(strings.TrimSpace(c.Mechanism)) }

// validate checks the SASL keys and that the secret can be read now.
func (c SASLConfig) validate(prefix string, tlsOn bool, tlsKey string) error {
	mech := c.mechanism()
	set := func(keys ...[2]string) error {
		for _, kv := range keys {
			if kv[1] != "" {
				if mech == "" {
					return fmt.Errorf("%s%s: set, but %smechanism is empty (no SASL)", prefix, kv[0], prefix)
				}
				return fmt.Errorf("%s%s: not used by %s", prefix, kv[0], mech)
			}
		}
		return nil
	}
	username := [2]string{"username", c.Username}
	password := [][2]string{{"password_file", c.PasswordFile}, {"password_env", c.PasswordEnv}}
	token := [][2]string{{"token_file", c.TokenFile}, {"token_env", c.TokenEnv}}
	switch mech {
	case "":
		return set(append(append([][2]string{username}, password...), token...)...)
	case MechanismScramSHA256, MechanismScramSHA512, MechanismPlain:
		if mech == MechanismPlain && !tlsOn {
			return fmt.Errorf("%smechanism: PLAIN sends the password in clear; it requires %s = true", prefix, tlsKey)
		}
		if err := set(token...); err != nil {
			return err
		}
		if strings.TrimSpace(c.Username) == "" {
			return fmt.Errorf("%susername: required by %s", prefix, mech)
		}
		_, err := c.password(prefix)
		return err
	case MechanismOAuthBearer:
		if !tlsOn {
			return fmt.Errorf("%smechanism: OAUTHBEARER sends the bearer token in clear; it requires %s = true", prefix, tlsKey)
		}
		if err := set(append([][2]string{username}, password...)...); err != nil {
			return err
		}
		_, err := c.token(prefix)
		return err
	}
	return fmt.Errorf("%smechanism: %q is not one of %s (or empty for none)", prefix, c.Mechanism, strings.Join(mechanisms, ", "))
}

// password reads the password; errors name the key, never the value.
func (c SASLConfig) password(prefix string) (config.Secret, error) {
	return readSecret(prefix, "password", c.PasswordFile, c.PasswordEnv, c.mechanism())
}

// token reads the OAUTHBEARER token.
func (c SASLConfig) token(prefix string) (config.Secret, error) {
	return readSecret(prefix, "token", c.TokenFile, c.TokenEnv, c.mechanism())
}

func readSecret(prefix, what, file, env, mech string) (config.Secret, error) {
	s, err := config.ReadSecret(file, env)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, config.ErrNoSecret):
		return s, fmt.Errorf("%s%s_file or %s%s_env: required by %s", prefix, what, prefix, what, mech)
	case file != "" && env != "":
		return s, fmt.Errorf("%s%s_file, %s%s_env: %w", prefix, what, prefix, what, err)
	case file != "":
		return s, fmt.Errorf("%s%s_file: %w", prefix, what, err)
	default:
		return s, fmt.Errorf("%s%s_env: %w", prefix, what, err)
	}
}

// dialTimeout bounds a TCP connect to a broker (franz-go's default).
const dialTimeout = 10 * time.Second

// securityOpts returns the TLS and SASL options of c.
func (c Config) securityOpts(prefix string, log *slog.Logger) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	dial, err := c.TLS.Dialer(prefix+"tls.", dialTimeout, log)
	if err != nil {
		return nil, err
	}
	if dial != nil {
		opts = append(opts, kgo.Dialer(dial))
	}
	if err := c.SASL.validate(prefix+"sasl.", c.TLS.Enabled, prefix+"tls.enabled"); err != nil {
		return nil, err
	}
	mech, err := c.SASL.mechanismOpt(prefix + "sasl.")
	if err != nil {
		return nil, err
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
		if !c.TLS.Enabled {
			log.Warn("kafka SASL without TLS: the password is not sent, but records and the session travel in clear; set kafka.tls.enabled",
				"mechanism", mech.Name(), "brokers", c.Brokers)
		}
	}
	return opts, nil
}

// mechanismOpt returns the franz-go mechanism, nil for none. Its callback
// reads the secret at every authentication.
func (c SASLConfig) mechanismOpt(prefix string) (sasl.Mechanism, error) {
	user := strings.TrimSpace(c.Username)
	switch mech := c.mechanism(); mech {
	case "":
		return nil, nil
	case MechanismScramSHA256, MechanismScramSHA512:
		auth := func(context.Context) (scram.Auth, error) {
			pw, err := c.password(prefix)
			if err != nil {
				return scram.Auth{}, err
			}
			return scram.Auth{User: user, Pass: pw.Reveal()}, nil
		}
		if mech == MechanismScramSHA512 {
			return scram.Sha512(auth), nil
		}
		return scram.Sha256(auth), nil
	case MechanismPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			pw, err := c.password(prefix)
			if err != nil {
				return plain.Auth{}, err
			}
			return plain.Auth{User: user, Pass: pw.Reveal()}, nil
		}), nil
	case MechanismOAuthBearer:
		return oauthMechanism{oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			tok, err := c.token(prefix)
			if err != nil {
				return oauth.Auth{}, err
			}
			return oauth.Auth{Token: tok.Reveal()}, nil
		})}, nil
	default:
		return nil, fmt.Errorf("%smechanism: %q is not one of %s", prefix, c.Mechanism, strings.Join(mechanisms, ", "))
	}
}

// ErrTokenRefused is returned (wrapped) when the broker refuses an
// OAUTHBEARER token; franz-go alone reports only "unexpected data in oauth
// response".
var ErrTokenRefused = errors.New("the broker refused the OAUTHBEARER token")

// oauthMechanism is franz-go's OAUTHBEARER with the broker's refusal
// (RFC 7628 §3.2.2: a JSON error challenge) turned into ErrTokenRefused
// with its status.
type oauthMechanism struct{ sasl.Mechanism }

func (m oauthMechanism) Authenticate(ctx context.Context, host string) (sasl.Session, []byte, error) {
	s, first, err := m.Mechanism.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	return oauthSession{s}, first, nil
}

type oauthSession struct{ sasl.Session }

func (s oauthSession) Challenge(resp []byte) (bool, []byte, error) {
	if len(resp) != 0 {
		// Only the status: the rest is not needed to act on it.
		var e struct {
			Status string `json:"status"`
		}
		_ = json.Unmarshal(resp, &e)
		return false, nil, fmt.Errorf("%w (status %q)", ErrTokenRefused, e.Status)
	}
	return s.Session.Challenge(resp)
}

// hintError is an error with what to check first.
type hintError struct {
	hint string
	err  error
}

func (e *hintError) Error() string { return e.hint + ": " + e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

// Explain wraps a Kafka client error with what to check when it is an
// authentication, TLS or authorization failure (naming the config keys),
// and returns any other error unchanged.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	if h, ok := errors.AsType[*hintError](err); ok && h != nil {
		return err
	}
	if hint, _ := classify(err); hint != "" {
		return &hintError{hint: hint, err: err}
	}
	return err
}

// Permanent reports whether err is one that retrying with the same
// configuration cannot fix: wrong credentials, an untrusted or mismatched
// certificate, TLS against a plaintext listener, a missing authorization.
func Permanent(err error) bool {
	_, permanent := classify(err)
	return permanent
}

func classify(err error) (hint string, permanent bool) {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		opErr     *net.OpError
	)
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, ErrTokenRefused):
		return "kafka authentication failed: check kafka.sasl.username and the password or token it reads (kafka.sasl.password_file/_env, token_file/_env)", true
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return "the broker does not accept this SASL mechanism on this listener: check kafka.sasl.mechanism and the broker's sasl.enabled.mechanisms", true
	case errors.As(err, &unknownCA), errors.As(err, &invalid):
		return "the broker's TLS certificate is not trusted: check kafka.tls.ca_file", true
	case errors.As(err, &hostname):
		return "the broker's TLS certificate is for another name: check kafka.brokers and kafka.tls.server_name", true
	case errors.As(err, &verify):
		return "the broker's TLS certificate failed verification: check kafka.tls.ca_file and kafka.tls.server_name", true
	case errors.As(err, &record):
		return "the broker did not answer with TLS: is this a plaintext listener (kafka.tls.enabled)?", true
	case errors.As(err, &opErr) && opErr.Op == "remote error": // a TLS alert from the broker
		return "the broker refused the TLS handshake: check kafka.tls.cert_file/key_file (mutual TLS) and the broker's TLS settings", true
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.GroupAuthorizationFailed), errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return "the broker refused this principal: grant the kafka.sasl.username (or certificate) principal ACLs for faultline's topics and groups", true
	}
	if _, ok := errors.AsType[*kgo.ErrFirstReadEOF](err); ok {
		return "the broker closed the connection at once: does the listener expect TLS (kafka.tls.enabled) or SASL (kafka.sasl.mechanism)?", false
	}
	return "", false
}
