package drain

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/faultline/faultline/schemas/events"
)

// The drain as a state machine. Each function here takes the drain's
// State, what was read from the cluster (the node's labels, its pods) and
// the time, and changes the State and returns what to do next; none makes
// an API call. Handler.stepOnce reads the node and its pods, calls them,
// writes the State and makes the calls they return.

// admission is what a trigger does to a node's drain.
type admission int

const (
	// admitReplay: the trigger of a finished drain came again; the step
	// says the drain's result again.
	admitReplay admission = iota
	// admitResume: the trigger of the drain in progress; the step goes on.
	admitResume
	// admitSkip: drainOverrides.skip; no drain.
	admitSkip
	// admitWiden: a second fault during a drain widened its scope.
	admitWiden
	// admitUnquarantined: the node is no longer quarantined; no drain.
	admitUnquarantined
	// admitCovered: the fault is covered by the drain that finished last
	// (State.covers); no drain, nothing written.
	admitCovered
	// admitStart: a new drain began.
	admitStart
	// admitEnded: the record follows a drain (HeaderDrain) that a newer
	// one replaced on the node; its work is over, nothing is done.
	admitEnded
)

// admit decides what a trigger (its event id and options) does to the
// node's drain st (nil when the node has none, or it was unreadable): it
// returns the state to go on with and what happened. quarantined is the
// node's quarantine label; id is the new drain's id; by is this processor.
//
// A record that names the drain it was admitted to (o.drain: a requeue
// record of a fault that started, joined or resumed a drain) follows that
// drain, whatever Seen still holds: it resumes it while it runs, says its
// result again once it finished, and ends when a newer drain replaced it
// (which serves the faults since; the record's fault was served by its
// own). Seen keeps maxSeen ids: with more faults joining one drain, each
// with its requeue chain, a chain whose id dropped out was taken for a
// new fault — it joined the drain again, pushing another chain's id out,
// and once the drain finished it started a new one. Only a record
// without a drain (a first look; a requeue from before a step admitted
// it, or from an older faultline), or one whose node has no drain state
// left (removed, or unreadable: started afresh, as any trigger would),
// is judged by Seen.
func admit(st *State, eventID string, o opts, quarantined bool, now time.Time, id, by string) (*State, admission) {
	follows := o.drain != "" && st != nil
	switch {
	case follows && st.ID != o.drain:
		return st, admitEnded
	case (follows || st.seen(eventID)) && !st.running():
		return st, admitReplay
	case follows || st.seen(eventID):
		return st, admitResume
	case o.skip:
		return st, admitSkip
	case st.running():
		// A second fault during a drain: widen the scope (a whole-node
		// drain covers any GPU), never start over.
		st.addSeen(eventID)
		st.Trigger.EventIDs = append(st.Trigger.EventIDs, eventID)
		if len(st.Trigger.EventIDs) > maxSeen {
			st.Trigger.EventIDs = st.Trigger.EventIDs[len(st.Trigger.EventIDs)-maxSeen:]
		}
		ids := st.Trigger.EventIDs
		st.Trigger = st.Trigger.join(o.trig)
		st.Trigger.EventIDs = ids
		if w := st.Scope.widen(o.scope); !reflect.DeepEqual(w, st.Scope) {
			// The pods it brings in get their whole timeout
			// (Config.advance); a repeat of a fault already in scope
			// moves nothing.
			st.Scope, st.ScopeAt = w, now
		}
		if o.force && !st.Force {
			// Forced from now: a pod backing off after a refusal is tried
			// at this step, a PDB's refusal answered with the delete.
			for _, ps := range st.Pods {
				if ps.Done == "" {
					ps.NextTry = time.Time{}
				}
			}
		}
		st.Force = st.Force || o.force
		return st, admitWiden
	case !quarantined:
		return st, admitUnquarantined
	case st.covers(o):
		return st, admitCovered
	}
	var seen []string
	if st != nil {
		seen = st.Seen
	}
	scope := o.scope
	if st.drainedNode(o) {
		// The union of the whole node and o's GPUs is the whole node.
		scope = Scope{}
	}
	next := &State{
		ID: id, Phase: PhaseRunning, StartedAt: now, ScopeAt: now, By: by,
		Scope: scope, Force: o.force, Trigger: o.trig.bounded(), Seen: seen, Pods: map[string]*PodState{},
	}
	next.addSeen(eventID)
	return next, admitStart
}

