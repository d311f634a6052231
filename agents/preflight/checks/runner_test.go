package checks_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The tests of this package share one broker (testenv.SharedSecureKafka).
func TestMain(m *testing.M) { testenv.Main(m) }

// standin writes a shell script that prints the file named by
// $STANDIN_<TOOL>_OUT (per subcommand for dcgmi), records its arguments
// (and NCCL_TOPO_FILE) in $STANDIN_ARGS, sleeps $STANDIN_SLEEP seconds and
// exits $STANDIN_<TOOL>_EXIT ($STANDIN_DISCOVERY_EXIT for dcgmi
// discovery).
const standinScript = `#!/bin/sh
tool=%s
echo "$tool $* NCCL_TOPO_FILE=${NCCL_TOPO_FILE}" >> "$STANDIN_ARGS"
case "$tool $1" in
  "dcgmi discovery") cat "$STANDIN_DISCOVERY_OUT"; exit ${STANDIN_DISCOVERY_EXIT:-0} ;;
esac
eval out=\$STANDIN_$(echo $tool | tr 'a-z-' 'A-Z_')_OUT
eval code=\$STANDIN_$(echo $tool | tr 'a-z-' 'A-Z_')_EXIT
if [ -n "$STANDIN_SLEEP" ]; then sleep "$STANDIN_SLEEP"; fi
[ -n "$out" ] && cat $out
exit ${code:-0}
`

// harness is a real gateway (TLS, producing to the shared real Kafka) and
// stand-in tools.
type harness struct {
	t      *testing.T
	k      *testenv.Kafka
	gw     *gatewaytest.Server
	ca     string
	token  string
	bin    string
	spool  string
	dir    string
	cursor map[string]bool
	mu     sync.Mutex
	cl     *kgo.Client
	seen   []*datamodels.HealthEvent
	// node, when set, is the node name of every run (else a new one per
	// run).
	node string
	// kube, when set, is every run's Kubernetes API (Options.Kube).
	kube kubernetes.Interface
	// environ is added to every run's tool environment.
	environ []string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	k := testenv.SharedSecureKafka(t)
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "preflight-test-ca")
	cert := ca.Issue(t, "faultline-gateway", "127.0.0.1")
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) { c.TLSCert, c.TLSKey = cert.CertFile, cert.KeyFile }, gateway.Options{})
	h := &harness{t: t, k: k, gw: gw, ca: ca.File, dir: dir, bin: filepath.Join(dir, "bin"), spool: filepath.Join(dir, "spool")}
	h.token = filepath.Join(dir, "token")
	must(t, os.WriteFile(h.token, []byte(gw.Token("alpha")+"\n"), 0o600))
	must(t, os.MkdirAll(h.bin, 0o755))
	for _, tool := range []string{"nvidia-smi", "dcgmi", "all_reduce_perf", "torchrun"} {
		must(t, os.WriteFile(filepath.Join(h.bin, tool), fmt.Appendf(nil, standinScript, tool), 0o755))
	}
	// The consumer starts at the topic's end offsets as they are now,
	// listed before any run produces (AtEnd would resolve them at its
	// first fetch, which a run's events may precede).
	ends, err := k.Admin(t).ListEndOffsets(context.Background(), events.TopicEvents)
	must(t, errors.Join(err, ends.Error()))
	from := map[string]map[int32]kgo.Offset{events.TopicEvents: {}}
	ends.Each(func(o kadm.ListedOffset) { from[o.Topic][o.Partition] = kgo.NewOffset().At(o.Offset) })
	h.cl = k.Client(t, kgo.ConsumePartitions(from))
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// run is one check run.
type run struct {
	code   int
	stdout string
	stderr string
	args   string // what the stand-ins recorded
	node   string
}

// run executes `faultline-preflight check name` in-process with the
// stand-ins; env are STANDIN_* settings.
func (h *harness) run(name string, env map[string]string, flags ...string) run {
	h.t.Helper()
	node := h.node
	if node == "" {
		node = fmt.Sprintf("gpu-node-%d", time.Now().UnixNano())
	}
	argsFile := filepath.Join(h.t.TempDir(), "args")
	environ := append([]string{"PATH=/usr/bin:/bin", "STANDIN_ARGS=" + argsFile}, h.environ...)
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	getenv := map[string]string{"NODE_NAME": node, "POD_NAME": "trainer-0", "POD_NAMESPACE": "training", "POD_UID": "uid-1"}
	base := []string{
		"--gateway.addr=" + h.gw.GRPCAddr(), "--gateway.token-file=" + h.token, "--gateway.ca-file=" + h.ca,
		"--gateway.max-backoff=200ms", "--spool.dir=" + h.spool, "--spool.drain-timeout=30s",
		"--dcgm.dcgmi=" + filepath.Join(h.bin, "dcgmi"), "--dcgm.nvidia-smi=" + filepath.Join(h.bin, "nvidia-smi"),
		"--nccl.all-reduce-perf=" + filepath.Join(h.bin, "all_reduce_perf"), "--nccl.torchrun=" + filepath.Join(h.bin, "torchrun"),
		"--dcgm.hostengine-addr=dcgm-hostengine.test:5555", "--kube.events=false",
		"--gang.marker-dir=" + h.t.TempDir(), // the pod-local emptyDir; a test names its own to share it between runs
	}
	var out, errb bytes.Buffer
	code := checks.Main(context.Background(), name, append(base, flags...), checks.Options{
		Stdout: &out, Stderr: &errb, Environ: environ, Getenv: func(k string) string { return getenv[k] }, Kube: h.kube})
	a, _ := os.ReadFile(argsFile)
	return run{code: code, stdout: out.String(), stderr: errb.String(), args: string(a), node: node}
}

