package rows

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/processors/rows/rowstest"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// decodeCases are encoded HealthEvents, including wire forms that
// proto.Marshal does not write but a client may send.
func decodeCases(t testing.TB) map[string][]byte {
	cases := map[string][]byte{}
	evs := rowstest.Events(t)
	for _, ev := range evs {
		v, _ := events.Marshal(ev)
		cases["testdata "+ev.GetId()] = v
	}
	for _, ev := range rowstest.GenEvents("alpha", 0, 3, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)) {
		v, _ := events.Marshal(ev)
		cases["generated "+ev.GetId()] = v
	}
	base, _ := events.Marshal(evs[0])
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(b, num, protowire.BytesType), s)
	}
	entry := func(k, v string) []byte { return str(str(nil, 1, k), 2, v) }
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), m)
	}
	varint := func(b []byte, num protowire.Number, x uint64) []byte {
		return protowire.AppendVarint(tag(b, num, protowire.VarintType), x)
	}
	cases["duplicate map key, last wins"] = msg(msg(base, 11, entry("severity", "LOW")), 11, entry("severity", "HIGH"))
	cases["timestamp merged from two occurrences"] = msg(msg(base, 12, varint(nil, 1, 1700000000)), 12, varint(nil, 2, 5e8))
	cases["unknown fields skipped"] = str(varint(varint(base, 50, 7), 2000, 1), 77, "x")
	cases["wrong wire type is an unknown field"] = varint(base, 2, 9)
	cases["scalar last wins"] = str(varint(base, 5, 0), 13, "other-node")
	cases["unknown enum value"] = varint(base, 8, 1234)
	cases["entity with missing value"] = msg(base, 10, str(nil, 1, "GPU"))
	cases["empty message"] = []byte{}
	cases["invalid utf-8"] = str(base, 7, "bad \xff byte")
	cases["invalid utf-8 in map key"] = msg(base, 11, entry("\xfe", "v"))
	cases["truncated"] = base[:len(base)-3]
	cases["bad tag"] = append(append([]byte{}, base...), 0x00)
	sub := str(varint(str(nil, 1, "token:ops#1"), 2, 2), 3, "gpu-node-42")
	cases["submitter"] = msg(base, 105, sub)
	cases["submitter merged from two occurrences"] = msg(msg(base, 105, str(nil, 1, "a")), 105, varint(nil, 2, 1))
	cases["submitter with an unknown role"] = msg(base, 105, varint(nil, 2, 99))
	cases["submitter name not utf-8"] = msg(base, 105, str(nil, 1, "\xff"))
	cases["empty submitter"] = msg(base, 105, nil)
	return cases
}

// TestDecodeMatchesProto holds the protowire decoder to proto.Unmarshal.
func TestDecodeMatchesProto(t *testing.T) {
	for name, v := range decodeCases(t) {
		t.Run(name, func(t *testing.T) { compareDecoders(t, v) })
	}
}

// TestBatchMatchesProto decodes every case into one Events, many times
// over, undecodable ones between: a row's arrays and entity, kept in the
// batch's shared strs and text, must stay as they were while the batch grows
// past them, and a record refused leaves nothing behind.
func TestBatchMatchesProto(t *testing.T) {
	var fast, ref Events
	for i := range 200 {
		for name, v := range decodeCases(t) {
			rec := &kgo.Record{Topic: events.TopicEvents, Key: events.Key("alpha", "gpu-node-42"), Value: v, Timestamp: time.Date(2025, 1, 1, 0, 0, i, 0, time.UTC)}
			if ev, err := events.Unmarshal(v); err == nil && ev.GetCluster() != "" && ev.GetNodeName() != "" {
				rec.Key = events.Key(ev.GetCluster(), ev.GetNodeName())
			}
			errFast, errRef := fast.Add(rec), ref.addEventProto(rec)
			if (errFast == nil) != (errRef == nil) {
				t.Fatalf("%s: protowire decoder err %v, proto.Unmarshal err %v", name, errFast, errRef)
			}
		}
	}
	if fast.Len() < 1000 || fast.Len() != ref.Len() {
		t.Fatalf("%d rows decoded, %d by proto.Unmarshal", fast.Len(), ref.Len())
	}
	for i, c := range fast.Columns() {
		if !reflect.DeepEqual(c, ref.Columns()[i]) {
			t.Fatalf("column %s differs after %d rows", EventTable[i].Name, fast.Len())
		}
	}
}

func compareDecoders(t *testing.T, v []byte) {
	// Keyed as the gateway keys it (the payload's cluster/node), so that
	// the comparison reaches the columns.
	cluster, node := "alpha", "node"
	if ev, err := events.Unmarshal(v); err == nil {
		if ev.GetCluster() != "" {
			cluster = ev.GetCluster()
		}
		if ev.GetNodeName() != "" {
			node = ev.GetNodeName()
		}
	}
	rec := &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: v, Timestamp: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	var fast, ref Events
	errFast, errRef := fast.Add(rec), ref.addEventProto(rec)
	if errFast != nil && !errors.Is(errFast, ErrPoison) {
		t.Fatalf("decode error does not wrap ErrPoison: %v", errFast)
	}
	if errFast != nil && strings.Contains(errFast.Error(), "outside ClickHouse DateTime") || errFast != nil && strings.Contains(errFast.Error(), "not a valid timestamp") {
		return // a check proto.Unmarshal does not make
	}
	if (errFast == nil) != (errRef == nil) {
		t.Fatalf("protowire decoder err %v, proto.Unmarshal err %v", errFast, errRef)
	}
	if errFast == nil && !reflect.DeepEqual(fast.Columns(), ref.Columns()) {
		t.Fatalf("blocks differ:\nprotowire %+v\nproto     %+v", fast.Columns(), ref.Columns())
	}
}

func FuzzDecode(f *testing.F) {
	for _, v := range decodeCases(f) {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v []byte) { compareDecoders(t, v) })
}

// TestKeyPayloadMismatchPoison: an event or action whose record key names
// another cluster or node than its payload is never stored.
func TestKeyPayloadMismatchPoison(t *testing.T) {
	ev := &datamodels.HealthEvent{Id: "x", Cluster: "alpha", NodeName: "n1", GeneratedTimestamp: timestamppb.Now(), ReceivedTimestamp: timestamppb.Now()}
	rec := rowstest.EventRecord(t, ev)
	var b Events
	if err := b.Add(rec); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"beta/n1", "alpha/n2", "alpha", ""} {
		rec.Key = []byte(key)
		if err := b.Add(rec); !errors.Is(err, ErrPoison) || !strings.Contains(err.Error(), "record key and payload disagree") {
			t.Errorf("key %q: err %v", key, err)
		}
	}
	if b.Len() != 1 {
		t.Fatalf("%d rows, want 1", b.Len())
	}
}

func TestDecodeTimeRange(t *testing.T) {
	for name, ts := range map[string]*timestamppb.Timestamp{
		"before 1970": timestamppb.New(time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC)),
		"after 2106":  timestamppb.New(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)),
		"invalid":     {Seconds: 1, Nanos: -5},
	} {
		ev := &datamodels.HealthEvent{Id: "x", Cluster: "c", NodeName: "n", GeneratedTimestamp: ts}
		var b Events
		if err := b.Add(rowstest.EventRecord(t, ev)); !errors.Is(err, ErrPoison) {
			t.Errorf("%s: err %v, want poison", name, err)
		}
	}
}
