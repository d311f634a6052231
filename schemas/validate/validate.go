// Package validate checks HealthEvents against faultline's limits: the
// rules the gateway applies to every submitted event, and that the agent's
// NVSentinel relay applies before it accepts an event into its spool, so
// that a monitor is told at once what the gateway would refuse (an event
// the gateway refuses later can only be dropped).
package validate

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Limits on one event; larger is rejected with the field named.
const (
	MaxNameLen      = 256  // agent, componentClass, checkName, entity type
	MaxNodeNameLen  = 253  // a Kubernetes node name
	MaxMessageLen   = 8192 // message
	MaxErrorCodes   = 32
	MaxErrorCodeLen = 128
	MaxEntities     = 64
	MaxEntityValue  = 512
	MaxIDLen        = 128
	MaxMetadata     = 64
	MaxMetadataKey  = 128
	MaxMetadataVal  = 2048
	MinYear         = 2000 // of generatedTimestamp
)

// NodeNamePattern is an RFC 1123 subdomain, as Kubernetes requires of node
// names (at most MaxNodeNameLen bytes).
var NodeNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// FieldError is a validation failure of one field.
type FieldError struct {
	Field  string
	Reason string
	// Code names, for a refusal a client can act on, what was refused
	// (ReasonFutureTimestamp, ReasonBatchLimit); "" for the others. The
	// gateway answers it as a google.rpc.ErrorInfo (StatusError).
	Code string
	// Info is Code's details: the ErrorInfo's metadata.
	Info map[string]string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validator checks submitted events.
type Validator struct {
	// MaxBatch is the most events in one batch (the gateway's
	// gateway.max_batch, 1000 by default).
	MaxBatch int
	// MaxFutureSkew is how far ahead of now generatedTimestamp may be
	// (the gateway's gateway.max_future_skew, 5m by default; at most
	// MaxFutureSkewLimit).
	MaxFutureSkew time.Duration
}

// MaxFutureSkewLimit bounds Validator.MaxFutureSkew: an accepted event's
// generatedTimestamp is at most this after the gateway received it, which
// the history reader relies on to skip what was received too early to
// hold a time it asks for (an agent clock a day ahead is broken anyway).
const MaxFutureSkewLimit = 24 * time.Hour

// ValidateBatch checks a whole request; the first problem is returned with
// the path of its field ("events[2].nodeName").
func (v Validator) ValidateBatch(evs []*datamodels.HealthEvent, now time.Time) error {
	if len(evs) == 0 {
		return fieldErr("events", "at least one event is required")
	}
	if len(evs) > v.MaxBatch {
		err := fieldErr("events", "%d events exceed the batch limit of %d", len(evs), v.MaxBatch)
		err.Code, err.Info = ReasonBatchLimit, map[string]string{InfoMaxBatch: strconv.Itoa(v.MaxBatch)}
		return err
	}
	for i, ev := range evs {
		if err := v.Validate(ev, now); err != nil {
			err.Field = fmt.Sprintf("events[%d].%s", i, err.Field)
			if err.Code != "" {
				err.Info[InfoIndex] = strconv.Itoa(i)
			}
			return err
		}
	}
	return nil
}

// Validate checks one event.
func (v Validator) Validate(ev *datamodels.HealthEvent, now time.Time) *FieldError {
	if ev == nil {
		return fieldErr("event", "must not be null")
	}
	for _, f := range []struct {
		name, val string
		max       int
	}{
		{"agent", ev.GetAgent(), MaxNameLen},
		{"componentClass", ev.GetComponentClass(), MaxNameLen},
		{"checkName", ev.GetCheckName(), MaxNameLen},
	} {
		if f.val == "" {
			return fieldErr(f.name, "required")
		}
		if len(f.val) > f.max {
			return fieldErr(f.name, "longer than %d bytes", f.max)
		}
	}
	if err := checkText(ev); err != nil {
		return err
	}
	if len(ev.GetId()) > MaxIDLen {
		return fieldErr("id", "longer than %d bytes: leave it empty, or set a key the retries of this event repeat", MaxIDLen)
	}
	switch n := ev.GetNodeName(); {
	case n == "":
		return fieldErr("nodeName", "required")
	case len(n) > MaxNodeNameLen:
		return fieldErr("nodeName", "longer than %d bytes", MaxNodeNameLen)
	case !ValidNodeName(n):
		return fieldErr("nodeName", "%q is not a valid Kubernetes node name (lowercase RFC 1123 subdomain)", Short(n))
	}
	if len(ev.GetMessage()) > MaxMessageLen {
		return fieldErr("message", "longer than %d bytes", MaxMessageLen)
	}
	if _, ok := datamodels.RecommendedAction_name[int32(ev.GetRecommendedAction())]; !ok {
		return fieldErr("recommendedAction", "unknown value %d", ev.GetRecommendedAction())
	}
	if ev.GetRecommendedAction() == datamodels.RecommendedAction_CUSTOM && ev.GetCustomRecommendedAction() == "" {
		return fieldErr("customRecommendedAction", "required when recommendedAction is CUSTOM")
	}
	if len(ev.GetCustomRecommendedAction()) > MaxNameLen {
		return fieldErr("customRecommendedAction", "longer than %d bytes", MaxNameLen)
	}
	if _, ok := datamodels.ProcessingStrategy_name[int32(ev.GetProcessingStrategy())]; !ok {
		return fieldErr("processingStrategy", "unknown value %d", ev.GetProcessingStrategy())
	}
	if len(ev.GetErrorCode()) > MaxErrorCodes {
		return fieldErr("errorCode", "%d codes exceed the limit of %d", len(ev.GetErrorCode()), MaxErrorCodes)
	}
	for i, c := range ev.GetErrorCode() {
		if c == "" || len(c) > MaxErrorCodeLen {
			return fieldErr(fmt.Sprintf("errorCode[%d]", i), "must be 1 to %d bytes", MaxErrorCodeLen)
		}
	}
	if len(ev.GetEntitiesImpacted()) > MaxEntities {
		return fieldErr("entitiesImpacted", "%d entities exceed the limit of %d", len(ev.GetEntitiesImpacted()), MaxEntities)
	}
	for i, e := range ev.GetEntitiesImpacted() {
		switch {
		case e == nil:
			return fieldErr(fmt.Sprintf("entitiesImpacted[%d]", i), "must not be null")
		case e.GetEntityType() == "" || len(e.GetEntityType()) > MaxNameLen:
			return fieldErr(fmt.Sprintf("entitiesImpacted[%d].entityType", i), "must be 1 to %d bytes", MaxNameLen)
		case e.GetEntityValue() == "" || len(e.GetEntityValue()) > MaxEntityValue:
			return fieldErr(fmt.Sprintf("entitiesImpacted[%d].entityValue", i), "must be 1 to %d bytes", MaxEntityValue)
		}
	}
	if len(ev.GetMetadata()) > MaxMetadata {
		return fieldErr("metadata", "%d keys exceed the limit of %d", len(ev.GetMetadata()), MaxMetadata)
	}
	for k, val := range ev.GetMetadata() {
		if k == "" || len(k) > MaxMetadataKey {
			return fieldErr("metadata", "key %q must be 1 to %d bytes", Short(k), MaxMetadataKey)
		}
		if len(val) > MaxMetadataVal {
			return fieldErr("metadata["+Short(k)+"]", "value longer than %d bytes", MaxMetadataVal)
		}
	}
	if ts := ev.GetGeneratedTimestamp(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			return fieldErr("generatedTimestamp", "invalid: %v", err)
		}
		t := ts.AsTime()
		if t.After(now.Add(v.MaxFutureSkew)) {
			err := fieldErr("generatedTimestamp", "%s is more than %s in the future", t.Format(time.RFC3339), v.MaxFutureSkew)
			err.Code, err.Info = ReasonFutureTimestamp, map[string]string{InfoMaxFutureSkew: v.MaxFutureSkew.String()}
			return err
		}
		if t.Year() < MinYear {
			return fieldErr("generatedTimestamp", "%s is before the year %d", t.Format(time.RFC3339), MinYear)
		}
	}
	return nil
}

