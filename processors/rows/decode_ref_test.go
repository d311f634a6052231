package rows

import (
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// addEventProto is the reference decoder: proto.Unmarshal into a message.
func (b *Events) addEventProto(rec *kgo.Record) error {
	ev, err := events.Unmarshal(rec.Value)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPoison, err)
	}
	cluster, node, err := pipeline.CheckKey(rec.Key, ev.GetCluster(), ev.GetNodeName())
	if err != nil {
		return fmt.Errorf("%w: event %s: %w", ErrPoison, ev.GetId(), err)
	}
	if ev.GetId() == "" {
		return fmt.Errorf("%w: event has no id", ErrPoison)
	}
	received := rec.Timestamp
	if ev.GetReceivedTimestamp() != nil {
		received = ev.GetReceivedTimestamp().AsTime()
	}
	ts, missing := received, uint8(1)
	if ev.GetGeneratedTimestamp() != nil {
		ts, missing = ev.GetGeneratedTimestamp().AsTime(), 0
	}
	tsSec, tsMS := splitTime(ts)
	rSec, rMS := splitTime(received)

	var et, evv []string
	for _, e := range ev.GetEntitiesImpacted() {
		et = append(et, e.GetEntityType())
		evv = append(evv, e.GetEntityValue())
	}
	mk := make([]string, 0, len(ev.GetMetadata()))
	for k := range ev.GetMetadata() {
		mk = append(mk, k)
	}
	sort.Strings(mk)
	mv := make([]string, len(mk))
	for i, k := range mk {
		mv[i] = ev.GetMetadata()[k]
	}
	q, d := ev.GetQuarantineOverrides(), ev.GetDrainOverrides()

	b.cluster = append(b.cluster, cluster)
	b.node = append(b.node, node)
	b.check = append(b.check, ev.GetCheckName())
	b.entity = append(b.entity, events.EntityKey(ev))
	b.ts = append(b.ts, tsSec)
	b.tsMS = append(b.tsMS, tsMS)
	b.id = append(b.id, ev.GetId())
	b.received = append(b.received, rSec)
	b.receivedMS = append(b.receivedMS, rMS)
	b.tsMissing = append(b.tsMissing, missing)
	b.version = append(b.version, ev.GetVersion())
	b.agent = append(b.agent, ev.GetAgent())
	b.componentClass = append(b.componentClass, ev.GetComponentClass())
	b.isFatal = append(b.isFatal, b2u(ev.GetIsFatal()))
	b.isHealthy = append(b.isHealthy, b2u(ev.GetIsHealthy()))
	b.message = append(b.message, ev.GetMessage())
	b.recAction = append(b.recAction, ev.GetRecommendedAction().String())
	b.customAction = append(b.customAction, ev.GetCustomRecommendedAction())
	b.errorCodes = append(b.errorCodes, stringsOrEmpty(ev.GetErrorCode()))
	b.entType = append(b.entType, stringsOrEmpty(et))
	b.entValue = append(b.entValue, stringsOrEmpty(evv))
	b.metaKey = append(b.metaKey, mk)
	b.metaValue = append(b.metaValue, mv)
	b.qSet = append(b.qSet, b2u(q != nil))
	b.qForce = append(b.qForce, b2u(q.GetForce()))
	b.qSkip = append(b.qSkip, b2u(q.GetSkip()))
	b.dSet = append(b.dSet, b2u(d != nil))
	b.dForce = append(b.dForce, b2u(d.GetForce()))
	b.dSkip = append(b.dSkip, b2u(d.GetSkip()))
	b.strategy = append(b.strategy, ev.GetProcessingStrategy().String())
	b.derivedBy = append(b.derivedBy, ev.GetDerivedBy())
	b.causeIDs = append(b.causeIDs, stringsOrEmpty(ev.GetCauseIds()))
	role := ""
	if sub := ev.GetSubmitter(); sub != nil {
		role = sub.GetRole().String()
	}
	b.subName = append(b.subName, ev.GetSubmitter().GetName())
	b.subRole = append(b.subRole, role)
	b.subNode = append(b.subNode, ev.GetSubmitter().GetNode())
	return nil
}
