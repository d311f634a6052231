package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/processors/correlate"
	"github.com/faultline/faultline/processors/quarantine"
)

// commandArgs are flags of a command that are arguments, not configuration.
// "cluster" is migrate's shorthand for --clickhouse.cluster.
var commandArgs = []string{"status", "param", "format", "list", "cluster"}

// helpFlags returns the flags `faultline CMD --help` lists.
func helpFlags(t *testing.T, cmd string) []string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{cmd, "--help"}, &out, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("%s --help: %v", cmd, err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(out.String(), -1) {
		names = append(names, m[1])
	}
	if len(names) < 5 {
		t.Fatalf("%s --help lists %v", cmd, names)
	}
	return names
}

// TestFlagsNameTheirKeys: every flag of every command is a TOML key of
// Config with "-" for "_" (--store.batch-records is store.batch_records),
// so the flag, the TOML path, the errors and the docs name a key the same
// way; --help lists no deprecated spelling.
func TestFlagsNameTheirKeys(t *testing.T) {
	keys := map[string]bool{}
	for _, k := range config.Keys(DefaultConfig()) {
		keys[config.FlagName(k)] = true
	}
	for c := range commands {
		for _, f := range helpFlags(t, c) {
			if f != "config" && !slices.Contains(commandArgs, f) && !keys[f] {
				t.Errorf("faultline %s --%s names no TOML key", c, f)
			}
		}
	}
}

// TestOldFlagSpellings: the spellings flags had before they were named
// after their keys still set the same keys, and say which to use.
func TestOldFlagSpellings(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"dev", "--kafka-port", "70000", "--dir", "x"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "dev.kafka_port: 70000 is not a port") {
		t.Fatalf("err %v", err)
	}
	for _, want := range []string{"flag --kafka-port is deprecated; use --dev.kafka-port", "flag --dir is deprecated; use --dev.dir"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestProcessorSections: the processor sections are top-level, as the
// flags and errors name them; the old [processors.*] tables and a
// password in the file are refused saying what to write instead.
func TestProcessorSections(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ toml, want string }{
		{"role = \"store\"\n[store]\nbatch_records = 0\n", "invalid configuration: store.batch_records: must be at least 1, got 0"},
		{"role = \"store\"\n[store]\nbatch_bytes = 1000\n", "invalid configuration: store.batch_bytes: must be at least 1 MiB (1048576), got 1000"},
		{"[processors.store]\nbatch_records = 5\n", "processors.store: no longer a key: use [store]"},
		{"[clickhouse]\npassword = \"x\"\n", "clickhouse.password: no longer a key: put the password in a file (clickhouse.password_file)"},
		{"[kube]\nqps = -1\n", "kube.qps: must be a finite number above 0, got -1"},
		{"[correlate]\ncache_ttl = \"0s\"\n", "correlate.cache_ttl: must be positive (it covers the store's lag), got 0s"},
		{"[correlate]\nstart_within = \"-1s\"\n", "correlate.start_within: must not be negative (0: from the topic's start), got -1s"},
		{"[remediate]\nslow_cluster = \"-1s\"\n", "remediate.slow_cluster: must not be negative (0: never), got -1s"},
	} {
		err := run(context.Background(), []string{"process", "--config", write(tc.toml)}, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.toml, err, tc.want)
		}
	}
}

