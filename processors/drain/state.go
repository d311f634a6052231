package drain

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Keys the drain role owns on a node; it writes nothing else.
const (
	// AnnotationState holds the JSON State of the node's drain: the source
	// of truth every replica resumes from.
	AnnotationState = "faultline.io/drain-state"
	// LabelDrain is the drain's phase (running, succeeded, gave_up,
	// cancelled), for kubectl get nodes -l.
	LabelDrain = "faultline.io/drain"
)

// annotationQuarantinedAt is when the node's quarantine began (RFC 3339),
// written by the quarantine role (a role reads another's marks by name,
// never through its package).
const annotationQuarantinedAt = "faultline.io/quarantined-at"

// quarantinedAt is when the node's quarantine began (zero when it does
// not say).
func quarantinedAt(n *corev1.Node) time.Time {
	at, err := time.Parse(time.RFC3339, n.Annotations[annotationQuarantinedAt])
	if err != nil {
		return time.Time{}
	}
	return at
}

// Drain phases.
const (
	PhaseRunning   = "running"
	PhaseSucceeded = "succeeded"
	PhaseGaveUp    = "gave_up"
	PhaseCancelled = "cancelled"
)

// Bounds of the drain state, which shares the node's 256 KiB of
// annotations with the quarantine state.
const (
	// maxSeen bounds the trigger event ids remembered across drains (and
	// those of the running drain's trigger).
	maxSeen = 32
	// maxTriggerEntities bounds the trigger's entity list kept in the
	// state (events.BoundKey); the actions carry it whole.
	maxTriggerEntities = 4096
	// maxScopeGPUs bounds the GPUs of a partial drain.
	maxScopeGPUs = 64
	// maxGonePods bounds the entries of pods gone from the node kept in
	// the state; the oldest past it are folded into State.Folded (a
	// controller creating pods on the cordoned node under new names).
	maxGonePods = 128
	// maxScopePodBytes bounds a partial drain's pod listing, as the state
	// writes it: ~four listings of the gateway's largest metadata value
	// (2 KiB), far more pods than a node's GPUs are held by.
	maxScopePodBytes = 8 << 10
)

// State is one node's drain, kept in AnnotationState.
type State struct {
	// ID identifies this drain (a hash of the node and the first trigger).
	ID string `json:"id"`
	// Phase is running, succeeded, gave_up or cancelled.
	Phase string `json:"phase"`
	// StartedAt is when the drain began; the timeouts of the pods on the
	// node then count from it (PodState.Deadline).
	StartedAt time.Time `json:"startedAt"`
	// ScopeAt is when the drain's scope last changed: its start, or the
	// last fault that joined and widened it (zero in a state from before
	// it: the next step's time). A pod first seen after it has its
	// deadline no later than ScopeAt plus its timeout plus
	// Config.EvictionTimeout (Config.advance).
	ScopeAt time.Time `json:"scopeAt,omitzero"`
	// FinishedAt is when the phase left running.
	FinishedAt time.Time `json:"finishedAt,omitzero"`
	// By is the processor that began the drain.
	By string `json:"by,omitempty"`
	// Scope: the whole node, or the pods using some GPUs.
	Scope
	// Force: drainOverrides.force — every pod Immediate, a PDB refusal is
	// answered with a delete.
	Force bool `json:"force,omitempty"`
	// Trigger carries what the remediation needs from the triggering event.
	Trigger Trigger `json:"trigger"`
	// Seen are the trigger event ids handled (this drain and earlier ones),
	// so a replayed trigger never starts a drain again.
	Seen []string `json:"seen,omitempty"`
	// Pods in scope, by namespace/name.
	Pods map[string]*PodState `json:"pods,omitempty"`
	// Skipped counts pods left alone, by reason (system namespace,
	// DaemonSet, mirror, emptyDir, out of scope).
	Skipped map[string]int `json:"skipped,omitempty"`
	// Folded counts the pods whose entries left Pods (fold): earlier
	// copies of a pod that came back under the same name, and gone pods
	// past maxGonePods.
	Folded Folded `json:"folded,omitzero"`
}

