package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// A recovery's lift, the stabilization sweep's, a manual uncordon
// noticed by the watch and a breaker closed by a fault let through change
// a node in a way nothing decides again: a redelivered recovery finds its
// faults gone, the next sweep finds nothing left to lift, a redelivered
// fault finds its node quarantined. A process killed between the node's
// write and its action's produce, or restarted while Kafka was down, would
// lose the action for ever. So the write that makes the change also writes its action into the
// node (State.Unsaid, AnnotationUnsaid). An event's actions go out with
// its batch's output (the pipeline says when), the loops' with say. Every
// resayInterval the replica owning the node removes from it, by one more
// write of the watch's copy, what was produced, leaves what a batch or
// loop of this replica has in flight, and produces the rest: what a
// process could not produce, or was killed before producing (the same id,
// which the store keeps once).

const (
	// maxUnsaid bounds the actions a node keeps unsaid: past it (a node
	// lifted and uncordoned this often during one Kafka outage) the oldest
	// are dropped.
	maxUnsaid = 16
	// maxUnsaidBytes bounds them together (beside the state's
	// MaxStateBytes, within Kubernetes' 256 KiB of annotations), and
	// maxUnsaidDetail each detail of the copy kept on the node: an
	// event's entities and pods may be tens of KiB.
	maxUnsaidBytes  = 16 << 10
	maxUnsaidDetail = 256
	// resayInterval is how often a replica produces the unsaid actions of
	// its nodes, and the bound of one produce (the loops go on while the
	// broker is down).
	resayInterval = 10 * time.Second
	// sayingFor bounds how long this replica remembers an unsaid action
	// it wrote: in flight (its batch or loop has not produced it; resay
	// leaves it), or produced (resay only removes it from its node). Past
	// it, resay produces the action again: a batch that failed and will
	// not decide it again, a node the watch did not show in time.
	sayingFor = 2 * time.Minute
)

// writtenUnsaid reports whether a is of the kinds written on their node
// until produced (ownUnsaid).
func writtenUnsaid(a *faultlinev1.Action) bool {
	switch a.GetKind() {
	case events.KindUnquarantine, events.KindManualUncordon, events.KindBreakerClose:
		return a.GetRole() == Role && !a.GetDryRun()
	}
	return false
}

// saying is what this replica knows of an unsaid action it wrote.
type saying struct {
	at       time.Time
	produced bool
}

// track remembers the unsaid actions ids this replica wrote: in flight,
// or produced.
func (h *Handler) track(ids []string, produced bool) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		h.saying[id] = saying{at: now, produced: produced}
	}
}

// unsaidIDs returns the ids of the actions among acts of the kinds
// written unsaid.
func unsaidIDs(acts []*faultlinev1.Action) []string {
	var ids []string
	for _, a := range acts {
		if writtenUnsaid(a) {
			ids = append(ids, a.GetId())
		}
	}
	return ids
}

// forgetSaying forgets what was tracked longer than sayingFor.
func (h *Handler) forgetSaying() {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, s := range h.saying {
		if now.Sub(s.at) > sayingFor {
			delete(h.saying, id)
		}
	}
}

// sortUnsaid splits a node's unsaid actions into those produced (their ids;
// forgotten here), those to produce, and (neither) those still in flight.
func (h *Handler) sortUnsaid(acts []*faultlinev1.Action) (produced []string, unsaid []*faultlinev1.Action) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range acts {
		s, ok := h.saying[a.GetId()]
		switch {
		case !ok:
			unsaid = append(unsaid, a)
		case s.produced:
			delete(h.saying, a.GetId())
			produced = append(produced, a.GetId())
		}
	}
	return produced, unsaid
}

// addUnsaid adds those of acts of the kinds written unsaid to the node's
// unsaid actions, each detail cut to maxUnsaidDetail; the oldest go past
// maxUnsaid or maxUnsaidBytes.
func (s *State) addUnsaid(acts ...*faultlinev1.Action) {
	for _, a := range acts {
		if !writtenUnsaid(a) {
			continue
		}
		a = proto.CloneOf(a)
		for k, v := range a.Details {
			a.Details[k] = events.Truncate(v, maxUnsaidDetail)
		}
		b, err := protojson.Marshal(a)
		if err != nil {
			continue // every field of an Action is encodable
		}
		s.Unsaid = append(s.Unsaid, b)
	}
	size, keep := 0, 0
	for i := len(s.Unsaid) - 1; i >= 0 && keep < maxUnsaid; i-- {
		if size += len(s.Unsaid[i]); size > maxUnsaidBytes {
			break
		}
		keep++
	}
	s.Unsaid = s.Unsaid[len(s.Unsaid)-keep:]
}

// unsaid decodes the node's unsaid actions. Only the kinds written there
// (writtenUnsaid), about this very node, are taken: the annotation is the node's,
// which its own kubelet may write, so an entry naming another node (a
// forged quarantine/applied would start a drain there), another kind or
// role, or one that does not decode, is not produced; bad counts them
// (forgetUnsaid removes them).
func (s *State) unsaid(cluster, node string) (acts []*faultlinev1.Action, bad int) {
	for _, raw := range s.Unsaid {
		if a, ok := ownUnsaid(raw, cluster, node); ok {
			acts = append(acts, a)
		} else {
			bad++
		}
	}
	return acts, bad
}

