package quarantine

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/schemas/events"
)

// Keys faultline owns on a node. Everything else on the node is left as it
// is; these are the only keys faultline writes or removes.
const (
	// AnnotationState holds the JSON State: the faults standing on the node
	// and exactly what faultline set for them. It is the source of truth
	// that every replica reads and updates with optimistic concurrency.
	AnnotationState = "faultline.io/quarantine-state"
	// AnnotationReason says why (rule, check, agent, message), bounded.
	AnnotationReason = "faultline.io/quarantine-reason"
	// AnnotationBy says which processor quarantined the node.
	AnnotationBy = "faultline.io/quarantined-by"
	// AnnotationAt is when the quarantine began (RFC 3339).
	AnnotationAt = "faultline.io/quarantined-at"
	// AnnotationManualUncordon records when a person uncordoned the node
	// while faults stood; faultline then leaves those faults uncordoned.
	AnnotationManualUncordon = "faultline.io/manual-uncordon-at"
	// AnnotationOnsets holds State.History, the JSON of when each fault
	// began before, kept for flap_window after the fault was lifted
	// (flap.go): the only mark faultline leaves on a node where nothing
	// stands, and only while a fault of it may still be flapping.
	AnnotationOnsets = "faultline.io/quarantine-onsets"
	// AnnotationUnsaid holds State.Unsaid: the audit actions of writes that
	// nothing decides again (a recovery's lift, a stabilization lift, a
	// manual uncordon), written with the change they record and removed
	// once produced (unsaid.go).
	AnnotationUnsaid = "faultline.io/quarantine-unsaid"
	// AnnotationRecovered holds State.Recovered: when each lifted fault's
	// recovery was generated, kept for recovery_memory after the lift, so
	// that a late or repeated copy of an occurrence from before the
	// recovery does not quarantine the node again (recovered.go).
	AnnotationRecovered = "faultline.io/quarantine-recovered"
	// LabelQuarantined is "true" while a standing fault cordons or taints
	// the node (not for faults acknowledged by a manual uncordon); the
	// drain role reads it (events.LabelQuarantined).
	LabelQuarantined = events.LabelQuarantined
)

// Bounds of what faultline writes on a node. Kubernetes refuses an object
// whose annotations together exceed 256 KiB (and a refused update is not
// retried), so the state is bounded field by field and as a whole.
const (
	maxMessage  = 1024 // node condition message
	maxReason   = 512  // reason annotation
	maxEventIDs = 8    // event ids kept per fault
	maxFaults   = 64   // faults kept per node (State.trim)

	// A fault's identity: the check and the entity list, each kept as
	// events.BoundKey (itself when short and plain, else a prefix and a
	// hash of the whole), so a fault of 64 entities of 512-byte values
	// costs a few hundred bytes, not ~50 KB twice.
	maxCheckKey  = 128
	maxEntityKey = 256
	// Display fields of a fault.
	maxFaultText = 256 // message
	maxFaultName = 128 // agent, class, derivedBy, rule
	maxEventID   = 64  // one event id

	// MaxStateBytes is the hard budget of the AnnotationState JSON: half
	// of Kubernetes' limit for all annotations together, leaving room for
	// the drain's state and everyone else's annotations. State.Fit keeps
	// the state within it.
	MaxStateBytes = 128 << 10
)