// events waits for n events of node in Kafka and returns them.
func (h *harness) events(node string, n int) []*datamodels.HealthEvent {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got []*datamodels.HealthEvent
		for _, ev := range h.seen {
			if ev.GetNodeName() == node {
				got = append(got, ev)
			}
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d of %d events of %s reached Kafka", len(got), n, node)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		fs := h.cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			ev, err := events.Unmarshal(r.Value)
			if err == nil {
				h.seen = append(h.seen, ev)
			}
		})
	}
}

func td(parts ...string) string {
	p, err := filepath.Abs(filepath.Join(parts...))
	if err != nil {
		panic(err)
	}
	return p
}

var (
	dcgmData = func(f string) string { return td("..", "dcgm", "testdata", f) }
	ncclData = func(f string) string { return td("..", "nccl", "testdata", f) }
	ownData  = func(f string) string { return td("testdata", f) }
)

// standingFaults applies events in order as the quarantine role does: an
// unhealthy event the shipped rule sets match sets a fault (its check and
// entities), a healthy one lifts the fault of its check and entities. It
// returns the faults left standing.
func standingFaults(t *testing.T, evs []*datamodels.HealthEvent) []string {
	t.Helper()
	rs, err := quarantine.LoadRules("")
	must(t, err)
	pol, err := quarantine.Compile(rs)
	must(t, err)
	faults := map[string]bool{}
	for _, ev := range evs {
		key := quarantine.FaultKey(ev.GetCheckName(), events.EntityKey(ev))
		if ev.GetIsHealthy() {
			delete(faults, key)
			continue
		}
		d, errs := pol.Evaluate(ev, nil)
		must(t, errors.Join(errs...))
		if d != nil {
			faults[key] = true
		}
	}
	return slices.Sorted(maps.Keys(faults))
}

func byEntity(evs []*datamodels.HealthEvent) map[string]*datamodels.HealthEvent {
	m := map[string]*datamodels.HealthEvent{}
	for _, ev := range evs {
		m[events.EntityKey(ev)] = ev
	}
	return m
}

