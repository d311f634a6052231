package gateway

import (
	"encoding/json"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request is checked for its shape before it is decoded. Decoding
// allocates a Go value per element of a repeated field however small the
// element is on the wire: two bytes (an empty HealthEvent) become a 336-byte
// struct, so one 4 MiB message of empty events decoded into 2 million
// events, ~790 MB, before anything looked at it. The shape check counts the
// elements of every repeated and map field in the encoded bytes, with no
// allocation per element, and refuses the request when a field has more
// than the validator would accept anyway: the events of a request
// (gateway.max_batch), errorCode (32), entitiesImpacted (64), metadata (64),
// any other repeated field (64). What is decoded is then bounded by the
// limits, not by how small an element can be encoded.

// maxRepeatedDefault bounds a repeated field that has no limit of its own.
const maxRepeatedDefault = 64

// shapeLimits are the element limits the shape check enforces.
type shapeLimits struct {
	// maxEvents bounds the events field of a request. 0 means no check at
	// all (the zero Codec of clients).
	maxEvents int
}

type fieldLimit struct {
	max  int
	noun string
}

// limit is the most elements field fd may have, and what they are called
// in the error (the validator's words, so both doors and both checks say
// the same thing).
func (l shapeLimits) limit(fd protoreflect.FieldDescriptor) fieldLimit {
	switch fd.FullName() {
	case "faultline.v1.SubmitEventsRequest.events", "datamodels.HealthEvents.events":
		return fieldLimit{l.maxEvents, "events"}
	case "datamodels.HealthEvent.errorCode":
		return fieldLimit{maxErrorCodes, "codes"}
	case "datamodels.HealthEvent.entitiesImpacted":
		return fieldLimit{maxEntities, "entities"}
	case "datamodels.HealthEvent.metadata":
		return fieldLimit{maxMetadata, "keys"}
	}
	return fieldLimit{maxRepeatedDefault, "elements"}
}

// ShapeError is a request with more elements in a field than allowed.
type ShapeError struct {
	// Field is the path of the field, e.g. "events[3].entitiesImpacted".
	Field string
	Count int
	Limit fieldLimit
}

func (e *ShapeError) Error() string {
	if e.Limit.noun == "events" {
		return fmt.Sprintf("%s: %d events exceed the batch limit of %d", e.Field, e.Count, e.Limit.max)
	}
	return fmt.Sprintf("%s: %d %s exceed the limit of %d", e.Field, e.Count, e.Limit.noun, e.Limit.max)
}

func joinPath(parent, field string) string {
	if parent == "" {
		return field
	}
	return parent + "." + field
}

// hasRepeated reports whether a message of md, or one nested in it, has a
// repeated or map field: only those need their elements walked.
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

// checkProto checks the wire form b of a message of descriptor md. A
// malformed message is left to the decoder, which refuses it (up to the
// malformed point everything was counted).
func (l shapeLimits) checkProto(b []byte, md protoreflect.MessageDescriptor, path string) error {
	if l.maxEvents == 0 {
		return nil
	}
	return l.walkProto(b, md, elemPath{prefix: path, index: -1}, 0)
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

func (l shapeLimits) walkProto(b []byte, md protoreflect.MessageDescriptor, at elemPath, depth int) error {
	if depth > 32 {
		return nil // the decoder's own recursion limit applies
	}
	var (
		counts [maxCounted]int
		more   map[int]int
	)
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		var val []byte
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil
			}
			val, b = v, b[m:]
		} else {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil
			}
			b = b[m:]
		}
		fd := fields.ByNumber(num)
		if fd == nil {
			continue
		}
		if fd.IsMap() && typ == protowire.BytesType {
			if err := checkMapEntry(val, fd, at); err != nil {
				return err
			}
		}
		count := 1
		if fd.IsList() || fd.IsMap() {
			if i := fd.Index(); i < maxCounted {
				counts[i]++
				count = counts[i]
			} else {
				if more == nil {
					more = map[int]int{}
				}
				more[i]++
				count = more[i]
			}
			if count > l.limit(fd).max {
				continue // counted; its elements are not walked
			}
		}
		sub := fd.Message()
		if sub == nil || typ != protowire.BytesType || fd.IsMap() || !hasRepeated(sub, 0) {
			continue
		}
		elem := elemPath{prefix: fd.JSONName(), index: -1}
		if p := at.String(); p != "" {
			elem.prefix = p + "." + elem.prefix
		}
		if fd.IsList() {
			elem.index = count - 1
		}
		if err := l.walkProto(val, sub, elem, depth+1); err != nil {
			return err
		}
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !fd.IsList() && !fd.IsMap() {
			continue
		}
		c := more[i]
		if i < maxCounted {
			c = counts[i]
		}
		if lim := l.limit(fd); c > lim.max {
			return &ShapeError{Field: joinPath(at.String(), fd.JSONName()), Count: c, Limit: lim}
		}
	}
	return nil
}

// checkMapEntry refuses a map entry whose key or value has another wire
// type than its field's. The standard decoder skips such a field as
// unknown (the key or value stays empty); vtprotobuf's generated decoder
// does not look at a map entry's wire types and reads it as its field's,
// so the two would decode the same bytes into different entries
// (FuzzCodecMatchesProto found one). A malformed entry is left to the
// decoder.
func checkMapEntry(b []byte, fd protoreflect.FieldDescriptor, at elemPath) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil
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
			return fmt.Errorf("%s: a map entry's %s has wire type %d, want %d", joinPath(at.String(), fd.JSONName()), part.Name(), typ, want)
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