// Folded is what Count needs of the pods folded out of State.Pods.
type Folded struct {
	Pods      int `json:"pods,omitempty"`
	Evicted   int `json:"evicted,omitempty"`
	Deleted   int `json:"deleted,omitempty"`
	Completed int `json:"completed,omitempty"`
	Gone      int `json:"gone,omitempty"`
	GaveUp    int `json:"gaveUp,omitempty"`
	Skipped   int `json:"skippedTerminating,omitempty"`
}

// fold removes a done pod's entry from s.Pods, keeping its counts in
// s.Folded.
func (s *State) fold(key string) {
	p := s.Pods[key]
	s.Folded.Pods++
	if p.Evicted {
		s.Folded.Evicted++
	}
	if !p.DeletedAt.IsZero() {
		s.Folded.Deleted++
	}
	switch p.Done {
	case "completed":
		s.Folded.Completed++
	case "gave_up":
		s.Folded.GaveUp++
	case "skipped":
		s.Folded.Skipped++
	default:
		s.Folded.Gone++
	}
	delete(s.Pods, key)
}

// Scope is what a drain evicts: with no GPUs the whole node, otherwise
// only the pods using one of GPUs (partial drain for COMPONENT_RESET).
type Scope struct {
	GPUs []string `json:"gpus,omitempty"`
	// GPUPods are the pods the kubelet said held the GPUs when the fault
	// was raised (events.MetaGPUPods); nil: not known.
	GPUPods *PodList `json:"gpuPods,omitempty"`
}

// PodList is a listing of pods ("namespace/name") taken At.
type PodList struct {
	Pods []string  `json:"pods"`
	At   time.Time `json:"at"`
}

// holds reports whether s covers o: a whole-node scope covers everything,
// a GPU scope the faults of its GPUs.
func (s Scope) holds(o Scope) bool {
	if len(s.GPUs) == 0 {
		return true
	}
	if len(o.GPUs) == 0 {
		return false
	}
	for _, g := range o.GPUs {
		if !slices.Contains(s.GPUs, g) {
			return false
		}
	}
	return true
}

// widen is the scope of a drain that must also cover o: a whole-node
// scope covers everything; GPU scopes add up, and their pod listings too
// (the earlier one's time, so a pod created in between is judged without
// them), as long as both are known and every GPU is named by its UUID
// (byUUID). Past maxScopeGPUs GPUs or
// maxScopePodBytes of listing it is the whole node, which drains every pod
// a GPU scope would and more (dropping only the listing would not: a pod
// listed but naming another GPU would be left), so the drain state stays
// bounded however many faults join.
func (s Scope) widen(o Scope) Scope {
	if len(s.GPUs) == 0 || len(o.GPUs) == 0 {
		return Scope{}
	}
	w := Scope{GPUs: slices.Clone(s.GPUs)}
	for _, g := range o.GPUs {
		if !slices.Contains(w.GPUs, g) {
			w.GPUs = append(w.GPUs, g)
		}
	}
	if len(w.GPUs) > maxScopeGPUs {
		return Scope{}
	}
	if s.GPUPods != nil && o.GPUPods != nil && byUUID(w.GPUs) {
		w.GPUPods = &PodList{Pods: slices.Clone(s.GPUPods.Pods), At: s.GPUPods.At}
		listed := make(map[string]bool, len(w.GPUPods.Pods)+len(o.GPUPods.Pods))
		for _, p := range w.GPUPods.Pods {
			listed[p] = true
		}
		for _, p := range o.GPUPods.Pods {
			if !listed[p] {
				listed[p] = true
				w.GPUPods.Pods = append(w.GPUPods.Pods, p)
			}
		}
		if b, _ := json.Marshal(w.GPUPods.Pods); len(b) > maxScopePodBytes {
			return Scope{}
		}
		if o.GPUPods.At.Before(w.GPUPods.At) {
			w.GPUPods.At = o.GPUPods.At
		}
	}
	return w
}

