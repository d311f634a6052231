package kafka

import (
	"bytes"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultline/faultline/internal/testenv"
)

// TestMinInsync: min.insync.replicas of created topics by replication
// factor — the fleet's 2 by default, capped at the replicas a topic has; an
// explicit value is used as given, and one above the replicas is refused
// naming the key (retrying could not help).
func TestMinInsync(t *testing.T) {
	tests := []struct {
		set, rf, want int
		err           string
	}{
		{0, 1, 1, ""}, {0, 2, 2, ""}, {0, 3, 2, ""}, {0, 5, 2, ""},
		{1, 3, 1, ""}, {3, 3, 3, ""},
		{3, 1, 0, "kafka.min_insync_replicas: 3 is more than the 1 replicas the topics get"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.MinInsyncReplicas = tt.set
		got, err := c.minInsync(tt.rf)
		if tt.err != "" {
			if _, ok := errors.AsType[configError](err); !ok || !strings.Contains(fmt.Sprint(err), tt.err) {
				t.Errorf("set %d, rf %d: err %v, want a config error with %q", tt.set, tt.rf, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("set %d, rf %d: %d %v, want %d", tt.set, tt.rf, got, err, tt.want)
		}
	}
	// Validate refuses what it can see at start.
	for _, v := range []struct {
		rf, set int
		want    string
	}{
		{3, 4, "kafka.min_insync_replicas: 4 is more than kafka.replication_factor 3"},
		{-1, -1, "kafka.min_insync_replicas: must be 0 (the default, 2) or at least 1, got -1"},
		{2, 2, ""}, {-1, 5, ""}, // the broker's default is only known when topics are created
	} {
		c := DefaultConfig()
		c.ReplicationFactor, c.MinInsyncReplicas = v.rf, v.set
		err := c.Validate("kafka.")
		if (v.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), v.want)) {
			t.Errorf("replication %d, min insync %d: %v, want %q", v.rf, v.set, err, v.want)
		}
	}
}

// TestValidateNamesTheKey: every bad combination of the TLS and SASL keys
// is refused at start with an error naming the key.
func TestValidateNamesTheKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pwFile := write("pw", "pw-9f8e7d\n")
	tokFile := write("tok", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.\n")
	emptyFile := write("empty", "\n")
	notPEM := write("notpem", "not a certificate")
	t.Setenv("FAULTLINE_TEST_KAFKA_PW", "pw-from-env")

	tests := []struct {
		name string
		mod  func(c *Config)
		want string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"scram-256 with file", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: pwFile}
		}, ""},
		{"scram-512 lower case with env", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "scram-sha-512", Username: "u", PasswordEnv: "FAULTLINE_TEST_KAFKA_PW"}
		}, ""},
		{"plain over tls", func(c *Config) {
			c.TLS.Enabled = true
			c.SASL = SASLConfig{Mechanism: "PLAIN", Username: "u", PasswordFile: pwFile}
		}, ""},
		{"oauthbearer over tls", func(c *Config) {
			c.TLS.Enabled = true
			c.SASL = SASLConfig{Mechanism: "OAUTHBEARER", TokenFile: tokFile}
		}, ""},
		{"unknown mechanism", func(c *Config) { c.SASL.Mechanism = "GSSAPI" }, `kafka.sasl.mechanism: "GSSAPI" is not one of SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, PLAIN`},
		{"plain without tls", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "PLAIN", Username: "u", PasswordFile: pwFile}
		}, "kafka.sasl.mechanism: PLAIN sends the password in clear; it requires kafka.tls.enabled = true"},
		{"oauthbearer without tls", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "OAUTHBEARER", TokenFile: tokFile}
		}, "kafka.sasl.mechanism: OAUTHBEARER sends the bearer token in clear; it requires kafka.tls.enabled = true"},
		{"scram without user", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", PasswordFile: pwFile}
		}, "kafka.sasl.username: required by SCRAM-SHA-256"},
		{"scram without password", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u"}
		}, "kafka.sasl.password_file or kafka.sasl.password_env: required by SCRAM-SHA-256"},
		{"scram missing password file", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: filepath.Join(dir, "absent")}
		}, "kafka.sasl.password_file: open " + filepath.Join(dir, "absent")},
		{"scram empty password file", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: emptyFile}
		}, "kafka.sasl.password_file: " + emptyFile + " is empty"},
		{"scram unset env", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordEnv: "FAULTLINE_TEST_KAFKA_UNSET"}
		}, "kafka.sasl.password_env: environment variable FAULTLINE_TEST_KAFKA_UNSET is not set"},
		{"both password sources", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: pwFile, PasswordEnv: "FAULTLINE_TEST_KAFKA_PW"}
		}, "kafka.sasl.password_file, kafka.sasl.password_env: both"},
		{"token with scram", func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: pwFile, TokenFile: tokFile}
		}, "kafka.sasl.token_file: not used by SCRAM-SHA-256"},
		{"password with oauthbearer", func(c *Config) {
			c.TLS.Enabled = true
			c.SASL = SASLConfig{Mechanism: "OAUTHBEARER", TokenFile: tokFile, PasswordFile: pwFile}
		}, "kafka.sasl.password_file: not used by OAUTHBEARER"},
		{"oauthbearer without token", func(c *Config) {
			c.TLS.Enabled = true
			c.SASL = SASLConfig{Mechanism: "OAUTHBEARER"}
		}, "kafka.sasl.token_file or kafka.sasl.token_env: required by OAUTHBEARER"},
		{"username without mechanism", func(c *Config) { c.SASL.Username = "u" }, "kafka.sasl.username: set, but kafka.sasl.mechanism is empty"},
		{"password file without mechanism", func(c *Config) { c.SASL.PasswordFile = pwFile }, "kafka.sasl.password_file: set, but kafka.sasl.mechanism is empty"},
		{"ca file with tls off", func(c *Config) { c.TLS.CAFile = notPEM }, "kafka.tls.ca_file: set, but kafka.tls.enabled is false"},
		{"server name with tls off", func(c *Config) { c.TLS.ServerName = "kafka" }, "kafka.tls.server_name: set, but kafka.tls.enabled is false"},
		{"ca file missing", func(c *Config) {
			c.TLS = TLSConfig{Enabled: true, CAFile: filepath.Join(dir, "absent.pem")}
		}, "kafka.tls.ca_file: open "},
		{"ca file not PEM", func(c *Config) {
			c.TLS = TLSConfig{Enabled: true, CAFile: notPEM}
		}, "kafka.tls.ca_file: no PEM certificates in " + notPEM},
		{"cert without key", func(c *Config) {
			c.TLS = TLSConfig{Enabled: true, CertFile: notPEM}
		}, "kafka.tls.key_file: required with kafka.tls.cert_file"},
		{"key without cert", func(c *Config) {
			c.TLS = TLSConfig{Enabled: true, KeyFile: notPEM}
		}, "kafka.tls.cert_file: required with kafka.tls.key_file"},
		{"bad key pair", func(c *Config) {
			c.TLS = TLSConfig{Enabled: true, CertFile: notPEM, KeyFile: notPEM}
		}, "kafka.tls.cert_file, kafka.tls.key_file: tls: failed to find any PEM data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate("kafka.")
			if tt.want == "" {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v\nwant an error containing %q", err, tt.want)
			}
			for _, secret := range []string{"pw-9f8e7d", "pw-from-env", "eyJhbGciOiJub25lIn0"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error shows a secret: %v", err)
				}
			}
			// NewClient refuses the same config with the same error.
			if _, cerr := NewClient(c, quietLog()); cerr == nil || cerr.Error() != err.Error() {
				t.Fatalf("NewClient: %v, want %v", cerr, err)
			}
		})
	}
}