// checkJSON checks a JSON body that protojson will decode into a message
// of descriptor md, the same way as checkProto. The scan is lenient: it
// follows only the structure (objects, arrays, strings) and stops, leaving
// the error to protojson, where the structure breaks; protojson is at least
// as strict, so it refuses the body at or before that point, and up to it
// everything was counted.
func (l shapeLimits) checkJSON(b []byte, md protoreflect.MessageDescriptor) error {
	if l.maxEvents == 0 {
		return nil
	}
	s := &jsonScan{b: b}
	s.ws()
	if !s.peek('{') {
		return nil
	}
	return s.object(l, md, "", 0)
}

// jsonScan is a cursor over a JSON document.
type jsonScan struct {
	b   []byte
	i   int
	bad bool // the structure broke: stop, protojson reports it
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScan) peek(c byte) bool { return s.i < len(s.b) && s.b[s.i] == c }

// str skips a string at the cursor and returns its raw contents (without
// the quotes) and whether it had escapes.
func (s *jsonScan) str() ([]byte, bool) {
	if !s.peek('"') {
		s.bad = true
		return nil, false
	}
	start := s.i + 1
	escaped := false
	for j := start; j < len(s.b); j++ {
		switch s.b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			s.i = j + 1
			return s.b[start:j], escaped
		}
	}
	s.bad = true
	return nil, false
}

// key decodes an object key at the cursor.
func (s *jsonScan) key() string {
	start := s.i
	raw, escaped := s.str()
	if s.bad {
		return ""
	}
	if !escaped {
		return string(raw)
	}
	var k string
	if err := json.Unmarshal(s.b[start:s.i], &k); err != nil {
		s.bad = true
	}
	return k
}

// skip skips one value at the cursor (a string, an object or array of any
// depth, without recursion, or a bare literal).
func (s *jsonScan) skip() {
	if s.i >= len(s.b) {
		s.bad = true
		return
	}
	switch s.b[s.i] {
	case '"':
		s.str()
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if s.str(); s.bad {
					return
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return
				}
			}
			s.i++
		}
		s.bad = true
	default: // a number, true, false or null: up to the next delimiter
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ':', ' ', '\t', '\n', '\r':
				return
			}
			s.i++
		}
	}
}

// members iterates the members of the object at the cursor, calling f with
// each key and the cursor at its value (f must consume the value). It
// returns the number of members, or -1 when the structure broke.
func (s *jsonScan) members(f func(key string) error) (int, error) {
	s.i++ // '{'
	n := 0
	s.ws()
	if s.peek('}') {
		s.i++
		return 0, nil
	}
	for {
		s.ws()
		k := s.key()
		if s.bad {
			return -1, nil
		}
		s.ws()
		if !s.peek(':') {
			s.bad = true
			return -1, nil
		}
		s.i++
		s.ws()
		if err := f(k); err != nil || s.bad {
			return -1, err
		}
		n++
		s.ws()
		switch {
		case s.peek(','):
			s.i++
		case s.peek('}'):
			s.i++
			return n, nil
		default:
			s.bad = true
			return -1, nil
		}
	}
}

// elements iterates the elements of the array at the cursor like members.
func (s *jsonScan) elements(f func(i int) error) (int, error) {
	s.i++ // '['
	n := 0
	s.ws()
	if s.peek(']') {
		s.i++
		return 0, nil
	}
	for {
		s.ws()
		if err := f(n); err != nil || s.bad {
			return -1, err
		}
		n++
		s.ws()
		switch {
		case s.peek(','):
			s.i++
		case s.peek(']'):
			s.i++
			return n, nil
		default:
			s.bad = true
			return -1, nil
		}
	}
}

// object checks the object at the cursor as a message of md.
func (s *jsonScan) object(l shapeLimits, md protoreflect.MessageDescriptor, path string, depth int) error {
	if depth > 32 {
		s.skip()
		return nil
	}
	fields := md.Fields()
	counts := map[protoreflect.Name]int{}
	_, err := s.members(func(k string) error {
		fd := fields.ByJSONName(k)
		if fd == nil {
			fd = fields.ByTextName(k)
		}
		if fd == nil || s.peek('n') { // unknown (protojson refuses it) or null
			s.skip()
			return nil
		}
		lim := l.limit(fd)
		name := joinPath(path, fd.JSONName())
		switch {
		case fd.IsMap() && s.peek('{'):
			n, err := s.members(func(string) error { s.skip(); return nil })
			if err != nil || n < 0 {
				return err
			}
			counts[fd.Name()] += n
		case fd.IsList() && s.peek('['):
			sub := fd.Message()
			walk := sub != nil && hasRepeated(sub, 0)
			already := counts[fd.Name()]
			n, err := s.elements(func(i int) error {
				if walk && already+i < lim.max && s.peek('{') {
					return s.object(l, sub, name+"["+strconv.Itoa(already+i)+"]", depth+1)
				}
				s.skip()
				return nil
			})
			if err != nil || n < 0 {
				return err
			}
			counts[fd.Name()] += n
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap() && s.peek('{') && hasRepeated(fd.Message(), 0):
			return s.object(l, fd.Message(), name, depth+1)
		default:
			s.skip()
		}
		if c := counts[fd.Name()]; (fd.IsList() || fd.IsMap()) && c > lim.max {
			return &ShapeError{Field: name, Count: c, Limit: lim}
		}
		return nil
	})
	return err
}