// State is the quarantine state of one node, kept in AnnotationState.
type State struct {
	// Faults standing on the node, by FaultKey.
	Faults map[string]*Fault `json:"faults,omitempty"`
	// Cordoned: faultline set spec.unschedulable (it was not already set).
	Cordoned bool `json:"cordoned,omitempty"`
	// Taints faultline added (key and effect identify a taint).
	Taints []Taint `json:"taints,omitempty"`
	// Conditions are the condition types faultline set False.
	Conditions []string `json:"conditions,omitempty"`
	// Since is when the quarantine began: the first standing fault was
	// recorded, or an active one came back after a manual uncordon.
	Since time.Time `json:"since,omitzero"`
	// By is the processor that first quarantined the node.
	By string `json:"by,omitempty"`
	// ManualUncordonAt is when a person uncordoned the node while faults stood.
	ManualUncordonAt time.Time `json:"manualUncordonAt,omitzero"`
	// History is, by FaultKey, when the fault began before (earlier
	// episodes, lifted, and re-occurrences while it was stabilizing),
	// newest maxOnsets, kept for flap_window: what makes a fault flapping
	// (flap.go). It outlives the faults, so it has its own annotation
	// (AnnotationOnsets); with AnnotationState it stays within
	// MaxStateBytes.
	History map[string][]time.Time `json:"-"`
	// Unsaid are the actions (protojson) of lifts and manual uncordons
	// not yet produced, newest maxUnsaid, in their own annotation
	// (AnnotationUnsaid): nothing would decide them again, so the node
	// keeps them until they are on the actions topic.
	Unsaid []json.RawMessage `json:"-"`
	// Recovered is, by FaultKey, the recovery that last lifted the fault,
	// kept for recovery_memory in its own annotation (AnnotationRecovered):
	// an occurrence generated no later than it is a late or repeated copy
	// (recovered.go).
	Recovered map[string]Recovery `json:"-"`
	// Overflow: cordoning or tainting faults were dropped to keep the
	// state bounded (trim, Fit); it holds the node quarantined until a
	// person uncordons it (DetectManualUncordon), so the recovery of the
	// faults kept does not put a node with a fault nothing would lift back
	// in service.
	Overflow *Overflow `json:"overflow,omitempty"`
	// uncordoned: DetectManualUncordon acknowledged the faults since the
	// state was read (a fault added after it, in the same write, begins a
	// new quarantine though the node still has the label).
	uncordoned bool
	// dropped are the keys of the faults dropped since the state was read
	// (dropFault), for updateNode to count and log. Never stored.
	dropped []string
	// orphaned are condition types the node shows False with faultline's
	// message that no standing fault holds (orphanConditions): the
	// sweep's write sets them True (RenderConditions). Never stored.
	orphaned []string
}

// Overflow is what the cordoning and tainting faults dropped from a full
// state held: it cordons the node (whatever they did, so that a manual
// uncordon releases it) and keeps their taints.
type Overflow struct {
	// Dropped is how many were dropped.
	Dropped int     `json:"dropped"`
	Taints  []Taint `json:"taints,omitempty"`
}

// dropFault removes a standing fault to keep the state bounded; one that
// cordons or taints (not acknowledged) leaves the node held by Overflow.
func (s *State) dropFault(key string) {
	f := s.Faults[key]
	delete(s.Faults, key)
	s.dropped = append(s.dropped, key)
	if f == nil || f.Acked || !(f.Cordon || f.Taint != nil) {
		return
	}
	if s.Overflow == nil {
		s.Overflow = &Overflow{}
	}
	s.Overflow.Dropped++
	if f.Taint != nil && !slices.ContainsFunc(s.Overflow.Taints, func(t Taint) bool { return t.same(*f.Taint) }) {
		s.Overflow.Taints = append(s.Overflow.Taints, *f.Taint)
	}
}

// Fault is one standing fault: a check on an entity.
type Fault struct {
	Check   string    `json:"check"`
	Class   string    `json:"class,omitempty"`
	Entity  string    `json:"entity,omitempty"`
	Agent   string    `json:"agent,omitempty"`
	Rule    string    `json:"rule"`
	Message string    `json:"message,omitempty"`
	Derived string    `json:"derivedBy,omitempty"`
	Action  string    `json:"recommendedAction,omitempty"`
	Since   time.Time `json:"since"`
	// LastSeen is the generated time of the newest event of the fault; a
	// recovery generated before it does not lift the fault.
	LastSeen  time.Time `json:"lastSeen"`
	EventIDs  []string  `json:"eventIds,omitempty"`
	Cordon    bool      `json:"cordon,omitempty"`
	Taint     *Taint    `json:"taint,omitempty"`
	Condition bool      `json:"condition,omitempty"`
	// Acked: a person uncordoned the node while this fault stood, so it no
	// longer cordons or taints (its condition stays).
	Acked bool `json:"acked,omitempty"`
	// Flapping: a recovery found the fault flapping; it stays so until
	// it is lifted, so every recovery of it waits for the stabilization
	// window (flap.go).
	Flapping bool `json:"flapping,omitempty"`
	// RecoveredAt and LiftAt: the flapping fault recovered at
	// RecoveredAt; it stands (stabilizing) until LiftAt unless it occurs
	// again (flap.go).
	RecoveredAt time.Time `json:"recoveredAt,omitzero"`
	LiftAt      time.Time `json:"liftAt,omitzero"`
}

// FaultKey identifies a fault on a node: the check and the impacted
// entities ("XID_ERROR_48|GPU=GPU-1"), each bounded (events.BoundKey).
func FaultKey(check, entity string) string {
	return events.BoundKey(check, maxCheckKey) + "|" + events.BoundKey(entity, maxEntityKey)
}