// byUUID reports whether every GPU of a scope is named by its UUID
// (events.IsGPUUUID): only then can a pod's GPUs, or the kubelet's listing,
// be matched with them.
func byUUID(gpus []string) bool {
	for _, g := range gpus {
		if !events.IsGPUUUID(g) {
			return false
		}
	}
	return true
}

// Trigger is the part of the triggering decision carried to the result.
type Trigger struct {
	EventIDs          []string `json:"eventIds,omitempty"`
	CheckName         string   `json:"checkName,omitempty"`
	RecommendedAction string   `json:"recommendedAction,omitempty"`
	CustomAction      string   `json:"customRecommendedAction,omitempty"`
	Entities          string   `json:"entities,omitempty"`
	// GeneratedAt is when the newest of the drain's faults was generated
	// (events.DetailGeneratedAt; zero when none said): remediate answers a
	// fault older than a remediation that succeeded with that one.
	GeneratedAt time.Time `json:"generatedAt,omitzero"`
}

// bounded is t as the state keeps it: the entity list bounded (the other
// fields are bounded by the gateway's limits on an event).
func (t Trigger) bounded() Trigger {
	t.Entities = events.BoundKey(t.Entities, maxTriggerEntities)
	return t
}

// remedyRank orders what remediations do: asking for none, resetting
// GPUs, a diagnostic or custom remediation (RUN_DCGMEUD, RUN_FIELDDIAG,
// CUSTOM, a value this faultline does not know), restarting the VM,
// restarting the bare-metal host, replacing the VM, escalating to
// support: each later one serves a fault asking for an earlier one (a
// reboot resets the GPUs; a node handed to support is not rebooted).
func remedyRank(action string) int {
	switch action {
	case "", datamodels.RecommendedAction_NONE.String(), datamodels.RecommendedAction_UNKNOWN.String():
		return 0
	case datamodels.RecommendedAction_COMPONENT_RESET.String():
		return 1
	case datamodels.RecommendedAction_RESTART_VM.String():
		return rankRestartVM
	case datamodels.RecommendedAction_RESTART_BM.String():
		return rankRestartBM
	case datamodels.RecommendedAction_REPLACE_VM.String():
		return 5
	case datamodels.RecommendedAction_CONTACT_SUPPORT.String():
		return 6
	}
	return rankDiagnostic
}

// remedyRank's ranks named here: a diagnostic or custom remediation;
// RESTART_VM, the least of those that act on the whole node; RESTART_BM.
const (
	rankDiagnostic = 2
	rankRestartVM  = 3
	rankRestartBM  = 4
)

// reboots reports whether remedyRank r is a reboot's (RESTART_VM,
// RESTART_BM): the machine stays, and a reboot neither runs a diagnostic
// nor flashes anything.
func reboots(r int) bool { return r == rankRestartVM || r == rankRestartBM }

// sameRemedy reports whether t and o ask remediate for the same thing.
func (t Trigger) sameRemedy(o Trigger) bool {
	return t.RecommendedAction == o.RecommendedAction && t.CustomAction == o.CustomAction
}

// serves reports whether a finished drain's trigger t serves a fault
// asking for o's remediation (State.covers): the same one, none, or less
// than a whole-node remediation (remedyRank from RESTART_VM) does — but a
// reboot serves no diagnostic or custom one (it runs no diagnostic and
// flashes nothing: such a fault arriving after the drain finished starts
// a drain of its own, though joining while it ran swallowed it,
// joinRemedy). A diagnostic or custom remediation serves no other:
// what it does is not known here.
func (t Trigger) serves(o Trigger) bool {
	r, ro := remedyRank(t.RecommendedAction), remedyRank(o.RecommendedAction)
	return t.sameRemedy(o) || ro == 0 || (r >= rankRestartVM && ro < r && !(ro == rankDiagnostic && reboots(r)))
}

