package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// ChdbVersion is the chdb-core release (PyPI; ClickHouse 26.9 in-process)
// install.sh puts in a venv under the cache; keep them in step.
const ChdbVersion = "26.9.0"

// SQLStep is one step of a script run by RunChdb (and by a test on a
// ClickHouse server the same way): a statement, or a query whose answer is
// kept.
type SQLStep struct {
	// Name identifies the step in errors and results.
	Name string `json:"name"`
	// SQL is one statement, without a FORMAT clause.
	SQL string `json:"sql"`
	// Query marks a step whose answer (TSVWithNamesAndTypes text) is kept;
	// a failing query is recorded and the script goes on. A failing
	// statement stops it.
	Query bool `json:"query,omitempty"`
}

// SQLAnswer is a query step's answer: its TSVWithNamesAndTypes text, or the
// engine's error.
type SQLAnswer struct {
	Out   string `json:"out,omitempty"`
	Error string `json:"error,omitempty"`
}

// ChdbRun is what RunChdb returns.
type ChdbRun struct {
	// Version is the engine's version() answer, e.g. 26.9.2.1.
	Version string `json:"version"`
	// Results holds every query step's answer by name.
	Results map[string]SQLAnswer `json:"results"`
	// FailedStatement is the statement that stopped the script, if any.
	FailedStatement *struct {
		Name  string `json:"name"`
		Error string `json:"error"`
	} `json:"failed_statement"`
}

// chdbPython returns $FAULTLINE_CHDB_PYTHON, else the cache's venv python.
func chdbPython() (string, bool) {
	if p := os.Getenv("FAULTLINE_CHDB_PYTHON"); p != "" {
		return p, isExecutable(p)
	}
	p := filepath.Join(CacheDir(), "chdb", ChdbVersion, "venv", "bin", "python")
	return p, isExecutable(p)
}

// repoFile finds path (relative to the repository root) by walking up from
// the working directory to the directory holding go.mod.
func repoFile(tb testing.TB, path string) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, path)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("testenv: no go.mod above the working directory; cannot find %s", path)
		}
		dir = parent
	}
}

// RunChdb runs steps, in order, in a fresh chdb-core session (a current
// ClickHouse engine in-process; it cannot listen on a port, so it checks
// SQL and answers, not clients) with the session time zone UTC, through
// scripts/testenv/chdb_run.py and the venv `install.sh chdb` made. A
// missing venv skips the test (fails in CI), like a missing server.
//
// Measured here: ~0.8 s for a trivial script (the engine loads in-process).
func RunChdb(tb testing.TB, steps []SQLStep) *ChdbRun {
	tb.Helper()
	if testing.Short() {
		tb.Skip("testenv: -short: not running chdb")
	}
	py, ok := chdbPython()
	if !ok {
		missing(tb, "chdb", "no chdb-core venv python at "+py)
	}
	script := repoFile(tb, filepath.Join("scripts", "testenv", "chdb_run.py"))
	dir := tb.TempDir()
	job, err := json.Marshal(map[string]any{"dir": filepath.Join(dir, "session"), "steps": steps})
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	jobPath, outPath := filepath.Join(dir, "job.json"), filepath.Join(dir, "out.json")
	writeFile(tb, jobPath, job, 0o644)
	cmd := exec.Command(py, script, jobPath, outPath)
	cmd.Env = append(os.Environ(), "TZ=UTC")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	began := time.Now()
	if err := cmd.Run(); err != nil {
		tb.Fatalf("testenv: chdb_run.py: %v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		tb.Fatalf("testenv: chdb_run.py wrote no answers: %v\n%s", err, stderr.String())
	}
	var run ChdbRun
	if err := json.Unmarshal(b, &run); err != nil {
		tb.Fatalf("testenv: chdb_run.py answers: %v", err)
	}
	tb.Logf("testenv: chdb %s ran %d steps in %s", run.Version, len(steps), time.Since(began).Round(time.Millisecond))
	if run.FailedStatement != nil {
		tb.Fatalf("testenv: chdb %s: statement %s failed: %s", run.Version, run.FailedStatement.Name, run.FailedStatement.Error)
	}
	return &run
}

// RunSQLSteps runs steps on the server through its HTTP interface, in
// database db, the way RunChdb runs them on chdb: a failing statement fails
// the test, a query's answer (TSVWithNamesAndTypes) or error is recorded.
func (c *ClickHouse) RunSQLSteps(tb testing.TB, db string, steps []SQLStep) map[string]SQLAnswer {
	tb.Helper()
	out := map[string]SQLAnswer{}
	for _, s := range steps {
		if !s.Query {
			if _, err := c.HTTPQuery(db, s.SQL); err != nil {
				tb.Fatalf("testenv: clickhouse: statement %s: %v", s.Name, err)
			}
			continue
		}
		res, err := c.HTTPQuery(db, s.SQL+"\nFORMAT TSVWithNamesAndTypes")
		if err != nil {
			out[s.Name] = SQLAnswer{Error: err.Error()}
			continue
		}
		out[s.Name] = SQLAnswer{Out: res}
	}
	return out
}

// httpClient is for ClickHouse's HTTP interface.
var httpClient = &http.Client{Timeout: 2 * time.Minute}

// HTTPQuery sends one statement to the server's HTTP interface in database
// db ("" for default) and returns the response body, or an error holding
// the server's message.
func (c *ClickHouse) HTTPQuery(db, sql string) (string, error) {
	url := "http://" + c.httpAddr + "/"
	if db != "" {
		url += "?database=" + db
	}
	resp, err := httpClient.Post(url, "text/plain", bytes.NewBufferString(sql))
	if err != nil {
		return "", fmt.Errorf("clickhouse http: %w", err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return "", fmt.Errorf("clickhouse http: %w", err)
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("clickhouse http %d: %s", resp.StatusCode, bytes.TrimSpace(body.Bytes()))
	}
	return body.String(), nil
}