// TestDCGMDiag runs dcgm-diag against stand-in tools printing published
// dcgmi outputs and asserts the exit code and what the real gateway put
// in Kafka.
func TestDCGMDiag(t *testing.T) {
	h := newHarness(t)

	t.Run("4.4.2 pass, GPU named by UUID through discovery", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuid-t4.txt"),
			"STANDIN_DISCOVERY_OUT":  dcgmData("discovery-1gpu.txt"),
			"STANDIN_DCGMI_OUT":      dcgmData("table-4.4.2-pass.txt")}, "--dcgm.diag-level=2")
		if r.code != checks.ExitPass {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		if !strings.Contains(r.args, "dcgmi diag -r 2 --host dcgm-hostengine.test:5555 -i GPU-934a71d6-e50c-86a3-f752-3743a8c1bbb2") {
			t.Errorf("dcgmi called as %q", r.args)
		}
		evs := h.events(r.node, 1)
		ev := evs[0]
		if !ev.GetIsHealthy() || ev.GetAgent() != "preflight-dcgm-diag" || ev.GetCheckName() != "dcgm-diag" ||
			events.EntityKey(ev) != "GPU=GPU-934a71d6-e50c-86a3-f752-3743a8c1bbb2" || ev.GetMetadata()["preflight.faultline.io/pod"] != "training/trainer-0" {
			t.Errorf("event %v", ev)
		}
	})

	// dcgmi discovery listed none of the pod's GPUs: DCGM's ids are not
	// theirs to name, so the failures are the node's.
	t.Run("3.3.8 Fail - All on 8 GPUs without their UUIDs: fatal on the node, CONTACT_SUPPORT", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
			"STANDIN_DISCOVERY_OUT":  "/dev/null",
			"STANDIN_DCGMI_OUT":      dcgmData("table-3.3.8-cuda-init-fail.txt"), "STANDIN_DCGMI_EXIT": "226"}, "--dcgm.diag-level=3", "--timeout=15m")
		if r.code != checks.ExitFail {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		evs := h.events(r.node, 8)
		for g := 0; g < 8; g++ {
			var ev *datamodels.HealthEvent
			for _, e := range evs {
				if strings.Contains(e.GetMessage(), fmt.Sprintf("GPU %d (DCGM's id", g)) {
					ev = e
				}
			}
			if ev == nil || !ev.GetIsFatal() || ev.GetRecommendedAction() != datamodels.RecommendedAction_CONTACT_SUPPORT || events.EntityKey(ev) != "NODE="+r.node ||
				!slices.Contains(ev.GetErrorCode(), "DCGM_DIAG_GPU_MEMORY_FAIL") || !strings.Contains(ev.GetMessage(), "cuInit") {
				t.Errorf("GPU %d: %v", g, ev)
			}
		}
	})

	t.Run("3.3.1 Fail - GPU: 0, Pass - GPU: 1: only GPU 0 fails", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
			"STANDIN_DISCOVERY_OUT":  "/dev/null",
			"STANDIN_DCGMI_OUT":      dcgmData("table-3.3.1-cuda-busy-fail-gpu0.txt"), "STANDIN_DCGMI_EXIT": "226"})
		if r.code != checks.ExitFail {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		bad := h.events(r.node, 1)[0]
		if !bad.GetIsFatal() || bad.GetIsHealthy() || !slices.Contains(bad.GetErrorCode(), "DCGM_DIAG_GPU_MEMORY_FAIL") ||
			!strings.Contains(bad.GetMessage(), "GPU 0 (DCGM's id") || events.EntityKey(bad) != "NODE="+r.node ||
			!strings.Contains(bad.GetMessage(), "CUDA-capable device(s) is/are busy or unavailable") {
			t.Errorf("GPU 0: %v", bad)
		}
	})

	// dcgmi discovery failed in one run (results under DCGM's GPU ids), and
	// answered in the next, which passed: every fault of the first is
	// lifted. Before, the failure was set on GPU=0 and the pass healthy on
	// GPU=<uuid>: the node stayed cordoned for ever.
	t.Run("discovery failing, a GPU failing, then a pass: every fault lifted", func(t *testing.T) {
		h.node = fmt.Sprintf("gpu-node-%d", time.Now().UnixNano())
		defer func() { h.node = "" }()
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuid-t4.txt"),
			"STANDIN_DISCOVERY_OUT":  "/dev/null", "STANDIN_DISCOVERY_EXIT": "1",
			"STANDIN_DCGMI_OUT": dcgmData("table-3.3.1-cuda-busy-fail-gpu0.txt"), "STANDIN_DCGMI_EXIT": "226"})
		if r.code != checks.ExitFail {
			t.Fatalf("failing run: exit %d\n%s", r.code, r.stderr)
		}
		failed := h.events(r.node, 1)
		if got := standingFaults(t, failed); len(got) == 0 {
			t.Fatalf("the failing run set no fault: %v", failed)
		}
		r = h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuid-t4.txt"),
			"STANDIN_DISCOVERY_OUT":  dcgmData("discovery-1gpu.txt"),
			"STANDIN_DCGMI_OUT":      dcgmData("table-4.4.2-pass.txt")})
		if r.code != checks.ExitPass {
			t.Fatalf("passing run: exit %d\n%s", r.code, r.stderr)
		}
		all := h.events(r.node, len(failed)+2)
		if got := standingFaults(t, all); len(got) > 0 {
			t.Errorf("faults %q still stand after the pass; events %v", got, all)
		}
	})

	t.Run("4.2.3 pcie internal error: not a hardware fault", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
			"STANDIN_DISCOVERY_OUT":  "/dev/null",
			"STANDIN_DCGMI_OUT":      dcgmData("table-4.2.3-internal-error.txt")})
		if r.code != checks.ExitFail {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		evs := h.events(r.node, 1)
		var internal *datamodels.HealthEvent
		for _, ev := range evs {
			if ev.GetIsFatal() {
				t.Errorf("fatal event for the diagnostic's own error: %v", ev)
			}
			if slices.Contains(ev.GetErrorCode(), checks.CodeDCGMInternal) {
				internal = ev
			}
		}
		if internal == nil || internal.GetIsHealthy() || internal.GetRecommendedAction() != datamodels.RecommendedAction_NONE ||
			!strings.Contains(internal.GetMessage(), "couldn't be parsed") && !strings.Contains(internal.GetMessage(), "child process") {
			t.Errorf("internal-error event %v", internal)
		}
	})

	t.Run("3.x JSON when asked for -j", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuid-t4.txt"),
			"STANDIN_DISCOVERY_OUT":  dcgmData("discovery-1gpu.txt"),
			"STANDIN_DCGMI_OUT":      dcgmData("json-3.x-r3-pass-skip.json")}, "--dcgm.format=json", "--dcgm.diag-level=3", "--timeout=15m")
		if r.code != checks.ExitPass || !strings.Contains(r.args, " -j") {
			t.Fatalf("exit %d args %q\n%s", r.code, r.args, r.stderr)
		}
		if ev := h.events(r.node, 1)[0]; !ev.GetIsHealthy() {
			t.Errorf("event %v", ev)
		}
	})

	t.Run("the diagnostic did not run: non-fatal", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
			"STANDIN_DISCOVERY_OUT":  "/dev/null",
			"STANDIN_DCGMI_OUT":      ownData("nvvs-runtime-error.json"), "STANDIN_DCGMI_EXIT": "226"}, "--dcgm.format=json")
		if r.code != checks.ExitFail {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		ev := h.events(r.node, 1)[0]
		if ev.GetIsFatal() || !slices.Contains(ev.GetErrorCode(), checks.CodeDCGMError) || !strings.Contains(ev.GetMessage(), "Host engine connection invalid") {
			t.Errorf("event %v", ev)
		}
	})

	// dcgmi killed (or crashed) mid-output: the table cut after its
	// metadata, or after passing deployment rows with a failing exit,
	// passed — no GPU test had run.
	t.Run("output cut short: not a pass", func(t *testing.T) {
		full, err := os.ReadFile(dcgmData("table-4.4.2-pass.txt"))
		must(t, err)
		text := string(full)
		for _, tc := range []struct{ name, upTo, exit string }{
			{"metadata only, exit 0", "|-----  Deployment", "0"},
			{"deployment passed, killed", "+-----  Hardware", "137"},
		} {
			cut := filepath.Join(t.TempDir(), "cut.txt")
			must(t, os.WriteFile(cut, []byte(text[:strings.Index(text, tc.upTo)]), 0o644))
			r := h.run(checks.DCGMDiag, map[string]string{
				"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuid-t4.txt"),
				"STANDIN_DISCOVERY_OUT":  dcgmData("discovery-1gpu.txt"),
				"STANDIN_DCGMI_OUT":      cut, "STANDIN_DCGMI_EXIT": tc.exit})
			if r.code != checks.ExitFail {
				t.Fatalf("%s: exit %d, want %d (fail)\n%s", tc.name, r.code, checks.ExitFail, r.stderr)
			}
			if ev := h.events(r.node, 1)[0]; ev.GetIsFatal() || ev.GetIsHealthy() || !slices.Contains(ev.GetErrorCode(), checks.CodeDCGMUnreadable) {
				t.Errorf("%s: event %v", tc.name, ev)
			}
		}
	})

	// A GPU failing eleven tests, each with the same two DCGM errors, made
	// an event of 33 codes: refused by the gateway, dropped by the sender —
	// the GPU that most needed it never quarantined.
	t.Run("eleven failed tests on a GPU: its fatal event arrives", func(t *testing.T) {
		var tests []string
		for _, n := range []string{"software", "memory", "pcie", "nvlink", "targeted_stress", "targeted_power",
			"memory_bandwidth", "diagnostic", "pulse_test", "memtest", "eud"} {
			tests = append(tests, `{"name":"`+n+`","results":[{"entity_group":"GPU","entity_group_id":1,"entity_id":0,"status":"Fail","warnings":[`+
				`{"error_category":10,"error_id":43,"error_severity":2,"warning":"Detected XID 79 for GPU 0"},`+
				`{"error_category":10,"error_id":95,"error_severity":2,"warning":"Uncontained ECC error on GPU 0"}]}],"test_summary":{"status":"Fail"}}`)
		}
		doc := filepath.Join(t.TempDir(), "diag.json")
		must(t, os.WriteFile(doc, []byte(`{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[`+
			strings.Join(tests, ",")+`]}]},"metadata":{"version":"4.4.2"}}`), 0o644))
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuid-t4.txt"),
			"STANDIN_DISCOVERY_OUT":  dcgmData("discovery-1gpu.txt"),
			"STANDIN_DCGMI_OUT":      doc, "STANDIN_DCGMI_EXIT": "226"}, "--dcgm.format=json")
		if r.code != checks.ExitFail {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		ev := h.events(r.node, 1)[0]
		if !ev.GetIsFatal() || len(ev.GetErrorCode()) != 13 || !slices.Contains(ev.GetErrorCode(), "DCGM_FR_95") {
			t.Errorf("fatal event for GPU 0: %v; want 13 codes (11 tests, 2 errors)", ev)
		}
	})

	t.Run("STORE_ONLY: recorded, pod not blocked", func(t *testing.T) {
		r := h.run(checks.DCGMDiag, map[string]string{
			"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
			"STANDIN_DISCOVERY_OUT":  "/dev/null",
			"STANDIN_DCGMI_OUT":      dcgmData("table-3.3.8-cuda-init-fail.txt")}, "--processing-strategy=STORE_ONLY")
		if r.code != checks.ExitPass {
			t.Fatalf("exit %d", r.code)
		}
		for _, ev := range h.events(r.node, 8) {
			if ev.GetProcessingStrategy() != datamodels.ProcessingStrategy_STORE_ONLY {
				t.Errorf("strategy %v", ev.GetProcessingStrategy())
			}
		}
	})
}

