// Package rows is the one mapping of faultline's records to ClickHouse
// rows: a HealthEvent record to a row of the events table, an Action
// record to a row of the actions table (sql/migrations). The store role
// inserts these rows; the correlate role sends the rows of a batch it has
// not seen stored yet along with its window queries, as an external table
// with the same column names (Events.Table), so a rule's
// SQL reads the batch exactly as it reads the table.
//
// Records are decoded column by column (decode.go: protowire straight into
// the columns, the store's main CPU cost). A record that can never be a
// row — undecodable, no id, a key that disagrees with its payload, a time
// outside ClickHouse's DateTime — is an error wrapping ErrPoison.
package rows

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// Column is one column of a table: its name and ClickHouse type.
type Column struct{ Name, Type string }

// EventTable is the events table's columns that Events fills, in the order
// of Events.Columns.
var EventTable = []Column{
	{"cluster", "String"}, {"node", "String"}, {"check", "String"}, {"entity", "String"},
	{"ts", "DateTime"}, {"ts_ms", "UInt16"}, {"id", "String"}, {"received", "DateTime"}, {"received_ms", "UInt16"},
	{"ts_missing", "UInt8"}, {"version", "UInt32"}, {"agent", "String"}, {"component_class", "String"},
	{"is_fatal", "UInt8"}, {"is_healthy", "UInt8"}, {"message", "String"}, {"recommended_action", "String"},
	{"custom_recommended_action", "String"}, {"error_codes", "Array(String)"},
	{"entities.type", "Array(String)"}, {"entities.value", "Array(String)"},
	{"metadata.key", "Array(String)"}, {"metadata.value", "Array(String)"},
	{"quarantine_set", "UInt8"}, {"quarantine_force", "UInt8"}, {"quarantine_skip", "UInt8"},
	{"drain_set", "UInt8"}, {"drain_force", "UInt8"}, {"drain_skip", "UInt8"},
	{"processing_strategy", "String"}, {"derived_by", "String"}, {"cause_ids", "Array(String)"},
	{"submitter_name", "String"}, {"submitter_role", "String"}, {"submitter_node", "String"},
}

// ActionTable is the actions table's columns that Actions fills, in the
// order of Actions.Columns.
var ActionTable = []Column{
	{"cluster", "String"}, {"node", "String"}, {"ts", "DateTime"}, {"ts_ms", "UInt16"}, {"id", "String"},
	{"role", "String"}, {"kind", "String"}, {"outcome", "String"}, {"reason", "String"}, {"rule", "String"},
	{"event_ids", "Array(String)"}, {"dry_run", "UInt8"}, {"details.key", "Array(String)"},
	{"details.value", "Array(String)"}, {"check", "String"}, {"recommended_action", "String"},
	{"received", "DateTime"},
}

// Names is the comma-separated column list of an insert.
func Names(cols []Column) string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

// EventColumns is the column list of an events insert, in the order of
// Events.Columns.
var EventColumns = Names(EventTable)

// ActionColumns is the column list of an actions insert, in the order of
// Actions.Columns.
var ActionColumns = Names(ActionTable)

// Events holds decoded events column by column, ready for a columnar
// insert.
type Events struct {
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

	// scratch is the record being decoded, its slices reused record after
	// record; strs and text hold the rows' array elements and entity
	// strings, a batch's in a few allocations instead of several per row.
	// Both are only appended to: a row's part is never written again, and
	// one that a growth left in an earlier array stays valid there.
	scratch wireEvent
	strs    []string
	text    []byte
}

// Len is the number of rows.
func (b *Events) Len() int { return len(b.id) }

// Columns returns the rows column by column, in EventTable order.
func (b *Events) Columns() []any {
	return []any{b.cluster, b.node, b.check, b.entity, b.ts, b.tsMS, b.id, b.received, b.receivedMS, b.tsMissing,
		b.version, b.agent, b.componentClass, b.isFatal, b.isHealthy, b.message, b.recAction,
		b.customAction, b.errorCodes, b.entType, b.entValue, b.metaKey,
		b.metaValue, b.qSet, b.qForce, b.qSkip, b.dSet, b.dForce,
		b.dSkip, b.strategy, b.derivedBy, b.causeIDs, b.subName, b.subRole,
		b.subNode}
}