// bound cuts a fault's fields to their bounds: the identity to its
// BoundKey stand-ins, the display fields to a prefix.
func (f *Fault) bound() {
	f.Check = events.BoundKey(f.Check, maxCheckKey)
	f.Entity = events.BoundKey(f.Entity, maxEntityKey)
	f.Message = events.Truncate(strings.ToValidUTF8(f.Message, "?"), maxFaultText)
	for _, p := range []*string{&f.Agent, &f.Class, &f.Derived, &f.Rule, &f.Action} {
		*p = events.Truncate(strings.ToValidUTF8(*p, "?"), maxFaultName)
	}
	for i, id := range f.EventIDs {
		f.EventIDs[i] = events.BoundKey(id, maxEventID)
	}
}

// sameIdentity reports whether a stored check or entity list is v (as
// stored now, a bounded stand-in, or in full by an older faultline).
func sameIdentity(stored, v string, n int) bool {
	return stored == v || stored == events.BoundKey(v, n)
}

// sameEntities reports whether a fault's stored entity list (an
// events.EntityKey, kept as the fault's event listed them) names the
// recovery's entities (events.EntityParts), in any order: an agent, or a
// person, may list the same entities in another order. A list stored as a
// bounded stand-in (longer than maxEntityKey, or with characters JSON
// escapes) is matched in the recovery's order only: its stand-in keeps
// a hash of the list as it came, not its parts.
func sameEntities(stored string, parts []string) bool {
	return sameIdentity(stored, strings.Join(parts, ","), maxEntityKey) || events.SameEntities(stored, parts)
}

// recovers reports whether a recovery of the entities parts clears a
// fault of the stored entity list: the same entities (sameEntities), or
// the recovery names NIC ports (events.EntityNICPort) and, without them,
// the fault's NIC entities: a healthy port says its device is there.
// NVSentinel's nic-health-monitor reports a vanished device as NIC=mlx5_0
// alone and, after the repair, sends healthy baselines per port only
// (NIC=mlx5_0, NICPort=1): before, that fault stood for good. The
// converse does not hold (a device's recovery says nothing of a port that
// is down), nor does it for any other entity: a healthy NVSwitch port
// (NVSwitch, GPU) says nothing of its switch needing a reset. A stored
// stand-in (events.IsBoundKey) keeps no parts: matched as it came only.
func recovers(stored string, parts []string) bool {
	if sameEntities(stored, parts) {
		return true
	}
	if events.IsBoundKey(stored) {
		return false
	}
	isPort := func(p string) bool { return strings.HasPrefix(p, events.EntityNICPort+"=") }
	device := slices.DeleteFunc(slices.Clone(parts), isPort)
	if len(device) == len(parts) || !slices.ContainsFunc(device, func(p string) bool { return strings.HasPrefix(p, events.EntityNIC+"=") }) {
		return false
	}
	return events.SameEntities(stored, device)
}

// ReadState decodes the node's state; a node without one gives an empty
// state. A corrupt annotation is an error (the caller starts afresh and
// says so); a corrupt AnnotationOnsets is dropped silently (it only damps
// flapping).
func ReadState(n *corev1.Node) (*State, error) {
	st := &State{Faults: map[string]*Fault{}}
	if raw := n.Annotations[AnnotationOnsets]; raw != "" {
		var h map[string][]time.Time
		if json.Unmarshal([]byte(raw), &h) == nil && len(h) > 0 {
			st.History = h
		}
	}
	if raw := n.Annotations[AnnotationUnsaid]; raw != "" {
		_ = json.Unmarshal([]byte(raw), &st.Unsaid) // corrupt: dropped (set by hand; only a record)
	}
	if raw := n.Annotations[AnnotationRecovered]; raw != "" {
		var r map[string]Recovery
		if json.Unmarshal([]byte(raw), &r) == nil && len(r) > 0 {
			st.Recovered = r // corrupt: dropped, as the onsets
		}
	}
	raw, ok := n.Annotations[AnnotationState]
	if !ok || raw == "" {
		return st, nil
	}
	if err := json.Unmarshal([]byte(raw), st); err != nil {
		return &State{Faults: map[string]*Fault{}, History: st.History, Unsaid: st.Unsaid, Recovered: st.Recovered}, fmt.Errorf("node %s: annotation %s: %w", n.Name, AnnotationState, err)
	}
	if st.Faults == nil {
		st.Faults = map[string]*Fault{}
	}
	// A null fault (the annotation edited by hand, or by whoever may write
	// the node's annotations) is no fault: kept, every walk of the faults
	// would dereference it.
	maps.DeleteFunc(st.Faults, func(_ string, f *Fault) bool { return f == nil })
	return st, nil
}

