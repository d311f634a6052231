package janitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/processors/pipeline"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// AnnotationUnsaid holds the actions (protojson, newest maxUnsaid) the
// janitor could not produce — Kafka down through emit's try — kept
// on the resource they report so that no audit record is lost: the next
// reconcile of the resource, by this janitor or the next, produces them
// (the same ids, which the store keeps once) and removes them. The
// operation goes on meanwhile.
const AnnotationUnsaid = "faultline.io/janitor-unsaid"

const (
	// maxUnsaid bounds the actions kept on one resource (an operation
	// produces a handful; past it the oldest go).
	maxUnsaid = 16
	// resayAfter is when a resource whose kept actions could not be
	// produced is looked at again.
	resayAfter = 30 * time.Second
)

// emit produces a (Janitor.emit); one the broker refused is kept on the
// resource (a dry-run cluster is never written: there it is lost). A
// janitor stopping mid-produce keeps nothing: it writes no status either,
// so the next one does the step again, with its action.
func (op *operation) emit(ctx context.Context, a *faultlinev1.Action) {
	op.nodeEvent(ctx, a)
	if op.j.emit(ctx, a) || ctx.Err() != nil {
		return
	}
	op.j.refusedAt.Store(op.j.now().UnixNano()) // resay does not wait on it again at once
	err := errors.New("the cluster is dry-run: nothing is written there")
	if !op.cr.cl.DryRun {
		err = op.keep(ctx, a)
	}
	if err != nil {
		op.j.m.auditErrors.Inc()
		op.j.log.Error("janitor: action neither produced nor kept on its resource", "err", err, "id", a.Id, "cluster", a.Cluster,
			"node", a.Node, "kind", a.Kind, "outcome", a.Outcome, "reason", a.Reason)
	}
}

// keep adds a to the resource's unsaid actions (optimistic concurrency:
// a conflict re-reads the resource).
func (op *operation) keep(ctx context.Context, a *faultlinev1.Action) error {
	b, err := protojson.Marshal(a)
	if err != nil {
		return err
	}
	u := op.u
	for try := 1; ; try++ {
		kept := append(unsaidOf(u), b)
		kept = kept[max(0, len(kept)-maxUnsaid):]
		raw, _ := json.Marshal(kept)
		out, err := op.setUnsaid(ctx, u, string(raw))
		if apierrors.IsConflict(err) && try < 5 {
			if u, err = op.res().Get(ctx, op.u.GetName(), metav1.GetOptions{}); err != nil {
				return fmt.Errorf("re-read %s: %w", op.ref(), err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("keep the action on %s: %w", op.ref(), err)
		}
		op.u = out
		return nil
	}
}

// setUnsaid writes u with its AnnotationUnsaid set to value ("": removed),
// if u is still the resource's latest version (an update, as the state's:
// the role may not patch its resources).
func (op *operation) setUnsaid(ctx context.Context, u *unstructured.Unstructured, value string) (*unstructured.Unstructured, error) {
	obj := u.DeepCopy()
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	if value == "" {
		delete(ann, AnnotationUnsaid)
	} else {
		ann[AnnotationUnsaid] = value
	}
	obj.SetAnnotations(ann)
	return op.res().Update(ctx, obj, metav1.UpdateOptions{FieldManager: "faultline-janitor"})
}

// unsaidOf decodes the resource's unsaid actions (a corrupt annotation:
// none).
func unsaidOf(u *unstructured.Unstructured) []json.RawMessage {
	var kept []json.RawMessage
	if raw := u.GetAnnotations()[AnnotationUnsaid]; raw != "" {
		_ = json.Unmarshal([]byte(raw), &kept)
	}
	return kept
}

// resay produces the actions kept on the resource and removes them; it
// returns when to look at the resource again (0: nothing left). Only the
// janitor's own actions about this resource's node and kind are produced:
// whoever may edit the resource may write the annotation, and a forged
// action about another node goes nowhere but away.
func (op *operation) resay(ctx context.Context) time.Duration {
	if _, ok := op.u.GetAnnotations()[AnnotationUnsaid]; !ok || op.cr.cl.DryRun || op.j.prod == nil {
		return 0
	}
	var recs []*kgo.Record
	bad := 0
	for _, raw := range unsaidOf(op.u) {
		a := &faultlinev1.Action{}
		if protojson.Unmarshal(raw, a) != nil || a.GetId() == "" || a.GetRole() != Role || a.GetCluster() != op.cr.name ||
			a.GetNode() != op.nodeName || a.GetKind() != op.kd.ActionKind || a.GetDryRun() {
			bad++
			continue
		}
		rec, err := pipeline.ActionRecord(a)
		if err != nil {
			bad++
			continue
		}
		recs = append(recs, rec)
	}
	if bad > 0 {
		op.j.log.Warn("entries of "+AnnotationUnsaid+" that are not this resource's own janitor actions; removed, not produced",
			"cluster", op.cr.name, "resource", op.ref(), "entries", bad)
	}
	if len(recs) > 0 {
		j := op.j
		if wait := j.refusedFor(); wait > 0 {
			return wait // the broker refused moments ago: no worker waits on it again yet
		}
		pctx, cancel := context.WithTimeout(ctx, j.emitTry)
		err := j.prod.ProduceSync(pctx, recs...).FirstErr()
		cancel()
		if err != nil {
			j.refusedAt.Store(j.now().UnixNano())
			j.log.Warn("janitor: kept actions not produced yet", "cluster", op.cr.name, "resource", op.ref(), "actions", len(recs), "err", err)
			return j.resayAfter
		}
	}
	out, err := op.setUnsaid(ctx, op.u, "")
	if err != nil {
		// Produced: the next try produces them again (same ids).
		op.j.log.Warn("janitor: produced actions not removed from their resource", "cluster", op.cr.name, "resource", op.ref(), "err", err)
		return time.Second
	}
	op.u = out
	return 0
}
