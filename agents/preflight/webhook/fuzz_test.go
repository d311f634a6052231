package webhook

import (
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"
)

// FuzzAdmitPod: whatever pod a well-formed AdmissionReview carries, the
// webhook answers it (the API server waits on it for every pod CREATE in
// its namespaces: a panic or a non-answer fails or delays the pod): a
// denial says why; a patch is a JSON Patch that applies to the pod and
// leaves a pod the API server takes (no two containers or volumes of one
// name); and the patched pod, admitted again (the IfNeeded
// reinvocation), gets no further patch.
func FuzzAdmitPod(f *testing.F) {
	pod := func(meta, spec string) string {
		return strings.Replace(strings.Replace(gpuPodJSON, "%s", meta, 1), "%s", spec, 1)
	}
	f.Add(pod("", ""))
	f.Add(pod("", `"workloadRef":{"name":"llm-train","podGroup":"workers","podGroupReplicaKey":"0"},`))
	f.Add(pod("", `"schedulingGroup":{"podGroupName":"training-workers"},`))
	f.Add(pod(`,"annotations":{"scheduling.k8s.io/group-name":"pg-1"}`, ""))
	f.Add(pod(`,"labels":{"kueue.x-k8s.io/pod-group-name":"g","kueue.x-k8s.io/pod-group-total-count":"2"}`, `"initContainers":[{"name":"preflight-dcgm-diag","image":"x"}],`))
	f.Add(pod("", `"resourceClaims":[{"name":"gpu","resourceClaimName":"x"}],`))
	f.Add(`{"metadata":{},"spec":{"containers":"not-a-list"}}`)
	f.Add(`{"metadata":{"generateName":"w-"},"spec":{"containers":[{"name":"m","resources":{"limits":{"nvidia.com/gpu":"-1"}}}]}}`)
	h := testHandler(f, nil)
	f.Fuzz(func(t *testing.T, podJSON string) {
		var obj struct {
			Metadata map[string]any `json:"metadata"`
			Spec     map[string]any `json:"spec"`
		}
		var in corev1.Pod
		if sigsjson.UnmarshalCaseSensitivePreserveInts([]byte(podJSON), &obj) != nil || obj.Metadata == nil || obj.Spec == nil ||
			sigsjson.UnmarshalCaseSensitivePreserveInts([]byte(podJSON), &in) != nil || dupName(&in) != "" {
			// The API server sends a JSON object with metadata and spec
			// (a review that is not JSON: TestMalformedReviews), and
			// refuses a pod with two of a name whatever the webhook does.
			return
		}
		resp, code, body := callWithin(t, h, review(t, "training", podJSON))
		if code != 200 || resp == nil || resp.UID != "u-1" {
			t.Fatalf("no answer in kind: %d %s", code, body)
		}
		if !resp.Allowed {
			if resp.Result == nil || resp.Result.Message == "" {
				t.Fatalf("denied without a reason: %s", body)
			}
			return
		}
		if resp.Patch == nil {
			return
		}
		if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
			t.Fatalf("patch type %v", resp.PatchType)
		}
		patch, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatalf("patch %s is not a JSON Patch: %v", resp.Patch, err)
		}
		patched, err := patch.Apply([]byte(podJSON))
		if err != nil {
			t.Fatalf("patch %s does not apply to the pod: %v", resp.Patch, err)
		}
		var p corev1.Pod
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(patched, &p); err != nil {
			t.Fatalf("patched pod %s is not a pod: %v", patched, err)
		}
		if n := dupName(&p); n != "" {
			t.Fatalf("patched pod has two of %s (the API server refuses it): patch %s", n, resp.Patch)
		}
		again, code, body := callWithin(t, h, review(t, "training", string(patched)))
		if code != 200 || again == nil || !again.Allowed || again.Patch != nil {
			t.Fatalf("the patched pod admitted again: %d %s (patch %s)", code, body, resp.Patch)
		}
	})
}

// dupName is the first name two of the pod's containers or two of its
// volumes share ("container x", "volume y"), or "".
func dupName(p *corev1.Pod) string {
	var names []string
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		names = append(names, "container "+c.Name)
	}
	for _, v := range p.Spec.Volumes {
		names = append(names, "volume "+v.Name)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return n
		}
		seen[n] = true
	}
	return ""
}

// callWithin is call, failing the test when no answer comes within the
// API server's wait (webhook.timeout): a pod would be refused or delayed.
func callWithin(t *testing.T, h *Handler, body []byte) (*admissionv1.AdmissionResponse, int, string) {
	t.Helper()
	type answer struct {
		resp *admissionv1.AdmissionResponse
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		resp, code, out := call(h, body)
		done <- answer{resp, code, out}
	}()
	select {
	case a := <-done:
		return a.resp, a.code, a.body
	case <-time.After(h.cfg.Webhook.Timeout):
		t.Fatalf("no answer within webhook.timeout (%v) to %s", h.cfg.Webhook.Timeout, body)
		return nil, 0, ""
	}
}