// join is the trigger of a drain that fault o joined: the drain's one
// result must ask remediate for what each fault needs. A fault asking for
// less than the drain's trigger (remedyRank: nothing, where it asks for a
// reboot; a GPU's reset or a VM restart under a replacement or an
// escalation to support, a diagnostic or custom one under a reboot), or
// for another remediation of the same rank, leaves it; a GPU's reset
// joining a reset of other GPUs adds its
// entities, so the reset covers both (a reset naming no GPU resets them
// all); otherwise (more, or the same again) o's trigger takes its place.
// The event ids are the caller's.
func (t Trigger) join(o Trigger) Trigger {
	j := t.joinRemedy(o)
	if o.GeneratedAt.After(t.GeneratedAt) {
		j.GeneratedAt = o.GeneratedAt
	} else {
		j.GeneratedAt = t.GeneratedAt
	}
	return j
}

// joinRemedy is join without GeneratedAt.
func (t Trigger) joinRemedy(o Trigger) Trigger {
	r, ro := remedyRank(t.RecommendedAction), remedyRank(o.RecommendedAction)
	switch {
	case ro < r, ro == r && ro != 1 && !t.sameRemedy(o):
		// Less, or another remediation of the same rank (two
		// diagnostics, two custom ones): the drain's stays.
		return t
	case ro == 1 && r == 1:
		have := entityValues(t.Entities, events.EntityGPU)
		add := entityValues(o.Entities, events.EntityGPU)
		if len(have) == 0 || len(add) == 0 {
			// One of them resets every GPU of the node: that one.
			if len(have) == 0 {
				return t
			}
			return o.bounded()
		}
		parts := strings.Split(t.Entities, ",")
		for _, p := range strings.Split(o.Entities, ",") {
			if p != "" && !slices.Contains(parts, p) {
				parts = append(parts, p)
			}
		}
		if merged := strings.Join(parts, ","); len(merged) <= maxTriggerEntities {
			t.Entities = merged
		}
		return t
	}
	return o.bounded()
}