// repoRoot is the repository's root directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docs returns the repository's Markdown files (path relative to the root
// → content).
func docs(t testing.TB) map[string]string {
	t.Helper()
	root := repoRoot(t)
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var tomlBlock = regexp.MustCompile("(?s)```toml\n(.*?)```")

// TestDocumentedExamples loads every TOML example of the documentation as
// what it documents: a quarantine or correlation rules file, the agent's
// config (agents/), or the faultline binary's config — the configs as
// --config files (config.Load: no key unknown or spelled in another case,
// durations with units).
func TestDocumentedExamples(t *testing.T) {
	n := 0
	for file, text := range docs(t) {
		for i, m := range tomlBlock.FindAllStringSubmatch(text, -1) {
			n++
			body := m[1]
			path := filepath.Join(t.TempDir(), "example.toml")
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			var err error
			switch {
			case strings.Contains(body, "[[rule-sets]]"):
				_, err = quarantine.LoadRules(path)
			case strings.Contains(body, "[[rules]]") && strings.Contains(body, "query"):
				_, err = correlate.LoadRules(path)
			case strings.HasPrefix(file, "agents"):
				cfg := agent.DefaultConfig()
				err = loadExample(path, &cfg)
			default:
				cfg := DefaultConfig()
				err = loadExample(path, &cfg)
			}
			if err != nil {
				t.Errorf("%s, TOML example %d: %v\n%s", file, i+1, err, body)
			}
		}
	}
	if n < 3 {
		t.Fatalf("found %d TOML examples", n)
	}
}

// loadExample loads the file path into cfg as its --config file.
func loadExample(path string, cfg any) error {
	_, err := config.Load("example", []string{"--config", path}, cfg, func(*flag.FlagSet) {}, func() error { return nil }, io.Discard)
	return err
}

// TestDocumentedKeys: the configuration tables of the documentation name
// each key by its TOML path and its flag by FlagName of that path, and
// every dotted flag the documentation of the faultline binary mentions
// exists.
func TestDocumentedKeys(t *testing.T) {
	keys := map[string]bool{}
	for _, k := range config.Keys(DefaultConfig()) {
		keys[k] = true
	}
	agentKeys := map[string]bool{}
	for _, k := range config.Keys(agent.DefaultConfig()) {
		agentKeys[k] = true
	}
	preflightKeys := map[string]bool{} // both subcommands' configurations
	for _, k := range append(config.Keys(webhook.DefaultConfig()), config.Keys(checks.DefaultConfig())...) {
		preflightKeys[k] = true
	}
	flags := map[string]bool{}
	for c := range commands {
		for _, f := range helpFlags(t, c) {
			flags[f] = true
		}
	}
	tick := regexp.MustCompile("`([^`\n]+)`")
	fence := regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	flagRE := regexp.MustCompile(`(?:^|\s)(--[a-z][a-z0-9.-]*)`)
	row := regexp.MustCompile(`(?m)^\|\s*(` + "`" + `[^|]*)\|\s*(` + "`--" + `[^|]*)\|`)
	sections := regexp.MustCompile(`^-?-?(kafka|gateway|clickhouse|kube|store|correlate|quarantine|drain|remediate|conformance|janitor|dev)\.`)
	for file, text := range docs(t) {
		if strings.HasPrefix(file, "deploy/chart") {
			continue // Helm values (deploy/chart TestValuesDocumented), not config keys
		}
		known := keys
		switch {
		case strings.HasPrefix(file, "agents/preflight"):
			known = preflightKeys
		case strings.HasPrefix(file, "agents"):
			known = agentKeys
		}
		rows := 0
		for _, m := range row.FindAllStringSubmatch(text, -1) {
			var ks, fl []string
			for _, k := range tick.FindAllStringSubmatch(m[1], -1) {
				ks = append(ks, k[1])
			}
			for _, f := range tick.FindAllStringSubmatch(m[2], -1) {
				fl = append(fl, f[1])
			}
			rows++
			if len(ks) != len(fl) {
				t.Errorf("%s: row %q: %d keys, %d flags", file, strings.TrimSpace(m[0]), len(ks), len(fl))
				continue
			}
			for i, k := range ks {
				if !known[k] {
					t.Errorf("%s: %s is not a key", file, k)
				}
				if want := "--" + config.FlagName(k); fl[i] != want {
					t.Errorf("%s: key %s: flag %s, want %s", file, k, fl[i], want)
				}
			}
		}
		if strings.HasPrefix(file, "agents") || strings.HasPrefix(file, "scripts") || strings.HasPrefix(file, "loadtest") {
			continue
		}
		// Flags in the examples (sh blocks) must exist as well.
		for _, m := range fence.FindAllStringSubmatch(text, -1) {
			for _, f := range flagRE.FindAllStringSubmatch(m[1], -1) {
				if sections.MatchString(f[1]) && !flags[strings.TrimPrefix(f[1], "--")] {
					t.Errorf("%s: example flag %s is not a flag of faultline", file, f[1])
				}
			}
		}
		for _, m := range tick.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			for _, tok := range strings.Fields(m[1]) {
				tok, _, _ = strings.Cut(tok, "=")
				if !sections.MatchString(tok) {
					continue
				}
				if strings.HasPrefix(tok, "--") {
					if f := strings.TrimPrefix(tok, "--"); !flags[f] && !strings.HasSuffix(f, ".*") {
						t.Errorf("%s: %s is not a flag of faultline", file, tok)
					}
					continue
				}
				key := regexp.MustCompile(`\[[^]]*\]`).ReplaceAllString(strings.TrimSuffix(tok, ":"), "")
				if regexp.MustCompile(`^[a-z0-9_.]+$`).MatchString(key) && !keys[key] {
					t.Errorf("%s: %s is not a key", file, tok)
				}
			}
		}
		_ = rows
	}
}