// TestConfigFromTOMLAndFlags: the keys decode from a TOML [kafka] section
// and the flags override them; --help names the keys and shows no secret.
func TestConfigFromTOMLAndFlags(t *testing.T) {
	t.Setenv("FAULTLINE_TEST_KAFKA_PW", "pw-never-shown-41")
	var file struct {
		Kafka Config `toml:"kafka"`
	}
	file.Kafka = DefaultConfig()
	md, err := toml.Decode(`
[kafka]
brokers = "k1:9093,k2:9093"
[kafka.tls]
enabled = true
server_name = "kafka.internal"
[kafka.sasl]
mechanism = "SCRAM-SHA-512"
username = "faultline-gateway"
password_env = "FAULTLINE_TEST_KAFKA_PW"
`, &file)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("undecoded keys %v", und)
	}
	c := file.Kafka
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	c.RegisterFlags(fs, "kafka.")
	if err := fs.Parse([]string{"--kafka.sasl.username", "faultline-store", "--kafka.tls.server-name", "kafka.example"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate("kafka."); err != nil {
		t.Fatal(err)
	}
	if c.SASL.Username != "faultline-store" || c.TLS.ServerName != "kafka.example" || !c.TLS.Enabled || c.SASL.mechanism() != MechanismScramSHA512 {
		t.Fatalf("config %+v", c)
	}
	fs.PrintDefaults()
	for _, want := range []string{"-kafka.sasl.mechanism", "-kafka.sasl.password-file", "-kafka.sasl.password-env", "-kafka.sasl.token-file",
		"-kafka.tls.enabled", "-kafka.tls.ca-file", "-kafka.tls.cert-file", "-kafka.tls.key-file", "-kafka.tls.server-name"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help lacks %s", want)
		}
	}
	if strings.Contains(help.String(), "pw-never-shown-41") {
		t.Errorf("--help shows the password:\n%s", help.String())
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestKfakeSCRAMOverTLS is the fast (in-process, no Java) check of
// NewClient's TLS and SASL wiring, run even under -short: franz-go's kfake
// broker with TLS and a SCRAM-SHA-512 user. The real-broker tests are
// TestRealBroker*.
func TestKfakeSCRAMOverTLS(t *testing.T) {
	ca := testenv.NewCA(t, "", "kfake")
	server := ca.Issue(t, "kfake", "127.0.0.1")
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{server.Cert}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser(MechanismScramSHA512, "faultline", "kfake-password-3"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	c := DefaultConfig()
	c.Brokers, c.Partitions = strings.Join(cluster.ListenAddrs(), ","), 1
	c.TLS = TLSConfig{Enabled: true, CAFile: ca.File}
	c.SASL = SASLConfig{Mechanism: MechanismScramSHA512, Username: "faultline", PasswordFile: writeSecret(t, "pw", "kfake-password-3")}
	if err := c.Validate("kafka."); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, quietLog())
	// Refusals are tested against the real broker only: kfake closes the
	// connection on a failed SCRAM login where Kafka answers
	// SASL_AUTHENTICATION_FAILED, so its failure looks transient.
}

// TestKfakeACLsTopicsPrecreated: a principal that may not create topics
// (broker ACLs) starts when an operator created them, and gets an error
// saying what to do when one is missing.
func TestKfakeACLsTopicsPrecreated(t *testing.T) {
	allow := func(res kmsg.ACLResourceType, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: res, Name: "*", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(MechanismScramSHA256, "admin", "admin-pw"),
		kfake.User(MechanismScramSHA256, "gateway", "gateway-pw",
			allow(kmsg.ACLResourceTypeTopic, kmsg.ACLOperationDescribe), allow(kmsg.ACLResourceTypeTopic, kmsg.ACLOperationWrite)),
		kfake.SeedTopics(1, "precreated"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	c := DefaultConfig()
	c.Brokers, c.Partitions = strings.Join(cluster.ListenAddrs(), ","), 1
	c.SASL = SASLConfig{Mechanism: MechanismScramSHA256, Username: "gateway", PasswordFile: writeSecret(t, "pw", "gateway-pw")}
	ctx := ctxT(t, 30*time.Second)
	if err := CreateTopics(ctx, c, quietLog(), "precreated"); err != nil {
		t.Fatalf("existing topic, no create permission: %v", err)
	}
	err = CreateTopics(ctx, c, quietLog(), "precreated", "missing")
	if err == nil || !strings.Contains(err.Error(), "create topic missing: not allowed to create it, and it does not exist") {
		t.Fatalf("missing topic, no create permission: %v", err)
	}
}

// TestSessionTimeout: the session timeout is refused outside the broker's
// default bounds, and sets the group's session and heartbeat.
func TestSessionTimeout(t *testing.T) {
	for _, tt := range []struct {
		set  time.Duration
		want string // error, "" for none
		opts int
	}{
		{15 * time.Second, "", 2},
		{0, "", 0}, // franz-go's defaults
		{6 * time.Second, "", 2},
		{5 * time.Second, "kafka.session_timeout: must be between 6s and 30m", 0},
		{31 * time.Minute, "kafka.session_timeout: must be between 6s and 30m", 0},
	} {
		c := DefaultConfig()
		c.SessionTimeout = tt.set
		err := c.Validate("kafka.")
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("session_timeout %v: %v, want %q", tt.set, err, tt.want)
		}
		if err == nil && len(c.GroupOpts()) != tt.opts {
			t.Errorf("session_timeout %v: %d group options, want %d", tt.set, len(c.GroupOpts()), tt.opts)
		}
	}
	if d := DefaultConfig().SessionTimeout; d != 15*time.Second {
		t.Errorf("default session_timeout %v, want 15s", d)
	}
}

// TestClientRetryOptions: every client asks for metadata again within
// metadataMinAge of a failure, not franz-go's 5 s, and retries a request
// requestRetries times, unless its caller says otherwise.
func TestClientRetryOptions(t *testing.T) {
	for _, tt := range []struct {
		opts    []kgo.Opt
		minAge  time.Duration
		retries int64
	}{
		{nil, metadataMinAge, requestRetries},
		{[]kgo.Opt{kgo.MetadataMinAge(3 * time.Second), kgo.RequestRetries(5)}, 3 * time.Second, 5},
	} {
		cl, err := NewClient(DefaultConfig(), quietLog(), tt.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := cl.OptValue(kgo.MetadataMinAge); got != tt.minAge {
			t.Errorf("options %d: metadata min age %v, want %v", len(tt.opts), got, tt.minAge)
		}
		if got := cl.OptValue(kgo.RequestRetries); got != tt.retries {
			t.Errorf("options %d: request retries %v, want %v", len(tt.opts), got, tt.retries)
		}
		cl.Close()
	}
}

// TestRetryBackoff: Kafka's client defaults, 100 ms doubling to 1 s, each
// within ±20 % jitter.
func TestRetryBackoff(t *testing.T) {
	for _, tt := range []struct {
		fails int
		base  time.Duration
	}{
		{0, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {64, time.Second},
	} {
		lo, hi := tt.base*8/10, tt.base*12/10
		for range 100 {
			if d := retryBackoff(tt.fails); d < lo || d > hi {
				t.Fatalf("retryBackoff(%d) = %v, want %v to %v", tt.fails, d, lo, hi)
			}
		}
	}
}
