package gateway

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// decodeSubmitFast decodes the common form of a POST /v1/events body
// into req without protojson's reflection, and reports whether it did.
// It takes only a strict subset of what protojson accepts, read exactly
// as protojson reads it: one "events" array of events whose fields are
// the usual ones (version as digits, agent, componentClass, checkName, isFatal, isHealthy,
// message, recommendedAction and processingStrategy by name, errorCode,
// entitiesImpacted, metadata, generatedTimestamp, nodeName, id,
// customRecommendedAction), strings without escapes in valid UTF-8, each
// field once. Anything else — another field, an escape, a number, null, a
// duplicate, a syntax error, trailing bytes — returns false with req
// untouched, and the body goes to protojson, which accepts it or answers
// the same error as ever. FuzzDecodeSubmitFastMatchesProtojson holds it
// to protojson.
func decodeSubmitFast(b []byte, req *faultlinev1.SubmitEventsRequest) bool {
	d := fastJSON{b: b}
	if !d.next('{') || d.key() != "events" || !d.next('[') {
		return false
	}
	var evs []*datamodels.HealthEvent
	if !d.next(']') {
		for {
			ev := d.event()
			if ev == nil {
				return false
			}
			evs = append(evs, ev)
			if d.next(',') {
				continue
			}
			if d.next(']') {
				break
			}
			return false
		}
	}
	if !d.next('}') {
		return false
	}
	d.space()
	if d.i != len(d.b) {
		return false
	}
	req.Reset() // as protojson does
	req.Events = evs
	return true
}

// fastJSON reads the JSON decodeSubmitFast takes; every method fails
// (false, "", nil) on anything outside it.
type fastJSON struct {
	b []byte
	i int
}

// space skips JSON whitespace.
func (d *fastJSON) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// next consumes c, after whitespace, if it comes next.
func (d *fastJSON) next(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// raw reads a string without escapes or control characters, in valid
// UTF-8, and returns its bytes (nil, ok false otherwise).
func (d *fastJSON) raw() ([]byte, bool) {
	if !d.next('"') {
		return nil, false
	}
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		}
		d.i++
	}
	return nil, false
}

// str reads a string value.
func (d *fastJSON) str() (string, bool) {
	s, ok := d.raw()
	return string(s), ok
}

// key reads an object key and its colon ("" when there is none).
func (d *fastJSON) key() string {
	k, ok := d.raw()
	if !ok || len(k) == 0 || !d.next(':') {
		return ""
	}
	return string(k)
}

// boolean reads true or false.
func (d *fastJSON) boolean() (v, ok bool) {
	d.space()
	switch {
	case len(d.b)-d.i >= 4 && string(d.b[d.i:d.i+4]) == "true":
		d.i += 4
		return true, true
	case len(d.b)-d.i >= 5 && string(d.b[d.i:d.i+5]) == "false":
		d.i += 5
		return false, true
	}
	return false, false
}

// uint32 reads a number written as decimal digits alone, no leading
// zero, at most 4294967295 (protojson also takes fractions, exponents and
// quotes: those go to it).
func (d *fastJSON) uint32() (uint32, bool) {
	d.space()
	start := d.i
	var n uint64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		n = n*10 + uint64(d.b[d.i]-'0')
		d.i++
		if d.i-start > 10 {
			return 0, false
		}
	}
	switch {
	case d.i == start, d.i-start > 1 && d.b[start] == '0', n > 1<<32-1:
		return 0, false
	case d.i < len(d.b) && (d.b[d.i] == '.' || d.b[d.i] == 'e' || d.b[d.i] == 'E'):
		return 0, false
	}
	return uint32(n), true
}

// strings reads an array of strings.
func (d *fastJSON) strings() ([]string, bool) {
	if !d.next('[') {
		return nil, false
	}
	var out []string
	if d.next(']') {
		return out, true
	}
	for {
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		if d.next(',') {
			continue
		}
		return out, d.next(']')
	}
}

// members reads an object's members, calling member with each key after
// its colon; member reads the value. A key seen twice fails.
func (d *fastJSON) members(member func(key string) bool) bool {
	if !d.next('{') {
		return false
	}
	if d.next('}') {
		return true
	}
	for {
		k := d.key()
		if k == "" || !member(k) {
			return false
		}
		if d.next(',') {
			continue
		}
		return d.next('}')
	}
}

