package store

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// eventColumns is the column list of an events insert, in the order of
// eventBlock's appends.
const eventColumns = `cluster, node, check, entity, ts, ts_ms, id, received, received_ms, ts_missing,
	version, agent, component_class, is_fatal, is_healthy, message, recommended_action,
	custom_recommended_action, error_codes, entities.type, entities.value, metadata.key,
	metadata.value, quarantine_set, quarantine_force, quarantine_skip, drain_set, drain_force,
	drain_skip, processing_strategy, derived_by, cause_ids, submitter_name, submitter_role,
	submitter_node`

// eventBlock holds decoded events column by column, ready for a columnar
// insert.
type eventBlock struct {
	cluster, node, check, entity             []string
	ts, received                             []time.Time
	tsMS, receivedMS                         []uint16
	id                                       []string
	tsMissing                                []uint8
	version                                  []uint32
	agent, componentClass, message           []string
	isFatal, isHealthy                       []uint8
	recAction, customAction                  []string
	errorCodes                               [][]string
	entType, entValue, metaKey, metaValue    [][]string
	qSet, qForce, qSkip, dSet, dForce, dSkip []uint8
	strategy, derivedBy                      []string
	causeIDs                                 [][]string
	subName, subRole, subNode                []string
}

func (b *eventBlock) len() int { return len(b.id) }

