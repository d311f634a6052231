// Package protoshape checks the shape of an encoded faultline or NVSentinel
// request before it is decoded: it counts the elements of every repeated
// and map field in the wire form and refuses a message with more than the
// validator (schemas/validate) would accept anyway.
//
// Decoding allocates a Go value per element however small the element is
// on the wire: two bytes (an empty HealthEvent) become a 336-byte struct,
// so one 4 MiB message of empty events decoded into 2 million events,
// ~800 MB, before anything looked at it. The check walks the message by its
// descriptor with no allocation per element, so what is decoded afterwards
// is bounded by the limits, not by how small an element can be encoded.
// The gateway's doors and the node agent's NVSentinel relay use it.
package protoshape

import (
	"fmt"
	"strconv"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/faultline/faultline/schemas/validate"
)

// MaxRepeated bounds a repeated or map field that has no limit of its own.
const MaxRepeated = 64

// Limits are the element limits Check enforces: MaxEvents for the events of
// a request, the validator's own limits for a HealthEvent's lists and map,
// MaxRepeated for any other repeated or map field.
type Limits struct {
	// MaxEvents bounds the events of a request (faultline.v1's
	// SubmitEventsRequest and NVSentinel's datamodels.HealthEvents): the
	// validator's MaxBatch. 0 (the zero Limits) means no check at all.
	MaxEvents int
}

// Limit is the most elements a field may have, and what they are called
// in an error (the validator's words, so both checks say the same thing).
type Limit struct {
	Max  int
	Noun string
}

// For is the limit of repeated or map field fd.
func (l Limits) For(fd protoreflect.FieldDescriptor) Limit {
	switch fd.FullName() {
	case "faultline.v1.SubmitEventsRequest.events", "datamodels.HealthEvents.events":
		return Limit{l.MaxEvents, "events"}
	case "datamodels.HealthEvent.errorCode":
		return Limit{validate.MaxErrorCodes, "codes"}
	case "datamodels.HealthEvent.entitiesImpacted":
		return Limit{validate.MaxEntities, "entities"}
	case "datamodels.HealthEvent.metadata":
		return Limit{validate.MaxMetadata, "keys"}
	}
	return Limit{MaxRepeated, "elements"}
}

// Error is a message with more elements in a field than its limit.
type Error struct {
	// Field is the path of the field, e.g. "events[3].entitiesImpacted".
	Field string
	Count int
	Limit Limit
}

func (e *Error) Error() string {
	if e.Limit.Noun == "events" {
		return fmt.Sprintf("%s: %d events exceed the batch limit of %d", e.Field, e.Count, e.Limit.Max)
	}
	return fmt.Sprintf("%s: %d %s exceed the limit of %d", e.Field, e.Count, e.Limit.Noun, e.Limit.Max)
}

// JoinPath is the path of field in the message at parent ("" for the top).
func JoinPath(parent, field string) string {
	if parent == "" {
		return field
	}
	return parent + "." + field
}

// HasRepeated reports whether a message of md, or one nested in it, has a
// repeated or map field: only those need their elements walked.
func HasRepeated(md protoreflect.MessageDescriptor) bool { return hasRepeated(md, 0) }

func hasRepeated(md protoreflect.MessageDescriptor, depth int) bool {
	if depth > 8 {
		return true // deeper than any faultline message: walk it to be safe
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsList() || fd.IsMap() {
			return true
		}
		if fd.Message() != nil && hasRepeated(fd.Message(), depth+1) {
			return true
		}
	}
	return false
}

// maxCounted is how many fields of one message are counted in a fixed
// array (HealthEvent has 30); a field past it is counted in a map.
const maxCounted = 48

// Malformed is a message that is not protobuf wire data: refused before
// decoding, since a decoder allocates every element before the point where
// it fails (a 4 MiB message of 2 million empty events and a cut tag was
// 755 MB), and vtprotobuf's skips an unknown group whose end does not
// match (which the standard decoder refuses) and decodes what follows.
type Malformed struct {
	// Field is the path of the message that does not parse ("" for the
	// request).
	Field string
	Err   error
}

func (e *Malformed) Error() string {
	if e.Field == "" {
		return "not protobuf: " + e.Err.Error()
	}
	return e.Field + ": not protobuf: " + e.Err.Error()
}

func (e *Malformed) Unwrap() error { return e.Err }

// Check checks the wire form b of a message of descriptor md, at path
// (named in errors; "" for a request). An element over its field's limit
// is an *Error; a map entry whose key or value has the wrong wire type is
// an error too (see checkMapEntry); wire data that does not parse (a tag,
// a length or a group cut short or broken, in the message or one walked
// inside it) is a *Malformed.
func (l Limits) Check(b []byte, md protoreflect.MessageDescriptor, path string) error {
	if l.MaxEvents == 0 {
		return nil
	}
	return l.walk(b, planOf(md), elemPath{prefix: path, index: -1}, 0)
}

// elemPath names the message being walked: prefix[index], or prefix when
// index is -1. It is turned into a string only for an error, or to walk a
// level deeper.
type elemPath struct {
	prefix string
	index  int
}

func (p elemPath) String() string {
	if p.index < 0 {
		return p.prefix
	}
	return p.prefix + "[" + strconv.Itoa(p.index) + "]"
}