// event reads one HealthEvent (nil when it cannot).
func (d *fastJSON) event() *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{}
	var seen uint32
	ok := d.members(func(k string) bool {
		var bit uint32
		var ok bool
		switch k {
		case "version":
			bit = 1 << 15
			ev.Version, ok = d.uint32()
		case "agent":
			bit = 1 << 0
			ev.Agent, ok = d.str()
		case "componentClass":
			bit = 1 << 1
			ev.ComponentClass, ok = d.str()
		case "checkName":
			bit = 1 << 2
			ev.CheckName, ok = d.str()
		case "isFatal":
			bit = 1 << 3
			ev.IsFatal, ok = d.boolean()
		case "isHealthy":
			bit = 1 << 4
			ev.IsHealthy, ok = d.boolean()
		case "message":
			bit = 1 << 5
			ev.Message, ok = d.str()
		case "recommendedAction":
			bit = 1 << 6
			ev.RecommendedAction, ok = enum[datamodels.RecommendedAction](d, datamodels.RecommendedAction_value)
		case "errorCode":
			bit = 1 << 7
			ev.ErrorCode, ok = d.strings()
		case "entitiesImpacted":
			bit = 1 << 8
			ev.EntitiesImpacted, ok = d.entities()
		case "metadata":
			bit = 1 << 9
			ev.Metadata, ok = d.metadata()
		case "generatedTimestamp":
			bit = 1 << 10
			ev.GeneratedTimestamp, ok = d.timestamp()
		case "nodeName":
			bit = 1 << 11
			ev.NodeName, ok = d.str()
		case "processingStrategy":
			bit = 1 << 12
			ev.ProcessingStrategy, ok = enum[datamodels.ProcessingStrategy](d, datamodels.ProcessingStrategy_value)
		case "id":
			bit = 1 << 13
			ev.Id, ok = d.str()
		case "customRecommendedAction":
			bit = 1 << 14
			ev.CustomRecommendedAction, ok = d.str()
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	if !ok {
		return nil
	}
	return ev
}

// enum reads an enum value by its name, protojson's form (values: the
// generated name → number map).
func enum[E ~int32](d *fastJSON, values map[string]int32) (E, bool) {
	name, ok := d.str()
	if !ok {
		return 0, false
	}
	n, ok := values[name]
	return E(n), ok
}

// entities reads entitiesImpacted.
func (d *fastJSON) entities() ([]*datamodels.Entity, bool) {
	if !d.next('[') {
		return nil, false
	}
	var out []*datamodels.Entity
	if d.next(']') {
		return out, true
	}
	for {
		e := &datamodels.Entity{}
		var seen uint8
		ok := d.members(func(k string) bool {
			var bit uint8
			var ok bool
			switch k {
			case "entityType":
				bit = 1
				e.EntityType, ok = d.str()
			case "entityValue":
				bit = 2
				e.EntityValue, ok = d.str()
			default:
				return false
			}
			if !ok || seen&bit != 0 {
				return false
			}
			seen |= bit
			return true
		})
		if !ok {
			return nil, false
		}
		out = append(out, e)
		if d.next(',') {
			continue
		}
		return out, d.next(']')
	}
}

// metadata reads the metadata map; a key seen twice fails (protojson
// refuses it).
func (d *fastJSON) metadata() (map[string]string, bool) {
	m := map[string]string{}
	ok := d.members(func(k string) bool {
		v, ok := d.str()
		if _, dup := m[k]; dup || !ok {
			return false
		}
		m[k] = v
		return true
	})
	return m, ok
}

// timestamp reads a Timestamp, parsed by protojson itself (its rules on
// RFC 3339 forms and ranges are its own).
func (d *fastJSON) timestamp() (*timestamppb.Timestamp, bool) {
	d.space()
	start := d.i
	if _, ok := d.raw(); !ok {
		return nil, false
	}
	ts := &timestamppb.Timestamp{}
	if protojson.Unmarshal(d.b[start:d.i], ts) != nil {
		return nil, false
	}
	return ts, true
}