// TestNCCLLoopback drives all_reduce_perf stand-ins printing published
// nccl-tests outputs.
func TestNCCLLoopback(t *testing.T) {
	h := newHarness(t)
	gpus := map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt")}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range gpus {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		flags  []string
		exit   int
		fatal  bool
		code   string
		action datamodels.RecommendedAction
	}{
		{"pass at 476.53 GB/s", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("h100-single-node.log")), nil, 0, false, "", datamodels.RecommendedAction_NONE},
		{"below threshold", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("h100-single-node.log")), []string{"--nccl.loopback-threshold-gbps=500"}, 1, true, "NCCL_BW_DEGRADED", datamodels.RecommendedAction_CONTACT_SUPPORT},
		{"wrong data whatever the bandwidth", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("derived-corruption.log")), nil, 1, true, "NCCL_DATA_CORRUPTION", datamodels.RecommendedAction_CONTACT_SUPPORT},
		{"unhandled system error", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("system-error.log"), "STANDIN_ALL_REDUCE_PERF_EXIT", "2"), nil, 1, true, "NCCL_SYSTEM_ERROR", datamodels.RecommendedAction_CONTACT_SUPPORT},
		{"unhandled cuda error", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("rtx5090-cuda-failure.log"), "STANDIN_ALL_REDUCE_PERF_EXIT", "2"), nil, 1, true, "NCCL_UNHANDLED_CUDA_ERROR", datamodels.RecommendedAction_RUN_DCGMEUD},
		{"mpirun prefix, error column", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("mpirun-error-column.log")), []string{"--nccl.loopback-threshold-gbps=30"}, 0, false, "", datamodels.RecommendedAction_NONE},
		{"slurm labels, N/A", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("slurm-label-two-nodes.log")), nil, 0, false, "", datamodels.RecommendedAction_NONE},
		// A one-GPU pod: nccl-tests prints a bus bandwidth of 0 for one
		// rank (nothing crosses a bus); the node is healthy.
		{"one GPU: no bus bandwidth to judge", with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("rtx5090-wide-values.log"), "STANDIN_NVIDIA_SMI_OUT", ownData("nvidia-smi-uuid-t4.txt")), nil, 0, false, "", datamodels.RecommendedAction_NONE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.run(checks.NCCLLoopback, tc.env, tc.flags...)
			if r.code != tc.exit {
				t.Fatalf("exit %d, want %d\n%s", r.code, tc.exit, r.stderr)
			}
			gpus := "2"
			if tc.env["STANDIN_NVIDIA_SMI_OUT"] == ownData("nvidia-smi-uuid-t4.txt") {
				gpus = "1"
			}
			if !strings.Contains(r.args, "all_reduce_perf -b 8 -e 256M -f 2 -g "+gpus) {
				t.Errorf("all_reduce_perf called as %q", r.args)
			}
			ev := h.events(r.node, 1)[0]
			if ev.GetAgent() != "preflight-nccl-loopback" || ev.GetIsFatal() != tc.fatal || ev.GetRecommendedAction() != tc.action ||
				ev.GetIsHealthy() != (tc.exit == 0) || (tc.code != "" && !slices.Contains(ev.GetErrorCode(), tc.code)) ||
				events.EntityKey(ev) != "NODE="+r.node {
				t.Errorf("event %v", ev)
			}
		})
	}

	t.Run("per-check timeout kills the tool", func(t *testing.T) {
		start := time.Now()
		r := h.run(checks.NCCLLoopback, with("STANDIN_ALL_REDUCE_PERF_OUT", ncclData("h100-single-node.log"), "STANDIN_SLEEP", "60"), "--timeout=2s")
		if r.code != checks.ExitFail || time.Since(start) > 40*time.Second {
			t.Fatalf("exit %d after %s", r.code, time.Since(start))
		}
		ev := h.events(r.node, 1)[0]
		if ev.GetIsFatal() || !slices.Contains(ev.GetErrorCode(), checks.CodeTimeout) {
			t.Errorf("event %v", ev)
		}
	})
}

