package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

const pw = "hunter2-s3cret"

// TestSecretNeverPrints formats a Secret every way a program might print a
// config or an error: none shows the value.
func TestSecretNeverPrints(t *testing.T) {
	s := NewSecret(pw)
	type exported struct {
		User     string
		Password Secret
	}
	type unexported struct {
		user     string
		password Secret
	}
	cfgE := exported{User: "alice", Password: s}
	cfgU := unexported{user: "alice", password: s}

	var logText, logJSON bytes.Buffer
	slog.New(slog.NewTextHandler(&logText, nil)).Info("connecting", "password", s, "cfg", cfgE)
	slog.New(slog.NewJSONHandler(&logJSON, nil)).Info("connecting", "password", s, "cfg", cfgE)
	js, err := json.Marshal(cfgE)
	if err != nil {
		t.Fatal(err)
	}
	var tm bytes.Buffer
	if err := toml.NewEncoder(&tm).Encode(cfgE); err != nil {
		t.Fatal(err)
	}

	outputs := map[string]string{
		"%s":                 fmt.Sprintf("%s", s),
		"%v":                 fmt.Sprintf("%v", s),
		"%+v":                fmt.Sprintf("%+v", s),
		"%#v":                fmt.Sprintf("%#v", s),
		"%q":                 fmt.Sprintf("%q", s),
		"%x":                 fmt.Sprintf("%x", s),
		"%X":                 fmt.Sprintf("%X", s),
		"%d":                 fmt.Sprintf("%d", s),
		"Sprint":             fmt.Sprint(s),
		"Println":            fmt.Sprintln(s),
		"%+v exported":       fmt.Sprintf("%+v", cfgE),
		"%#v exported":       fmt.Sprintf("%#v", cfgE),
		"%+v unexported":     fmt.Sprintf("%+v", cfgU),
		"%#v unexported":     fmt.Sprintf("%#v", cfgU),
		"%v pointer":         fmt.Sprintf("%v", &cfgU),
		"error %w":           fmt.Errorf("login as %s with %v: %w", "alice", s, errors.New("refused")).Error(),
		"slog text":          logText.String(),
		"slog json":          logJSON.String(),
		"json":               string(js),
		"toml":               tm.String(),
		"String()":           s.String(),
		"GoString()":         s.GoString(),
		"MarshalText":        string(must(s.MarshalText())),
		"LogValue":           s.LogValue().String(),
		"slice of secrets":   fmt.Sprintf("%v", []Secret{s, s}),
		"map value":          fmt.Sprintf("%v", map[string]Secret{"k": s}),
		"pointer to secret":  fmt.Sprintf("%v", &s),
		"%+v of pointer cfg": fmt.Sprintf("%+v", &cfgE),
	}
	for name, out := range outputs {
		if strings.Contains(out, pw) || strings.Contains(out, fmt.Sprintf("%x", pw)) || strings.Contains(strings.ToLower(out), fmt.Sprintf("%x", pw)) {
			t.Errorf("%s prints the secret: %s", name, out)
		}
	}
	// The redacted marker is what the direct forms print.
	for _, name := range []string{"%s", "%v", "String()", "MarshalText", "LogValue", "slog text", "json", "toml"} {
		if !strings.Contains(outputs[name], Redacted) {
			t.Errorf("%s = %q, want it to contain %q", name, outputs[name], Redacted)
		}
	}
	if s.Reveal() != pw {
		t.Errorf("Reveal = %q", s.Reveal())
	}
	if (Secret{}).String() != "" || !(Secret{}).IsZero() || NewSecret("").Reveal() != "" || s.IsZero() {
		t.Error("empty secret handling")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAULTLINE_TEST_SECRET", " "+pw+" ")
	t.Setenv("FAULTLINE_TEST_EMPTY", "")
	tests := []struct {
		name, path, env string
		want            string // value, or "" when an error is expected
		wantErr         string
	}{
		{"file, newline trimmed", file, "", pw, ""},
		{"env, spaces trimmed", "", "FAULTLINE_TEST_SECRET", pw, ""},
		{"both named", file, "FAULTLINE_TEST_SECRET", "", "set only one"},
		{"neither", "", "", "", "no secret configured"},
		{"missing file", filepath.Join(dir, "absent"), "", "", "no such file"},
		{"empty file", empty, "", "", "is empty"},
		{"unset variable", "", "FAULTLINE_TEST_UNSET_XYZ", "", "FAULTLINE_TEST_UNSET_XYZ is not set"},
		{"empty variable", "", "FAULTLINE_TEST_EMPTY", "", "FAULTLINE_TEST_EMPTY is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ReadSecret(tt.path, tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), pw) {
					t.Fatalf("error shows the secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Reveal() != tt.want {
				t.Fatalf("got %q, want %q", s.Reveal(), tt.want)
			}
		})
	}
	if _, err := ReadSecret("", ""); !errors.Is(err, ErrNoSecret) {
		t.Errorf("neither named: %v, want ErrNoSecret", err)
	}
}

func ExampleSecret() {
	s := NewSecret("hunter2")
	fmt.Printf("%s %v %q\n", s, s, s)
	slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})).Info("kafka login", "user", "alice", "password", s)
	fmt.Println(len(s.Reveal()))
	// Output:
	// [redacted] [redacted] "[redacted]"
	// level=INFO msg="kafka login" user=alice password=[redacted]
	// 7
}
