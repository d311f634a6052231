package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

type section struct {
	BatchRecords int           `toml:"batch_records"`
	Linger       time.Duration `toml:"linger"`
	MaxBytes     uint64        `toml:"max_bytes"`
}

func (s *section) register(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&s.BatchRecords, prefix+"batch-records", s.BatchRecords, "records per batch")
	fs.DurationVar(&s.Linger, prefix+"linger", s.Linger, "wait")
}

// Shared is embedded: its sections are top-level ones.
type Shared struct {
	Store section `toml:"store"`
}

type testConfig struct {
	LogLevel string `toml:"log_level"`
	Shared
	Gateway struct {
		GRPCAddr string `toml:"grpc_addr"`
		Insecure bool   `toml:"insecure"`
	} `toml:"gateway"`
	Rules []struct {
		Mode  string        `toml:"mode"`
		Every time.Duration `toml:"every"`
	} `toml:"rules"`
	Timeouts map[string]*time.Duration `toml:"timeouts"`
	skipped  string
}

func load(t *testing.T, file string, args ...string) (testConfig, string, error) {
	t.Helper()
	return loadOpts(t, file, nil, args...)
}

// loadOpts is load with more options.
func loadOpts(t *testing.T, file string, opts []Option, args ...string) (testConfig, string, error) {
	t.Helper()
	cfg := testConfig{LogLevel: "info"}
	cfg.Store.BatchRecords = 10
	if file != "" {
		path := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	var out bytes.Buffer
	_, err := Load("test", args, &cfg, func(fs *flag.FlagSet) {
		fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "level")
		cfg.Store.register(fs, "store.")
		Prefix(fs, "gateway.", func(fs *flag.FlagSet) {
			fs.StringVar(&cfg.Gateway.GRPCAddr, "grpc-addr", cfg.Gateway.GRPCAddr, "listen")
			fs.BoolVar(&cfg.Gateway.Insecure, "insecure", cfg.Gateway.Insecure, "no TLS")
		})
	}, func() error { return nil }, &out, append([]Option{Moved(map[string]string{"store.size": "use store.batch_records"})}, opts...)...)
	return cfg, out.String(), err
}

