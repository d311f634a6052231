package testenv

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// KafkaSecurity describes the authenticated listeners of a broker started
// with KafkaSecure. The plaintext listener (Kafka.Addr) stays, for the
// broker's own traffic and for test set-up.
type KafkaSecurity struct {
	// SASLSSLAddr is a SASL_SSL listener: TLS with the broker certificate,
	// then SCRAM-SHA-256, SCRAM-SHA-512, PLAIN or OAUTHBEARER.
	SASLSSLAddr string
	// SSLAddr is an SSL listener that requires a client certificate signed
	// by CA (mutual TLS, no SASL).
	SSLAddr string
	// CA signs the broker's certificate (for 127.0.0.1 and localhost);
	// CA.Issue makes client certificates the SSL listener accepts.
	CA *CA
	// User and Password are a SCRAM user (both SHA-256 and SHA-512
	// credentials, added through the admin API at start) and a PLAIN user
	// (in the listener's JAAS config).
	User, Password string
	// PasswordFile holds Password, for configs that read it from a file.
	PasswordFile string
}

// KafkaSecure adds a SASL_SSL and an SSL (mutual TLS) listener to the
// broker, with a CA and a broker certificate generated for it, a SCRAM and
// PLAIN user, and OAUTHBEARER with Kafka's unsecured JWS validator (tokens
// from Kafka.OAuthToken). Kafka.Security describes them. It costs a second
// or two of start-up: the SCRAM user is added through the admin API and
// the broker is ready once a SCRAM login over TLS succeeds. Default off.
//
// Under `go test -short` the test is skipped.
func KafkaSecure() KafkaOption {
	return func(c *kafkaConfig) { c.secure = true }
}

// Security describes the secure listeners; nil unless the broker was
// started with KafkaSecure.
func (k *Kafka) Security() *KafkaSecurity { return k.sec }

// secureListeners generates the broker's certificate and user and adds
// the two listeners to props.
func secureListeners(tb testing.TB, dir string, props map[string]string, saslPort, sslPort int) *KafkaSecurity {
	tb.Helper()
	if testing.Short() {
		tb.Skip("testenv: -short: not starting a real Kafka broker with TLS listeners")
	}
	tlsDir := filepath.Join(dir, "tls")
	mkdirs(tb, tlsDir)
	ca := NewCA(tb, tlsDir, "kafka-testenv")
	broker := ca.Issue(tb, "kafka-broker", "127.0.0.1", "localhost")
	// A PEM key store is the PKCS#8 key followed by the certificate chain.
	keyPEM, err := os.ReadFile(broker.KeyFile)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	certPEM, err := os.ReadFile(broker.CertFile)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	keystore := filepath.Join(tlsDir, "broker-keystore.pem")
	writeFile(tb, keystore, append(keyPEM, certPEM...), 0o600)

	sec := &KafkaSecurity{
		SASLSSLAddr:  fmt.Sprintf("127.0.0.1:%d", saslPort),
		SSLAddr:      fmt.Sprintf("127.0.0.1:%d", sslPort),
		CA:           ca,
		User:         "faultline",
		Password:     randomHex(tb, 16),
		PasswordFile: filepath.Join(tlsDir, "password"),
	}
	writeFile(tb, sec.PasswordFile, []byte(sec.Password+"\n"), 0o600)

	props["listeners"] += ",SASL_SSL://" + sec.SASLSSLAddr + ",SSL://" + sec.SSLAddr
	props["advertised.listeners"] += ",SASL_SSL://" + sec.SASLSSLAddr + ",SSL://" + sec.SSLAddr
	props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL,SSL:SSL"
	const scramModule = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
	for k, v := range map[string]string{
		"ssl.keystore.type":                                     "PEM",
		"ssl.keystore.location":                                 keystore,
		"ssl.truststore.type":                                   "PEM",
		"ssl.truststore.location":                               ca.File,
		"listener.name.ssl.ssl.client.auth":                     "required",
		"sasl.enabled.mechanisms":                               "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER",
		"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scramModule,
		"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scramModule,
		"listener.name.sasl_ssl.plain.sasl.jaas.config": fmt.Sprintf(
			`org.apache.kafka.common.security.plain.PlainLoginModule required user_%s="%s";`, sec.User, sec.Password),
		// Kafka's unsecured validator: an unsigned JWT with sub, iat and
		// exp claims (see OAuthToken). A test broker only.
		"listener.name.sasl_ssl.oauthbearer.sasl.jaas.config":                   "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
		"listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class": "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler",
	} {
		props[k] = v
	}
	return sec
}

// addSCRAMUser adds the SCRAM-SHA-256 and -512 credentials of the user
// through the plaintext listener.
func (k *Kafka) addSCRAMUser() {
	k.tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr))
	if err != nil {
		k.tb.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One request per mechanism: Kafka refuses a request naming the same
	// user twice (DUPLICATE_RESOURCE).
	for _, m := range []kadm.ScramMechanism{kadm.ScramSha256, kadm.ScramSha512} {
		up := kadm.UpsertSCRAM{User: k.sec.User, Mechanism: m, Iterations: 4096, Password: k.sec.Password}
		resp, err := kadm.NewClient(cl).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{up})
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			k.tb.Fatalf("testenv: add SCRAM user %s (%s): %v\n%s", k.sec.User, m, err, k.proc.logTail(40))
		}
	}
}

// secureReady succeeds once a SCRAM-SHA-512 login over TLS on the SASL_SSL
// listener lists the broker (the credentials reach the listener through
// the metadata log a moment after AlterUserSCRAMs answers).
func (k *Kafka) secureReady(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.sec.SASLSSLAddr), kgo.RetryTimeout(time.Second),
		kgo.DialTLSConfig(&tls.Config{RootCAs: k.sec.CA.Pool(), MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: k.sec.User, Pass: k.sec.Password}.AsSha512Mechanism()))
	if err != nil {
		return err
	}
	defer cl.Close()
	brokers, err := kadm.NewClient(cl).ListBrokers(ctx)
	if err != nil {
		return fmt.Errorf("SCRAM over TLS: %w", err)
	}
	if len(brokers) == 0 {
		return fmt.Errorf("SCRAM over TLS: no brokers in metadata")
	}
	return nil
}

// OAuthToken returns an unsigned JWT for the broker's unsecured OAUTHBEARER
// validator: principal sub, expiring after ttl (a negative ttl gives an
// expired token, which the broker refuses).
func (k *Kafka) OAuthToken(sub string, ttl time.Duration) string {
	now := time.Now()
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	iat := now
	if ttl < 0 {
		iat = now.Add(2 * ttl)
	}
	return enc(map[string]string{"alg": "none"}) + "." +
		enc(map[string]any{"sub": sub, "iat": iat.Unix(), "exp": now.Add(ttl).Unix()}) + "."
}

// TLSConfig returns a client TLS config trusting only the broker's CA.
func (s *KafkaSecurity) TLSConfig() *tls.Config {
	return &tls.Config{RootCAs: s.CA.Pool(), MinVersion: tls.VersionTLS12}
}

// String describes the listeners (never the password).
func (s *KafkaSecurity) String() string {
	return strings.Join([]string{"SASL_SSL " + s.SASLSSLAddr, "SSL " + s.SSLAddr, "user " + s.User}, ", ")
}