// checkText rejects strings that are not UTF-8, as proto3 requires (the
// gRPC door decodes with vtprotobuf, which does not check), and control
// characters: none at all in identifiers (agent, componentClass,
// checkName, customRecommendedAction, id, errorCode, entity types and
// values, metadata keys), where a NUL, an ESC or a newline could forge a
// log line or a terminal's output downstream; in free text (message and
// metadata values) tab, newline and carriage return are allowed and every
// other control character is not.
func checkText(ev *datamodels.HealthEvent) *FieldError {
	for _, f := range [...]struct {
		name, val string
		text      bool
	}{
		{"agent", ev.GetAgent(), false}, {"componentClass", ev.GetComponentClass(), false},
		{"checkName", ev.GetCheckName(), false}, {"message", ev.GetMessage(), true},
		{"nodeName", ev.GetNodeName(), false}, {"customRecommendedAction", ev.GetCustomRecommendedAction(), false},
		{"id", ev.GetId(), false},
	} {
		if r := badString(f.val, f.text); r != "" {
			return fieldErr(f.name, "%s", r)
		}
	}
	// The field names below are formatted only for an error: this runs for
	// every event the gateway accepts.
	for i, c := range ev.GetErrorCode() {
		if r := badString(c, false); r != "" {
			return fieldErr(fmt.Sprintf("errorCode[%d]", i), "%s", r)
		}
	}
	for i, e := range ev.GetEntitiesImpacted() {
		if r := badString(e.GetEntityType(), false); r != "" {
			return fieldErr(fmt.Sprintf("entitiesImpacted[%d].entityType", i), "%s", r)
		}
		if r := badString(e.GetEntityValue(), false); r != "" {
			return fieldErr(fmt.Sprintf("entitiesImpacted[%d].entityValue", i), "%s", r)
		}
	}
	for k, v := range ev.GetMetadata() {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fieldErr("metadata", "a key or value is not valid UTF-8")
		}
		if r := badString(k, false); r != "" {
			return fieldErr("metadata", "key %q %s", Short(k), r)
		}
		if r := badString(v, true); r != "" {
			return fieldErr("metadata["+Short(k)+"]", "%s", r)
		}
	}
	return nil
}

