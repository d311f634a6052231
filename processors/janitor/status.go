package janitor

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/faultline/faultline/schemas/events"
)

// Group is the API group of NVIDIA NVSentinel's janitor, whose kinds
// faultline's remediate role creates (deploy/crds).
const Group = "janitor.dgxc.nvidia.com"

// kind is one of the janitor's resource kinds.
type kind struct {
	Name       string
	GVR        schema.GroupVersionResource
	ActionKind string
	// Result is the condition type that ends the work (NodeReady,
	// NodeTerminated, Complete).
	Result string
}

var (
	kindReboot    = kind{"RebootNode", schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: "rebootnodes"}, events.KindReboot, "NodeReady"}
	kindTerminate = kind{"TerminateNode", schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: "terminatenodes"}, events.KindTerminate, "NodeTerminated"}
	kindGPUReset  = kind{"GPUReset", schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: "gpuresets"}, events.KindGPUReset, "Complete"}
	kinds         = []kind{kindReboot, kindTerminate, kindGPUReset}
)

// Condition types and reasons, as NVSentinel's janitor writes them
// (deploy/crds has the contract; processors/remediate KindCompletion reads
// it).
const (
	CondSignalSent      = "SignalSent"
	CondNodeReady       = "NodeReady"
	CondNodeTerminated  = "NodeTerminated"
	CondComplete        = "Complete"
	CondReady           = "Ready"
	CondResetJobCreated = "ResetJobCreated"

	ReasonInitializing      = "Initializing"
	ReasonSucceeded         = "Succeeded"
	ReasonFailed            = "Failed"
	ReasonTimeout           = "Timeout"
	ReasonGPUResetSucceeded = "GPUResetSucceeded"
	ReasonResetJobFailed    = "ResetJobFailed"
	ReasonNodeNotFound      = "NodeNotFound"
	// ReasonNotDrained: the node is not quarantined and drained by
	// faultline and the resource does not say force.
	ReasonNotDrained = "NotDrained"
	// ReasonNoProvider: no provider is configured for the node.
	ReasonNoProvider = "NoProvider"
	// ReasonNoBootID: the node reported no boot ID for reboot_timeout
	// after the resource was created: a reboot's end could not be told, so
	// none was sent.
	ReasonNoBootID = "NoBootID"
	// ReasonQueueTimeout: the resource was not started (its signal not
	// recorded) within max_queue_age of its creation; none was sent.
	ReasonQueueTimeout = "QueueTimeout"
	// ReasonEscalated: the node was escalated to CONTACT_SUPPORT by the
	// remediate role after the resource was created, before it started;
	// no signal was sent.
	ReasonEscalated = "Escalated"
	// ReasonRecorded: the signal was recorded by a janitor that stopped
	// before it wrote SignalSent; it is not sent again (at most once).
	ReasonRecorded = "Recorded"
	// ReasonMaybeSent: the provider's request carrying the signal went out
	// and no answer came (a timeout, a cut connection: ErrMaybeSent); it
	// may have been carried out, so it is followed as sent and never sent
	// again.
	ReasonMaybeSent = "MaybeSent"
)

// AnnotationState is the janitor's record of an operation on the resource,
// written (with the resource's resourceVersion) BEFORE the signal is
// sent, so that a janitor that stops mid-operation never sends it twice.
const AnnotationState = "faultline.io/janitor-state"

// opState is the JSON of AnnotationState.
type opState struct {
	// Step is "signal" (the signal is being or was sent) or "force" (a
	// forced reboot followed the graceful one).
	Step string `json:"step"`
	// At is when the signal was recorded: the timeouts count from it.
	At time.Time `json:"at"`
	// ForcedAt is when the forced reboot was recorded.
	ForcedAt time.Time `json:"forcedAt,omitzero"`
	// BootID is the node's boot ID before the signal: a reboot is over
	// when the node is Ready with another one.
	BootID string `json:"bootId,omitempty"`
	// NodeUID is the Node's UID at the signal: a terminate deletes that
	// Node only, not one of the same name registered since (a recycled
	// name). Empty in records written before it was kept: by name then.
	NodeUID  string `json:"nodeUid,omitempty"`
	Provider string `json:"provider"`
	By       string `json:"by"`
}

func stateOf(o *unstructured.Unstructured) *opState {
	v := o.GetAnnotations()[AnnotationState]
	if v == "" {
		return nil
	}
	var st opState
	if json.Unmarshal([]byte(v), &st) != nil || st.At.IsZero() {
		return nil
	}
	return &st
}

func (st opState) encode() string {
	b, _ := json.Marshal(st)
	return string(b)
}

// conditions of a resource's status.
func conditions(o *unstructured.Unstructured) []map[string]any {
	raw, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	out := make([]map[string]any, 0, len(raw))
	for _, c := range raw {
		if m, ok := c.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func condition(o *unstructured.Unstructured, typ string) map[string]any {
	for _, c := range conditions(o) {
		if c["type"] == typ {
			return c
		}
	}
	return nil
}

func condIs(o *unstructured.Unstructured, typ, status string) bool {
	c := condition(o, typ)
	return c != nil && c["status"] == status
}

func finished(o *unstructured.Unstructured) bool {
	v, ok, _ := unstructured.NestedString(o.Object, "status", "completionTime")
	return ok && v != ""
}

// cond is one condition to set.
type cond struct{ Type, Status, Reason, Message string }

// reasonRule is the CRDs' rule for a condition's reason
// (deploy/crds: pattern, minLength 1, maxLength 1024); the apiserver
// refuses (422 Invalid) a status write with any other.
var reasonRule = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// validReason is whether the CRDs accept reason as a condition's reason.
func validReason(reason string) bool {
	return len(reason) <= 1024 && reasonRule.MatchString(reason)
}

// quotedReasonMax is how much of a refused reason a message quotes.
const quotedReasonMax = 128

// safeReason is reason and msg when the CRDs accept reason; else
// ReasonFailed, msg led by the refused reason, quoted and cut short. A
// provider's reason may be a node's own words (the local agent's answer),
// and a status write with a reason the CRDs refuse is refused every time
// it is retried: the resource would never end, holding its slot.
func safeReason(reason, msg string) (string, string) {
	if validReason(reason) {
		return reason, msg
	}
	return ReasonFailed, fmt.Sprintf("provider reason %q is not a condition reason: %s", events.Truncate(reason, quotedReasonMax), msg)
}

// setConditions returns o's conditions with cs set (lastTransitionTime
// kept when the status did not change), in a stable order.
func setConditions(o *unstructured.Unstructured, now time.Time, cs ...cond) []any {
	cur := conditions(o)
	ts := now.UTC().Format(time.RFC3339)
	for _, c := range cs {
		msg := events.Truncate(c.Message, 32768)
		found := false
		for _, m := range cur {
			if m["type"] != c.Type {
				continue
			}
			found = true
			if m["status"] != c.Status {
				m["lastTransitionTime"] = ts
			}
			m["status"], m["reason"], m["message"] = c.Status, c.Reason, msg
		}
		if !found {
			cur = append(cur, map[string]any{"type": c.Type, "status": c.Status, "reason": c.Reason, "message": msg, "lastTransitionTime": ts})
		}
	}
	out := make([]any, len(cur))
	for i, m := range cur {
		out[i] = m
	}
	return out
}

// nodeReady reports the node's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
