package janitor

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"
)

// refuses is a provider that refuses every reboot with its reason, as the
// local agent answers {"ok":false,"reason":...}.
type refuses struct{ reason string }

func (p refuses) Reboot(context.Context, Target, RebootMode) error {
	return perr(p.reason, "agent 10.0.0.1:9400 of node n-bad: not done")
}
func (refuses) Terminate(context.Context, Target) error { return ErrUnsupported }
func (refuses) ResetGPUs(context.Context, Target, []string) error {
	return ErrUnsupported
}

// crdReasonRule is the RebootNode CRD's rule for a condition's reason
// (its pattern and maxLength), read from deploy/crds.
func crdReasonRule(t *testing.T) (*regexp.Regexp, int) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/crds/rebootnode.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Status struct {
								Properties struct {
									Conditions struct {
										Items struct {
											Properties struct {
												Reason struct {
													Pattern   string `json:"pattern"`
													MaxLength int    `json:"maxLength"`
												} `json:"reason"`
											} `json:"properties"`
										} `json:"items"`
									} `json:"conditions"`
								} `json:"properties"`
							} `json:"status"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	r := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Status.Properties.Conditions.Items.Properties.Reason
	if r.Pattern == "" || r.MaxLength == 0 {
		t.Fatalf("no reason rule in the CRD: %+v", r)
	}
	return regexp.MustCompile(r.Pattern), r.MaxLength
}

// validateStatus has the fake refuse a status patch of kind k as the
// apiserver would: 422 Invalid when a condition's reason breaks the CRD's
// rule; refuse(reason) may refuse more (nil: no error).
func (f *fakeCluster) validateStatus(k kind, rule *regexp.Regexp, maxLen int, refuse func(reason string) error) {
	f.dyn.PrependReactor("patch", k.GVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		pa := a.(clienttesting.PatchAction)
		if pa.GetSubresource() != "status" {
			return false, nil, nil
		}
		var p struct {
			Status struct {
				Conditions []struct {
					Reason string `json:"reason"`
				} `json:"conditions"`
			} `json:"status"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &p); err != nil {
			return true, nil, err
		}
		for _, c := range p.Status.Conditions {
			if len(c.Reason) > maxLen || !rule.MatchString(c.Reason) {
				return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: Group, Kind: k.Name}, pa.GetName(), field.ErrorList{
					field.Invalid(field.NewPath("status", "conditions", "reason"), c.Reason, "should match '"+rule.String()+"'")})
			}
			if refuse != nil {
				if err := refuse(c.Reason); err != nil {
					return true, nil, err
				}
			}
		}
		return false, nil, nil
	})
}

// TestRefusedReasonEndsTheResource: a provider's reason the RebootNode
// CRD refuses (the local agent's answer is the node's own words: "Not
// Allowed", 1025 characters) ends the resource Failed, the reason quoted in
// the message, and gives its slot back; so does a status write refused
// for good for any other cause (Invalid at once; anything else at
// reboot_timeout). Before, the refused write was retried for the life of
// the process, past reboot_timeout, the resource holding its slots.
func TestRefusedReasonEndsTheResource(t *testing.T) {
	t.Parallel()
	rule, maxLen := crdReasonRule(t)
	long := strings.Repeat("A", maxLen+1)
	gr := schema.GroupResource{Group: Group, Resource: kindReboot.GVR.Resource}
	for _, tc := range []struct {
		name, reason string
		refuse       func(reason string) error // the write of a valid reason refused too
		msg          string                    // the message holds it
	}{
		{name: "pattern", reason: "Not Allowed", msg: `"Not Allowed"`},
		{name: "length", reason: long, msg: `"` + long[:quotedReasonMax-3] + `..."`},
		{name: "invalid", reason: ReasonBMCAuthFailed, msg: "is invalid",
			refuse: func(r string) error {
				if r == ReasonBMCAuthFailed { // a stricter rule (an older CRD, a webhook)
					return apierrors.NewInvalid(schema.GroupKind{Group: Group, Kind: kindReboot.Name}, "reboot", nil)
				}
				return nil
			}},
		{name: "forbidden", reason: ReasonBMCAuthFailed, msg: "forbidden",
			refuse: func(r string) error {
				if r == ReasonBMCAuthFailed {
					return apierrors.NewForbidden(gr, "reboot", nil)
				}
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeCluster(t, fakeNode("n-bad", "r1", "boot-n-bad"))
			f.validateStatus(kindReboot, rule, maxLen, tc.refuse)
			cfg := fakeConfig()
			cfg.RebootTimeout = 300 * time.Millisecond
			j, rec := f.janitor(cfg, false, refuses{tc.reason})
			f.run(j)
			f.create(kindReboot, "reboot", "n-bad", nil)

			o := f.waitFor(kindReboot, "reboot", 10*time.Second, "finished", finished)
			for _, typ := range []string{CondSignalSent, CondNodeReady} {
				if got := condOf(o, typ); got != "False/"+ReasonFailed {
					t.Errorf("%s %s, want False/%s", typ, got, ReasonFailed)
				}
			}
			if msg, _ := condition(o, CondNodeReady)["message"].(string); !strings.Contains(msg, tc.msg) {
				t.Errorf("message %q does not hold %q", msg, tc.msg)
			}
			for deadline := time.Now().Add(2 * time.Second); j.lim.inProgress(cluster) != 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d slots held after the resource ended", j.lim.inProgress(cluster))
				}
			}
			if tc.refuse == nil { // one failure, its reason the one written
				rec.expect(t, "n-bad", []string{"reboot/failed"})
			}
			rec.mu.Lock()
			last := rec.acts[len(rec.acts)-1]
			rec.mu.Unlock()
			if last.Outcome != "failed" || last.Details["reason"] != ReasonFailed {
				t.Errorf("last action %s/%s, want failed/%s", last.Outcome, last.Details["reason"], ReasonFailed)
			}
		})
	}
}

// TestReasonOf: a provider's reason the CRDs refuse is Failed, and its
// error quotes it, cut short.
func TestReasonOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reason, want string
	}{
		{ReasonBMCAuthFailed, ReasonBMCAuthFailed},
		{"GPUInUse", "GPUInUse"},
		{"Not Allowed", ReasonFailed},
		{"Trailing:", ReasonFailed},
		{"9Lives", ReasonFailed},
		{strings.Repeat("A", 1024), strings.Repeat("A", 1024)},
		{strings.Repeat("A", 1025), ReasonFailed},
	} {
		err := perr(tc.reason, "boom")
		if got := reasonOf(err); got != tc.want {
			t.Errorf("reasonOf(%.20q) = %.20q, want %.20q", tc.reason, got, tc.want)
		}
		if tc.want == ReasonFailed && len(err.Error()) > quotedReasonMax+len(`"": boom`) {
			t.Errorf("error of %.20q: %d bytes, not cut short", tc.reason, len(err.Error()))
		}
	}
}
