package rows

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The store decodes HealthEvent records with protowire straight into
// columns instead of proto.Unmarshal into a message: no message, map or
// per-string allocations (strings point into the record value, which is
// never modified and outlives the insert). This is about 5x cheaper per
// event and the store's main CPU cost. The semantics are proto.Unmarshal's:
// last value wins for scalars, repeated embedded messages merge, map keys
// are unique (last wins), fields with an unexpected wire type and unknown
// fields are skipped, and invalid UTF-8 in a string is an error.
// TestDecodeMatchesProto and FuzzDecode hold it to proto.Unmarshal.

// wireEvent is one decoded HealthEvent, its strings aliasing the record.
type wireEvent struct {
	version                                        uint32
	agent, class, check, message, node, id, custom string
	cluster, derivedBy                             string
	fatal, healthy                                 bool
	recAction, strategy                            int32
	codes, causes                                  []string
	entType, entValue                              []string
	meta                                           []kv
	generated, received                            wireTime
	quarantine, drain                              wireOverrides
	submitter                                      wireSubmitter
}

// reset empties ev for the next record, keeping its slices' room.
func (ev *wireEvent) reset() {
	*ev = wireEvent{codes: ev.codes[:0], causes: ev.causes[:0], entType: ev.entType[:0],
		entValue: ev.entValue[:0], meta: ev.meta[:0]}
}

type kv struct{ k, v string }

type wireTime struct {
	set   bool
	sec   int64
	nanos int32
}

type wireOverrides struct{ set, force, skip bool }

// wireSubmitter is HealthEvent.submitter (field 105): name (1), role (2),
// node (3).
type wireSubmitter struct {
	set        bool
	name, node string
	role       int32
}

var errBadWire = errors.New("malformed protobuf")

// bstr returns b as a string without copying.
func bstr(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// fieldLoop calls f for every field of msg; f returns how many bytes of
// the value it consumed, or -1 to have the value skipped.
func fieldLoop(msg []byte, f func(num protowire.Number, typ protowire.Type, b []byte) int) error {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return fmt.Errorf("%w: %w", errBadWire, protowire.ParseError(n))
		}
		if !num.IsValid() { // ConsumeTag checks only the lower bound; proto.Unmarshal both
			return fmt.Errorf("%w: field number %d is over the maximum %d", errBadWire, num, protowire.MaxValidNumber)
		}
		msg = msg[n:]
		m := f(num, typ, msg)
		if m < 0 {
			m = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if m < 0 {
			return fmt.Errorf("%w: field %d: %w", errBadWire, num, protowire.ParseError(m))
		}
		msg = msg[m:]
	}
	return nil
}

// str consumes a length-delimited UTF-8 string.
func str(b []byte, dst *string, bad *error) int {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n
	}
	if !utf8.Valid(v) {
		*bad = fmt.Errorf("%w: string field is not valid UTF-8", errBadWire)
	}
	*dst = bstr(v)
	return n
}

