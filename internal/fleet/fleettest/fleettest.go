// Package fleettest seeds a small fleet history for the fleet page's
// tests (internal/fleet, the gateway, the browser test).
package fleettest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/drain"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Base is the seed's epoch.
var Base = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// seeder builds the records the gateway and the processors produce.
type seeder struct {
	recs []*kgo.Record
	n    int
	// prefix starts every id (Change's calls must not reuse Seed's).
	prefix string
}

func (s *seeder) event(cluster, node, check, class string, at time.Duration, healthy bool, msg string) string {
	return s.gpuEvent(cluster, node, "GPU-"+node, check, class, at, healthy, msg)
}

// gpuEvent is event on the node's GPU gpu.
func (s *seeder) gpuEvent(cluster, node, gpu, check, class string, at time.Duration, healthy bool, msg string) string {
	s.n++
	id := fmt.Sprintf("%s%s-%s-e%03d", s.prefix, cluster, node, s.n)
	ev := &datamodels.HealthEvent{
		Id: id, Cluster: cluster, NodeName: node, CheckName: check, ComponentClass: class,
		IsFatal: !healthy, IsHealthy: healthy, Message: msg,
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: gpu}},
		GeneratedTimestamp: timestamppb.New(Base.Add(at)),
	}
	v, _ := events.Marshal(ev)
	s.recs = append(s.recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: v, Timestamp: Base})
	return id
}

func (s *seeder) action(cluster, node, role, kind, outcome string, at time.Duration, reason string, details map[string]string, evIDs ...string) {
	s.n++
	a := &faultlinev1.Action{
		Id: fmt.Sprintf("%sa%04d", s.prefix, s.n), Cluster: cluster, Node: node, Role: role, Kind: kind, Outcome: outcome,
		Reason: reason, Rule: "xid", CheckName: "SysLogsXIDError", EventIds: evIDs, Details: details,
		DryRun:    outcome == events.OutcomeDryRun,
		Timestamp: timestamppb.New(Base.Add(at)),
	}
	v, _ := events.MarshalAction(a)
	s.recs = append(s.recs, &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: v, Timestamp: Base})
}

// drift records a conformance role's action on node.
func (s *seeder) drift(cluster, node string, at time.Duration, kind, differing string) {
	d := map[string]string{}
	if differing != "" {
		d[events.DetailDiffering] = differing
	}
	s.action(cluster, node, "conformance", kind, events.OutcomeApplied, at, "drifted from its conformance group", d)
}

// quarantine records an XID fault on node and its quarantine decision.
func (s *seeder) quarantine(cluster, node string, at time.Duration, outcome string) string {
	id := s.event(cluster, node, "SysLogsXIDError", "GPU", at, false, "XID 79 on "+node)
	s.action(cluster, node, events.RoleQuarantine, events.KindQuarantine, outcome, at+time.Second,
		"rule xid matched SysLogsXIDError", map[string]string{
			events.DetailEntities: "GPU=GPU-" + node, events.DetailTaint: "faultline.io/unhealthy=true:NoSchedule", events.DetailCordon: "true",
		}, id)
	return id
}

// unapplied records an XID fault on node's GPU gpu and its quarantine
// decided but not applied (outcome held_by_breaker or dry_run); a
// negative at stores no event.
func (s *seeder) unapplied(cluster, node, gpu string, at time.Duration, outcome string) {
	var ids []string
	if at >= 0 {
		ids = append(ids, s.gpuEvent(cluster, node, gpu, "SysLogsXIDError", "GPU", at, false, "XID 79 on "+gpu))
	} else {
		at = -at
	}
	s.action(cluster, node, events.RoleQuarantine, events.KindQuarantine, outcome, at+time.Second,
		"would quarantine", map[string]string{events.DetailEntities: "GPU=" + gpu}, ids...)
}

// recovered records node's GPU gpu healthy again.
func (s *seeder) recovered(cluster, node, gpu string, at time.Duration) {
	s.gpuEvent(cluster, node, gpu, "SysLogsXIDError", "GPU", at, true, "ok")
}