// TestNCCLAllreduce: the gang wait on the mounted ConfigMap files, rank by
// sorted pod names, the torchrun command, and its published outputs.
func TestNCCLAllreduce(t *testing.T) {
	h := newHarness(t)
	gang := func(expected, peers string) string {
		d := t.TempDir()
		must(t, os.WriteFile(filepath.Join(d, "gang_id"), []byte("volcano-training-pg1"), 0o644))
		must(t, os.WriteFile(filepath.Join(d, "expected_count"), []byte(expected), 0o644))
		must(t, os.WriteFile(filepath.Join(d, "master_addr"), []byte("10.0.1.5"), 0o644))
		must(t, os.WriteFile(filepath.Join(d, "peers"), []byte(peers), 0o644))
		return d
	}
	ok := filepath.Join(t.TempDir(), "torchrun-ok.log")
	banner, _ := os.ReadFile(ncclData("torchrun-banner.txt"))
	must(t, os.WriteFile(ok, append(banner, []byte("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"+
		"  4294967296    1073741824     float     sum      -1  25410.3  169.03  169.03    N/A  25410.3  169.03  169.03    N/A\n# Avg bus bandwidth    : 169.03\n")...), 0o644))
	smi := ownData("nvidia-smi-uuids.txt")

	t.Run("gang formed: rank 1 of 2, master is the first pod's IP", func(t *testing.T) {
		d := gang("2", "trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\n")
		r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok}, "--gang.dir="+d, "--pod.name=trainer-1")
		if r.code != checks.ExitPass {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		for _, want := range []string{"--nnodes=2", "--nproc_per_node=2", "--node_rank=1", "--master_addr=10.0.1.5", "--master_port=29500", ".py"} {
			if !strings.Contains(r.args, want) {
				t.Errorf("torchrun args %q lack %s", r.args, want)
			}
		}
		ev := h.events(r.node, 1)[0]
		if !ev.GetIsHealthy() || ev.GetAgent() != "preflight-nccl-allreduce" || ev.GetMetadata()["preflight.faultline.io/gang"] != "volcano-training-pg1" {
			t.Errorf("event %v", ev)
		}
	})

	t.Run("gang does not form: non-fatal timeout", func(t *testing.T) {
		d := gang("2", "trainer-0:10.0.1.5\n")
		mf := filepath.Join(t.TempDir(), "metrics.prom")
		r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok},
			"--gang.dir="+d, "--pod.name=trainer-0", "--gang.timeout=1s", "--gang.poll-interval=100ms", "--metrics.textfile="+mf)
		if r.code != checks.ExitFail || strings.Contains(r.args, "torchrun") {
			t.Fatalf("exit %d, torchrun ran: %q", r.code, r.args)
		}
		ev := h.events(r.node, 1)[0]
		if ev.GetIsFatal() || ev.GetRecommendedAction() != datamodels.RecommendedAction_NONE || !slices.Contains(ev.GetErrorCode(), checks.CodeGangTimeout) {
			t.Errorf("event %v", ev)
		}
		m, _ := os.ReadFile(mf)
		for _, want := range []string{`preflight_gang_wait_seconds_count{workload="volcano-training-pg1"} 1`,
			`preflight_check_total{check="nccl-allreduce",result="fail"} 1`,
			`preflight_check_failures_total{check="nccl-allreduce",error_code="PREFLIGHT_GANG_TIMEOUT",node="` + r.node + `"} 1`,
			`preflight_check_duration_seconds_count{check="nccl-allreduce"} 1`} {
			if !strings.Contains(string(m), want) {
				t.Errorf("metrics lack %s:\n%s", want, m)
			}
		}
	})

	// The gang wait was inside the check's timeout (300s against
	// gang.timeout's 600s by default): a gang forming after it failed as a
	// check timeout.
	t.Run("gang forms after the check's timeout, within gang.timeout", func(t *testing.T) {
		d := gang("2", "trainer-0:10.0.1.5\n")
		time.AfterFunc(1500*time.Millisecond, func() {
			_ = os.WriteFile(filepath.Join(d, "peers"), []byte("trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\n"), 0o644)
		})
		r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok},
			"--gang.dir="+d, "--pod.name=trainer-1", "--timeout=1s", "--gang.timeout=5s", "--gang.poll-interval=100ms")
		if r.code != checks.ExitPass || !strings.Contains(r.args, "--node_rank=1") {
			t.Fatalf("exit %d, torchrun %q\n%s", r.code, r.args, r.stderr)
		}
	})

	// A peer whose check ended (the controller lists it as finished) takes
	// part in no rendezvous any more: a pod that replaced one of the
	// gang's, or whose sandbox was recreated after its check passed, ran
	// torchrun against it until the check's timeout, failed, and did so
	// again on every restart. A pod whose own check failed (its marker in
	// the pod-local gang.marker_dir, or the controller lists it as rerun)
	// is not passed so: its rerun passed with exit 0 and the job started on
	// the node that failed. The marker is what the first rerun, about 10s
	// after the failure, sees: the mounted ConfigMap shows rerun a minute
	// or more later.
	marker := "nccl-allreduce-failed"
	for _, tc := range []struct {
		name   string
		rerun  string
		marker bool
		code   int
	}{
		{"a peer finished, this pod never ran: not run, the pod not held", "", false, checks.ExitPass},
		{"a peer finished, another pod reruns: not run, the pod not held", "trainer-2\n", false, checks.ExitPass},
		{"a peer finished, this pod listed rerun: not skipped, fails", "trainer-1\n", false, checks.ExitFail},
		{"a peer finished, this pod's marker, not yet listed rerun: not skipped, fails", "", true, checks.ExitFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := gang("2", "trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\n")
			must(t, os.WriteFile(filepath.Join(d, "finished"), []byte("trainer-0\n"), 0o644))
			if tc.rerun != "" {
				must(t, os.WriteFile(filepath.Join(d, "rerun"), []byte(tc.rerun), 0o644))
			}
			md := t.TempDir()
			if tc.marker {
				must(t, os.WriteFile(filepath.Join(md, marker), []byte("1\n"), 0o644))
			}
			// torchrun waits for the finished peer, which never joins,
			// until the check's timeout.
			r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok, "STANDIN_SLEEP": "60"},
				"--gang.dir="+d, "--pod.name=trainer-1", "--timeout=2s", "--gang.marker-dir="+md)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; torchrun %q\n%s", r.code, tc.code, r.args, r.stderr)
			}
			if _, err := os.Stat(filepath.Join(md, marker)); (err == nil) != (tc.code != checks.ExitPass) {
				t.Errorf("exit %d, marker left: %v", r.code, err == nil)
			}
			if tc.code == checks.ExitPass {
				if strings.Contains(r.args, "torchrun") || !strings.Contains(r.stderr, "peers trainer-0 already finished") {
					t.Errorf("torchrun ran (%q) or the log lacks the reason:\n%s", r.args, r.stderr)
				}
				return
			}
			if ev := h.events(r.node, 1)[0]; ev.GetIsHealthy() {
				t.Errorf("event %v", ev)
			}
		})
	}

	// The sequence the marker is for: the check fails (its own rank), the
	// kubelet runs it again before the mounted ConfigMap lists the pod as
	// rerun while the peer has finished: it is not passed. Once it passes,
	// the marker is gone (a sandbox recreated after the pass may skip).
	t.Run("a failed run leaves the marker, its rerun is held, a pass removes it", func(t *testing.T) {
		d := gang("2", "trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\n")
		md := t.TempDir()
		r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok, "STANDIN_TORCHRUN_EXIT": "1"},
			"--gang.dir="+d, "--pod.name=trainer-1", "--gang.marker-dir="+md)
		if _, err := os.Stat(filepath.Join(md, marker)); r.code != checks.ExitFail || err != nil {
			t.Fatalf("exit %d, marker: %v\n%s", r.code, err, r.stderr)
		}
		must(t, os.WriteFile(filepath.Join(d, "finished"), []byte("trainer-0\n"), 0o644))
		r = h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok, "STANDIN_SLEEP": "60"},
			"--gang.dir="+d, "--pod.name=trainer-1", "--timeout=2s", "--gang.marker-dir="+md)
		if _, err := os.Stat(filepath.Join(md, marker)); r.code != checks.ExitFail || err != nil || strings.Contains(r.stderr, "already finished the gang-wide check") {
			t.Fatalf("rerun: exit %d, marker: %v\n%s", r.code, err, r.stderr)
		}
		must(t, os.Remove(filepath.Join(d, "finished")))
		r = h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok},
			"--gang.dir="+d, "--pod.name=trainer-1", "--gang.marker-dir="+md)
		if _, err := os.Stat(filepath.Join(md, marker)); r.code != checks.ExitPass || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("pass: exit %d, marker: %v\n%s", r.code, err, r.stderr)
		}
	})

	t.Run("only this pod listed finished (a stale view): runs", func(t *testing.T) {
		d := gang("2", "trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\n")
		must(t, os.WriteFile(filepath.Join(d, "finished"), []byte("trainer-1\n"), 0o644))
		r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok}, "--gang.dir="+d, "--pod.name=trainer-1")
		if r.code != checks.ExitPass || !strings.Contains(r.args, "--node_rank=1") {
			t.Fatalf("exit %d, torchrun %q\n%s", r.code, r.args, r.stderr)
		}
	})

	// More peers than expected_count (replicas above minMember, a stale
	// peer): torchrun got --node_rank=2 --nnodes=2.
	t.Run("more peers than expected: non-fatal mismatch, torchrun not run", func(t *testing.T) {
		d := gang("2", "trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\ntrainer-2:10.0.1.7\n")
		r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ok},
			"--gang.dir="+d, "--pod.name=trainer-2")
		if r.code != checks.ExitFail || strings.Contains(r.args, "torchrun") {
			t.Fatalf("exit %d, torchrun ran: %q", r.code, r.args)
		}
		if ev := h.events(r.node, 1)[0]; ev.GetIsFatal() || !slices.Contains(ev.GetErrorCode(), checks.CodeGangMismatch) ||
			!strings.Contains(ev.GetMessage(), "lists 3 peers, expected 2") {
			t.Errorf("event %v", ev)
		}
	})

	for _, tc := range []struct {
		name, log string
		fatal     bool
		code      string
	}{
		{"remote error", "torch-remote-error.log", false, "NCCL_REMOTE_ERROR"},
		{"internal error", "torch-internal-error.log", true, "NCCL_INTERNAL_ERROR"},
		{"watchdog timeout", "torch-timeout.log", false, "NCCL_TIMEOUT"},
		{"system error", "torch-system-error.log", false, "NCCL_SYSTEM_ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := gang("2", "trainer-0:10.0.1.5\ntrainer-1:10.0.1.6\n")
			r := h.run(checks.NCCLAllreduce, map[string]string{"STANDIN_NVIDIA_SMI_OUT": smi, "STANDIN_TORCHRUN_OUT": ncclData(tc.log), "STANDIN_TORCHRUN_EXIT": "1"},
				"--gang.dir="+d, "--pod.name=trainer-0")
			if r.code != checks.ExitFail {
				t.Fatalf("exit %d\n%s", r.code, r.stderr)
			}
			ev := h.events(r.node, 1)[0]
			if ev.GetIsFatal() != tc.fatal || !slices.Contains(ev.GetErrorCode(), tc.code) {
				t.Errorf("event %v", ev)
			}
		})
	}
}