// TestLibraryLogLevel: the libraries' loggers (component kafka,
// clickhouse, and klog's client-go) log at library_log_level, faultline's
// own at log_level; faultline dev defaults the libraries to warn.
func TestLibraryLogLevel(t *testing.T) {
	var out bytes.Buffer
	cfg := DefaultConfig()
	cfg.LibraryLogLevel = "warn"
	log, err := newLogger(&out, cfg)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("decision")
	log.With("component", "history").Info("history read")
	log.With("component", "kafka").Info("kafka chatter")
	log.With("component", "kafka").With("broker", "1").Warn("kafka trouble")
	log.With("component", "clickhouse").Debug("driver detail")
	klog.Infof("attempting to acquire leader lease %s...", "faultline/faultline-janitor")
	for range 3 { // at every try of the elector; logged once a minute
		klog.Errorf("error retrieving resource lock %s: %v", "faultline/faultline-janitor", "forbidden")
	}
	got := out.String()
	if n := strings.Count(got, "error retrieving resource lock"); n != 1 {
		t.Errorf("a repeated client-go line logged %d times, want 1:\n%s", n, got)
	}
	for _, want := range []string{"msg=decision", `msg="history read"`, `msg="kafka trouble"`,
		`level=ERROR msg="error retrieving resource lock faultline/faultline-janitor: forbidden" component=client-go`} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %s:\n%s", want, got)
		}
	}
	for _, not := range []string{"kafka chatter", "driver detail", "attempting to acquire"} {
		if strings.Contains(got, not) {
			t.Errorf("log has %q:\n%s", not, got)
		}
	}
	out.Reset()
	cfg.LibraryLogLevel = "debug"
	if log, err = newLogger(&out, cfg); err != nil {
		t.Fatal(err)
	}
	log.With("component", "clickhouse").Debug("driver detail")
	log.Debug("own debug")
	klog.Infof("successfully acquired lease %s", "faultline/faultline-janitor")
	if !strings.Contains(out.String(), "driver detail") || strings.Contains(out.String(), "own debug") ||
		!strings.Contains(out.String(), `msg="successfully acquired lease faultline/faultline-janitor" component=client-go`) {
		t.Errorf("library at debug, own at info:\n%s", out.String())
	}
	out.Reset()
	for i := range 40 {
		klog.Errorf("error %d", i)
	}
	if n, dropped := strings.Count(out.String(), "msg=\"error "), strings.Count(out.String(), "the rest are dropped"); n != 31 || dropped != 1 {
		// 32 messages a minute, one of them the lease line above.
		t.Errorf("40 client-go messages: %d logged and %d lines saying the rest are dropped, want 31 and 1:\n%s", n, dropped, out.String())
	}
	cfg.LibraryLogLevel = "loud"
	if _, err := newLogger(&out, cfg); err == nil || !strings.HasPrefix(err.Error(), "library_log_level:") {
		t.Errorf("bad level: %v", err)
	}
	var help bytes.Buffer
	if err := run(context.Background(), []string{"dev", "--help"}, &help, &help); !errors.Is(err, flag.ErrHelp) ||
		!regexp.MustCompile(`-library-log-level string\n.*\n?.*\(default "warn"\)`).MatchString(help.String()) {
		t.Errorf("dev --help does not show the warn default:\n%s", help.String())
	}
}