// TestLoadNoArgsAndUnused: with NoArgs a word left after the flags (where
// the parser stopped, dropping the flags behind it) is refused; with
// Unused a key set in the file or by its flag (its deprecated spelling
// too), or a key under it, is refused naming the key, and one left unset
// is not.
func TestLoadNoArgsAndUnused(t *testing.T) {
	unused := Unused(map[string]string{"gateway.grpc_addr": "the test listens itself", "store": "no store here"})
	for _, tc := range []struct {
		name string
		file string
		opts []Option
		args []string
		want string
	}{
		{"stray word", "", []Option{NoArgs()}, []string{"--gateway.insecure", "false", "--log-level=debug"},
			`unexpected argument "false": flags after it would be ignored (write a true/false flag as --flag=false)`},
		{"word first", "", []Option{NoArgs()}, []string{"stray", "--log-level=debug"}, `unexpected argument "stray"`},
		{"after --", "", []Option{NoArgs()}, []string{"--", "x"}, `unexpected argument "x"`},
		{"unused flag", "", []Option{unused}, []string{"--gateway.grpc-addr=a:1"}, "gateway.grpc_addr (--gateway.grpc-addr): not used by test: the test listens itself"},
		{"unused deprecated flag", "", []Option{unused}, []string{"--grpc-addr=a:1"}, "gateway.grpc_addr (--grpc-addr): not used by test"},
		{"flag under an unused section", "", []Option{unused}, []string{"--store.linger=1s"}, "store (--store.linger): not used by test: no store here"},
		{"unused file key", "[gateway]\ngrpc_addr = \"a:1\"\n", []Option{unused}, nil, "gateway.grpc_addr: not used by test: the test listens itself"},
		{"file key under an unused section", "[store]\nlinger = \"1s\"\n", []Option{unused}, nil, "store: not used by test: no store here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := loadOpts(t, tc.file, tc.opts, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	if _, _, err := loadOpts(t, "[gateway]\ninsecure = true\n", []Option{NoArgs(), unused}, "--log-level=debug", "--gateway.insecure=false"); err != nil {
		t.Fatalf("keys that are used: %v", err)
	}
	if _, _, err := load(t, "", "--log-level=debug", "rest"); err != nil {
		t.Fatalf("without NoArgs: %v", err)
	}
}

// TestLoadNaming: an embedded struct's sections are top-level TOML
// sections; a prefixed component's flags are its section's; the old bare
// spelling still sets the value, is named as deprecated, and is not in
// --help; a moved key says what to use.
func TestLoadNaming(t *testing.T) {
	cfg, out, err := load(t, "log_level = \"warn\"\n[store]\nbatch_records = 5\nlinger = \"2s\"\n[gateway]\ngrpc_addr = \"a:1\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.BatchRecords != 5 || cfg.Store.Linger != 2*time.Second || cfg.Gateway.GRPCAddr != "a:1" || cfg.LogLevel != "warn" || out != "" {
		t.Fatalf("%+v %q", cfg, out)
	}
	cfg, out, err = load(t, "", "--gateway.grpc-addr=b:2", "--insecure", "--store.linger=3s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.GRPCAddr != "b:2" || !cfg.Gateway.Insecure || cfg.Store.Linger != 3*time.Second || out != "test: flag --insecure is deprecated; use --gateway.insecure\n" {
		t.Fatalf("%+v %q", cfg, out)
	}
	_, out, err = load(t, "", "--help")
	if err != flag.ErrHelp || !strings.Contains(out, "-gateway.grpc-addr") || strings.Contains(out, "-grpc-addr ") || strings.Contains(out, "deprecated") {
		t.Fatalf("help: %v\n%s", err, out)
	}
	if _, _, err = load(t, "[processors.store]\nbatch_records = 5\n"); err == nil || !strings.Contains(err.Error(), "unknown keys: processors.store") {
		t.Fatalf("nested section: %v", err)
	}
	if _, _, err = load(t, "[store]\nsize = 5\n"); err == nil || !strings.HasSuffix(err.Error(), "store.size: no longer a key: use store.batch_records") {
		t.Fatalf("moved key: %v", err)
	}
}

func TestKeysAndCheckFlags(t *testing.T) {
	keys := Keys(&testConfig{})
	want := []string{"log_level", "store", "store.batch_records", "store.linger", "store.max_bytes", "gateway", "gateway.grpc_addr", "gateway.insecure", "rules", "rules.mode", "rules.every", "timeouts"}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	var s string
	fs.String("config", "", "")
	fs.StringVar(&s, "store.batch-records", "", "")
	fs.StringVar(&s, "gateway.grpc-addr", "", "")
	Alias(fs, "grpc-addr", "gateway.grpc-addr")
	fs.StringVar(&s, "list", "", "")
	if err := CheckFlags(fs, testConfig{}, "list"); err != nil {
		t.Fatal(err)
	}
	fs.StringVar(&s, "fabric-poll-interval", "", "")
	fs.StringVar(&s, "store.batch_records", "", "")
	if err := CheckFlags(fs, testConfig{}, "list"); err == nil || err.Error() != "flags that name no TOML key: --fabric-poll-interval, --store.batch_records" {
		t.Fatalf("err %v", err)
	}
}

// TestLoadDurationNeedsUnit: a duration key given a bare number is refused
// with its key path (the decoder would read it as nanoseconds), wherever
// the key is: a section, an embedded struct's section, an array of tables,
// a map; a string with a unit and non-duration numbers are accepted.
func TestLoadDurationNeedsUnit(t *testing.T) {
	for _, tc := range []struct {
		name, file, err string
	}{
		{"units", "[store]\nbatch_records = 5\nlinger = \"7ms\"\n[[rules]]\nevery = \"1m\"\n[timeouts]\nread = \"2s\"\n", ""},
		{"section", "[store]\nlinger = 7\n", `store.linger = 7: a duration needs a unit, such as "7ms" or "7s"`},
		{"float", "[store]\nlinger = 0.5\n", `(last key "store.linger"): incompatible types`}, // the decoder's own refusal
		{"dotted key", "store.linger = 0\n", `store.linger = 0: a duration needs a unit`},
		{"array of tables", "[[rules]]\nevery = \"1s\"\n[[rules]]\nmode = \"x\"\nevery = 30\n", `rules[1].every = 30: a duration needs a unit`},
		{"map", "[timeouts]\nread = \"1s\"\nwrite = 3\n", `timeouts.write = 3: a duration needs a unit`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := load(t, tc.file)
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// TestLoadKeySpelling: the TOML decoder matches a key to a field
// case-insensitively when no spelling matches exactly, so `Linger = 600`
// would set store.linger (as 600 ns, the bare number never checked) with
// no unknown key reported; a key whose spelling is not exactly a key of
// the config is refused with the right spelling, wherever it is. A map's
// own keys are its data, any spelling.
func TestLoadKeySpelling(t *testing.T) {
	for _, tc := range []struct {
		name, file, err string
	}{
		{"exact", "log_level = \"warn\"\n[store]\nlinger = \"1s\"\n[timeouts]\nRead = \"1s\"\n", ""},
		{"field", "[store]\nLinger = 600\n", "store.Linger: unknown key (keys are case-sensitive): write store.linger"},
		{"top level", "Log_Level = \"warn\"\n", "Log_Level: unknown key (keys are case-sensitive): write log_level"},
		{"section", "[Store]\nlinger = \"1s\"\n", "Store: unknown key (keys are case-sensitive): write store"},
		{"dotted key", "store.LINGER = \"1s\"\n", "store.LINGER: unknown key (keys are case-sensitive): write store.linger"},
		{"array of tables", "[[rules]]\nmode = \"x\"\n[[rules]]\nEvery = \"1s\"\n", "rules[1].Every: unknown key (keys are case-sensitive): write rules[1].every"},
		{"unused section", "[Gateway]\ngrpc_addr = \"a:1\"\n", "Gateway: unknown key (keys are case-sensitive): write gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := loadOpts(t, tc.file, []Option{Unused(map[string]string{"gateway": "not here"})})
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// TestLoadUnsignedNotNegative: the TOML decoder stores -1 in a uint64
// field as 18446744073709551615; a negative number for an unsigned key is
// refused, naming the key.
func TestLoadUnsignedNotNegative(t *testing.T) {
	cfg, _, err := load(t, "[store]\nmax_bytes = 7\n")
	if err != nil || cfg.Store.MaxBytes != 7 {
		t.Fatalf("%v %d", err, cfg.Store.MaxBytes)
	}
	for _, file := range []string{"[store]\nmax_bytes = -1\n", "store.max_bytes = -1\n"} {
		if _, _, err := load(t, file); err == nil || !strings.HasSuffix(err.Error(), "store.max_bytes = -1: must not be negative") {
			t.Fatalf("%q: err %v", file, err)
		}
	}
}

// TestLoadConfigTwice: the flag parser keeps the last --config and the
// file was read from the first, so a second --config (a patch appending
// one) was ignored without a word; it is refused, naming both.
func TestLoadConfigTwice(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other.toml")
	if err := os.WriteFile(other, []byte("log_level = \"debug\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--config", other}, {"--config=" + other}, {"-config", other}, {"-config=" + other}} {
		if _, _, err := load(t, "log_level = \"warn\"\n", args...); err == nil || !strings.Contains(err.Error(), "--config given twice: ") || !strings.HasSuffix(err.Error(), " and "+other) {
			t.Fatalf("%v: err %v", args, err)
		}
	}
	if cfg, _, err := load(t, "", "--config="+other, "--", "--config=x"); err != nil || cfg.LogLevel != "debug" {
		t.Fatalf("after --: %v %q", err, cfg.LogLevel)
	}
}