// covers reports whether the drain st, finished, already did what a new
// drain for o would: it succeeded after o's fault was generated or its
// quarantine was decided (before), on a node already quarantined (so its
// last look at the pods came after the fault, and the node stayed
// quarantined since: a lift and a new quarantine in between would have
// started a drain of their own, earlier on the node's partition), over a
// scope that holds o's, with a remediation that serves o's (the same, or
// a whole-node one that outranks it: Trigger.serves) and no force it
// lacked. Such a fault joins that drain's remediation instead of
// draining the node again: a GPU repeating a fatal Xid while an outage
// held its quarantine back; an Xid flood's repeats generated before the
// remediation's reboot (which follows the drain's end) and sent from the
// agent's spool once the node was back, decided after the drain finished
// — each of them drained the rebooted node again. The times are three
// clocks (the agent's, the quarantine's, the drain's): a skew between
// them shifts the bound by as much.
func (s *State) covers(o opts) bool {
	return s != nil && s.Phase == PhaseSucceeded && o.already && s.ofQuarantine(o) && s.finishedAfter(o) &&
		s.Scope.holds(o.scope) && (s.Force || !o.force) && s.Trigger.serves(o.trig)
}

// ofQuarantine reports whether the drain st finished no earlier than the
// quarantine o's fault found standing began (o.since, when the node says;
// within quarantineSlack, as the janitor judges it). A node a person
// uncordoned keeps its acknowledged faults (o.already), and a fault
// coming back begins a new quarantine: a drain of before the uncordon is
// not of it (it covered a late fault generated before it finished, and
// the pods scheduled since the uncordon stayed on the node, cordoned
// again, with nothing to remediate it).
func (s *State) ofQuarantine(o opts) bool {
	return o.since.IsZero() || !o.since.After(s.FinishedAt.Add(quarantineSlack))
}

// quarantineSlack is how far a drain's finish may seem to precede the
// quarantine it drained for: the two times are two processors' clocks
// (the janitor's drainSlack).
const quarantineSlack = time.Minute

// drainedNode reports whether the drain st, finished, drained the whole
// node (succeeded or gave up) in the quarantine o's fault found standing:
// o came on a node already quarantined, and st finished no earlier than
// that quarantine began (o.since, when the node says; within
// quarantineSlack, as the janitor judges it). A new drain for o then
// keeps the whole node as its scope: the node's drain state is what the
// janitor reads before a reboot or terminate, and a GPU-scoped state
// there refuses them (a partial drain). A COMPONENT_RESET arriving while
// the RebootNode of the node's whole-node fault waited for its slot or
// cooldown narrowed the state to its GPUs, and the janitor handed the
// drained node to a human instead of rebooting it. A whole-node drain of
// a node drained since it was cordoned finds little to evict (what was
// bound to it since, what the drain that gave up left); one that gave up
// counts for the janitor as drained too, so it is kept as well.
func (s *State) drainedNode(o opts) bool {
	return s != nil && (s.Phase == PhaseSucceeded || s.Phase == PhaseGaveUp) && len(s.GPUs) == 0 && o.already && s.ofQuarantine(o)
}

// finishedAfter reports whether the drain st finished no earlier than o's
// fault was generated (when it says) or its quarantine was decided.
func (s *State) finishedAfter(o opts) bool {
	return s.generatedBefore(o) || (!o.decidedAt.IsZero() && !o.decidedAt.After(s.FinishedAt))
}

// generatedBefore reports whether o's fault was generated (it says when)
// no later than the drain st finished.
func (s *State) generatedBefore(o opts) bool {
	return !o.trig.GeneratedAt.IsZero() && !o.trig.GeneratedAt.After(s.FinishedAt)
}

// cancel ends a running drain whose node is no longer quarantined.
func cancel(st *State, now time.Time) {
	st.Phase, st.FinishedAt = PhaseCancelled, now
}

// op is one API call a step makes on a pod.
type op struct {
	key    string
	pod    *corev1.Pod
	delete bool
}