// TestConfigErrors: exit 2, no event, the message names the key.
func TestConfigErrors(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name  string
		check string
		flags []string
		want  string
	}{
		{"bad level", checks.DCGMDiag, []string{"--dcgm.diag-level=9"}, "dcgm.diag_level: 9 is not 1..4"},
		{"missing tool", checks.NCCLLoopback, []string{"--nccl.all-reduce-perf=/nonexistent/all_reduce_perf"}, "nccl.all_reduce_perf"},
		{"no gang mounted", checks.NCCLAllreduce, []string{"--gang.dir=/nonexistent"}, "gang.dir: /nonexistent is not a directory"},
		{"unknown check", "gpu-burn", nil, "unknown check"},
		{"bad strategy", checks.DCGMDiag, []string{"--processing-strategy=MAYBE"}, "processing_strategy"},
		{"empty token", checks.DCGMDiag, []string{"--gateway.token-file=/dev/null"}, "gateway.token_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.run(tc.check, map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt")}, tc.flags...)
			if r.code != checks.ExitConfig || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr lacks %q:\n%s", r.code, tc.want, r.stderr)
			}
		})
	}
}

// TestGatewayBrieflyDown: a failing check while the gateway is down exits
// 1 with its events spooled on the node; the next check run, with the
// gateway back, delivers them as well as its own.
func TestGatewayBrieflyDown(t *testing.T) {
	h := newHarness(t)
	h.gw.Stop()
	first := h.run(checks.NCCLLoopback, map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
		"STANDIN_ALL_REDUCE_PERF_OUT": ncclData("system-error.log"), "STANDIN_ALL_REDUCE_PERF_EXIT": "2"}, "--spool.drain-timeout=2s")
	if first.code != checks.ExitFail || !strings.Contains(first.stderr, "stay spooled") {
		t.Fatalf("exit %d\n%s", first.code, first.stderr)
	}
	dirs, _ := filepath.Glob(filepath.Join(h.spool, "run-*"))
	if len(dirs) != 1 {
		t.Fatalf("spool dirs %v, want the first run's", dirs)
	}
	h.gw.StartAgain()
	second := h.run(checks.NCCLLoopback, map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
		"STANDIN_ALL_REDUCE_PERF_OUT": ncclData("h100-single-node.log")})
	if second.code != checks.ExitPass {
		t.Fatalf("exit %d\n%s", second.code, second.stderr)
	}
	ev := h.events(first.node, 1)[0]
	if !ev.GetIsFatal() || !slices.Contains(ev.GetErrorCode(), "NCCL_SYSTEM_ERROR") {
		t.Errorf("the first run's event: %v", ev)
	}
	h.events(second.node, 1)
	if dirs, _ := filepath.Glob(filepath.Join(h.spool, "run-*")); len(dirs) != 0 {
		t.Errorf("spool dirs left: %v", dirs)
	}
}

