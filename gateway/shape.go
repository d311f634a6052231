package gateway

import (
	"encoding/json"
	"strconv"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/faultline/faultline/internal/protoshape"
)

// A request is checked for its shape before it is decoded (see
// internal/protoshape): the elements of every repeated and map field are
// counted in the encoded bytes, with no allocation per element, and the
// request refused when a field has more than the validator would accept
// anyway: the events of a request (gateway.max_batch), errorCode (32),
// entitiesImpacted (64), metadata (64), any other repeated field (64).
// protoshape walks the protobuf wire form; the JSON body of the REST door
// is walked here, to the same limits.

// shapeLimits are the element limits the shape check enforces.
type shapeLimits struct {
	// maxEvents bounds the events field of a request. 0 means no check at
	// all (the zero Codec of clients).
	maxEvents int
}

func (l shapeLimits) shape() protoshape.Limits { return protoshape.Limits{MaxEvents: l.maxEvents} }

// checkProto checks the wire form b of a message of descriptor md (see
// protoshape.Limits.Check).
func (l shapeLimits) checkProto(b []byte, md protoreflect.MessageDescriptor, path string) error {
	return l.shape().Check(b, md, path)
}

// checkJSON checks a JSON body that protojson will decode into a message
// of descriptor md, the same way as checkProto. The scan is lenient: it
// follows only the structure (objects, arrays, strings) and stops, leaving
// the error to protojson, where the structure breaks; protojson is at least
// as strict, so it refuses the body at or before that point, and what it
// decodes up to there was counted and checked (a body of 2 million empty
// events with its end cut off is refused here, not decoded).
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
// returns the number of members; where the structure broke (s.bad), those
// begun before it, which protojson decodes before it refuses the body, so
// they count against the limits too.
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
			return n, nil
		}
		s.ws()
		if !s.peek(':') {
			s.bad = true
			return n, nil
		}
		s.i++
		s.ws()
		if err := f(k); err != nil || s.bad {
			return n + 1, err
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
			return n, nil
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
			return n + 1, err
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
			return n, nil
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
		lim := l.shape().For(fd)
		name := protoshape.JoinPath(path, fd.JSONName())
		switch {
		case fd.IsMap() && s.peek('{'):
			n, err := s.members(func(string) error { s.skip(); return nil })
			if err != nil {
				return err
			}
			counts[fd.Name()] += n
		case fd.IsList() && s.peek('['):
			sub := fd.Message()
			walk := sub != nil && protoshape.HasRepeated(sub)
			already := counts[fd.Name()]
			n, err := s.elements(func(i int) error {
				if walk && already+i < lim.Max && s.peek('{') {
					return s.object(l, sub, name+"["+strconv.Itoa(already+i)+"]", depth+1)
				}
				s.skip()
				return nil
			})
			if err != nil {
				return err
			}
			counts[fd.Name()] += n
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap() && s.peek('{') && protoshape.HasRepeated(fd.Message()):
			return s.object(l, fd.Message(), name, depth+1)
		default:
			s.skip()
		}
		if c := counts[fd.Name()]; (fd.IsList() || fd.IsMap()) && c > lim.Max {
			return &protoshape.Error{Field: name, Count: c, Limit: lim}
		}
		return nil
	})
	return err
}