// ownUnsaid decodes raw when it is an action of the kinds written unsaid,
// about cluster/node.
func ownUnsaid(raw json.RawMessage, cluster, node string) (*faultlinev1.Action, bool) {
	a := &faultlinev1.Action{}
	if protojson.Unmarshal(raw, a) != nil || a.GetId() == "" || a.GetCluster() != cluster || a.GetNode() != node || !writtenUnsaid(a) {
		return nil, false
	}
	return a, true
}

// say produces acts; resay removes the live ones (written there as
// unsaid) from their nodes. Dry-run would-lifts, written nowhere, are
// reported again by the next sweep when the produce fails.
func (h *Handler) say(ctx context.Context, p pipeline.Producer, acts []*faultlinev1.Action) error {
	if len(acts) == 0 {
		return nil
	}
	var (
		recs []*kgo.Record
		errs []error
	)
	for _, a := range acts {
		rec, err := pipeline.ActionRecord(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec)
	}
	pctx, cancel := context.WithTimeout(ctx, resayInterval) // a broker that is down: the node keeps them
	err := p.ProduceSync(pctx, recs...).FirstErr()
	cancel()
	if err != nil {
		h.mu.Lock()
		for _, a := range acts {
			delete(h.dryRunLifts, a.GetId())
			delete(h.saying, a.GetId()) // no longer in flight: the next resay produces it
		}
		h.mu.Unlock()
		return errors.Join(append(errs, fmt.Errorf("produce %d action(s): %w", len(recs), err))...)
	}
	h.track(unsaidIDs(acts), true)
	return errors.Join(errs...)
}

// forgetUnsaid removes the produced actions ids from the node, and any
// entry that is not the node's own (State.unsaid).
func (h *Handler) forgetUnsaid(ctx context.Context, cluster, node string, ids []string) error {
	cl, err := h.reg.Get(cluster)
	if err != nil || cl.Kube == nil {
		return err
	}
	n, ok := h.nodes.Cached(cl, node, h.now())
	if !ok {
		if n, err = h.getNode(ctx, cl, node); err != nil {
			return err
		}
	}
	var acked *faultlinev1.Action
	_, err = h.updateNode(ctx, cl, n, func(n *corev1.Node, st *State) (bool, error) {
		before := len(st.Unsaid)
		st.Unsaid = slices.DeleteFunc(st.Unsaid, func(raw json.RawMessage) bool {
			a, ok := ownUnsaid(raw, cluster, node)
			return !ok || slices.Contains(ids, a.GetId())
		})
		// A person's uncordon not acknowledged yet is acknowledged with
		// this write (its action left on the node for the next resay),
		// or the write would cordon the node again.
		acked = h.acknowledgeUncordon(cluster, n, st, "the resay of unsaid actions")
		return len(st.Unsaid) != before || acked != nil, nil
	})
	if err != nil {
		return fmt.Errorf("cluster %s: remove the produced actions of node %s: %w", cluster, node, err)
	}
	if acked != nil {
		h.m.decisions.WithLabelValues(cluster, events.KindManualUncordon, events.OutcomeDecided).Inc()
	}
	return nil
}

// resay produces the unsaid actions of the nodes this replica owns, in
// every cluster it watches, and removes from the nodes what was produced
// (by resay, a batch or a loop); what a batch or loop of this replica has
// in flight is left to it.
func (h *Handler) resay(ctx context.Context, p pipeline.Producer) error {
	h.forgetSaying()
	var errs []error
	for _, name := range h.nodes.Names() {
		cl, err := h.reg.Get(name)
		if err != nil || cl.Kube == nil || cl.DryRun {
			continue
		}
		nodes, ok := h.nodes.List(cl, labels.Everything())
		if !ok {
			continue
		}
		var (
			acts []*faultlinev1.Action
			// By node: the produced ids to remove, and whether entries that
			// are not its own are to go too (an entry without ids).
			forget = map[string][]string{}
		)
		for _, n := range nodes {
			if _, ok := n.Annotations[AnnotationUnsaid]; !ok || !h.Owns(events.Key(name, n.Name)) {
				continue
			}
			if _, trusted := h.nodes.Cached(cl, n.Name, h.now()); !trusted {
				continue // written by this replica within recentWrite
			}
			st, _ := ReadState(n)
			own, bad := st.unsaid(name, n.Name)
			if bad > 0 {
				h.log.Warn("entries of "+AnnotationUnsaid+" that are not this node's own quarantine actions; removed, not produced",
					"cluster", name, "node", n.Name, "entries", bad)
			}
			produced, unsaid := h.sortUnsaid(own)
			if len(produced) > 0 || bad > 0 {
				forget[n.Name] = produced
			}
			acts = append(acts, unsaid...)
		}
		if err := h.say(ctx, p, acts); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
		} else {
			for _, a := range acts {
				forget[a.GetNode()] = append(forget[a.GetNode()], a.GetId())
			}
		}
		for node, ids := range forget {
			if err := h.forgetUnsaid(ctx, name, node, ids); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// sayLoop is a loop's way to produce its actions: say, with a warning
// naming what is left to resay.
func (h *Handler) sayLoop(ctx context.Context, p pipeline.Producer, what string, acts []*faultlinev1.Action, err error) {
	if err = errors.Join(err, h.say(ctx, p, acts)); err != nil && ctx.Err() == nil {
		h.log.Warn(what+" incomplete; the actions it wrote on nodes are produced again within "+resayInterval.String(), "err", err)
	}
}