// columns returns the block's columns in eventColumns order.
func (b *eventBlock) columns() []any {
	return []any{b.cluster, b.node, b.check, b.entity, b.ts, b.tsMS, b.id, b.received, b.receivedMS, b.tsMissing,
		b.version, b.agent, b.componentClass, b.isFatal, b.isHealthy, b.message, b.recAction,
		b.customAction, b.errorCodes, b.entType, b.entValue, b.metaKey,
		b.metaValue, b.qSet, b.qForce, b.qSkip, b.dSet, b.dForce,
		b.dSkip, b.strategy, b.derivedBy, b.causeIDs, b.subName, b.subRole,
		b.subNode}
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// splitTime is t as DateTime seconds (UTC) and the milliseconds within the
// second.
func splitTime(t time.Time) (time.Time, uint16) {
	t = t.UTC()
	return t.Truncate(time.Second), uint16(t.Nanosecond() / int(time.Millisecond))
}

func stringsOrEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// errPoison marks a record that can never be stored.
var errPoison = errors.New("poison record")

// addEvent decodes rec and appends it; the error wraps errPoison when the
// record can never be stored.
func (b *eventBlock) addEvent(rec *kgo.Record) error {
	var ev wireEvent
	if err := decodeEvent(rec.Value, &ev); err != nil {
		return fmt.Errorf("%w: decode HealthEvent: %w", errPoison, err)
	}
	// Key and payload must name the same node: the quarantine role acts
	// on what the store records. An empty payload field takes the key's.
	cluster, node, err := pipeline.CheckKey(rec.Key, ev.cluster, ev.node)
	if err != nil {
		return fmt.Errorf("%w: event %s: %w", errPoison, ev.id, err)
	}
	if ev.id == "" {
		return fmt.Errorf("%w: event has no id", errPoison)
	}
	received := rec.Timestamp
	if ev.received.set {
		if !ev.received.valid() {
			return fmt.Errorf("%w: event %s: receivedTimestamp is not a valid timestamp", errPoison, ev.id)
		}
		received = ev.received.time()
	}
	ts, missing := received, uint8(1)
	if ev.generated.set {
		if !ev.generated.valid() {
			return fmt.Errorf("%w: event %s: generatedTimestamp is not a valid timestamp", errPoison, ev.id)
		}
		ts, missing = ev.generated.time(), 0
	}
	if !inDateTimeRange(ts) || !inDateTimeRange(received) {
		return fmt.Errorf("%w: event %s: time %s or %s outside ClickHouse DateTime (1970 to 2106)", errPoison, ev.id,
			ts.Format(time.RFC3339), received.Format(time.RFC3339))
	}
	tsSec, tsMS := splitTime(ts)
	rSec, rMS := splitTime(received)
	meta := normalizeMeta(ev.meta)
	mk, mv := make([]string, len(meta)), make([]string, len(meta))
	for i, e := range meta {
		mk[i], mv[i] = e.k, e.v
	}
	entity := ""
	for i := range ev.entType {
		if i > 0 {
			entity += ","
		}
		entity += ev.entType[i] + "=" + ev.entValue[i]
	}

	b.cluster = append(b.cluster, cluster)
	b.node = append(b.node, node)
	b.check = append(b.check, ev.check)
	b.entity = append(b.entity, entity)
	b.ts = append(b.ts, tsSec)
	b.tsMS = append(b.tsMS, tsMS)
	b.id = append(b.id, ev.id)
	b.received = append(b.received, rSec)
	b.receivedMS = append(b.receivedMS, rMS)
	b.tsMissing = append(b.tsMissing, missing)
	b.version = append(b.version, ev.version)
	b.agent = append(b.agent, ev.agent)
	b.componentClass = append(b.componentClass, ev.class)
	b.isFatal = append(b.isFatal, b2u(ev.fatal))
	b.isHealthy = append(b.isHealthy, b2u(ev.healthy))
	b.message = append(b.message, ev.message)
	b.recAction = append(b.recAction, enumName(recActionNames, ev.recAction))
	b.customAction = append(b.customAction, ev.custom)
	b.errorCodes = append(b.errorCodes, stringsOrEmpty(ev.codes))
	b.entType = append(b.entType, stringsOrEmpty(ev.entType))
	b.entValue = append(b.entValue, stringsOrEmpty(ev.entValue))
	b.metaKey = append(b.metaKey, mk)
	b.metaValue = append(b.metaValue, mv)
	b.qSet = append(b.qSet, b2u(ev.quarantine.set))
	b.qForce = append(b.qForce, b2u(ev.quarantine.force))
	b.qSkip = append(b.qSkip, b2u(ev.quarantine.skip))
	b.dSet = append(b.dSet, b2u(ev.drain.set))
	b.dForce = append(b.dForce, b2u(ev.drain.force))
	b.dSkip = append(b.dSkip, b2u(ev.drain.skip))
	b.strategy = append(b.strategy, enumName(strategyNames, ev.strategy))
	b.derivedBy = append(b.derivedBy, ev.derivedBy)
	b.causeIDs = append(b.causeIDs, stringsOrEmpty(ev.causes))
	role := ""
	if ev.submitter.set {
		role = enumName(roleNames, ev.submitter.role)
	}
	b.subName = append(b.subName, ev.submitter.name)
	b.subRole = append(b.subRole, role)
	b.subNode = append(b.subNode, ev.submitter.node)
	return nil
}

// inDateTimeRange reports whether t fits a ClickHouse DateTime (UInt32
// seconds since 1970).
func inDateTimeRange(t time.Time) bool {
	return t.Unix() >= 0 && t.Unix() <= math.MaxUint32
}

// actionColumns is the column list of an actions insert, in the order of
// actionBlock's appends.
const actionColumns = `cluster, node, ts, ts_ms, id, role, kind, outcome, reason, rule, event_ids,
	dry_run, details.key, details.value, check, recommended_action, received`

// actionBlock holds decoded actions column by column.
type actionBlock struct {
	cluster, node                         []string
	ts, received                          []time.Time
	tsMS                                  []uint16
	id, role, kind, outcome, reason, rule []string
	eventIDs                              [][]string
	dryRun                                []uint8
	detKey, detValue                      [][]string
	check, recAction                      []string
}

func (b *actionBlock) len() int { return len(b.id) }

func (b *actionBlock) columns() []any {
	return []any{b.cluster, b.node, b.ts, b.tsMS, b.id, b.role, b.kind, b.outcome, b.reason, b.rule, b.eventIDs,
		b.dryRun, b.detKey, b.detValue, b.check, b.recAction, b.received}
}

func (b *actionBlock) addAction(rec *kgo.Record) error {
	a, err := events.UnmarshalAction(rec.Value)
	if err != nil {
		return fmt.Errorf("%w: %w", errPoison, err)
	}
	cluster, node, err := pipeline.CheckKey(rec.Key, a.GetCluster(), a.GetNode())
	if err != nil {
		return fmt.Errorf("%w: action %s: %w", errPoison, a.GetId(), err)
	}
	if a.GetId() == "" {
		return fmt.Errorf("%w: action has no id", errPoison)
	}
	ts := rec.Timestamp
	if a.GetTimestamp() != nil {
		ts = a.GetTimestamp().AsTime()
	}
	if !inDateTimeRange(ts) || !inDateTimeRange(rec.Timestamp) {
		return fmt.Errorf("%w: action %s: time %s outside ClickHouse DateTime (1970 to 2106)", errPoison, a.GetId(), ts.Format(time.RFC3339))
	}
	tsSec, tsMS := splitTime(ts)
	rSec, _ := splitTime(rec.Timestamp)
	dk := make([]string, 0, len(a.GetDetails()))
	for k := range a.GetDetails() {
		dk = append(dk, k)
	}
	sort.Strings(dk)
	dv := make([]string, len(dk))
	for i, k := range dk {
		dv[i] = a.GetDetails()[k]
	}
	b.cluster = append(b.cluster, cluster)
	b.node = append(b.node, node)
	b.ts = append(b.ts, tsSec)
	b.tsMS = append(b.tsMS, tsMS)
	b.id = append(b.id, a.GetId())
	b.role = append(b.role, a.GetRole())
	b.kind = append(b.kind, a.GetKind())
	b.outcome = append(b.outcome, a.GetOutcome())
	b.reason = append(b.reason, a.GetReason())
	b.rule = append(b.rule, a.GetRule())
	b.eventIDs = append(b.eventIDs, stringsOrEmpty(a.GetEventIds()))
	b.dryRun = append(b.dryRun, b2u(a.GetDryRun()))
	b.detKey = append(b.detKey, dk)
	b.detValue = append(b.detValue, dv)
	b.check = append(b.check, a.GetCheckName())
	b.recAction = append(b.recAction, a.GetRecommendedAction())
	b.received = append(b.received, rSec)
	return nil
}
