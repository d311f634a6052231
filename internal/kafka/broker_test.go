package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/internal/tlsclient"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// debugLog returns a debug-level logger (franz-go logs every connection
// and SASL step at debug) and what it wrote.
func debugLog() (*slog.Logger, *syncbuf.Buffer) {
	var buf syncbuf.Buffer
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// roundTrip creates a topic, produces one record and consumes it back, each
// through its own kafka.NewClient of c.
func roundTrip(t *testing.T, c Config, log *slog.Logger) {
	t.Helper()
	topic := fmt.Sprintf("sec-%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), time.Now().UnixNano())
	ctx := ctxT(t, 60*time.Second)
	if err := CreateTopics(ctx, c, log, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	prod, err := NewClient(c, log, kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	want := "value " + topic
	if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("dev/node-1"), Value: []byte(want)}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	cons, err := NewClient(c, log, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consume: %v", err)
		}
		if errs := fs.Errors(); len(errs) > 0 {
			t.Fatalf("fetch: %v", errs[0].Err)
		}
		if recs := fs.Records(); len(recs) > 0 {
			if got := string(recs[0].Value); got != want {
				t.Fatalf("consumed %q, want %q", got, want)
			}
			return
		}
	}
}

// secureConfig is a Config for the shared broker's SASL_SSL listener with
// the given mechanism and the test user's password file.
func secureConfig(k *testenv.Kafka, mech string) Config {
	sec := k.Security()
	c := DefaultConfig()
	c.Brokers, c.Partitions = sec.SASLSSLAddr, 2
	c.TLS = TLSConfig{Enabled: true, CAFile: sec.CA.File}
	c.SASL = SASLConfig{Mechanism: mech, Username: sec.User, PasswordFile: sec.PasswordFile}
	return c
}

func writeSecret(t *testing.T, name, v string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRealBrokerRoundTrip: through kafka.NewClient, a record goes to a
// real Apache Kafka broker and back over TLS with every supported SASL
// mechanism, and over mutual TLS; the password never reaches the logs.
func TestRealBrokerRoundTrip(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	sec := k.Security()
	for _, mech := range []string{MechanismScramSHA256, MechanismScramSHA512, MechanismPlain} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			log, logs := debugLog()
			roundTrip(t, secureConfig(k, mech), log)
			if !strings.Contains(logs.String(), mech) {
				t.Errorf("the debug log does not show a %s login:\n%s", mech, logs)
			}
			if strings.Contains(logs.String(), sec.Password) {
				t.Errorf("the password is in the logs")
			}
		})
	}
	t.Run("OAUTHBEARER token file", func(t *testing.T) {
		t.Parallel()
		c := secureConfig(k, MechanismOAuthBearer)
		c.SASL = SASLConfig{Mechanism: MechanismOAuthBearer, TokenFile: writeSecret(t, "token", k.OAuthToken("faultline-store", time.Hour))}
		log, logs := debugLog()
		roundTrip(t, c, log)
		if strings.Contains(logs.String(), "eyJ") {
			t.Errorf("the token is in the logs")
		}
	})
	t.Run("SCRAM password from env", func(t *testing.T) {
		// t.Setenv: not parallel.
		t.Setenv("FAULTLINE_TEST_KAFKA_PASSWORD", sec.Password)
		c := secureConfig(k, MechanismScramSHA256)
		c.SASL.PasswordFile, c.SASL.PasswordEnv = "", "FAULTLINE_TEST_KAFKA_PASSWORD"
		roundTrip(t, c, quietLog())
	})
	t.Run("mutual TLS", func(t *testing.T) {
		t.Parallel()
		client := sec.CA.Issue(t, "faultline-gateway")
		c := DefaultConfig()
		c.Brokers, c.Partitions = sec.SSLAddr, 2
		c.TLS = TLSConfig{Enabled: true, CAFile: sec.CA.File, CertFile: client.CertFile, KeyFile: client.KeyFile}
		roundTrip(t, c, quietLog())
	})
}