// TestSpoolNotOpenable: a check that cannot open its spool (run as the
// pod's non-root user under the kubelet's root-owned hostPath; here a
// spool.dir under a regular file, which fails as root too) still reports
// its result to the gateway, directly, and exits with the check's verdict.
// Before, it exited 2 and the pod stayed in Init:Error on a healthy node.
func TestSpoolNotOpenable(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(h.dir, "not-a-dir")
	must(t, os.WriteFile(file, nil, 0o644))
	r := h.run(checks.NCCLLoopback, map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
		"STANDIN_ALL_REDUCE_PERF_OUT": ncclData("h100-single-node.log")}, "--spool.dir="+filepath.Join(file, "spool"))
	if r.code != checks.ExitPass || !strings.Contains(r.stderr, "cannot open the spool") {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	h.events(r.node, 1)
}

// TestThroughAgentRelay: with --relay-socket a check sends its events to
// the node agent's relay (agents/relay, in-process here over a real agent
// spool) and needs no gateway token (its token file does not exist): a
// failing check's events are in the agent's spool, for the agent to send
// with its node-bound credential, and the check exits 1. A relay that
// refuses them (the agent is another node's: it relays its own node's
// only) leaves them unrecorded, and the check exits 2 for the kubelet to
// run it again, as when the gateway never took them.
func TestThroughAgentRelay(t *testing.T) {
	h := newHarness(t)
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name      string
		agentNode string
		want      int
		spooled   bool
	}{
		{"the agent's node", "gpu-node-relay", checks.ExitFail, true},
		{"another node's agent", "gpu-node-other", checks.ExitConfig, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.node = "gpu-node-relay"
			defer func() { h.node = "" }()
			dir := t.TempDir()
			sp, err := agent.OpenSpool(filepath.Join(dir, "spool"), 8<<20, log, nil)
			must(t, err)
			defer sp.Close()
			socket := filepath.Join(dir, "agent.sock")
			srv, err := relay.New(relay.Config{Socket: socket}, tc.agentNode, sp, log, prometheus.NewRegistry(), nil)
			must(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx) }()
			defer func() { cancel(); <-done }()

			r := h.run(checks.NCCLLoopback, map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
				"STANDIN_ALL_REDUCE_PERF_OUT": ncclData("system-error.log"), "STANDIN_ALL_REDUCE_PERF_EXIT": "2"},
				"--relay-socket="+socket, "--gateway.token-file="+filepath.Join(dir, "no-token"), "--spool.drain-timeout=5s")
			if r.code != tc.want {
				t.Fatalf("exit %d, want %d\n%s", r.code, tc.want, r.stderr)
			}
			evs, _, err := sp.Peek(100)
			must(t, err)
			if !tc.spooled {
				if len(evs) != 0 {
					t.Fatalf("the agent spooled %d events of a refused call", len(evs))
				}
				return
			}
			if len(evs) != 1 || !evs[0].GetIsFatal() || !slices.Contains(evs[0].GetErrorCode(), "NCCL_SYSTEM_ERROR") ||
				evs[0].GetNodeName() != "gpu-node-relay" || evs[0].GetCheckName() != checks.NCCLLoopback {
				t.Fatalf("the agent spooled %v", evs)
			}
			if dirs, _ := filepath.Glob(filepath.Join(h.spool, "run-*")); len(dirs) != 0 {
				t.Errorf("the check spooled on its own: %v", dirs)
			}
		})
	}
}