// Active reports whether some fault still cordons or taints, or dropped
// ones hold the node (Overflow).
func (s *State) Active() bool {
	if s.Overflow != nil {
		return true
	}
	for _, f := range s.Faults {
		if !f.Acked && (f.Cordon || f.Taint != nil) {
			return true
		}
	}
	return false
}

// AddFault records a fault occurrence; it reports whether the state
// changed (false when this event id was already recorded). An occurrence
// of a standing fault never weakens it (Fault.strengthen).
func (s *State) AddFault(key string, f Fault, eventID string) bool {
	if eventID != "" {
		eventID = events.BoundKey(eventID, maxEventID)
	}
	f.bound()
	old, ok := s.Faults[key]
	if !ok {
		if eventID != "" {
			f.EventIDs = []string{eventID}
		}
		s.Faults[key] = &f
		s.trim(key)
		return true
	}
	if eventID != "" && slices.Contains(old.EventIDs, eventID) {
		return false
	}
	if old.Stabilizing() && f.LastSeen.After(old.RecoveredAt) {
		// It occurred again while stabilizing: the pending lift is
		// cancelled and the occurrence counts as a new onset.
		old.RecoveredAt, old.LiftAt = time.Time{}, time.Time{}
		s.addOnset(key, f.LastSeen)
	}
	if eventID != "" {
		old.EventIDs = append(old.EventIDs, eventID)
		if len(old.EventIDs) > maxEventIDs {
			old.EventIDs = old.EventIDs[len(old.EventIDs)-maxEventIDs:]
		}
	}
	if f.LastSeen.After(old.LastSeen) {
		old.LastSeen = f.LastSeen
	}
	old.strengthen(f)
	return true
}

// strengthen takes another occurrence's decision into a standing fault
// without ever weakening it: the fault key has no error code, so a
// non-fatal Xid on a GPU (a rule that only taints PreferNoSchedule) is the
// same fault as the fatal one that cordoned it, and taking its decision
// would uncordon the node while the fatal one stands. The cordon and the
// condition are either's, the taint the stronger (taintRank); the rule and
// message are the occurrence's when its decision holds at least all the
// fault's did, else the fault's stay (they name what holds the node).
// Only a recovery lifts the fault.
func (f *Fault) strengthen(o Fault) {
	covers := (o.Cordon || !f.Cordon) && (o.Condition || !f.Condition) && taintRank(o.Taint) >= taintRank(f.Taint)
	if covers {
		f.Message, f.Rule, f.Taint = o.Message, o.Rule, o.Taint
	} else if taintRank(o.Taint) > taintRank(f.Taint) {
		f.Taint = o.Taint
	}
	f.Cordon, f.Condition = f.Cordon || o.Cordon, f.Condition || o.Condition
}

// taintRank orders taints by what they keep off the node: none,
// PreferNoSchedule, NoSchedule, NoExecute.
func taintRank(t *Taint) int {
	if t == nil {
		return 0
	}
	switch corev1.TaintEffect(t.Effect) {
	case corev1.TaintEffectNoExecute:
		return 3
	case corev1.TaintEffectNoSchedule:
		return 2
	}
	return 1
}

// Repeats reports whether f is another occurrence of a fault that stands
// (acknowledged or not: an occurrence leaves an acknowledgement as it is)
// that would leave it deciding exactly as it does (rule, cordon, taint,
// condition, message: the same decision, or a weaker one that
// Fault.strengthen leaves out), at most within after its last recorded
// occurrence: recording it would change nothing on the node but its
// bookkeeping.
func (s *State) Repeats(key string, f Fault, within time.Duration) bool {
	old, ok := s.Faults[key]
	if !ok || old.Stabilizing() {
		return false // a stabilizing fault's occurrence cancels its lift: written
	}
	f.bound()
	g := *old
	g.strengthen(f)
	sameTaint := (old.Taint == nil) == (g.Taint == nil) && (old.Taint == nil || *old.Taint == *g.Taint)
	return sameTaint && old.Rule == g.Rule && old.Cordon == g.Cordon && old.Condition == g.Condition &&
		old.Message == g.Message && f.LastSeen.Sub(old.LastSeen) < within
}

