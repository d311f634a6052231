package pipeline

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/faultline/faultline/schemas/events"
)

// ErrKeyMismatch marks a record whose Kafka key (cluster/node) and payload
// name different nodes. Every role dead-letters such a record: roles that
// read the key and roles that read the payload would otherwise act for
// different clusters on the same record.
var ErrKeyMismatch = errors.New("record key and payload disagree")

// Field numbers of the cluster and node in the two payloads (see
// schemas/proto): HealthEvent.cluster (101) and nodeName (13),
// faultline.v1.Action cluster (2) and node (3).
const (
	eventCluster  = 101
	eventNode     = 13
	actionCluster = 2
	actionNode    = 3
)

// EventKey checks a record of the events topic (or a topic carrying its
// records, such as a retry topic): the cluster and nodeName of the encoded
// HealthEvent must be the ones of the record key. It reads only those two
// fields (protowire, no decode of the rest) and returns the record's
// cluster and node (CheckKey).
func EventKey(rec *kgo.Record) (cluster, node string, err error) {
	return payloadKey(rec, "event", "nodeName", eventCluster, eventNode)
}

// ActionKey is EventKey for records of the actions topic (and the requeue
// topics that carry them): the Action's cluster and node.
func ActionKey(rec *kgo.Record) (cluster, node string, err error) {
	return payloadKey(rec, "action", "node", actionCluster, actionNode)
}

func payloadKey(rec *kgo.Record, what, nodeField string, clusterNum, nodeNum protowire.Number) (string, string, error) {
	var cluster, node string
	b := rec.Value
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", fmt.Errorf("decode %s: malformed protobuf: %w", what, protowire.ParseError(n))
		}
		if !num.IsValid() { // ConsumeTag checks only the lower bound; proto.Unmarshal both
			return "", "", fmt.Errorf("decode %s: malformed protobuf: field number %d is over the maximum %d", what, num, protowire.MaxValidNumber)
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == clusterNum || num == nodeNum) {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", "", fmt.Errorf("decode %s: malformed protobuf: field %d: %w", what, num, protowire.ParseError(m))
			}
			if !utf8.Valid(v) {
				return "", "", fmt.Errorf("decode %s: field %d is not valid UTF-8", what, num)
			}
			// Last one wins, as proto.Unmarshal has it.
			if num == clusterNum {
				cluster = string(v)
			} else {
				node = string(v)
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return "", "", fmt.Errorf("decode %s: malformed protobuf: field %d: %w", what, num, protowire.ParseError(m))
		}
		b = b[m:]
	}
	return checkKey(rec.Key, cluster, node, what, nodeField)
}

// CheckKey compares a record key with the cluster and node its payload
// names and returns the record's cluster and node. A payload field left
// empty takes the key's value (the correlator's cluster-wide verdicts have
// no nodeName); a key that is not cluster/node, or a payload value that
// differs from the key's, is an error wrapping ErrKeyMismatch that says
// what disagrees. Roles that decode the payload themselves (the store)
// call it with the decoded fields.
func CheckKey(key []byte, cluster, node string) (string, string, error) {
	return checkKey(key, cluster, node, "payload", "node")
}

func checkKey(key []byte, cluster, node, what, nodeField string) (string, string, error) {
	kc, kn, err := events.SplitKey(key)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrKeyMismatch, err)
	}
	if cluster != "" && cluster != kc {
		return "", "", fmt.Errorf("%w: key %q names cluster %q, the %s's cluster is %q",
			ErrKeyMismatch, events.Truncate(string(key), 300), kc, what, events.Truncate(cluster, 256))
	}
	if node != "" && node != kn {
		return "", "", fmt.Errorf("%w: key %q names node %q, the %s's %s is %q",
			ErrKeyMismatch, events.Truncate(string(key), 300), kn, what, nodeField, events.Truncate(node, 256))
	}
	return kc, kn, nil
}
