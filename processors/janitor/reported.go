package janitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/faultline/faultline/schemas/events"
)

// MaintenanceStateName is the ConfigMap, in janitor.lease_namespace of
// aws.maintenance_cluster, in which the maintenance monitor keeps the
// scheduled events it reported as standing (under its data key
// maintenanceStateKey, as JSON), so that a restarted janitor, or the next
// holder of the cluster's Lease, does not report a standing event again,
// nor miss the recovery of one that ended meanwhile. Under its data key
// maintenancePendingKey it keeps the records written ahead of their
// produce.
const MaintenanceStateName = "faultline-janitor-maintenance"

const (
	maintenanceStateKey   = "reported.json"
	maintenancePendingKey = "pending.json"
)

// reportedState keeps what the maintenance monitor reported as standing.
// Load returns it (empty where nothing was kept yet); Save writes it, and
// fails with errStateChanged where another janitor wrote it since this one
// loaded or saved it.
type reportedState interface {
	Load(ctx context.Context) (keptReports, error)
	Save(ctx context.Context, k keptReports) error
}

// keptReports is what the maintenance monitor keeps: the events it
// reported as standing, and the records of the last changes, written
// before they are produced and until they are (whoever reads them
// produces them again, the same bytes: the same ids and times, one row
// each in the events table).
type keptReports struct {
	standing map[string]standingEvent
	pending  []*kgo.Record
}

// pendingEntry is a pending record as kept in the ConfigMap (its topic is
// the events topic).
type pendingEntry struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

// errStateChanged: the kept state was written by another janitor since
// this one read it (a handover); it is read again before the next poll.
var errStateChanged = errors.New("the maintenance state was written by another janitor")

// reportedEntry is a standing event as kept in the ConfigMap.
type reportedEntry struct {
	Node     string    `json:"node"`
	Instance string    `json:"instance"`
	Region   string    `json:"region"`
	Code     string    `json:"code"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end,omitzero"`
}

// maintenanceState is the reportedState of cluster: the ConfigMap
// MaintenanceStateName in janitor.lease_namespace, written with optimistic
// concurrency (its resourceVersion).
func (j *Janitor) maintenanceState(cluster string) reportedState {
	return &configMapState{j: j, cluster: cluster}
}

type configMapState struct {
	j       *Janitor
	cluster string
	rv      string // the resourceVersion read or last written; "" while there is none
}

func (s *configMapState) where() string {
	return s.j.cfg.LeaseNamespace + "/" + MaintenanceStateName
}

// api is the ConfigMaps of the state's namespace.
func (s *configMapState) api() (typedcorev1.ConfigMapInterface, error) {
	cl, err := s.j.reg.Get(s.cluster)
	if err != nil {
		return nil, err
	}
	if cl.Kube == nil {
		return nil, fmt.Errorf("cluster %q has no kubeconfig to keep ConfigMap %s in", s.cluster, s.where())
	}
	return cl.Kube.CoreV1().ConfigMaps(s.j.cfg.LeaseNamespace), nil
}

func (s *configMapState) Load(ctx context.Context) (keptReports, error) {
	out := keptReports{standing: map[string]standingEvent{}}
	api, err := s.api()
	if err != nil {
		return out, err
	}
	cm, err := api.Get(ctx, MaintenanceStateName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s.rv = ""
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("reading ConfigMap %s: %w", s.where(), err)
	}
	s.rv = cm.ResourceVersion
	// Written by hand or by another version: the events standing are
	// reported again, and the state written anew.
	var kept map[string]reportedEntry
	if err := json.Unmarshal([]byte(cm.Data[maintenanceStateKey]), &kept); err != nil {
		s.j.log.Warn("janitor: the maintenance state cannot be read; the standing scheduled events are reported again",
			"configmap", s.where(), "key", maintenanceStateKey, "err", err)
		return out, nil
	}
	for k, e := range kept {
		out.standing[k] = standingEvent{node: e.Node, instance: e.Instance, region: e.Region, code: e.Code, start: e.Start.UTC(), end: e.End.UTC()}
	}
	if b, ok := cm.Data[maintenancePendingKey]; ok {
		var pending []pendingEntry
		if err := json.Unmarshal([]byte(b), &pending); err != nil {
			s.j.log.Warn("janitor: the maintenance records written ahead of their produce cannot be read; they are not produced again",
				"configmap", s.where(), "key", maintenancePendingKey, "err", err)
			pending = nil
		}
		for _, p := range pending {
			out.pending = append(out.pending, &kgo.Record{Topic: events.TopicEvents, Key: p.Key, Value: p.Value})
		}
	}
	return out, nil
}

func (s *configMapState) Save(ctx context.Context, k keptReports) error {
	api, err := s.api()
	if err != nil {
		return err
	}
	kept := make(map[string]reportedEntry, len(k.standing))
	for key, e := range k.standing {
		kept[key] = reportedEntry{Node: e.node, Instance: e.instance, Region: e.region, Code: e.code, Start: e.start, End: e.end}
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: MaintenanceStateName, Namespace: s.j.cfg.LeaseNamespace, ResourceVersion: s.rv,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline-janitor"}},
		Data: map[string]string{maintenanceStateKey: string(b)},
	}
	if len(k.pending) > 0 {
		pending := make([]pendingEntry, len(k.pending))
		for i, r := range k.pending {
			pending[i] = pendingEntry{Key: r.Key, Value: r.Value}
		}
		b, err := json.Marshal(pending)
		if err != nil {
			return err
		}
		cm.Data[maintenancePendingKey] = string(b)
	}
	if s.rv == "" {
		cm, err = api.Create(ctx, cm, metav1.CreateOptions{})
	} else {
		cm, err = api.Update(ctx, cm, metav1.UpdateOptions{})
	}
	switch {
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		return fmt.Errorf("writing ConfigMap %s: %w", s.where(), errStateChanged)
	case apierrors.IsNotFound(err): // deleted meanwhile: created at the next save
		s.rv = ""
		return fmt.Errorf("writing ConfigMap %s: %w", s.where(), err)
	case err != nil:
		return fmt.Errorf("writing ConfigMap %s: %w", s.where(), err)
	}
	s.rv = cm.ResourceVersion
	return nil
}