// TestRealBrokerRotatedPassword: the password file is read at every
// login, so after the credential and the file change, new connections of
// the same config log in with the new password.
func TestRealBrokerRotatedPassword(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	ctx := ctxT(t, 60*time.Second)
	adm := k.Admin(t)
	setPassword := func(pw string) {
		t.Helper()
		resp, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "rotating", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: pw}})
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setPassword("first-password-1")
	pwFile := writeSecret(t, "pw", "first-password-1")
	c := secureConfig(k, MechanismScramSHA256)
	c.SASL.Username, c.SASL.PasswordFile = "rotating", pwFile
	eventually(t, func() error { return ping(ctx, c) }) // the credential reaches the listener a moment later
	setPassword("second-password-2")
	eventually(t, func() error {
		if err := ping(ctx, c); !errors.Is(err, kerr.SaslAuthenticationFailed) {
			return fmt.Errorf("old password: %v, want SASL_AUTHENTICATION_FAILED", err)
		}
		return nil
	})
	if err := os.WriteFile(pwFile, []byte("second-password-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, c); err != nil {
		t.Fatalf("after rotating the file: %v", err)
	}
}

// ping lists the brokers through a new client of c.
func ping(ctx context.Context, c Config) error {
	cl, err := NewClient(c, quietLog(), kgo.RetryTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = kadm.NewClient(cl).ListBrokers(ctx)
	return err
}

func eventually(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRealBrokerRefusals: wrong credentials, an untrusted CA, an expired
// token, a missing client certificate and a TLS/plaintext mismatch each
// fail at start, fast, with an error that says what to check — and never
// shows the secret.
func TestRealBrokerRefusals(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	sec := k.Security()
	otherCA := testenv.NewCA(t, "", "some-other-ca")
	tests := []struct {
		name string
		mod  func(t *testing.T, c *Config)
		want []string // substrings of the error
		// permanent: CreateTopics gives up at once instead of retrying
		// for its minute.
		permanent bool
	}{
		{"wrong password", func(t *testing.T, c *Config) {
			c.SASL.PasswordFile = writeSecret(t, "pw", "not-the-password-77")
		}, []string{"kafka authentication failed: check kafka.sasl.username", "SASL_AUTHENTICATION_FAILED"}, true},
		{"unknown user", func(t *testing.T, c *Config) { c.SASL.Username = "mallory" },
			[]string{"kafka authentication failed", "SASL_AUTHENTICATION_FAILED"}, true},
		{"wrong password SCRAM-SHA-512", func(t *testing.T, c *Config) {
			c.SASL.Mechanism = MechanismScramSHA512
			c.SASL.PasswordFile = writeSecret(t, "pw", "not-the-password-77")
		}, []string{"kafka authentication failed", "SASL_AUTHENTICATION_FAILED"}, true},
		{"wrong PLAIN password", func(t *testing.T, c *Config) {
			c.SASL.Mechanism = MechanismPlain
			c.SASL.PasswordFile = writeSecret(t, "pw", "not-the-password-77")
		}, []string{"kafka authentication failed", "SASL_AUTHENTICATION_FAILED"}, true},
		{"expired token", func(t *testing.T, c *Config) {
			c.SASL = SASLConfig{Mechanism: MechanismOAuthBearer, TokenFile: writeSecret(t, "tok", k.OAuthToken("x", -time.Hour))}
		}, []string{"kafka authentication failed", "the broker refused the OAUTHBEARER token (status \"invalid_token\")"}, true},
		{"wrong CA", func(t *testing.T, c *Config) { c.TLS.CAFile = otherCA.File },
			[]string{"the broker's TLS certificate is not trusted: check kafka.tls.ca_file", "certificate signed by unknown authority"}, true},
		{"system roots", func(t *testing.T, c *Config) { c.TLS.CAFile = "" },
			[]string{"the broker's TLS certificate is not trusted: check kafka.tls.ca_file", "certificate signed by unknown authority"}, true},
		{"wrong server name", func(t *testing.T, c *Config) { c.TLS.ServerName = "kafka.example.com" },
			[]string{"the broker's TLS certificate is for another name: check kafka.brokers and kafka.tls.server_name", "kafka.example.com"}, true},
		{"TLS to the plaintext listener", func(t *testing.T, c *Config) {
			c.Brokers = k.Addr()
			c.SASL = SASLConfig{}
		}, []string{"does the listener expect TLS (kafka.tls.enabled)", "using TLS when the broker is not expecting it"}, true},
		{"mutual TLS without a client certificate", func(t *testing.T, c *Config) {
			c.Brokers = sec.SSLAddr
			c.SASL = SASLConfig{}
		}, []string{"the broker refused the TLS handshake: check kafka.tls.cert_file", "bad certificate"}, true},
		{"client certificate from another CA", func(t *testing.T, c *Config) {
			kp := otherCA.Issue(t, "intruder")
			c.Brokers = sec.SSLAddr
			c.SASL = SASLConfig{}
			c.TLS.CertFile, c.TLS.KeyFile = kp.CertFile, kp.KeyFile
		}, []string{"the broker refused the TLS handshake: check kafka.tls.cert_file", "unknown certificate"}, true},
		{"no SASL on the SASL_SSL listener", func(t *testing.T, c *Config) { c.SASL = SASLConfig{} },
			[]string{"does the listener expect TLS (kafka.tls.enabled) or SASL (kafka.sasl.mechanism)?", "is SASL missing?"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := secureConfig(k, MechanismScramSHA256)
			tt.mod(t, &c)
			if err := c.Validate("kafka."); err != nil {
				t.Fatalf("the config itself is valid, got %v", err)
			}
			log, logs := debugLog()
			began := time.Now()
			ctx := ctxT(t, 90*time.Second)
			err := CreateTopics(ctx, c, log, "never-created")
			took := time.Since(began)
			if err == nil {
				t.Fatal("CreateTopics succeeded")
			}
			t.Logf("after %s: %v", took.Round(time.Millisecond), err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q", w)
				}
			}
			if tt.permanent && took > 15*time.Second {
				t.Errorf("took %s: a permanent failure must not be retried", took)
			}
			for _, s := range []string{sec.Password, "not-the-password-77", "eyJ"} {
				if strings.Contains(err.Error(), s) || strings.Contains(logs.String(), s) {
					t.Errorf("a secret (%.6s…) is in the error or the logs", s)
				}
			}
		})
	}
}

// TestRealBrokerCreatedTopicsAnswer: CreateTopics returns once every
// partition of the topics it created answers on its leader. Before that,
// a produce to a partition its leader has not loaded yet is refused
// (NOT_LEADER_OR_FOLLOWER) and franz-go retries it only after its next
// metadata refresh, up to metadataMinAge later (franz-go's default: 5 s):
// a new gateway's first events would wait that long. Many partitions at once widen the window the broker
// takes to load them.
func TestRealBrokerCreatedTopicsAnswer(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	c := DefaultConfig()
	c.Brokers, c.Partitions = k.Addr(), 64
	topics := make([]string, 4)
	for i := range topics {
		topics[i] = fmt.Sprintf("answer-%d-%d", i, time.Now().UnixNano())
	}
	ctx := ctxT(t, 90*time.Second)
	// connected before, so its question follows CreateTopics at once
	cl, err := NewClient(c, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topics...) })
	if err := CreateTopics(ctx, c, quietLog(), topics...); err != nil {
		t.Fatal(err)
	}
	offs, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	offs.Each(func(o kadm.ListedOffset) {
		n++
		if o.Err != nil {
			t.Errorf("%s/%d right after CreateTopics: %v", o.Topic, o.Partition, o.Err)
		}
	})
	if want := len(topics) * c.Partitions; n != want {
		t.Errorf("%d partitions listed, want %d", n, want)
	}
}

