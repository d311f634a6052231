package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The HealthEvent a scheduled maintenance becomes (the CSP health monitor
// of NVSentinel's data flow: agent csp-health-monitor, class CSP, check
// SCHEDULED_MAINTENANCE, non-fatal, recommendedAction NONE).
const (
	MaintenanceAgent = "csp-health-monitor"
	MaintenanceClass = "CSP"
	MaintenanceCheck = "SCHEDULED_MAINTENANCE"
	// Metadata keys.
	MetaMaintenanceStart = "maintenance_start"
	MetaMaintenanceEnd   = "maintenance_end"
	MetaMaintenanceKind  = "maintenance_kind"
	MetaMaintenanceID    = "maintenance_event_id"
	MetaInstance         = "instance_id"
	MetaProvider         = "cloud_provider"
)

// errNotWorked: Poll read nothing, this janitor does not work the
// maintenance cluster.
var errNotWorked = errors.New("the maintenance cluster is worked by another janitor")

// NodeResolver returns the maintenance cluster's nodes by the EC2
// instance they run on, or ok false while this janitor does not work the
// cluster (a standby, its Lease lost, its node cache not synced yet).
type NodeResolver func() (byInstance map[string]string, ok bool)

// MaintenanceMonitor turns the EC2 scheduled events of configured regions
// (DescribeInstanceStatus) into HealthEvents on the events topic: one
// unhealthy, non-fatal event per scheduled event while it stands (ahead of
// and during its window), naming the node, the kind (the event code:
// system-reboot, instance-retirement, ...) and the window; and one
// healthy (recovery) event once it is gone, completed, canceled or past
// its window. What it reported as standing is kept in its reportedState,
// read when it starts to work the cluster and written after each change.
type MaintenanceMonitor struct {
	cfg     AWSConfig
	log     *slog.Logger
	now     func() time.Time
	resolve NodeResolver
	state   reportedState          // nil: kept in memory only
	polls   *prometheus.CounterVec // by outcome, ok or failed; nil: not counted
	build   func(region string) (EC2API, error)

	mu       sync.Mutex
	clients  map[string]EC2API
	standing map[string]standingEvent // instance/eventID → the event reported
	pending  []*kgo.Record            // the last changes' records, not produced yet
	loaded   bool                     // standing was read from state since the cluster was last worked
	dirty    bool                     // standing changed since it was last written to state
}

type standingEvent struct {
	node, instance, region, code string
	start, end                   time.Time
}

// newMaintenanceMonitor returns the monitor; resolve maps instances to
// nodes and state keeps what was reported (Janitor.InstanceNodes and
// Janitor.maintenanceState of the janitor it runs beside; state nil: in
// memory only).
func newMaintenanceMonitor(cfg AWSConfig, log *slog.Logger, resolve NodeResolver, state reportedState) (*MaintenanceMonitor, error) {
	if cfg.MaintenanceCluster == "" {
		return nil, fmt.Errorf("janitor.aws.maintenance_cluster: must be set when aws.maintenance_regions is")
	}
	m := &MaintenanceMonitor{cfg: cfg, log: log, now: time.Now, resolve: resolve, state: state, clients: map[string]EC2API{}, standing: map[string]standingEvent{}}
	m.build = func(region string) (EC2API, error) { return newEC2(context.Background(), cfg, region) }
	return m, nil
}

// MaintenanceMonitor returns the monitor of cfg.MaintenanceCluster beside
// this janitor: its nodes from the janitor's cache, its state in the
// cluster (maintenanceState), its polls counted in the janitor's metrics.
func (j *Janitor) MaintenanceMonitor(cfg AWSConfig) (*MaintenanceMonitor, error) {
	m, err := newMaintenanceMonitor(cfg, j.log, j.InstanceNodes(cfg.MaintenanceCluster), j.maintenanceState(cfg.MaintenanceCluster))
	if err != nil {
		return nil, err
	}
	m.polls = j.m.maintenancePolls
	return m, nil
}

// Run polls every MaintenanceInterval until ctx ends, producing to p. A
// region that fails is logged and tried again at the next poll.
func (m *MaintenanceMonitor) Run(ctx context.Context, p pipeline.Producer) error {
	t := time.NewTicker(m.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		m.report(ctx, p)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// report polls once and produces what changed. The changes are written to
// the state ahead of their produce, as pending: a crash or a handover
// after the write has whoever reads the state next produce them again,
// the same records (the same ids and times: one row each). A write beaten
// by another janitor's (both polled in a handover) is not produced: that
// one reports, and this one reads the state again. What could not be
// produced (the broker down) stays pending and is produced again at the
// next poll, with what that poll finds; a write that failed otherwise is
// produced all the same (a restart before the next write reports the
// changes again, in new records). A write beaten by another's counts as
// an ok poll; a failed read, write or produce as a failed one.
func (m *MaintenanceMonitor) report(ctx context.Context, p pipeline.Producer) {
	_, commit, err := m.Poll(ctx)
	if errors.Is(err, errNotWorked) {
		return
	}
	ok := err == nil
	if err != nil && ctx.Err() == nil {
		m.log.Warn("janitor: maintenance poll failed; next poll retries", "err", err)
	}
	commit()
	switch werr := m.persist(ctx); {
	case errors.Is(werr, errStateChanged):
		m.count(ok)
		return
	case werr != nil:
		ok = false
	}
	if pending := m.pendingRecords(); len(pending) > 0 {
		if err := p.ProduceSync(ctx, pending...).FirstErr(); err != nil {
			if ctx.Err() == nil {
				m.log.Warn("janitor: maintenance events not produced; produced again at the next poll", "records", len(pending), "err", err)
				m.count(false)
			}
			return
		}
		m.produced()
		if m.persist(ctx) != nil {
			ok = false
		}
	}
	if ctx.Err() == nil {
		m.count(ok)
	}
}

// pendingRecords returns the records written ahead and not produced yet.
func (m *MaintenanceMonitor) pendingRecords() []*kgo.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending
}

// produced takes the pending records as produced.
func (m *MaintenanceMonitor) produced() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending, m.dirty = nil, true
}

func (m *MaintenanceMonitor) count(ok bool) {
	if m.polls == nil {
		return
	}
	outcome := "ok"
	if !ok {
		outcome = "failed"
	}
	m.polls.WithLabelValues(outcome).Inc()
}

// persist writes what is standing and pending to the state if it changed
// since it was last written. A write that fails is tried again at the
// next persist; errStateChanged (another janitor's write beat it) has the
// state read again first.
func (m *MaintenanceMonitor) persist(ctx context.Context) error {
	m.mu.Lock()
	if m.state == nil || !m.dirty || !m.loaded {
		m.mu.Unlock()
		return nil
	}
	k := keptReports{standing: maps.Clone(m.standing), pending: m.pending}
	m.mu.Unlock()
	err := m.state.Save(ctx, k)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err == nil:
		m.dirty = false
	case errors.Is(err, errStateChanged):
		m.loaded = false
		m.log.Warn("janitor: another janitor wrote the maintenance state; it reports, and this one reads the state again at the next poll", "err", err)
	case ctx.Err() == nil:
		m.log.Warn("janitor: maintenance state not written; tried again after the next poll", "err", err)
	}
	return err
}