// plan is what walk needs of a message descriptor, worked out once: the
// descriptor's methods (a field by number, its kind, its full name for
// its limit, whether a nested message has a repeated field) cost more
// than the walk itself when asked for every element.
type plan struct {
	byNum  []*fieldPlan                    // by field number, when they are small
	more   map[protowire.Number]*fieldPlan // the others
	counts []*fieldPlan                    // the repeated and map fields
}

type fieldPlan struct {
	fd      protoreflect.FieldDescriptor
	index   int  // fd.Index()
	counted bool // a list or a map
	isMap   bool
	events  bool  // limited by Limits.MaxEvents
	limit   Limit // the limit otherwise (For with no MaxEvents)
	// sub is the element's message when it is walked: a message (not a
	// map entry) with a repeated field somewhere inside.
	sub protoreflect.MessageDescriptor
}

// maxByNum bounds the field numbers a plan looks up in a slice.
const maxByNum = 256

// plans are the plans made so far, by descriptor.
var plans sync.Map // protoreflect.MessageDescriptor → *plan

func planOf(md protoreflect.MessageDescriptor) *plan {
	if p, ok := plans.Load(md); ok {
		return p.(*plan)
	}
	p := &plan{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		f := &fieldPlan{fd: fd, index: i, counted: fd.IsList() || fd.IsMap(), isMap: fd.IsMap()}
		if f.counted {
			f.limit = Limits{}.For(fd)
			f.events = f.limit.Noun == "events"
			p.counts = append(p.counts, f)
		}
		if sub := fd.Message(); sub != nil && !fd.IsMap() && hasRepeated(sub, 0) {
			f.sub = sub
		}
		if n := fd.Number(); n < maxByNum {
			for len(p.byNum) <= int(n) {
				p.byNum = append(p.byNum, nil)
			}
			p.byNum[n] = f
		} else {
			if p.more == nil {
				p.more = map[protowire.Number]*fieldPlan{}
			}
			p.more[n] = f
		}
	}
	got, _ := plans.LoadOrStore(md, p)
	return got.(*plan)
}

func (p *plan) field(num protowire.Number) *fieldPlan {
	if int(num) < len(p.byNum) && num >= 0 {
		return p.byNum[num]
	}
	return p.more[num]
}

// max is the most elements of f.
func (l Limits) max(f *fieldPlan) int {
	if f.events {
		return l.MaxEvents
	}
	return f.limit.Max
}

func (l Limits) walk(b []byte, p *plan, at elemPath, depth int) error {
	if depth > 32 {
		return nil // the decoder's own recursion limit applies
	}
	var (
		counts [maxCounted]int
		more   map[int]int
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return &Malformed{Field: at.String(), Err: protowire.ParseError(n)}
		}
		b = b[n:]
		var val []byte
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return &Malformed{Field: at.String(), Err: protowire.ParseError(m)}
			}
			val, b = v, b[m:]
		} else {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return &Malformed{Field: at.String(), Err: protowire.ParseError(m)}
			}
			b = b[m:]
		}
		f := p.field(num)
		if f == nil {
			continue
		}
		if f.isMap && typ == protowire.BytesType {
			if err := checkMapEntry(val, f.fd, at); err != nil {
				return err
			}
		}
		count := 1
		if f.counted {
			if i := f.index; i < maxCounted {
				counts[i]++
				count = counts[i]
			} else {
				if more == nil {
					more = map[int]int{}
				}
				more[i]++
				count = more[i]
			}
			if count > l.max(f) {
				continue // counted; its elements are not walked
			}
		}
		if f.sub == nil || typ != protowire.BytesType {
			continue
		}
		elem := elemPath{prefix: f.fd.JSONName(), index: -1}
		if s := at.String(); s != "" {
			elem.prefix = s + "." + elem.prefix
		}
		if f.counted {
			elem.index = count - 1
		}
		if err := l.walk(val, planOf(f.sub), elem, depth+1); err != nil {
			return err
		}
	}
	for _, f := range p.counts {
		c := more[f.index]
		if f.index < maxCounted {
			c = counts[f.index]
		}
		if lim := (Limit{l.max(f), f.limit.Noun}); c > lim.Max {
			return &Error{Field: JoinPath(at.String(), f.fd.JSONName()), Count: c, Limit: lim}
		}
	}
	return nil
}

// checkMapEntry refuses a map entry whose key or value has another wire
// type than its field's. The standard decoder skips such a field as
// unknown (the key or value stays empty); vtprotobuf's generated decoder
// does not look at a map entry's wire types and reads it as its field's,
// so the two would decode the same bytes into different entries (the
// gateway's FuzzCodecMatchesProto found one). A malformed entry is a
// *Malformed.
func checkMapEntry(b []byte, fd protoreflect.FieldDescriptor, at elemPath) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return &Malformed{Field: JoinPath(at.String(), fd.JSONName()), Err: protowire.ParseError(n)}
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return &Malformed{Field: JoinPath(at.String(), fd.JSONName()), Err: protowire.ParseError(m)}
		}
		b = b[m:]
		var part protoreflect.FieldDescriptor
		switch num {
		case 1:
			part = fd.MapKey()
		case 2:
			part = fd.MapValue()
		default:
			continue
		}
		if want := wireType(part.Kind()); typ != want {
			return fmt.Errorf("%s: a map entry's %s has wire type %d, want %d", JoinPath(at.String(), fd.JSONName()), part.Name(), typ, want)
		}
	}
	return nil
}

// wireType is the wire type a (non-packed) field of kind k is encoded with.
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Int64Kind,
		protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.BytesType // string, bytes, message
}