// TestBoundedProducerWhileTheBrokerIsDown: with its broker stopped, a
// try of NewBoundedProducer ends with an error within a retry backoff of
// its context's end, and the client produces again once the broker is
// back; a plain idempotent client (acks=all) given the same try is still
// waiting for the broker seconds after its context ended — what the
// janitor's emit and quarantine's loops met (they stalled for the whole
// outage).
func TestBoundedProducerWhileTheBrokerIsDown(t *testing.T) {
	k := testenv.StartKafka(t)
	c := DefaultConfig()
	c.Brokers = k.Addr()
	const topic = "bounded"
	ctx := ctxT(t, 2*time.Minute)
	if err := CreateTopics(ctx, c, quietLog(), topic); err != nil {
		t.Fatal(err)
	}
	bounded, err := NewBoundedProducer(c, quietLog(), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer bounded.Close()
	plain, err := NewClient(c, quietLog(), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	for _, cl := range []*kgo.Client{bounded, plain} { // both have found the broker
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("warm")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	k.Stop()

	const try = time.Second
	ended := func(cl *kgo.Client) <-chan error {
		out := make(chan error, 1)
		go func() {
			tctx, cancel := context.WithTimeout(ctx, try)
			defer cancel()
			out <- cl.ProduceSync(tctx, &kgo.Record{Value: []byte("during")}).FirstErr()
		}()
		return out
	}
	began := time.Now()
	plainTry, boundedTry := ended(plain), ended(bounded)
	select {
	case err := <-boundedTry:
		if err == nil {
			t.Fatal("produced with the broker down")
		}
		t.Logf("bounded: the %s try ended after %s: %v", try, time.Since(began).Round(time.Millisecond), err)
	case <-time.After(try + 3*time.Second):
		t.Fatalf("bounded: the %s try still waiting after %s", try, time.Since(began).Round(time.Millisecond))
	}
	select {
	case err := <-plainTry:
		t.Fatalf("plain: the %s try ended after %s (%v): franz-go no longer holds a record in a produce request, and NewBoundedProducer's AllowIdempotentProduceCancellation may be needless", try, time.Since(began).Round(time.Millisecond), err)
	case <-time.After(try + 5*time.Second - time.Since(began)):
		t.Logf("plain: the %s try still waiting after %s", try, time.Since(began).Round(time.Millisecond))
	}

	k.Start()
	if err := bounded.ProduceSync(ctx, &kgo.Record{Value: []byte("after")}).FirstErr(); err != nil {
		t.Fatalf("bounded: produce after the broker is back: %v", err)
	}
	select { // the held record goes once the broker is back
	case err := <-plainTry:
		t.Logf("plain: the held try ended once the broker was back: %v", err)
	case <-ctx.Done():
		t.Fatal("plain: the held try never ended")
	}
}

// TestRealBrokerFollowsTheCAFile: kafka.tls.ca_file is read again when it
// changes, so a CA bundle replaced in place (a Kafka operator's cluster CA
// renewed, the Secret updated under the pod) is trusted by the next
// connection of the same client. Before, a client trusted the bundle it
// read at start until it was restarted. The broker's CA taken out of the
// file again (distrusted), the client's open connections are closed within
// tlsclient.ReverifyEvery and its next ones refused; before, it kept the
// connections it had.
func TestRealBrokerFollowsTheCAFile(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	sec := k.Security()
	caFile, otherCA := filepath.Join(t.TempDir(), "ca.crt"), testenv.NewCA(t, "", "before-the-rotation")
	testenv.Rotate(t, caFile, otherCA.File)
	c := secureConfig(k, MechanismScramSHA256)
	c.TLS.CAFile = caFile
	cl, err := NewClient(c, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pingCtx := func() context.Context { return ctxT(t, 10*time.Second) }
	if err := cl.Ping(pingCtx()); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("ping with a CA that does not sign the broker: %v, want unknown authority", err)
	}
	testenv.Rotate(t, caFile, sec.CA.File)
	if err := cl.Ping(pingCtx()); err != nil {
		t.Fatalf("ping once the broker's CA is in the file: %v", err)
	}
	testenv.Rotate(t, caFile, otherCA.File)
	deadline := time.Now().Add(2*tlsclient.ReverifyEvery + 5*time.Second)
	for err := cl.Ping(pingCtx()); err == nil; err = cl.Ping(pingCtx()) {
		if time.Now().After(deadline) {
			t.Fatal("still answering on the connections the CA file no longer verifies")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