// Seed writes, through the store processor, cluster alpha's fleet (every
// state once or more) and a beta node that alpha must never see; each
// record twice, as a store retry would:
//
//	n00..n11  report events (12 reporting nodes)
//	n01       quarantined (XID, taint faultline.io/unhealthy, cordon)
//	n02       draining          n03 remediating (its fault repeated since)
//	n04       escalated
//	n05       released (unquarantine)                n08 released (manual uncordon)
//	n06       held by the breaker (open: "3 of 12 nodes quarantined within 10m")
//	n07       drifted only (a conformance_drift action)
//	n09       quarantined (one of two faults left) and drifted
//	n10       drifted, then restored (conformance_restored)
//	beta/b01  quarantined in dry-run
//	gamma/g01 reporting, healthy; gamma/g02 quarantined, reporting nothing
//	delta     held and dry-run quarantines whose faults recover (Unapplied)
func Seed(t testing.TB, conn clickhouse.Conn) {
	t.Helper()
	var s seeder
	const m = time.Minute
	for i := range 12 {
		s.event("alpha", fmt.Sprintf("n%02d", i), "HeartbeatCheck", "GPU", time.Duration(i)*time.Second, true, "ok")
	}
	s.quarantine("alpha", "n01", 1*m, events.OutcomeApplied)
	s.quarantine("alpha", "n02", 2*m, events.OutcomeApplied)
	s.action("alpha", "n02", events.RoleDrain, events.KindDrain, events.OutcomeInProgress, 3*m, "drain started (node)", nil)
	s.quarantine("alpha", "n03", 3*m, events.OutcomeApplied)
	s.action("alpha", "n03", events.RoleDrain, events.KindDrain, events.OutcomeSucceeded, 4*m, "drained", nil)
	s.action("alpha", "n03", events.RoleRemediate, events.KindRemediate, events.OutcomeInProgress, 5*m, "RebootNode created", nil)
	// A repeat of the fault: the quarantine role writes another applied
	// action (already quarantined), which the finished drain covered: not
	// a step of the node's drain, nor a new quarantine (its state and
	// state's since stay).
	rep := s.event("alpha", "n03", "SysLogsXIDError", "GPU", 5*m+20*time.Second, false, "XID 79 on n03")
	s.action("alpha", "n03", events.RoleQuarantine, events.KindQuarantine, events.OutcomeApplied, 5*m+21*time.Second,
		"rule xid matched SysLogsXIDError", map[string]string{
			events.DetailEntities: "GPU=GPU-n03", events.DetailCordon: "true", events.DetailAlreadyQuarantined: "true",
		}, rep)
	s.action("alpha", "n03", events.RoleDrain, events.KindDrain, events.OutcomeSkipped, 5*m+30*time.Second,
		drain.ReasonCovered+" d1 (succeeded at …)", nil)
	s.quarantine("alpha", "n04", 4*m, events.OutcomeApplied)
	s.action("alpha", "n04", events.RoleRemediate, events.KindRemediate, events.OutcomeFailed, 5*m, "reboot failed", nil)
	s.action("alpha", "n04", events.RoleRemediate, events.KindEscalate, events.OutcomeApplied, 6*m, "CONTACT_SUPPORT", nil)
	// n05: quarantined, then recovered.
	s.quarantine("alpha", "n05", 5*m, events.OutcomeApplied)
	s.action("alpha", "n05", events.RoleQuarantine, events.KindUnquarantine, events.OutcomeApplied, 6*m, "recovered",
		map[string]string{events.DetailEntities: "GPU=GPU-n05"})
	// n06: held back by the breaker, which opened.
	s.action("alpha", "n06", events.RoleQuarantine, events.KindBreakerOpen, events.OutcomeApplied, 7*m, "3 of 12 nodes quarantined within 10m", nil)
	id := s.event("alpha", "n06", "SysLogsXIDError", "GPU", 7*m, false, "XID 48 on n06")
	s.action("alpha", "n06", events.RoleQuarantine, events.KindQuarantine, events.OutcomeHeld, 7*m+time.Second,
		"would quarantine: circuit breaker open: 3 of 12", map[string]string{events.DetailEntities: "GPU=GPU-n06"}, id)
	// n07: drifted only.
	s.drift("alpha", "n07", 8*m, events.KindConformanceDrift, `nic_firmware: expected "28.39.1002", actual "28.41.1000"`)
	// n08: quarantined, then a person uncordoned it.
	s.quarantine("alpha", "n08", 8*m, events.OutcomeApplied)
	s.action("alpha", "n08", events.RoleQuarantine, events.KindManualUncordon, events.OutcomeDecided, 9*m, "a person uncordoned the node", nil)
	// n09: two faults, one recovered (unquarantine in progress), and drifted.
	s.quarantine("alpha", "n09", 9*m, events.OutcomeApplied)
	nic := s.event("alpha", "n09", "InfiniBandStateCheck", "NIC", 9*m+10*time.Second, false, "port down")
	s.action("alpha", "n09", events.RoleQuarantine, events.KindQuarantine, events.OutcomeApplied, 9*m+11*time.Second,
		"rule nic matched", map[string]string{events.DetailEntities: "NIC=mlx5_0", events.DetailCordon: "true"}, nic)
	s.action("alpha", "n09", events.RoleQuarantine, events.KindUnquarantine, events.OutcomeInProgress, 10*m, "recovered; 1 fault remains",
		map[string]string{events.DetailEntities: "NIC=mlx5_0"})
	s.drift("alpha", "n09", 10*m, events.KindConformanceDrift, `kernel: expected "6.8.0-45", actual "6.8.0-47"`)
	// n10: drifted, then conformant again.
	s.drift("alpha", "n10", 8*m, events.KindConformanceDrift, "driver")
	s.drift("alpha", "n10", 9*m, events.KindConformanceRestored, "")
	// beta: one quarantined node alpha must not see.
	s.quarantine("beta", "b01", 1*m, events.OutcomeDryRun)
	s.event("beta", "n01", "HeartbeatCheck", "GPU", 0, true, "ok")
	// gamma: g01 reports, g02 is quarantined and reports nothing.
	s.event("gamma", "g01", "HeartbeatCheck", "GPU", 0, true, "ok")
	s.action("gamma", "g02", events.RoleQuarantine, events.KindQuarantine, events.OutcomeApplied, 1*m,
		"rule xid matched SysLogsXIDError", map[string]string{events.DetailEntities: "GPU=GPU-g02", events.DetailCordon: "true"})

	// delta: quarantines that applied nothing end when their faults recover.
	const held, dry = events.OutcomeHeld, events.OutcomeDryRun
	s.unapplied("delta", "d01", "GPU-0", 1*m, held) // recovered: healthy
	s.recovered("delta", "d01", "GPU-0", 2*m)
	s.unapplied("delta", "d02", "GPU-0", 1*m, held) // recovered, then failed again: held
	s.recovered("delta", "d02", "GPU-0", 2*m)
	s.unapplied("delta", "d02", "GPU-0", 3*m, held)
	s.unapplied("delta", "d03", "GPU-0", 1*m, held) // one of two GPUs recovered: held
	s.unapplied("delta", "d03", "GPU-1", 1*m, held)
	s.recovered("delta", "d03", "GPU-1", 2*m)
	s.unapplied("delta", "d04", "GPU-0", 1*m, dry) // recovered: healthy
	s.recovered("delta", "d04", "GPU-0", 2*m)
	s.unapplied("delta", "d05", "GPU-0", 2*m, dry) // a healthy event generated before the fault: quarantined
	s.recovered("delta", "d05", "GPU-0", 1*m)
	s.unapplied("delta", "d06", "GPU-0", -1*m, held) // its event not stored: held
	s.unapplied("delta", "d07", "GPU-0", 1*m, dry)   // two faults, one recovered: quarantined, one fault
	s.unapplied("delta", "d07", "GPU-1", 1*m, dry)
	s.recovered("delta", "d07", "GPU-0", 2*m)

	// Fix the checks of the NIC actions (seeder.action writes the XID check).
	for _, r := range s.recs {
		if r.Topic != events.TopicActions {
			continue
		}
		a, err := events.UnmarshalAction(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		if a.GetDetails()[events.DetailEntities] == "NIC=mlx5_0" {
			a.CheckName = "InfiniBandStateCheck"
			r.Value, _ = events.MarshalAction(a)
		}
	}
	h := store.New(conn, slog.Default(), nil)
	for range 2 {
		if _, err := h.Handle(context.Background(), s.recs); err != nil {
			t.Fatal(err)
		}
	}
}

// Change writes, through the store processor, one action on each of
// cluster's nodes at Base+at, to change the fleet while a test pages
// through it: kind quarantine (an XID fault on the node's GPU, applied),
// unquarantine (that fault recovered: the node released) or drain (in
// progress). Its ids start with prefix, which must differ per call.
func Change(t testing.TB, conn clickhouse.Conn, cluster, kind, prefix string, at time.Duration, nodes ...string) {
	t.Helper()
	s := seeder{prefix: prefix}
	for _, node := range nodes {
		switch kind {
		case events.KindQuarantine:
			s.quarantine(cluster, node, at-time.Second, events.OutcomeApplied)
		case events.KindUnquarantine:
			s.action(cluster, node, events.RoleQuarantine, events.KindUnquarantine, events.OutcomeApplied, at, "recovered",
				map[string]string{events.DetailEntities: "GPU=GPU-" + node})
		case events.KindDrain:
			s.action(cluster, node, events.RoleDrain, events.KindDrain, events.OutcomeInProgress, at, "drain started (node)", nil)
		default:
			t.Fatalf("fleettest.Change: kind %q", kind)
		}
	}
	if _, err := store.New(conn, slog.Default(), nil).Handle(context.Background(), s.recs); err != nil {
		t.Fatal(err)
	}
}
