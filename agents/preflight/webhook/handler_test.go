package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/gang"
	"github.com/faultline/faultline/agents/preflight/injection"
)

// failingClaims stands in for the API when a claim cannot be read.
type failingClaims struct{}

func (failingClaims) DeviceClasses(context.Context, string, corev1.PodResourceClaim) ([]string, error) {
	return nil, errors.New("ResourceClaim training/x not found")
}

func testHandler(t testing.TB, mod func(*Config)) *Handler {
	cfg := DefaultConfig()
	cfg.Namespaces.Include = []string{"training"}
	cfg.Gang.Methods = []string{"workloadRef", "volcano", "kueue"}
	cfg.Checks = []injection.CheckSpec{{Name: checks.DCGMDiag}, {Name: checks.NCCLLoopback}, {Name: checks.NCCLAllreduce}}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var claims injection.ClaimResolver
	if len(cfg.GPU.DeviceClasses) > 0 {
		claims = failingClaims{}
	}
	inj := injection.New(InjectionConfig(&cfg), claims, Discovery(&cfg, nil))
	return NewHandler(&cfg, inj, slog.New(slog.DiscardHandler), nil)
}

// gpuPodJSON is an 8-GPU, 4-NIC pod as the API server sends it.
const gpuPodJSON = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"trainer-0","namespace":"training"%s},
 "spec":{%s"containers":[{"name":"main","image":"trainer:1","env":[{"name":"NCCL_IB_HCA","value":"mlx5"}],
 "resources":{"limits":{"nvidia.com/gpu":"8","nvidia.com/mlnxnics":"4"},"requests":{"nvidia.com/gpu":"8","nvidia.com/mlnxnics":"4"}},
 "terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}],
 "restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","schedulerName":"default-scheduler"}}`

func review(t testing.TB, ns, podJSON string) []byte {
	rev := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: ns, Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: []byte(podJSON)}}}
	b, err := json.Marshal(rev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func call(h http.Handler, body []byte) (*admissionv1.AdmissionResponse, int, string) {
	rr := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/mutate-pod", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rr, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rr.Body.Bytes(), &out); err != nil {
		return nil, rr.Code, rr.Body.String()
	}
	return out.Response, rr.Code, rr.Body.String()
}

// TestWorkloadRef: Kubernetes 1.35's spec.workloadRef and 1.36's
// spec.schedulingGroup are newer than this build's API types (and than
// the test API server, which would drop them), so they are tested with
// the AdmissionReview the newer API server sends.
func TestWorkloadRef(t *testing.T) {
	h := testHandler(t, nil)
	for _, tc := range []struct{ spec, wantGang string }{
		{`"workloadRef":{"name":"llm-train","podGroup":"workers","podGroupReplicaKey":"0"},`, "wl-llm-train-workers-0"},
		{`"schedulingGroup":{"podGroupName":"training-workers"},`, "pg-training-workers"},
		{``, ""},
	} {
		resp, code, body := call(h, review(t, "training", strings.Replace(strings.Replace(gpuPodJSON, "%s", "", 1), "%s", tc.spec, 1)))
		if code != 200 || resp == nil || !resp.Allowed || resp.Patch == nil {
			t.Fatalf("%s: %d %s", tc.spec, code, body)
		}
		p := string(resp.Patch)
		if tc.wantGang == "" {
			if strings.Contains(p, "preflight-nccl-allreduce") || strings.Contains(p, gang.LabelGang) {
				t.Errorf("singleton got the gang check: %s", p)
			}
			continue
		}
		if !strings.Contains(p, `"`+gang.LabelGang+`":"`+tc.wantGang+`"`) || !strings.Contains(p, "preflight-nccl-allreduce") ||
			!strings.Contains(p, `"name":"preflight-`+tc.wantGang+`"`) {
			t.Errorf("%s: patch %s", tc.spec, p)
		}
	}
}

// TestNamespacesAndPolicy: the handler's own guard (whatever the API
// server's selector let through) and the failure policy for errors inside
// the webhook.
func TestNamespacesAndPolicy(t *testing.T) {
	h := testHandler(t, nil)
	for _, ns := range []string{"kube-system", "faultline", "default"} {
		resp, _, body := call(h, review(t, ns, strings.ReplaceAll(gpuPodJSON, "%s", "")))
		if resp == nil || !resp.Allowed || resp.Patch != nil {
			t.Errorf("%s: mutated: %s", ns, body)
		}
	}
	draPod := strings.Replace(strings.Replace(gpuPodJSON, "%s", "", 1), "%s", `"resourceClaims":[{"name":"gpu","resourceClaimName":"x"}],`, 1)
	fail := testHandler(t, func(c *Config) { c.GPU.DeviceClasses = []string{"gpu.example.com"} })
	resp, _, body := call(fail, review(t, "training", draPod))
	if resp == nil || resp.Allowed || !strings.Contains(resp.Result.Message, "cannot inject preflight checks: resource claim \"gpu\": ResourceClaim training/x not found") {
		t.Errorf("Fail: %s", body)
	}
	ignore := testHandler(t, func(c *Config) { c.GPU.DeviceClasses = []string{"gpu.example.com"}; c.Webhook.FailurePolicy = "Ignore" })
	resp, _, body = call(ignore, review(t, "training", draPod))
	if resp == nil || !resp.Allowed || resp.Patch != nil || len(resp.Warnings) != 1 {
		t.Errorf("Ignore: %s", body)
	}
}

// BenchmarkAdmitGPUPod is one AdmissionReview for an 8-GPU pod answered by
// the handler (decode, detection, injection of three checks, patch,
// encode), without the network. It reports p50 and p99 per request.
func BenchmarkAdmitGPUPod(b *testing.B) {
	h := testHandler(b, nil)
	body := review(b, "training", strings.Replace(strings.Replace(gpuPodJSON, "%s", `,"annotations":{"scheduling.k8s.io/group-name":"pg-1"}`, 1), "%s", "", 1))
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		resp, code, _ := call(h, body)
		lat = append(lat, time.Since(start))
		if code != 200 || resp.Patch == nil {
			b.Fatal("no patch")
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if n := len(lat); n > 0 {
		b.ReportMetric(float64(lat[n/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[min(n-1, n*99/100)].Microseconds()), "p99-µs")
	}
	_ = slices.Clone(lat)
}