func podKey(p *corev1.Pod) string {
	uid := string(p.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return p.Namespace + "/" + p.Name + "@" + uid
}

// advance moves each pod of the drain on, given the pods on the node now: a
// pod seen for the first time is classified (in scope with its mode and
// deadline, its mode's timeout from now but no later than that timeout
// and EvictionTimeout past State.ScopeAt — or, a pod back under the same
// name, its first copy's deadline, the earlier copies folded — or counted
// as skipped); in a
// forced drain, one classified before the force joined and not done is
// made Immediate, its eviction timeout from now; one that finished is
// done; one
// terminating more than SkipWaitForDeleteTimeout past its DeletionTimestamp
// is no longer waited for (done "skipped", skipWait); one whose deadline
// passed is given up (DeleteAfterTimeout: deleted, a refused delete tried
// again after the pod's backoff, and given up EvictionTimeout after its
// deadline if it is still there) — but never while its last call is
// unanswered (PodState.Unanswered: not made, or met the cluster's error):
// such a pod is asked again, not given up, up to unansweredCap past the
// time it would have been, and past it until a call made at or after the
// cap met the cluster's error again (PodState.UnansweredCall; then given
// up "unanswered: <the error>"); a pod
// no longer on the node is gone
// (past maxGonePods gone entries, the earliest are folded). It returns the calls to make — evictions of
// pods due for one (not terminating, not waiting to complete, not backing
// off after a PDB refusal) and deletions — with each eviction's intent
// (EvictAt) recorded first, so a restart after the calls counts each pod
// once, and each call Unanswered until its answer is recorded.
func (c *Config) advance(st *State, pods []corev1.Pod, now time.Time) []op {
	present := map[string]bool{}
	skipped := map[string]int{}
	var ops []op
	if st.ScopeAt.IsZero() {
		// A state from before ScopeAt: bounded from now, never giving
		// a pod up unasked for the upgrade.
		st.ScopeAt = now
	}
	for i := range pods {
		p := &pods[i]
		key := podKey(p)
		present[key] = true
		ps := st.Pods[key]
		if ps == nil {
			pl := c.classify(p, st.Scope, st.Force)
			if pl.skip != "" {
				skipped[pl.skip]++
				continue
			}
			// The timeout counts from now, when the drain first sees the
			// pod: the drain's start for the pods there then, later for a
			// pod the drain's scope took in when a fault joined, or one
			// bound to the node since. Counted from the start, such a pod
			// could be past its deadline at once: given up, or deleted,
			// without an eviction tried. The deadline is kept in the
			// state, written by this step, so it is counted once.
			ps = &PodState{UID: string(p.UID), Mode: pl.mode, Deadline: now.Add(pl.timeout)}
			// But no later than its timeout and eviction_timeout past
			// the scope's last change: a controller whose replacement
			// lands on the cordoned node under a new name (a Deployment
			// tolerating every taint, spec.nodeName set) gave each a
			// fresh timeout, and the drain evicted one every poll for
			// ever. Past that bound a newcomer is past its deadline
			// when first seen, as a same-name copy past the first's is.
			if bound := st.ScopeAt.Add(pl.timeout + c.EvictionTimeout); ps.Deadline.After(bound) {
				ps.Deadline = bound
			}
			// A pod back under the same name (a controller recreating
			// it on the cordoned node: a StatefulSet pinned by a local
			// volume, a pod with spec.nodeName) keeps the first copy's
			// deadline, so the drain ends (gave_up) however often it is
			// recreated; the earlier copies' entries are folded.
			if d, ok := st.foldCopies(p.Namespace+"/"+p.Name, present); ok {
				ps.Deadline = d
			}
			st.Pods[key] = ps
		}
		if ps.Done != "" {
			continue
		}
		if st.Force && ps.Mode != ModeImmediate {
			// A force joined the drain after the pod was classified:
			// Immediate, as force makes every pod (an AllowCompletion pod
			// no longer waited for up to completion_timeout).
			ps.Mode, ps.Deadline, ps.NextTry = ModeImmediate, now.Add(c.EvictionTimeout), time.Time{}
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			ps.Done = "completed"
			continue
		}
		if c.skipWait(p, now) {
			ps.Done, ps.Reason = "skipped", fmt.Sprintf("terminating since %s, more than skip_wait_for_delete_timeout %v ago",
				p.DeletionTimestamp.UTC().Format(time.RFC3339), c.SkipWaitForDeleteTimeout)
			continue
		}
		expired := !now.Before(ps.Deadline)
		switch {
		case !ps.Unanswered.IsZero() && !ps.UnansweredCall.Before(c.unansweredCap(ps)):
			// Unanswered that long past its giving up, a call made at or
			// after the cap met the cluster's error again: the cluster's
			// errors are the pod's (a webhook slower than kube.timeout)
			// or an outage outlasting it; given up, so the drain ends.
			// Past the cap with no such call (the steps failed before
			// their calls: an outage at the pod list), the call is made
			// first: given up unasked, the node was rebooted under the
			// pod, its PDBs never asked.
			ps.Done, ps.Reason = "gave_up", "unanswered: "+cmp.Or(ps.UnansweredErr, "no call made")
		case ps.Mode == ModeDeleteAfterTimeout && expired:
			switch {
			case !now.Before(ps.Deadline.Add(c.EvictionTimeout)) && ps.Unanswered.IsZero():
				// Its delete refused (a webhook, a policy) or the pod
				// held after it (a finalizer) for eviction_timeout more:
				// given up, as an eviction is, so the drain ends.
				ps.Done, ps.Reason = "gave_up", giveUpReason(ps, p)
			case ps.DeletedAt.IsZero() && !now.Before(ps.NextTry):
				// At its deadline, then after each refusal's backoff.
				ops = append(ops, op{key: key, pod: p, delete: true})
			}
		case expired && (ps.Mode == ModeAllowCompletion || p.DeletionTimestamp != nil || ps.Unanswered.IsZero()):
			// Only the pod's side answering (a PDB, a webhook, an
			// accepted eviction still terminating) gives it up: past its
			// deadline, a pod whose calls met the cluster's errors alone
			// (an outage, throttling, a missing RBAC rule) is asked
			// again, judged by the answer. Given up unasked, the drain
			// ended gave_up and the node was rebooted under its
			// workloads, its PDBs never asked.
			ps.Done, ps.Reason = "gave_up", giveUpReason(ps, p)
		case p.DeletionTimestamp != nil || ps.Mode == ModeAllowCompletion || ps.Evicted:
			// Terminating, or waiting for the pod to finish by itself.
		case now.Before(ps.NextTry):
			// Backing off after a PDB refusal.
		default:
			ops = append(ops, op{key: key, pod: p})
		}
	}
	var gone []string
	for k, ps := range st.Pods {
		if ps.Done == "" && !present[k] {
			ps.Done = "gone"
		}
		if ps.Done != "" {
			// Done: nothing is asked of it any more.
			ps.clearUnanswered()
		}
		if ps.Done == "gone" || ps.Done == "gave_up" && !present[k] {
			// A pod given up that left the node counts as gone here:
			// newcomers past their deadline when first seen (a
			// controller's replacements under new names) are given up
			// one after the other while another pod holds the drain.
			gone = append(gone, k)
		}
	}
	if len(gone) > maxGonePods {
		// The earliest deadlines first: the pods seen first.
		slices.SortFunc(gone, func(a, b string) int {
			return cmp.Or(st.Pods[a].Deadline.Compare(st.Pods[b].Deadline), strings.Compare(a, b))
		})
		for _, k := range gone[:len(gone)-maxGonePods] {
			st.fold(k)
		}
	}
	st.Skipped = skipped
	for _, o := range ops {
		ps := st.Pods[o.key]
		if !o.delete && ps.EvictAt.IsZero() {
			ps.EvictAt = now
		}
		if ps.Unanswered.IsZero() {
			ps.Unanswered = now
		}
	}
	return ops
}

// foldCopies folds the entries of earlier copies of pod name
// ("namespace/name", another UID, not on the node now) and returns the
// earliest of their deadlines.
func (st *State) foldCopies(name string, present map[string]bool) (time.Time, bool) {
	var first time.Time
	found := false
	for k, ps := range st.Pods {
		if present[k] || !strings.HasPrefix(k, name+"@") {
			continue
		}
		if !found || ps.Deadline.Before(first) {
			first, found = ps.Deadline, true
		}
		if ps.Done == "" {
			ps.Done = "gone"
		}
		st.fold(k)
	}
	return first, found
}

// skipWait reports whether the drain stops waiting for pod p: it is being
// deleted and its DeletionTimestamp lies more than
// Config.SkipWaitForDeleteTimeout before now (0: never). These are kubectl
// drain's --skip-wait-for-delete-timeout semantics (k8s.io/kubectl
// v0.34.4 pkg/drain/filters.go, shouldSkipPod, which drain.go's
// waitForDelete and skipDeletedFilter use: SkipWaitForDeleteTimeoutSeconds
// > 0, DeletionTimestamp set, and time.Now() minus it more than that many
// seconds), here in a Duration rather than whole seconds. The apiserver
// sets DeletionTimestamp to the time of the delete plus the grace period
// (k8s.io/apiserver pkg/registry/rest/delete.go, BeforeDelete), so the
// timeout runs from when the kubelet should have killed the pod. Like
// kubectl, it compares the apiserver's timestamp with this processor's
// clock: a skew between them shifts the timeout by as much.
func (c *Config) skipWait(p *corev1.Pod, now time.Time) bool {
	return c.SkipWaitForDeleteTimeout > 0 && p.DeletionTimestamp != nil &&
		now.Sub(p.DeletionTimestamp.Time) > c.SkipWaitForDeleteTimeout
}

// giveUpReason says why a pod was given up at its deadline (a
// DeleteAfterTimeout pod: EvictionTimeout after it).
func giveUpReason(ps *PodState, p *corev1.Pod) string {
	switch {
	case ps.Mode == ModeDeleteAfterTimeout && (p.DeletionTimestamp != nil || !ps.DeletedAt.IsZero()):
		return "deleted, still terminating eviction_timeout after its timeout"
	case ps.Mode == ModeDeleteAfterTimeout && ps.Reason != "":
		return "not deleted eviction_timeout after its timeout: " + ps.Reason
	case ps.Mode == ModeDeleteAfterTimeout:
		return "not deleted eviction_timeout after its timeout"
	case ps.BlockedBy != "":
		return "blocked by PDB " + ps.BlockedBy
	case p.DeletionTimestamp != nil:
		return "still terminating at the timeout"
	case ps.Mode == ModeAllowCompletion:
		return "still running at the completion timeout"
	case ps.Reason != "":
		// The pod's last refusal (a webhook's denial, more than one PDB).
		return "not evicted by the timeout: " + ps.Reason
	}
	return "not evicted by the timeout"
}

// callResult is what one op's API call did.
type callResult struct {
	// deleted: the pod was deleted (a delete op, or a force answering a
	// PDB refusal).
	deleted bool
	// blockedBy names the PDB that refused the eviction (429).
	blockedBy string
	// err is the call's error.
	err error
	// notFound: the pod was already gone (or its UID changed).
	notFound bool
	// retriable: err is the cluster's trouble; the step is retried. An
	// error that is the pod's own (podRefusal) is not.
	retriable bool
}

// maxPodReason bounds the error kept as a pod's Reason: a webhook's
// denial says what it likes, and the state shares the node's annotations.
const maxPodReason = 512

// record notes the result of one call in the pod's state and returns what
// it was, for the metrics: "deleted", "blocked", "evicted", "refused" (an
// error that is the pod's own: noted, tried again after the pod's backoff)
// or "" (gone, or the cluster's error).
func (c *Config) record(st *State, o op, r callResult, now time.Time) string {
	ps := st.Pods[o.key]
	if !r.retriable && !r.notFound {
		ps.noteAnswer(now)
	}
	switch {
	case r.err == nil && r.deleted:
		ps.DeletedAt = now
		return "deleted"
	case r.err == nil && r.blockedBy != "":
		ps.Attempts++
		if ps.BlockedBy != r.blockedBy {
			// A new blocker: this step says so (blockedAt).
			ps.BlockedBy, ps.BlockedAt = r.blockedBy, now
		}
		ps.NextTry = c.retryAt(ps, o, now)
		return "blocked"
	case r.err == nil:
		ps.Evicted, ps.BlockedBy, ps.BlockedAt, ps.Reason = true, "", time.Time{}, ""
		return "evicted"
	case r.notFound:
		ps.Done = "gone"
		ps.clearUnanswered()
	case r.retriable:
		// Left as it was (Unanswered); the step is retried after the
		// cluster's backoff.
		ps.UnansweredErr = events.Truncate(r.err.Error(), maxPodReason)
		ps.UnansweredCall = now
	default:
		// The pod's own: tried again after its backoff, given up at its
		// deadline with this reason.
		ps.Attempts++
		ps.Reason = events.Truncate(r.err.Error(), maxPodReason)
		ps.NextTry = c.retryAt(ps, o, now)
		return "refused"
	}
	return ""
}

// noteAnswer notes that the pod's side answered its call at now
// (accepted or refused it): no longer Unanswered, and its deadline moves
// out by the time it was, so a pod gets its whole timeout of answers
// however long the cluster failed. A DeleteAfterTimeout pod's deadline is
// its delete's, which no PDB holds back: it stays (its delete, past the
// deadline, is made again while unanswered).
func (ps *PodState) noteAnswer(now time.Time) {
	since := ps.Unanswered
	ps.clearUnanswered()
	if since.IsZero() || !now.After(since) || ps.Mode == ModeDeleteAfterTimeout {
		return
	}
	ps.Deadline = ps.Deadline.Add(now.Sub(since))
}

// clearUnanswered forgets the pod's unanswered calls (Unanswered and what
// goes with it): answered, gone, or done.
func (ps *PodState) clearUnanswered() {
	ps.Unanswered, ps.UnansweredErr, ps.UnansweredCall = time.Time{}, "", time.Time{}
}

// unansweredBound is how many eviction_timeouts a pod may stay unanswered
// past the time it would have been given up.
const unansweredBound = 3

// unansweredCap is when a pod still unanswered is given up: unansweredBound
// eviction_timeouts after the time it would have been given up answered
// (its deadline; a DeleteAfterTimeout pod's, eviction_timeout after it).
// Without it, an error clusters.Retriable counts as the cluster's that is
// lasting for the pod held its drain running for ever, and failed every
// step of it, backing the whole cluster off.
func (c *Config) unansweredCap(ps *PodState) time.Time {
	at := ps.Deadline
	if ps.Mode == ModeDeleteAfterTimeout {
		at = at.Add(c.EvictionTimeout)
	}
	return at.Add(unansweredBound * c.EvictionTimeout)
}

// retryAt is when a pod whose call was refused is tried again: after its
// backoff — a DeleteAfterTimeout pod's eviction no later than its
// deadline, so the backoff never holds its delete back.
func (c *Config) retryAt(ps *PodState, o op, now time.Time) time.Time {
	at := now.Add(c.backoff(ps.Attempts))
	if !o.delete && ps.Mode == ModeDeleteAfterTimeout && at.After(ps.Deadline) {
		at = ps.Deadline
	}
	return at
}

// backoff is the wait after the attempts-th refused eviction of a pod:
// PDBBackoff doubling up to MaxPDBBackoff.
func (c *Config) backoff(attempts int) time.Duration {
	d := c.PDBBackoff << min(attempts-1, 20)
	if d > c.MaxPDBBackoff || d <= 0 {
		d = c.MaxPDBBackoff
	}
	return d
}

// settle ends the drain once no pod remains: succeeded, or gave_up when
// the policy gave up on any pod. It reports whether the drain ended.
func settle(st *State, now time.Time) bool {
	c := st.Count()
	if c.Remaining > 0 {
		return false
	}
	st.Phase, st.FinishedAt = PhaseSucceeded, now
	if c.GaveUp > 0 {
		st.Phase = PhaseGaveUp
	}
	return true
}

// blockedAt lists, sorted, the PDBs that newly blocked a pod (not done)
// in the step made at, and those pods ("ns/name@uid8=pdb"): what that
// step's blocked action says, and its id. A step that is done again reads
// the same from the state the first one wrote.
func blockedAt(st *State, at time.Time) (pdbs, pods []string) {
	for k, p := range st.Pods {
		if p.Done == "" && p.BlockedBy != "" && p.BlockedAt.Equal(at) {
			pods = append(pods, k+"="+p.BlockedBy)
			if !slices.Contains(pdbs, p.BlockedBy) {
				pdbs = append(pdbs, p.BlockedBy)
			}
		}
	}
	sort.Strings(pdbs)
	sort.Strings(pods)
	return pdbs, pods
}

// blockTimes lists, sorted, the times of the steps whose new blockers
// still block a pod (not done): the steps whose blocked actions the state
// can say again.
func blockTimes(st *State) []time.Time {
	var out []time.Time
	for _, p := range st.Pods {
		if p.Done == "" && p.BlockedBy != "" && !p.BlockedAt.IsZero() &&
			!slices.ContainsFunc(out, p.BlockedAt.Equal) {
			out = append(out, p.BlockedAt)
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// blockedReason is the reason of a blocked action: "blocked by PDB a, PDB b".
func blockedReason(pdbs []string) string {
	return "blocked by PDB " + strings.Join(pdbs, ", PDB ")
}