// trim drops faults beyond maxFaults, least valuable first as Fit does:
// acknowledged ones, then those that neither cordon nor taint, then the
// others, each oldest first; never added, the fault just recorded (an
// occurrence older than every standing fault, a late event or an agent's
// clock behind, still counts). A cordoning or tainting fault dropped
// leaves the node held (Overflow).
func (s *State) trim(added string) {
	if len(s.Faults) <= maxFaults {
		return
	}
	keys := slices.DeleteFunc(s.keys(), func(k string) bool { return k == added })
	rank := func(f *Fault) int {
		switch {
		case f.Acked:
			return 0
		case !(f.Cordon || f.Taint != nil):
			return 1
		}
		return 2
	}
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := s.Faults[keys[i]], s.Faults[keys[j]]
		if rank(a) != rank(b) {
			return rank(a) < rank(b)
		}
		return a.LastSeen.Before(b.LastSeen)
	})
	for _, k := range keys[:len(s.Faults)-maxFaults] {
		s.dropFault(k)
	}
}

func (s *State) keys() []string {
	keys := make([]string, 0, len(s.Faults))
	for k := range s.Faults {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// FitReport is what State.Fit did to stay within its budget.
type FitReport struct {
	// Dropped are the keys of faults removed, Compacted how many faults
	// lost their message, agent and older event ids.
	Dropped   []string
	Compacted int
	// Bytes is the state's JSON size afterwards.
	Bytes int
}

// Fit keeps the state's JSON within budget bytes, least valuable first:
// it drops acknowledged faults (a person already uncordoned the node for
// them), oldest first; then compacts faults, oldest first (message, agent
// and all but the newest event id go; check and entities, the identity a
// recovery matches, stay); then drops the oldest faults that neither cordon
// nor taint; then the oldest cordoning faults, never the newest one, so a
// quarantined node stays quarantined (and a dropped one leaves it held:
// Overflow). With the field bounds the first two
// steps always suffice for maxFaults faults of the largest events the
// gateway accepts; the last two are the guarantee.
func (s *State) Fit(budget int) FitReport {
	var rep FitReport
	size := func() int {
		b, _ := json.Marshal(s)
		n := len(b)
		if len(s.History) > 0 {
			h, _ := json.Marshal(s.History)
			n += len(h)
		}
		if len(s.Recovered) > 0 {
			r, _ := json.Marshal(s.Recovered)
			n += len(r)
		}
		return n
	}
	rep.Bytes = size()
	if rep.Bytes <= budget {
		return rep
	}
	byAge := func(keep func(*Fault) bool) []string {
		var ks []string
		for _, k := range s.keys() {
			if keep(s.Faults[k]) {
				ks = append(ks, k)
			}
		}
		sort.SliceStable(ks, func(i, j int) bool { return s.Faults[ks[i]].LastSeen.Before(s.Faults[ks[j]].LastSeen) })
		return ks
	}
	drop := func(keys []string, spare int) {
		for _, k := range keys[:max(len(keys)-spare, 0)] {
			if rep.Bytes <= budget {
				return
			}
			s.dropFault(k)
			rep.Dropped = append(rep.Dropped, k)
			rep.Bytes = size()
		}
	}
	// Remembered recoveries go first, oldest first: they only guard
	// against late copies; then the onsets of faults no longer standing:
	// they only damp the next flaps.
	for _, k := range s.recoveredByAge() {
		if rep.Bytes <= budget {
			break
		}
		delete(s.Recovered, k)
		rep.Bytes = size()
	}
	for _, k := range s.historyByAge() {
		if rep.Bytes <= budget {
			break
		}
		delete(s.History, k)
		rep.Bytes = size()
	}
	drop(byAge(func(f *Fault) bool { return f.Acked }), 0)
	for _, k := range byAge(func(*Fault) bool { return true }) {
		if rep.Bytes <= budget {
			break
		}
		f := s.Faults[k]
		if f.Message == "" && f.Agent == "" && len(f.EventIDs) <= 1 {
			continue
		}
		f.Message, f.Agent = "", ""
		if len(f.EventIDs) > 1 {
			f.EventIDs = f.EventIDs[len(f.EventIDs)-1:]
		}
		rep.Compacted++
		rep.Bytes = size()
	}
	drop(byAge(func(f *Fault) bool { return f.Acked || !(f.Cordon || f.Taint != nil) }), 0)
	drop(byAge(func(*Fault) bool { return true }), 1)
	return rep
}

// Recover removes the faults a healthy event clears: the same check on the
// same entities (events.EntityParts; in any order: sameEntities) or on the
// NIC device of a healthy port (recovers), or every entity of the check
// when the event names none. A fault last seen after
// the recovery was generated stays (the recovery is stale). It returns the
// removed keys and the stale ones.
func (s *State) Recover(check string, entities []string, at time.Time) (removed, stale []string) {
	for _, k := range s.keys() {
		f := s.Faults[k]
		if !sameIdentity(f.Check, check, maxCheckKey) || (len(entities) > 0 && !recovers(f.Entity, entities)) {
			continue
		}
		if !at.IsZero() && at.Before(f.LastSeen) {
			stale = append(stale, k)
			continue
		}
		delete(s.Faults, k)
		removed = append(removed, k)
	}
	return removed, stale
}

// DetectManualUncordon reports whether a person uncordoned a node that
// faultline cordoned: the state says faultline cordoned it, the node is
// schedulable. The standing faults are acknowledged (they no longer cordon
// or taint), so is the hold of dropped ones (Overflow), and the time
// recorded.
func (s *State) DetectManualUncordon(n *corev1.Node, now time.Time) bool {
	if !s.Cordoned || n.Spec.Unschedulable {
		return false
	}
	s.Cordoned = false
	s.ManualUncordonAt = now
	s.uncordoned = true
	s.Overflow = nil
	for _, f := range s.Faults {
		f.Acked = true
	}
	return true
}

// RenderObject makes the node's metadata and spec say what the state says,
// touching only what faultline owns: it cordons when an active fault wants
// it and the node is schedulable (and remembers that it did); it uncordons
// only a cordon it set; it adds and removes only its own taints, never one
// that was there before; labels and annotations are faultline's keys. It
// reports whether the node changed.
func RenderObject(n *corev1.Node, s *State, by string, now time.Time) bool {
	before := n.DeepCopy()
	wantCordon := false
	var wantTaints []Taint
	for _, k := range s.keys() {
		f := s.Faults[k]
		if f.Acked {
			continue
		}
		wantCordon = wantCordon || f.Cordon
		if f.Taint != nil && !slices.ContainsFunc(wantTaints, func(t Taint) bool { return t.same(*f.Taint) }) {
			wantTaints = append(wantTaints, *f.Taint)
		}
	}
	if s.Overflow != nil {
		wantCordon = true
		for _, t := range s.Overflow.Taints {
			if !slices.ContainsFunc(wantTaints, func(w Taint) bool { return w.same(t) }) {
				wantTaints = append(wantTaints, t)
			}
		}
	}
	switch {
	case wantCordon && !n.Spec.Unschedulable:
		n.Spec.Unschedulable = true
		s.Cordoned = true
	case !wantCordon && s.Cordoned:
		n.Spec.Unschedulable = false
		s.Cordoned = false
	}
	// Taints: drop ours that are no longer wanted, add wanted ones that are
	// missing, and update the value of ours.
	var owned []Taint
	for _, t := range s.Taints {
		if slices.ContainsFunc(wantTaints, func(w Taint) bool { return w.same(t) }) {
			owned = append(owned, t)
			continue
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(nt corev1.Taint) bool { return t.matches(nt) })
	}
	for _, w := range wantTaints {
		i := slices.IndexFunc(n.Spec.Taints, func(nt corev1.Taint) bool { return w.matches(nt) })
		isOwned := slices.ContainsFunc(owned, func(t Taint) bool { return t.same(w) })
		switch {
		case i < 0:
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: w.Key, Value: w.Value, Effect: corev1.TaintEffect(w.Effect)})
			if !isOwned {
				owned = append(owned, w)
			}
		case isOwned && n.Spec.Taints[i].Value != w.Value:
			n.Spec.Taints[i].Value = w.Value
		}
		// Present and not ours: someone else's taint with the same key and
		// effect; it stays theirs.
	}
	for i := range owned {
		for _, w := range wantTaints {
			if owned[i].same(w) {
				owned[i].Value = w.Value
			}
		}
	}
	s.Taints = owned

	if len(s.Faults) == 0 && s.Overflow == nil {
		for _, k := range []string{AnnotationState, AnnotationReason, AnnotationBy, AnnotationAt, AnnotationManualUncordon} {
			delete(n.Annotations, k)
		}
		delete(n.Labels, LabelQuarantined)
	} else {
		// A quarantine begins now when none was (Since zero), and again
		// when an active fault comes back to a node a person uncordoned
		// (its acknowledged faults kept the old Since; the uncordon noticed
		// in this very write, or before it: no label): the drain and the
		// janitor read quarantined-at to tell a drain of this quarantine
		// from one of before the uncordon (a whole-node drain of then is
		// no drain of a node back in service since).
		if s.Since.IsZero() || (s.Active() && (n.Labels[LabelQuarantined] != "true" || s.uncordoned)) {
			s.Since = now
			s.By = by
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		// The label says faultline holds the node out of scheduling (drain
		// keys on it); faults acknowledged by a manual uncordon do not.
		if s.Active() {
			n.Labels[LabelQuarantined] = "true"
		} else {
			delete(n.Labels, LabelQuarantined)
		}
		n.Annotations[AnnotationReason] = s.reason()
		n.Annotations[AnnotationBy] = s.By
		n.Annotations[AnnotationAt] = s.Since.UTC().Format(time.RFC3339)
		if !s.ManualUncordonAt.IsZero() {
			n.Annotations[AnnotationManualUncordon] = s.ManualUncordonAt.UTC().Format(time.RFC3339)
		}
		b, _ := json.Marshal(s)
		n.Annotations[AnnotationState] = string(b)
	}
	// The onsets of faults, standing or lifted, for flap_window (flap.go),
	// and the actions not yet produced (unsaid.go).
	setJSONAnnotation(n, AnnotationOnsets, s.History, len(s.History) == 0)
	setJSONAnnotation(n, AnnotationUnsaid, s.Unsaid, len(s.Unsaid) == 0)
	s.pruneRecovered(now)
	setJSONAnnotation(n, AnnotationRecovered, s.Recovered, len(s.Recovered) == 0)
	return !equalObject(before, n)
}

// setJSONAnnotation writes v's JSON as the node's annotation key, or
// removes the key when empty.
func setJSONAnnotation(n *corev1.Node, key string, v any, empty bool) {
	if empty {
		delete(n.Annotations, key)
		return
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	b, _ := json.Marshal(v)
	n.Annotations[key] = string(b)
}

func equalObject(a, b *corev1.Node) bool {
	return a.Spec.Unschedulable == b.Spec.Unschedulable &&
		slices.EqualFunc(a.Spec.Taints, b.Spec.Taints, sameTaint) &&
		mapsEqual(a.Labels, b.Labels) && mapsEqual(a.Annotations, b.Annotations)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// reason is the human summary of the standing faults, bounded.
func (s *State) reason() string {
	var parts []string
	for _, k := range s.keys() {
		f := s.Faults[k]
		p := fmt.Sprintf("rule=%s check=%s", f.Rule, f.Check)
		if f.Entity != "" {
			p += " entity=" + f.Entity
		}
		if f.Agent != "" {
			p += " agent=" + f.Agent
		}
		if f.Acked {
			p += " (acknowledged by manual uncordon)"
		}
		if f.Stabilizing() {
			p += " (flapping: recovered, stabilizing until " + f.LiftAt.UTC().Format(time.RFC3339) + ")"
		}
		parts = append(parts, p)
	}
	if s.Overflow != nil {
		parts = append([]string{fmt.Sprintf("%d cordoning faults dropped (more than %d standing): held until a manual uncordon", s.Overflow.Dropped, maxFaults)}, parts...)
	}
	return events.Truncate(strings.Join(parts, "; "), maxReason)
}

// RenderConditions sets one condition per component class: False while a
// fault of the class with Condition stands (reason: the newest fault's check
// in CamelCase; message: the faults' messages, bounded), True again for a
// class faultline had set False whose faults all recovered. Conditions of
// other types are untouched. It reports whether the status changed.
func RenderConditions(n *corev1.Node, s *State, now time.Time) bool {
	type agg struct {
		newest *Fault
		msgs   []string
	}
	byType := map[string]*agg{}
	for _, k := range s.keys() {
		f := s.Faults[k]
		if !f.Condition {
			continue
		}
		t := ConditionType(f.Class)
		a := byType[t]
		if a == nil {
			a = &agg{}
			byType[t] = a
		}
		if a.newest == nil || f.LastSeen.After(a.newest.LastSeen) {
			a.newest = f
		}
		m := f.Check
		if f.Entity != "" {
			m += " on " + f.Entity
		}
		if f.Stabilizing() {
			m += " (flapping: recovered at " + f.RecoveredAt.UTC().Format(time.RFC3339) +
				", stabilizing until " + f.LiftAt.UTC().Format(time.RFC3339) + " unless it recurs)"
		}
		if f.Message != "" {
			m += ": " + f.Message
		}
		a.msgs = append(a.msgs, m)
	}
	changed := false
	var managed []string
	for t, a := range byType {
		managed = append(managed, t)
		msg := events.Truncate(conditionPrefix+strings.Join(a.msgs, "; "), maxMessage)
		changed = setCondition(n, corev1.NodeCondition{
			Type: corev1.NodeConditionType(t), Status: corev1.ConditionFalse,
			Reason: CamelCase(a.newest.Check), Message: msg,
		}, now) || changed
	}
	for _, t := range s.Conditions {
		if _, ok := byType[t]; ok {
			continue
		}
		changed = setCondition(n, corev1.NodeCondition{
			Type: corev1.NodeConditionType(t), Status: corev1.ConditionTrue,
			Reason: "FaultsRecovered", Message: conditionPrefix + "every fault of this component recovered",
		}, now) || changed
	}
	for _, t := range s.orphaned {
		if _, ok := byType[t]; ok || slices.Contains(s.Conditions, t) {
			continue
		}
		changed = setCondition(n, corev1.NodeCondition{
			Type: corev1.NodeConditionType(t), Status: corev1.ConditionTrue,
			Reason: "NoFaultStanding", Message: conditionPrefix + "no fault of this component stands: the quarantine that set this condition False was not applied",
		}, now) || changed
	}
	s.orphaned = nil
	sort.Strings(managed)
	s.Conditions = managed
	return changed
}

// orphanConditions returns the condition types n shows False with
// faultline's message that no fault of s holds, last written at least
// grace before now: the condition is written (nodes/status) before the
// state that records it (the object), so an apply whose object patch never
// landed — refused for good, deferred and then held by the breaker or
// decided otherwise, its process killed between the two — leaves one on a
// node faultline does not quarantine, and nothing else would lift it. The
// grace (a batch's bound) keeps an apply still in flight out: its object
// patch carries the resourceVersion of its status patch, so a write that
// set such a condition True in between would be refused and the apply
// redone, writing it False again, but the condition would flicker.
func (s *State) orphanConditions(n *corev1.Node, now time.Time, grace time.Duration) []string {
	var out []string
	for _, c := range n.Status.Conditions {
		if c.Status != corev1.ConditionFalse || !strings.HasPrefix(c.Message, conditionPrefix) ||
			now.Sub(c.LastHeartbeatTime.Time) < grace || s.holdsCondition(string(c.Type)) {
			continue
		}
		out = append(out, string(c.Type))
	}
	return out
}

// holdsCondition reports whether a standing fault (acknowledged and
// stabilizing ones included) sets condition type t False.
func (s *State) holdsCondition(t string) bool {
	for _, f := range s.Faults {
		if f.Condition && ConditionType(f.Class) == t {
			return true
		}
	}
	return false
}

// conditionPrefix starts the message of every condition faultline sets: the
// node watch keeps those conditions (and no others).
const conditionPrefix = "faultline: "

func setCondition(n *corev1.Node, c corev1.NodeCondition, now time.Time) bool {
	ts := metav1.NewTime(now)
	for i := range n.Status.Conditions {
		old := &n.Status.Conditions[i]
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			return false
		}
		if old.Status != c.Status {
			old.LastTransitionTime = ts
		}
		old.Status, old.Reason, old.Message, old.LastHeartbeatTime = c.Status, c.Reason, c.Message, ts
		return true
	}
	c.LastTransitionTime, c.LastHeartbeatTime = ts, ts
	n.Status.Conditions = append(n.Status.Conditions, c)
	return true
}

// ConditionType is the node condition of a component class: "GPUHealthy",
// "NICHealthy"; "NodeHealthy" when the class is empty.
func ConditionType(class string) string {
	c := CamelCase(class)
	if class != "" && strings.ToUpper(class) == class && len(class) <= 6 {
		c = class // keep acronyms: GPU, NIC, CPU, NVLINK
	}
	if c == "" || c == "Check" {
		c = "Node"
	}
	return c + "Healthy"
}

// CamelCase turns a check name into a condition reason: "XID_ERROR_48" →
// "XidError48", "nic-link-flap" → "NicLinkFlap"; names already in
// CamelCase are kept. The result starts with a letter, is at most 128
// characters, and is "Check" when nothing is left.
func CamelCase(s string) string {
	var b strings.Builder
	for _, part := range strings.FieldsFunc(s, func(r rune) bool {
		return !(r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)))
	}) {
		allUpper := strings.ToUpper(part) == part
		for i, r := range part {
			switch {
			case i == 0:
				b.WriteRune(unicode.ToUpper(r))
			case allUpper:
				b.WriteRune(unicode.ToLower(r))
			default:
				b.WriteRune(r)
			}
		}
	}
	out := b.String()
	if out == "" {
		return "Check"
	}
	if !unicode.IsLetter(rune(out[0])) {
		out = "Check" + out
	}
	return events.Truncate(out, 128)
}

func (t Taint) same(o Taint) bool { return t.Key == o.Key && t.Effect == o.Effect }

func (t Taint) matches(nt corev1.Taint) bool {
	return t.Key == nt.Key && t.Effect == string(nt.Effect)
}
