package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/testenv"
)

// ArtifactsEnv names the directory TestFleetPageInBrowser writes its
// screenshots to (default: the test's temporary directory).
const ArtifactsEnv = "FAULTLINE_UI_ARTIFACTS"

// chromiumPath finds the headless browser installed by
// scripts/testenv/install.sh chromium.
func chromiumPath() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no chromium on PATH: run scripts/testenv/install.sh chromium")
}

// TestFleetPageInBrowser runs `faultline dev` (embedded Kafka, its real
// local ClickHouse, every processor; dry-run), seeds a fleet through the
// REST API as agents would (20 nodes reporting, three fatal XIDs), and
// drives the fleet page in headless Chromium as a person would: types the
// operator token, sees the quarantined node posted here with its reason,
// follows its link to the node's timeline (the event, the dry-run
// decision, the fault and how to release it), opens the faults view.
// Screenshots of each view are written to $FAULTLINE_UI_ARTIFACTS (or the
// test's temporary directory).
func TestFleetPageInBrowser(t *testing.T) {
	_, _, chErr := chserver.FindBinary()
	testenv.Server(t, "faultline dev (its local ClickHouse server)", chErr)
	browser, err := chromiumPath()
	testenv.Server(t, "headless chromium", err)

	artifacts := os.Getenv(ArtifactsEnv)
	if artifacts == "" {
		artifacts = t.TempDir()
	}
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		t.Fatal(err)
	}
	base, dir := startDev(t)
	operator := readFile(t, filepath.Join(dir, "operator-token"))
	agent := readFile(t, filepath.Join(dir, "dev-token"))

	// The fleet: 20 nodes reporting healthy, three fatal XIDs.
	var evs []string
	for i := range 20 {
		evs = append(evs, fmt.Sprintf(`{"agent":"faultline-agent","componentClass":"GPU","checkName":"GpuHealthCheck","isHealthy":true,
		  "message":"ok","entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-%02d"}],"nodeName":"gpu-node-%02d"}`, i, i))
	}
	for _, n := range []string{"03", "11"} {
		evs = append(evs, fmt.Sprintf(`{"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError","isFatal":true,
		  "message":"Xid 48: double bit ECC error","recommendedAction":"RESTART_VM","errorCode":["XID-48"],
		  "entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-%s"}],"nodeName":"gpu-node-%s"}`, n, n))
	}
	post(t, base, agent, `{"events":[`+strings.Join(evs, ",")+`]}`)
	// The node this test follows.
	const node, msg = "gpu-node-07", "Xid 79: GPU has fallen off the bus"
	post(t, base, agent, `{"events":[{"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError","isFatal":true,
	  "message":"`+msg+`","recommendedAction":"REPLACE_VM","errorCode":["XID-79"],
	  "entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-07"}],"nodeName":"`+node+`"}]}`)
	waitFor(t, 2*time.Minute, func() bool {
		code, b := get(base, operator, "/v1/fleet/nodes?state=quarantined")
		return code == http.StatusOK && strings.Contains(b, `"node":"`+node+`"`) && strings.Count(b, `"node":`) == 3
	})

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelT()

	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			buf, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			path := filepath.Join(artifacts, name)
			t.Logf("screenshot %s", path)
			return os.WriteFile(path, buf, 0o644)
		})
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	row := `#nodes tr[data-node="` + node + `"]`
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(css(`#token`)),
		shot("0-sign-in.png"),
		chromedp.SendKeys(css(`#token`), operator),
		chromedp.Click(css(`#login-form button`)),
		chromedp.WaitVisible(css(row)),
		shot("1-fleet.png"),
	); err != nil {
		failShot(t, ctx, artifacts, "fail-fleet.png")
		t.Fatalf("fleet view: %v", err)
	}
	fleetText, rowText := text(`#view`), text(row)
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("faultline.token")`))
	if err != nil {
		t.Fatal(err)
	}
	if stored != operator {
		t.Errorf("the token is not kept in sessionStorage")
	}
	for _, want := range []string{"Cluster dev", "dry-run", "quarantined", "Circuit breaker"} {
		if !strings.Contains(fleetText, want) {
			t.Errorf("fleet view does not show %q:\n%s", want, fleetText)
		}
	}
	// The node's row: its state and the quarantine's reason.
	for _, want := range []string{node, "quarantined", "would quarantine", "SysLogsXIDError"} {
		if !strings.Contains(rowText, want) {
			t.Errorf("the row of %s does not show %q: %q", node, want, rowText)
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(css(row+` a.node-link`)),
		chromedp.WaitVisible(css(`#timeline`)),
		shot("2-node.png"),
	); err != nil {
		t.Fatalf("node view: %v", err)
	}
	title, nodeText := text(`#node-title`), text(`#view`)
	if !strings.Contains(title, node) || !strings.Contains(title, "quarantined") {
		t.Errorf("node title: %q", title)
	}
	for _, want := range []string{msg, "quarantine quarantine → dry_run", "GPU=GPU-07", "How to release it", "Dry-run", "Timeline"} {
		if !strings.Contains(nodeText, want) {
			t.Errorf("node view does not show %q:\n%s", want, nodeText)
		}
	}
	// The decision's cause id links to the event's row.
	if err := chromedp.Do(ctx,
		chromedp.Click(css(`#timeline tr[id^="act-"] a.cause`)),
		chromedp.WaitVisible(css(`#timeline tr.target`)),
		shot("3-cause.png"),
	); err != nil {
		t.Fatalf("cause link: %v", err)
	}
	target, err := chromedp.Run(ctx, chromedp.AttributeValue(css(`#timeline tr.target`), "id"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(target.Value, "ev-") {
		t.Errorf("the cause link marked %q, not an event", target.Value)
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(css(`#nav-faults`)),
		chromedp.WaitVisible(css(`#result`)),
		shot("4-faults.png"),
	); err != nil {
		t.Fatalf("faults view: %v", err)
	}
	if faultsText := text(`#view`); !strings.Contains(faultsText, "dry_run") {
		t.Errorf("remediation outcomes do not show the dry-run decisions:\n%s", faultsText)
	}
}

// failShot saves what the browser shows when a step failed.
func failShot(t *testing.T, ctx context.Context, dir, name string) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		_ = os.WriteFile(filepath.Join(dir, name), buf, 0o644)
		t.Logf("screenshot %s", filepath.Join(dir, name))
	}
}

// startDev runs `faultline dev` on free ports until the test ends and
// returns its REST base URL and state directory, once /readyz answers.
func startDev(t *testing.T) (base, dir string) {
	t.Helper()
	dir = t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--dev.dir", dir, "--dev.kafka-port", "0", "--dev.clickhouse-port", "0",
			"--gateway.http-addr", "127.0.0.1:0", "--gateway.grpc-addr", "127.0.0.1:0", "--dev.fleet-nodes", "0", "--log-level", "warn"}, pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev exited: %v", err)
		}
	})
	rest := make(chan string, 1)
	restRE := regexp.MustCompile(`REST\s+(http://\S+)`)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := restRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case rest <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case base = <-rest:
	case <-time.After(2 * time.Minute):
		t.Fatal("dev did not print its REST address")
	}
	waitFor(t, 2*time.Minute, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base, dir
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func post(t *testing.T, base, token, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/events: %d %s", resp.StatusCode, b)
	}
}

func get(base, token, path string) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
