package correlate

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
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
			items, _ := decode(records(t, evs(ev)), slog.New(slog.NewTextHandler(io.Discard, nil)))
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
		items, _ := decode(records(t, evs(ev)), slog.New(slog.NewTextHandler(io.Discard, nil)))
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