// PodState is one pod's progress.
type PodState struct {
	UID  string `json:"uid"`
	Mode Mode   `json:"mode"`
	// Deadline is when the mode's timeout runs out, counted from the step
	// that first saw the pod (the drain's start for the pods there then).
	Deadline time.Time `json:"deadline"`
	// EvictAt: faultline asked for the eviction (written before the call,
	// so a restart knows the pod was asked and counts it once).
	EvictAt time.Time `json:"evictAt,omitzero"`
	// Evicted: the Eviction API accepted.
	Evicted bool `json:"evicted,omitempty"`
	// DeletedAt: force-deleted (DeleteAfterTimeout, or force).
	DeletedAt time.Time `json:"deletedAt,omitzero"`
	// Unanswered: a call was asked for the pod (its intent written before
	// the call) and its side has not answered since: the call was not
	// made, or met the cluster's error (a 503, a timeout, throttling, an
	// RBAC 403). Set to the first such call's time; cleared by an answer
	// (accepted, or refused by a PDB, a webhook, a policy), which moves
	// the deadline out by the time it was unanswered (PodState.noteAnswer).
	// A pod unanswered is not given up at its deadline: it is asked again,
	// up to unansweredCap, and past it until a call made at or after the
	// cap meets the cluster's error again (UnansweredCall; then given up
	// "unanswered: <UnansweredErr>"). Cleared once the pod is done.
	Unanswered time.Time `json:"unanswered,omitzero"`
	// UnansweredErr: the last cluster's error its call met while
	// Unanswered (at most maxPodReason bytes).
	UnansweredErr string `json:"unansweredErr,omitempty"`
	// UnansweredCall: the time of the last call that met the cluster's
	// error while Unanswered. A pod is given up at its cap only if this
	// call was made at or after the cap: steps that failed before their
	// calls (an outage failing the pod list) never give it up unasked.
	UnansweredCall time.Time `json:"unansweredCall,omitzero"`
	// Attempts counts refused evictions; NextTry is when to try again.
	Attempts int       `json:"attempts,omitempty"`
	NextTry  time.Time `json:"nextTry,omitzero"`
	// BlockedBy names the PDB of the last refusal.
	BlockedBy string `json:"blockedBy,omitempty"`
	// BlockedAt is the time of the step that found BlockedBy (a new
	// blocker): the step whose blocked action named it.
	BlockedAt time.Time `json:"blockedAt,omitzero"`
	// Done: "gone" (no longer on the node), "completed" (phase Succeeded or
	// Failed), "skipped" (terminating more than
	// Config.SkipWaitForDeleteTimeout past its DeletionTimestamp: no
	// longer waited for) or "gave_up" (the mode's timeout ran out).
	Done   string `json:"done,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// ReadState decodes the node's drain state; nil when there is none. A
// corrupt annotation is an error (the caller starts afresh).
func ReadState(n *corev1.Node) (*State, error) {
	raw := n.Annotations[AnnotationState]
	if raw == "" {
		return nil, nil
	}
	st := &State{}
	if err := json.Unmarshal([]byte(raw), st); err != nil {
		return nil, fmt.Errorf("node %s: annotation %s: %w", n.Name, AnnotationState, err)
	}
	if st.Pods == nil {
		st.Pods = map[string]*PodState{}
	}
	// A null pod (the annotation edited by hand) is no pod: kept, every
	// walk of the pods would dereference it.
	maps.DeleteFunc(st.Pods, func(_ string, p *PodState) bool { return p == nil })
	return st, nil
}

func (s *State) running() bool { return s != nil && s.Phase == PhaseRunning }

func (s *State) seen(id string) bool { return s != nil && id != "" && slices.Contains(s.Seen, id) }

func (s *State) addSeen(id string) {
	if id == "" || slices.Contains(s.Seen, id) {
		return
	}
	s.Seen = append(s.Seen, id)
	if len(s.Seen) > maxSeen {
		s.Seen = s.Seen[len(s.Seen)-maxSeen:]
	}
}

// Counts summarises the pods of a drain; every pod counts once, by its
// key, however often the drain was resumed.
type Counts struct {
	InScope, Evicted, Deleted, Completed, Gone, GaveUp, Remaining, Blocked int
	// SkippedTerminating counts the pods done "skipped".
	SkippedTerminating int
}

// Count returns the drain's counts.
func (s *State) Count() Counts {
	f := s.Folded
	c := Counts{InScope: f.Pods, Evicted: f.Evicted, Deleted: f.Deleted, Completed: f.Completed, Gone: f.Gone,
		GaveUp: f.GaveUp, SkippedTerminating: f.Skipped}
	for _, p := range s.Pods {
		c.InScope++
		if p.Evicted {
			c.Evicted++
		}
		if !p.DeletedAt.IsZero() {
			c.Deleted++
		}
		switch p.Done {
		case "completed":
			c.Completed++
		case "gone":
			c.Gone++
		case "gave_up":
			c.GaveUp++
		case "skipped":
			c.SkippedTerminating++
		case "":
			c.Remaining++
			if p.BlockedBy != "" {
				c.Blocked++
			}
		}
	}
	return c
}

// skippedTerminating returns, sorted, the keys of the pods the drain
// stopped waiting for (Done "skipped").
func (s *State) skippedTerminating() []string {
	var out []string
	for k, p := range s.Pods {
		if p.Done == "skipped" {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// blockers returns the distinct PDBs holding pods that are not done.
func (s *State) blockers() []string {
	var out []string
	for _, p := range s.Pods {
		if p.Done == "" && p.BlockedBy != "" && !slices.Contains(out, p.BlockedBy) {
			out = append(out, p.BlockedBy)
		}
	}
	sort.Strings(out)
	return out
}

func (s *State) encode() string {
	b, _ := json.Marshal(s)
	return string(b)
}
