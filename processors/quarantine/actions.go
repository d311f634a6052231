package quarantine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func (h *Handler) breaker(cl *clusters.Client) *breaker {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.breakers[cl.Name]
	if !ok {
		b = newBreaker(h.cfg.Breaker, cl.Kube, h.now)
		b.log, b.cluster = h.log, cl.Name
		gauge := h.m.selectorUnmatched.WithLabelValues(cl.Name)
		b.unmatched = func(all bool) {
			if all {
				gauge.Set(1)
			} else {
				gauge.Set(0)
			}
		}
		if h.cfg.Breaker.Enabled && cl.WatchKube != nil {
			b.watch = newBreakerWatch(h.cfg.Breaker, cl, h.log, h.nodes.Done())
			b.listed = func(sel labels.Selector) ([]*corev1.Node, bool) { return h.nodes.List(cl, sel) }
		}
		h.breakers[cl.Name] = b
	}
	return b
}

// breakerActions reports a breaker transition: an action, the metric, and
// a Kubernetes Event on the breaker's ConfigMap. closing is the closing's
// action when it was already built (written on the node it cordons).
func (h *Handler) breakerActions(ctx context.Context, cl *clusters.Client, it item, v breakerVerdict, closing *faultlinev1.Action) []*faultlinev1.Action {
	h.showBreaker(cl.Name, h.breaker(cl), v.Open)
	var acts []*faultlinev1.Action
	if v.ManualClose {
		h.log.Info("circuit breaker closed by an operator; the quarantines of the window that tripped it no longer count",
			"cluster", cl.Name, "dropped", v.Dropped)
	}
	if v.Closed {
		if closing == nil {
			closing = h.breakerClose(it, cl)
		}
		h.m.decisions.WithLabelValues(it.cluster, events.KindBreakerClose, events.OutcomeApplied).Inc()
		acts = append(acts, closing)
		h.breakerEvent(ctx, cl, "QuarantineBreakerClosed", "faultline closed the quarantine circuit breaker after its window", it)
	}
	if v.Opened {
		h.log.Warn("circuit breaker opened; no new quarantines", "cluster", cl.Name, "reason", v.Reason)
		a := h.action(it, events.KindBreakerOpen, events.OutcomeApplied, v.Reason, "", cl)
		a.Id = pipeline.ActionID(cl.Name, events.KindBreakerOpen, recordID(it))
		a.Details[events.DetailBreakerCount], a.Details[events.DetailBreakerLimit] = itoa(v.Count), itoa(v.Limit)
		a.Details[events.DetailBreakerTotal], a.Details[events.DetailBreakerSchedulable] = itoa(v.Total), itoa(v.Schedulable)
		acts = append(acts, a)
		h.m.breakerTrips.WithLabelValues(cl.Name).Inc()
		h.breakerEvent(ctx, cl, "QuarantineBreakerOpen", "faultline stopped quarantining new nodes: "+v.Reason, it)
	}
	return acts
}

// showBreaker sets the cluster's faultline_quarantine_breaker_open.
func (h *Handler) showBreaker(cluster string, b *breaker, open bool) {
	b.shownOpen.Store(open)
	if open {
		h.m.breakerOpen.WithLabelValues(cluster).Set(1)
	} else {
		h.m.breakerOpen.WithLabelValues(cluster).Set(0)
	}
}

// RefreshBreakerGauges looks again at each breaker this replica shows
// open, and shows it closed once its ConfigMap says so — closed by an
// operator (FaultlineBreakerTripped's runbook) or past its window with
// auto_close. The gauge was set only at this replica's next reservation:
// with no new fault, the alert kept firing after the close.
func (h *Handler) RefreshBreakerGauges(ctx context.Context) {
	h.mu.Lock()
	shown := map[string]*breaker{}
	for c, b := range h.breakers {
		if b.shownOpen.Load() {
			shown[c] = b
		}
	}
	h.mu.Unlock()
	for c, b := range shown {
		open, err := b.isOpen(ctx)
		if err != nil {
			h.log.Warn("circuit breaker not read; its gauge is looked at again later", "cluster", c, "err", err)
			continue
		}
		if !open {
			h.showBreaker(c, b, false)
		}
	}
}

// ReadBreakers shows each cluster's breaker as its ConfigMap says, counts
// its nodes (warning of a quarantine.breaker.gpu_node_selector that matches
// none), and returns the clusters whose breaker could not be read, to be
// read again.
// A replica started while a breaker was open (a rollout, a restart)
// showed it closed until its next reservation in that cluster, and
// FaultlineBreakerTripped cleared while new quarantines were still held
// back.
func (h *Handler) ReadBreakers(ctx context.Context, names []string) (unread []string) {
	for _, c := range names {
		cl, err := h.reg.Get(c)
		switch {
		case errors.Is(err, clusters.ErrUnknownCluster):
			continue
		case err != nil:
			h.log.Warn("circuit breaker not read; looked at again later", "cluster", c, "err", err)
			unread = append(unread, c)
			continue
		case cl.Kube == nil || cl.DryRun:
			continue // decided in dry-run: no breaker
		}
		b := h.breaker(cl)
		open, err := b.isOpen(ctx)
		if err != nil {
			h.log.Warn("circuit breaker not read; looked at again later", "cluster", c, "err", err)
			unread = append(unread, c)
			continue
		}
		if open {
			h.showBreaker(c, b, true)
		}
		if h.cfg.Breaker.Enabled {
			// A selector matching no node is said now (the count warns).
			if err := b.checkSelector(ctx); err != nil {
				h.log.Warn("circuit breaker's node count not read at start; counted at the first quarantine", "cluster", c, "err", err)
			}
		}
	}
	return unread
}