func decodeEvent(msg []byte, ev *wireEvent) error {
	var bad error
	err := fieldLoop(msg, func(num protowire.Number, typ protowire.Type, b []byte) int {
		if typ == protowire.BytesType {
			switch num {
			case 2:
				return str(b, &ev.agent, &bad)
			case 3:
				return str(b, &ev.class, &bad)
			case 4:
				return str(b, &ev.check, &bad)
			case 7:
				return str(b, &ev.message, &bad)
			case 13:
				return str(b, &ev.node, &bad)
			case 17:
				return str(b, &ev.id, &bad)
			case 18:
				return str(b, &ev.custom, &bad)
			case 101:
				return str(b, &ev.cluster, &bad)
			case 103:
				return str(b, &ev.derivedBy, &bad)
			case 9, 104:
				var s string
				n := str(b, &s, &bad)
				if n >= 0 {
					if num == 9 {
						ev.codes = append(ev.codes, s)
					} else {
						ev.causes = append(ev.causes, s)
					}
				}
				return n
			case 10, 11, 12, 14, 15, 102, 105:
				v, n := protowire.ConsumeBytes(b)
				if n < 0 {
					return n
				}
				var err error
				switch num {
				case 10:
					var t, val string
					err = fieldLoop(v, func(num protowire.Number, typ protowire.Type, b []byte) int {
						switch {
						case num == 1 && typ == protowire.BytesType:
							return str(b, &t, &bad)
						case num == 2 && typ == protowire.BytesType:
							return str(b, &val, &bad)
						}
						return -1
					})
					ev.entType, ev.entValue = append(ev.entType, t), append(ev.entValue, val)
				case 11:
					var e kv
					err = fieldLoop(v, func(num protowire.Number, typ protowire.Type, b []byte) int {
						switch {
						case num == 1 && typ == protowire.BytesType:
							return str(b, &e.k, &bad)
						case num == 2 && typ == protowire.BytesType:
							return str(b, &e.v, &bad)
						}
						return -1
					})
					ev.meta = append(ev.meta, e)
				case 12, 102:
					t := &ev.generated
					if num == 102 {
						t = &ev.received
					}
					t.set = true
					err = fieldLoop(v, func(num protowire.Number, typ protowire.Type, b []byte) int {
						if typ != protowire.VarintType || (num != 1 && num != 2) {
							return -1
						}
						x, n := protowire.ConsumeVarint(b)
						if num == 1 {
							t.sec = int64(x)
						} else {
							t.nanos = int32(x)
						}
						return n
					})
				case 105:
					// A repeated embedded message merges, as proto.Unmarshal does.
					sub := &ev.submitter
					sub.set = true
					err = fieldLoop(v, func(num protowire.Number, typ protowire.Type, b []byte) int {
						switch {
						case num == 1 && typ == protowire.BytesType:
							return str(b, &sub.name, &bad)
						case num == 3 && typ == protowire.BytesType:
							return str(b, &sub.node, &bad)
						case num == 2 && typ == protowire.VarintType:
							x, n := protowire.ConsumeVarint(b)
							sub.role = int32(x)
							return n
						}
						return -1
					})
				case 14, 15:
					o := &ev.quarantine
					if num == 15 {
						o = &ev.drain
					}
					o.set = true
					err = fieldLoop(v, func(num protowire.Number, typ protowire.Type, b []byte) int {
						if typ != protowire.VarintType || (num != 1 && num != 2) {
							return -1
						}
						x, n := protowire.ConsumeVarint(b)
						if num == 1 {
							o.force = x != 0
						} else {
							o.skip = x != 0
						}
						return n
					})
				}
				if err != nil {
					bad = err
				}
				return n
			}
			return -1
		}
		if typ == protowire.VarintType {
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return n
			}
			switch num {
			case 1:
				ev.version = uint32(x)
			case 5:
				ev.fatal = x != 0
			case 6:
				ev.healthy = x != 0
			case 8:
				ev.recAction = int32(x)
			case 16:
				ev.strategy = int32(x)
			default:
				return -1
			}
			return n
		}
		return -1
	})
	if err != nil {
		return err
	}
	return bad
}

// normalizeMeta sorts the metadata by key, keeping the last value of a
// repeated key as a protobuf map does.
func normalizeMeta(m []kv) []kv {
	if len(m) < 2 {
		return m
	}
	slices.SortStableFunc(m, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	out := m[:0]
	for i := range m {
		if i+1 < len(m) && m[i+1].k == m[i].k {
			continue
		}
		out = append(out, m[i])
	}
	return out
}

func (t wireTime) time() time.Time { return time.Unix(t.sec, int64(t.nanos)).UTC() }

// validTime is timestamppb's CheckValid: what AsTime can represent.
func (t wireTime) valid() bool {
	const minSec, maxSec = -62135596800, 253402300799
	return t.sec >= minSec && t.sec <= maxSec && t.nanos >= 0 && t.nanos < 1e9
}

func enumName(names map[int32]string, v int32) string {
	if s, ok := names[v]; ok {
		return s
	}
	return fmt.Sprint(v)
}

var (
	recActionNames = datamodels.RecommendedAction_name
	strategyNames  = datamodels.ProcessingStrategy_name
	roleNames      = datamodels.SubmitterRole_name
)