// TestNoAgentOnNode: with --relay-socket on a node where no agent ever
// made the socket (not scheduled there, e.g. without
// nvidia.com/gpu.present=true, or not yet rolled out) the check waits for
// it until spool.drain_timeout, then exits on its own result with a
// Warning Event on the pod: before, it exited 2 and the pod's init
// container looped for ever. A socket that exists but refuses (the agent
// crash-looping) still exits 2, for the kubelet to run the check again.
func TestNoAgentOnNode(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name      string
		nccl      string
		exit      string
		dead      bool
		want      int
		wantEvent bool
	}{
		{"no agent, check fails", "system-error.log", "2", false, checks.ExitFail, true},
		{"no agent, check passes", "h100-single-node.log", "0", false, checks.ExitPass, true},
		{"agent crash-looping", "system-error.log", "2", true, checks.ExitConfig, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := fake.NewClientset()
			h.kube = kc
			defer func() { h.kube = nil }()
			socket := filepath.Join(t.TempDir(), "agent.sock")
			if tc.dead {
				ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
				must(t, err)
				ln.SetUnlinkOnClose(false)
				must(t, ln.Close())
			}
			r := h.run(checks.NCCLLoopback, map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"),
				"STANDIN_ALL_REDUCE_PERF_OUT": ncclData(tc.nccl), "STANDIN_ALL_REDUCE_PERF_EXIT": tc.exit},
				"--relay-socket="+socket, "--gateway.token-file="+filepath.Join(t.TempDir(), "no-token"), "--spool.drain-timeout=1s", "--kube.events=true")
			if r.code != tc.want {
				t.Fatalf("exit %d, want %d\n%s", r.code, tc.want, r.stderr)
			}
			l, err := kc.CoreV1().Events("training").List(context.Background(), metav1.ListOptions{})
			must(t, err)
			var notReported []corev1.Event
			for _, e := range l.Items {
				if e.Reason == "PreflightCheckNotReported" {
					notReported = append(notReported, e)
				}
			}
			if !tc.wantEvent {
				if len(notReported) != 0 {
					t.Fatalf("Events %+v", notReported)
				}
				return
			}
			if len(notReported) != 1 || notReported[0].Type != corev1.EventTypeWarning || !strings.Contains(notReported[0].Message, "no faultline agent on node") {
				t.Fatalf("Events %+v, want one Warning PreflightCheckNotReported", l.Items)
			}
			if !strings.Contains(r.stderr, "no faultline agent on this node") {
				t.Errorf("no Error logged:\n%s", r.stderr)
			}
		})
	}
}