// breakerClose is the action of the breaker closed by the reservation of it
// (counted by breakerActions).
func (h *Handler) breakerClose(it item, cl *clusters.Client) *faultlinev1.Action {
	a := h.newAction(it, events.KindBreakerClose, events.OutcomeApplied, "circuit breaker closed after its window", "", cl)
	a.Id = pipeline.ActionID(cl.Name, events.KindBreakerClose, recordID(it))
	return a
}

func (h *Handler) breakerEvent(ctx context.Context, cl *clusters.Client, reason, msg string, it item) {
	now := metav1.NewTime(h.now())
	bc := h.cfg.Breaker
	kev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name: bc.Name + ".fl-" + shortHash(reason+recordID(it)), Namespace: bc.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline"},
		},
		InvolvedObject:      corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: bc.Namespace, Name: bc.Name},
		Reason:              reason,
		Message:             events.Truncate(msg, maxMessage),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: "faultline-quarantine"},
		ReportingController: "faultline.io/quarantine",
		ReportingInstance:   events.Truncate(h.cfg.Identity, 128),
		FirstTimestamp:      now, LastTimestamp: now, Count: 1,
	}
	if _, err := cl.Kube.CoreV1().Events(bc.Namespace).Create(ctx, kev, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		h.log.Warn("breaker event not recorded", "cluster", cl.Name, "err", err)
	}
}

// action builds the audit record of a decision on one event; its id is
// deterministic (cluster, node, event, kind), so a retried decision writes
// the same id.
func (h *Handler) action(it item, kind, outcome, reason, rule string, cl *clusters.Client) *faultlinev1.Action {
	h.m.decisions.WithLabelValues(it.cluster, kind, outcome).Inc()
	return h.newAction(it, kind, outcome, reason, rule, cl)
}

// newAction is action, not yet counted: for a decision made inside a node
// write, which a conflict makes again (count it once the write succeeded).
func (h *Handler) newAction(it item, kind, outcome, reason, rule string, cl *clusters.Client) *faultlinev1.Action {
	ev := it.ev
	var ids []string
	if ev.GetId() != "" {
		ids = []string{ev.GetId()}
	}
	// What the drain and remediate roles need of the event travels in
	// the details (keys shared with processors/drain).
	details := map[string]string{}
	if e := events.EntityKey(ev); e != "" {
		details[events.DetailEntities] = e
	}
	if ts := ev.GetGeneratedTimestamp(); ts != nil && ts.IsValid() {
		details[events.DetailGeneratedAt] = ts.AsTime().UTC().Format(time.RFC3339Nano)
	}
	switch o := ev.GetDrainOverrides(); {
	case o.GetSkip():
		details[events.DetailDrainOverrides] = "skip"
	case o.GetForce():
		details[events.DetailDrainOverrides] = "force"
	}
	if c := ev.GetCustomRecommendedAction(); c != "" {
		details[events.DetailCustomAction] = c
	}
	if pods, ok := ev.GetMetadata()[events.MetaGPUPods]; ok {
		details[events.MetaGPUPods], details[events.MetaGPUPodsAt] = pods, ev.GetMetadata()[events.MetaGPUPodsAt]
	}
	// Who sent the event: the drain honours drainOverrides only when the
	// quarantine says an operator did.
	details[events.DetailSubmitterRole] = events.RoleName(events.SubmitterRole(ev))
	if n := ev.GetSubmitter().GetName(); n != "" {
		details[events.DetailSubmitter] = events.Truncate(strings.ToValidUTF8(n, "?"), 128)
	}
	if it.ignored != "" {
		details[events.DetailOverridesIgnored] = it.ignored
		reason += " (" + it.ignored + ")"
	}
	return &faultlinev1.Action{
		Id:                pipeline.ActionID(it.cluster, it.node, recordID(it), kind),
		Cluster:           it.cluster,
		Node:              it.node,
		Role:              Role,
		Kind:              kind,
		Outcome:           outcome,
		Reason:            events.Truncate(reason, maxMessage),
		Rule:              rule,
		EventIds:          ids,
		DryRun:            cl == nil || cl.DryRun || cl.Kube == nil,
		Timestamp:         timestamppb.New(h.now()),
		Details:           details,
		CheckName:         ev.GetCheckName(),
		RecommendedAction: ev.GetRecommendedAction().String(),
	}
}

// recordID identifies the event of a record: its id, else its position.
func recordID(it item) string {
	if id := it.ev.GetId(); id != "" {
		return id
	}
	return fmt.Sprintf("%s/%d/%d", it.rec.Topic, it.rec.Partition, it.rec.Offset)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}