// Grow makes room for n more rows, so a batch's columns are allocated once
// instead of doubling as its rows arrive.
func (b *Events) Grow(n int) {
	for _, c := range []*[]string{&b.cluster, &b.node, &b.check, &b.entity, &b.id, &b.agent, &b.componentClass,
		&b.message, &b.recAction, &b.customAction, &b.strategy, &b.derivedBy, &b.subName, &b.subRole, &b.subNode} {
		*c = slices.Grow(*c, n)
	}
	for _, c := range []*[][]string{&b.errorCodes, &b.entType, &b.entValue, &b.metaKey, &b.metaValue, &b.causeIDs} {
		*c = slices.Grow(*c, n)
	}
	for _, c := range []*[]uint8{&b.tsMissing, &b.isFatal, &b.isHealthy, &b.qSet, &b.qForce, &b.qSkip, &b.dSet, &b.dForce, &b.dSkip} {
		*c = slices.Grow(*c, n)
	}
	b.ts, b.received = slices.Grow(b.ts, n), slices.Grow(b.received, n)
	b.tsMS, b.receivedMS = slices.Grow(b.tsMS, n), slices.Grow(b.receivedMS, n)
	b.version = slices.Grow(b.version, n)
}

// AppendColumn appends a column's values (one of Events.Columns,
// Actions.Columns) to dst. An Array(String) column goes in row by row:
// clickhouse-go appends a [][]string whole by reflection, a value per
// element, and row by row without (over a quarter of the store's handling
// CPU before).
func AppendColumn(dst driver.BatchColumn, values any) error {
	arrs, ok := values.([][]string)
	if !ok {
		return dst.Append(values)
	}
	for _, a := range arrs {
		if err := dst.AppendRow(a); err != nil {
			return err
		}
	}
	return nil
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

// ErrPoison marks a record that can never be a row.
var ErrPoison = errors.New("poison record")

// Add decodes an events-topic record and appends its row; the error wraps ErrPoison when the
// record can never be stored.
func (b *Events) Add(rec *kgo.Record) error {
	ev := &b.scratch
	ev.reset()
	if err := decodeEvent(rec.Value, ev); err != nil {
		return fmt.Errorf("%w: decode HealthEvent: %w", ErrPoison, err)
	}
	// Key and payload must name the same node: the quarantine role acts
	// on what the store records. An empty payload field takes the key's.
	cluster, node, err := pipeline.CheckKey(rec.Key, ev.cluster, ev.node)
	if err != nil {
		return fmt.Errorf("%w: event %s: %w", ErrPoison, ev.id, err)
	}
	if ev.id == "" {
		return fmt.Errorf("%w: event has no id", ErrPoison)
	}
	received := rec.Timestamp
	if ev.received.set {
		if !ev.received.valid() {
			return fmt.Errorf("%w: event %s: receivedTimestamp is not a valid timestamp", ErrPoison, ev.id)
		}
		received = ev.received.time()
	}
	ts, missing := received, uint8(1)
	if ev.generated.set {
		if !ev.generated.valid() {
			return fmt.Errorf("%w: event %s: generatedTimestamp is not a valid timestamp", ErrPoison, ev.id)
		}
		ts, missing = ev.generated.time(), 0
	}
	if !inDateTimeRange(ts) || !inDateTimeRange(received) {
		return fmt.Errorf("%w: event %s: time %s or %s outside ClickHouse DateTime (1970 to 2106)", ErrPoison, ev.id,
			ts.Format(time.RFC3339), received.Format(time.RFC3339))
	}
	tsSec, tsMS := splitTime(ts)
	rSec, rMS := splitTime(received)
	meta := normalizeMeta(ev.meta)
	mk, mv := b.keepN(len(meta)), b.keepN(len(meta))
	for i, e := range meta {
		mk[i], mv[i] = e.k, e.v
	}
	start := len(b.text)
	for i := range ev.entType {
		if i > 0 {
			b.text = append(b.text, ',')
		}
		b.text = append(b.text, ev.entType[i]...)
		b.text = append(b.text, '=')
		b.text = append(b.text, ev.entValue[i]...)
	}
	entity := bstr(b.text[start:])

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
	b.errorCodes = append(b.errorCodes, b.keep(ev.codes))
	b.entType = append(b.entType, b.keep(ev.entType))
	b.entValue = append(b.entValue, b.keep(ev.entValue))
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
	b.causeIDs = append(b.causeIDs, b.keep(ev.causes))
	role := ""
	if ev.submitter.set {
		role = enumName(roleNames, ev.submitter.role)
	}
	b.subName = append(b.subName, ev.submitter.name)
	b.subRole = append(b.subRole, role)
	b.subNode = append(b.subNode, ev.submitter.node)
	return nil
}

// keepN returns n strings of the batch's strs for a row's array (an empty,
// non-nil slice for none: a nil one is not an Array(String) value).
func (b *Events) keepN(n int) []string {
	if n == 0 {
		return []string{}
	}
	start := len(b.strs)
	b.strs = slices.Grow(b.strs, n)[:start+n]
	return b.strs[start : start+n : start+n]
}

// keep returns a copy of s in the batch's strs.
func (b *Events) keep(s []string) []string {
	c := b.keepN(len(s))
	copy(c, s)
	return c
}

// inDateTimeRange reports whether t fits a ClickHouse DateTime (UInt32
// seconds since 1970).
func inDateTimeRange(t time.Time) bool {
	return t.Unix() >= 0 && t.Unix() <= math.MaxUint32
}

// Actions holds decoded actions column by column.
type Actions struct {
	cluster, node                         []string
	ts, received                          []time.Time
	tsMS                                  []uint16
	id, role, kind, outcome, reason, rule []string
	eventIDs                              [][]string
	dryRun                                []uint8
	detKey, detValue                      [][]string
	check, recAction                      []string
}

// Len is the number of rows.
func (b *Actions) Len() int { return len(b.id) }

// Columns returns the rows column by column, in ActionTable order.
func (b *Actions) Columns() []any {
	return []any{b.cluster, b.node, b.ts, b.tsMS, b.id, b.role, b.kind, b.outcome, b.reason, b.rule, b.eventIDs,
		b.dryRun, b.detKey, b.detValue, b.check, b.recAction, b.received}
}

// Add decodes an actions-topic record and appends its row; the error
// wraps ErrPoison when the record can never be stored.
func (b *Actions) Add(rec *kgo.Record) error {
	a, err := events.UnmarshalAction(rec.Value)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPoison, err)
	}
	cluster, node, err := pipeline.CheckKey(rec.Key, a.GetCluster(), a.GetNode())
	if err != nil {
		return fmt.Errorf("%w: action %s: %w", ErrPoison, a.GetId(), err)
	}
	if a.GetId() == "" {
		return fmt.Errorf("%w: action has no id", ErrPoison)
	}
	ts := rec.Timestamp
	if a.GetTimestamp() != nil {
		ts = a.GetTimestamp().AsTime()
	}
	if !inDateTimeRange(ts) || !inDateTimeRange(rec.Timestamp) {
		return fmt.Errorf("%w: action %s: time %s outside ClickHouse DateTime (1970 to 2106)", ErrPoison, a.GetId(), ts.Format(time.RFC3339))
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

// Table returns the named columns of the rows as a ClickHouse external
// table called name: sent along with a query, read in it like a table.
// Its columns are filled whole (AppendColumn), not row by row.
func (b *Events) Table(name string, columns ...string) (*ext.Table, error) {
	return table(name, EventTable, b.Columns(), columns)
}

// Table is Events.Table for actions rows (ActionTable).
func (b *Actions) Table(name string, columns ...string) (*ext.Table, error) {
	return table(name, ActionTable, b.Columns(), columns)
}

// table is the external table of the named columns out of cols (the
// columns of all, in its order).
func table(name string, all []Column, cols []any, names []string) (*ext.Table, error) {
	idx := make([]int, len(names))
	opts := make([]func(*ext.Table) error, len(names))
	for k, want := range names {
		i := slices.IndexFunc(all, func(c Column) bool { return c.Name == want })
		if i < 0 {
			return nil, fmt.Errorf("external table %s: no column %q", name, want)
		}
		idx[k], opts[k] = i, ext.Column(all[i].Name, column.Type(all[i].Type))
	}
	t, err := ext.NewTable(name, opts...)
	if err != nil {
		return nil, fmt.Errorf("external table %s: %w", name, err)
	}
	for k, col := range t.Block().Columns {
		if err := AppendColumn(Appender{col}, cols[idx[k]]); err != nil {
			return nil, fmt.Errorf("external table %s, column %s: %w", name, names[k], err)
		}
	}
	return t, nil
}

// Appender is a clickhouse-go column (an external table's, an insert's) as
// the driver.BatchColumn AppendColumn fills.
type Appender struct{ column.Interface }

// Append appends a column's worth of values.
func (c Appender) Append(v any) error {
	_, err := c.Interface.Append(v)
	return err
}
