package correlate

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/celbound"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// TestDerivedKeepsTheTriggersReceivedTime: a derived event is received
// when its trigger reached faultline (the gateway's receivedTimestamp),
// not when an agent says it generated it. The quarantine role skips an
// event received before the Node object was created (one of an earlier
// machine of that name), so a verdict on a new machine's boot-time
// fault — generated (the kernel's time) before its Node registered,
// received after — must not read as received before the Node existed.
func TestDerivedKeepsTheTriggersReceivedTime(t *testing.T) {
	h, rule := flapRule(t)
	generated := base                      // the agent's time: the node's boot, before it registered
	received := base.Add(90 * time.Second) // the gateway's: after the Node was created
	for _, tc := range []struct {
		name          string
		gen, recv     *timestamppb.Timestamp
		wantGenerated time.Time
		wantReceived  time.Time
	}{
		{"generated before received", timestamppb.New(generated), timestamppb.New(received), generated, received},
		{"no generated time", nil, timestamppb.New(received), received, received},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := nicState("c1", "n1", 0, false)
			ev.GeneratedTimestamp, ev.ReceivedTimestamp = tc.gen, tc.recv
			items, _, err := decode(records(t, evs(ev)), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			trigs := h.triggers(rule, items)
			if len(trigs) != 1 {
				t.Fatalf("%d triggers, want 1", len(trigs))
			}
			d := h.derive(rule, emission{t: trigs[0], res: result{value: 3}, mode: ModeLive})
			if got := d.GetGeneratedTimestamp().AsTime(); !got.Equal(tc.wantGenerated) {
				t.Errorf("derived generatedTimestamp %s, want %s (the trigger's)", got.Format(time.RFC3339Nano), tc.wantGenerated.Format(time.RFC3339Nano))
			}
			if got := d.GetReceivedTimestamp().AsTime(); !got.Equal(tc.wantReceived) {
				t.Errorf("derived receivedTimestamp %s, want %s (when the trigger reached the gateway)", got.Format(time.RFC3339Nano), tc.wantReceived.Format(time.RFC3339Nano))
			}
		})
	}
}

// TestDerivedKeepsTheTriggersMachine: a node's verdict names the machine
// its trigger came from (events.MetaSystemUUID, stamped by the node's
// agent), so the quarantine role does not act on a verdict that the late
// event of a Node object's earlier machine triggered (a Node kept across
// a machine swap); a trigger naming no machine gives none.
func TestDerivedKeepsTheTriggersMachine(t *testing.T) {
	h, rule := flapRule(t)
	const machine = "4C4C4544-0042-3510-8052-B4C04F4E3732"
	for _, want := range []string{machine, ""} {
		ev := nicState("c1", "n1", 0, false)
		events.SetSystemUUID(ev, want, validate.MaxMetadata)
		items, _, err := decode(records(t, evs(ev)), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		trigs := h.triggers(rule, items)
		if len(trigs) != 1 {
			t.Fatalf("%d triggers, want 1", len(trigs))
		}
		d := h.derive(rule, emission{t: trigs[0], res: result{value: 3}, mode: ModeLive})
		if got, ok := d.GetMetadata()[events.MetaSystemUUID]; got != want || ok != (want != "") {
			t.Errorf("derived %s = %q (present %v), want the trigger's %q", events.MetaSystemUUID, got, ok, want)
		}
	}
}

// flapRule is a handler of the shipped rules, with no ClickHouse, and its
// RepeatedNICLinkFlap rule.
func flapRule(t *testing.T) (*Handler, *Rule) {
	t.Helper()
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Name == "RepeatedNICLinkFlap" {
			return New(nil, rules, time.Now, time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), nil), r
		}
	}
	t.Fatal("no shipped RepeatedNICLinkFlap rule")
	return nil, nil
}

// TestDecodeInPartsKeepsOrder: a batch decoded in parts on every core is
// what one pass gives, in the same order: items (events, actions, derived
// and too-large ones) and dead records (a key naming another node)
// alike.
func TestDecodeInPartsKeepsOrder(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	var recs []*kgo.Record
	for i := range 5*decodePart + 7 {
		ev := nicState("c1", fmt.Sprintf("n%d", i%50), time.Duration(i)*time.Millisecond, i%3 == 0)
		switch i % 7 {
		case 1:
			ev.DerivedBy = "RepeatedNICLinkFlap"
		case 2:
			ev.Message = strings.Repeat("m", celbound.MaxBytes+1) // over celbound's sizes: runs tracked
		}
		rec := evRecord(t, ev)
		switch i % 11 {
		case 3:
			rec.Key = events.Key("c1", "elsewhere") // key and payload disagree: dead
		case 5:
			b, _ := events.MarshalAction(&faultlinev1.Action{Id: nextID(), Cluster: "c1", Node: "n1", Kind: "remediate", Outcome: "applied"})
			rec = &kgo.Record{Topic: events.TopicActions, Key: events.Key("c1", "n1"), Value: b, Timestamp: rec.Timestamp}
		}
		recs = append(recs, rec)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wantItems, wantDead := decodeInOrder(recs, log)
	items, dead, err := decode(recs, log)
	if err != nil {
		t.Fatal(err)
	}
	summary := func(items []item, dead []pipeline.Dead) []string {
		var out []string
		for _, it := range items {
			out = append(out, fmt.Sprintf("%s%s %s/%s at %d recv %d vars %v fits %v", it.ev.GetId(), it.act.GetId(), it.cluster, it.node, it.atMS, it.recvMS, it.vars != nil, it.fits))
		}
		for _, d := range dead {
			out = append(out, fmt.Sprintf("dead %s: %v", d.Record.Key, d.Reason))
		}
		return out
	}
	got, want := summary(items, dead), summary(wantItems, wantDead)
	if len(wantDead) == 0 || len(want) != len(recs) || !slices.Equal(got, want) {
		t.Fatalf("in parts %d entries, in one pass %d (%d dead); first difference at %d", len(got), len(want), len(wantDead), firstDiff(got, want))
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