// badString checks one string (see checkText); text allows \t, \n, \r.
// It returns why the string is refused, or "" when it is accepted.
func badString(v string, text bool) string {
	// Fast path: ASCII with no control character (almost every string).
	ascii := true
	for i := 0; i < len(v); i++ {
		b := v[i]
		if b >= utf8.RuneSelf || b < ' ' || b == 0x7f {
			ascii = false
			break
		}
	}
	if ascii {
		return ""
	}
	if !utf8.ValidString(v) {
		return "not valid UTF-8"
	}
	for i, r := range v {
		if !unicode.IsControl(r) || (text && (r == '\t' || r == '\n' || r == '\r')) {
			continue
		}
		what := "an identifier"
		if text {
			what = "text (tab, newline and carriage return are allowed)"
		}
		return fmt.Sprintf("control character %U at byte %d is not allowed in %s", r, i, what)
	}
	return ""
}

// Clean makes what an agent put into ev from what it read (a log line, a
// tool's output) pass Validate: the message, metadata values and entity
// values printable (events.Printable) and cut to their limits, an entity
// left empty dropped (the event is then the node's), and a
// generatedTimestamp after now (a line written before the clock was set
// back) or before MinYear replaced by now; error codes printable, cut,
// the empty and repeated ones dropped and the rest cut to MaxErrorCodes
// (a DCGM diagnostic failing eleven tests on a GPU with the same two
// errors made 33), entities past MaxEntities dropped. An event the gateway
// refused would be dropped from the agent's spool, its fault never
// reported.
func Clean(ev *datamodels.HealthEvent, now time.Time) {
	if ts := ev.GetGeneratedTimestamp(); ts != nil {
		if t := ts.AsTime(); t.After(now) || t.Year() < MinYear {
			ev.GeneratedTimestamp = timestamppb.New(now)
		}
	}
	ev.Message = events.Truncate(events.Printable(ev.Message), MaxMessageLen)
	for k, v := range ev.Metadata {
		ev.Metadata[k] = events.Truncate(events.Printable(v), MaxMetadataVal)
	}
	kept := ev.EntitiesImpacted[:0]
	for _, e := range ev.EntitiesImpacted {
		if v := events.Printable(e.GetEntityValue()); v != "" {
			e.EntityValue = events.Truncate(v, MaxEntityValue)
			kept = append(kept, e)
		}
	}
	ev.EntitiesImpacted = kept[:min(len(kept), MaxEntities)]
	codes := ev.ErrorCode[:0]
	for _, c := range ev.ErrorCode {
		c = events.Truncate(events.Printable(c), MaxErrorCodeLen)
		if c != "" && len(codes) < MaxErrorCodes && !slices.Contains(codes, c) {
			codes = append(codes, c)
		}
	}
	ev.ErrorCode = codes
}

// ValidNodeName reports whether n matches NodeNamePattern (a lowercase
// RFC 1123 subdomain), without the regexp engine: it runs for every event.
func ValidNodeName(n string) bool {
	if n == "" {
		return false
	}
	start := 0 // of the current label
	for i := 0; i <= len(n); i++ {
		if i < len(n) && n[i] != '.' {
			if c := n[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
			continue
		}
		// n[start:i] is a label: not empty, alphanumeric at both ends.
		if i == start || n[start] == '-' || n[i-1] == '-' {
			return false
		}
		start = i + 1
	}
	return true
}

// Short returns s, or its first 64 bytes (on a UTF-8 boundary) and "…",
// for quoting client strings in error messages.
func Short(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	for i := max; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i] + "…"
		}
	}
	return ""
}