// load reads the state once the cluster is worked (again): the janitor
// that worked it before may have reported meanwhile.
func (m *MaintenanceMonitor) load(ctx context.Context) error {
	m.mu.Lock()
	done := m.state == nil || m.loaded
	m.mu.Unlock()
	if done {
		return nil
	}
	k, err := m.state.Load(ctx) // outside the lock, as persist's Save
	if err != nil {
		return fmt.Errorf("the maintenance state: %w", err)
	}
	if k.standing == nil {
		k.standing = map[string]standingEvent{}
	}
	m.mu.Lock()
	m.standing, m.pending, m.loaded, m.dirty = k.standing, k.pending, true, false
	m.mu.Unlock()
	return nil
}

func (m *MaintenanceMonitor) client(region string) (EC2API, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.clients[region]; ok {
		return c, nil
	}
	c, err := m.build(region)
	if err != nil {
		return nil, err
	}
	m.clients[region] = c
	return c, nil
}

// Poll reads every region once and returns the records of what changed:
// events newly scheduled (or changed), and recoveries. commit takes them
// as reported, and pending until they are produced (report); until then
// the next Poll returns them again. A janitor that does not work the
// maintenance cluster reads nothing and reports nothing (no recovery of
// what it reported while it did; errNotWorked): the one that works it
// reports, from the state it reads when it starts to.
func (m *MaintenanceMonitor) Poll(ctx context.Context) (recs []*kgo.Record, commit func(), err error) {
	nodes, ok := m.resolve()
	if !ok {
		m.mu.Lock()
		m.loaded = false
		m.mu.Unlock()
		return nil, func() {}, errNotWorked
	}
	if err := m.load(ctx); err != nil {
		return nil, func() {}, err
	}
	seen := map[string]standingEvent{}
	failed := map[string]bool{}
	for _, region := range m.cfg.MaintenanceRegions {
		if rerr := m.pollRegion(ctx, region, nodes, seen); rerr != nil {
			failed[region] = true
			if err == nil {
				err = fmt.Errorf("region %s: %w", region, rerr)
			}
		}
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(m.standing)
	for _, k := range slices.Sorted(maps.Keys(seen)) {
		ev := seen[k]
		if !ev.end.IsZero() && now.After(ev.end) {
			continue // past its window: recovered below if it was standing
		}
		if old, ok := next[k]; ok && old == ev {
			continue
		}
		next[k] = ev
		recs = append(recs, m.record(k, ev, false))
	}
	for k, ev := range m.standing {
		cur, still := seen[k]
		if failed[ev.region] && !still {
			continue // not read this time: unknown, not recovered
		}
		if still && (cur.end.IsZero() || !now.After(cur.end)) {
			continue
		}
		delete(next, k)
		recs = append(recs, m.record(k, ev, true))
	}
	return recs, func() {
		m.mu.Lock()
		m.standing = next
		m.pending = append(m.pending, recs...)
		m.dirty = m.dirty || len(recs) > 0
		m.mu.Unlock()
	}, err
}

func (m *MaintenanceMonitor) pollRegion(ctx context.Context, region string, nodes map[string]string, seen map[string]standingEvent) error {
	c, err := m.client(region)
	if err != nil {
		return err
	}
	in := &ec2.DescribeInstanceStatusInput{IncludeAllInstances: aws.Bool(true)}
	for {
		out, err := c.DescribeInstanceStatus(ctx, in)
		if err != nil {
			return err
		}
		for _, st := range out.InstanceStatuses {
			id := aws.ToString(st.InstanceId)
			for _, e := range st.Events {
				if done(e) {
					continue
				}
				node := nodes[id]
				if node == "" {
					continue // not one of the cluster's nodes
				}
				key := id + "/" + aws.ToString(e.InstanceEventId)
				if aws.ToString(e.InstanceEventId) == "" {
					key = id + "/" + string(e.Code) + "/" + aws.ToTime(e.NotBefore).UTC().Format(time.RFC3339)
				}
				seen[key] = standingEvent{node: node, instance: id, region: region, code: string(e.Code),
					start: aws.ToTime(e.NotBefore).UTC(), end: aws.ToTime(e.NotAfter).UTC()}
			}
		}
		if aws.ToString(out.NextToken) == "" {
			return nil
		}
		in.NextToken = out.NextToken
	}
}

// done: EC2 keeps completed and canceled events for a while, their
// descriptions starting "[Completed]" or "[Canceled]".
func done(e ec2types.InstanceStatusEvent) bool {
	d := aws.ToString(e.Description)
	return strings.HasPrefix(d, "[Completed]") || strings.HasPrefix(d, "[Canceled]")
}

// record is the HealthEvent of a scheduled event (healthy: its recovery).
func (m *MaintenanceMonitor) record(key string, ev standingEvent, healthy bool) *kgo.Record {
	window := ev.start.Format(time.RFC3339)
	if !ev.end.IsZero() {
		window += " to " + ev.end.Format(time.RFC3339)
	}
	msg := fmt.Sprintf("EC2 scheduled %s for instance %s (%s), window %s", ev.code, ev.instance, ev.region, window)
	if healthy {
		msg = fmt.Sprintf("EC2 scheduled %s for instance %s is over (window %s)", ev.code, ev.instance, window)
	}
	now := timestamppb.New(m.now())
	he := &datamodels.HealthEvent{
		Version: 1, Id: events.HashID("csp", m.cfg.MaintenanceCluster, key, fmt.Sprint(healthy), ev.start.String(), ev.end.String()),
		Agent: MaintenanceAgent, ComponentClass: MaintenanceClass, CheckName: MaintenanceCheck,
		IsFatal: false, IsHealthy: healthy, Message: msg, NodeName: ev.node, Cluster: m.cfg.MaintenanceCluster,
		RecommendedAction:  datamodels.RecommendedAction_NONE,
		GeneratedTimestamp: now, ReceivedTimestamp: now,
		EntitiesImpacted: []*datamodels.Entity{{EntityType: "INSTANCE", EntityValue: ev.instance}},
		Submitter:        &datamodels.Submitter{Name: Role + "/maintenance", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE},
		Metadata: map[string]string{MetaMaintenanceStart: ev.start.Format(time.RFC3339), MetaMaintenanceKind: ev.code,
			MetaMaintenanceID: key, MetaInstance: ev.instance, MetaProvider: "aws"},
	}
	if !ev.end.IsZero() {
		he.Metadata[MetaMaintenanceEnd] = ev.end.Format(time.RFC3339)
	}
	b, _ := events.Marshal(he)
	m.log.Info("janitor: maintenance event", "cluster", he.Cluster, "node", ev.node, "kind", ev.code, "healthy", healthy, "window", window)
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(he.Cluster, ev.node), Value: b}
}

// InstanceNodes returns the nodes of cluster by the EC2 instance their
// providerID names (aws:///<zone>/<instance-id>), from the janitor's node
// cache; not ok while this janitor does not work the cluster.
func (j *Janitor) InstanceNodes(cluster string) NodeResolver {
	return func() (map[string]string, bool) {
		j.mu.Lock()
		cr := j.running[cluster]
		j.mu.Unlock()
		if cr == nil {
			return nil, false
		}
		out := map[string]string{}
		for _, o := range cr.nodes.List() {
			n := o.(*corev1.Node)
			if i := strings.LastIndexByte(n.Spec.ProviderID, '/'); i >= 0 && i < len(n.Spec.ProviderID)-1 {
				out[n.Spec.ProviderID[i+1:]] = n.Name
			}
		}
		return out, true
	}
}
