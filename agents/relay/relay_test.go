package relay_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/nvsentinel"
)

var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// xid is what NVSentinel's syslog-health-monitor reports for an Xid 79.
func xid(node, msg string) nvsentinel.Event {
	return nvsentinel.Event{Version: 1, Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, Message: msg, RecommendedAction: nvsentinel.ActionReplaceVM, ErrorCode: []string{"79"},
		Entities: []nvsentinel.Entity{{Type: "GPU", Value: "0"}, {Type: "GPU_UUID", Value: "GPU-3f2a"}},
		NodeName: node, GeneratedTimestamp: testNow.Add(-time.Minute)}
}

// machine is the system UUID of the relay's machine.
const machine = "4C4C4544-0042-3510-8052-B4C04F4E3732"

type fixture struct {
	spool  *agent.Spool
	reg    *prometheus.Registry
	socket string
	mon    *nvsentinel.Monitor
}

// start runs a relay for node gpu-node-42 over a real agent spool, and a
// stand-in NVSentinel monitor dialling its socket.
func start(t *testing.T, spoolBytes int64) *fixture {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sp, err := agent.OpenSpool(filepath.Join(dir, "spool"), spoolBytes, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{spool: sp, reg: prometheus.NewRegistry(), socket: filepath.Join(dir, "nvsentinel.sock")}
	srv, err := relay.New(relay.Config{Socket: f.socket, SystemUUID: machine}, "gpu-node-42", sp, log, f.reg, func() time.Time { return testNow })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	f.mon, err = nvsentinel.Dial(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.mon.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		sp.Close()
		// The socket stays, refusing: a restarting agent, not a node
		// without one (relay.New).
		if st, err := os.Stat(f.socket); err != nil || st.Mode().Type() != os.ModeSocket {
			t.Errorf("socket gone after Serve: %v", err)
		} else if c, err := net.Dial("unix", f.socket); err == nil {
			c.Close()
			t.Error("socket still answers after Serve")
		}
	})
	return f
}

func (f *fixture) send(t *testing.T, evs ...nvsentinel.Event) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.mon.Send(ctx, evs...)
}

func (f *fixture) spooled(t *testing.T) []*datamodels.HealthEvent {
	t.Helper()
	evs, _, err := f.spool.Peek(1000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestRelayAccepts: a monitor's events are spooled whole and in order,
// with the relay's idempotency key in place of any id the monitor set and
// the machine's system UUID, its own generatedTimestamp kept (or the time the agent received it),
// its processingStrategy (STORE_AND_ANALYSE too) untouched, and none of
// the fields the gateway owns stamped.
func TestRelayAccepts(t *testing.T) {
	f := start(t, 1<<20)
	a, b, c := xid("gpu-node-42", "first"), xid("gpu-node-42", "second"), xid("gpu-node-42", "third")
	b.ID = "monitor-set-id"
	b.ProcessingStrategy = nvsentinel.StrategyStoreAndAnalyse
	c.GeneratedTimestamp = time.Time{}
	c.Metadata = map[string]string{"pci": "0000:17:00"}
	if err := f.send(t, a, b); err != nil {
		t.Fatal(err)
	}
	if err := f.send(t, c); err != nil {
		t.Fatal(err)
	}
	got := f.spooled(t)
	if len(got) != 3 || got[0].GetMessage() != "first" || got[1].GetMessage() != "second" || got[2].GetMessage() != "third" {
		t.Fatalf("spooled %v", got)
	}
	ids := map[string]bool{}
	for _, ev := range got {
		if ev.GetId() == "" || ev.GetId() == "monitor-set-id" || ids[ev.GetId()] {
			t.Fatalf("id %q: want a new key per event", ev.GetId())
		}
		ids[ev.GetId()] = true
		if ev.GetCluster() != "" || ev.GetSubmitter() != nil || ev.GetReceivedTimestamp() != nil || ev.GetDerivedBy() != "" {
			t.Fatalf("the relay stamped a field the gateway owns: %v", ev)
		}
		if ev.GetNodeName() != "gpu-node-42" || ev.GetAgent() != "syslog-health-monitor" || ev.GetRecommendedAction() != datamodels.RecommendedAction_REPLACE_VM {
			t.Fatalf("event changed: %v", ev)
		}
	}
	if !got[0].GetGeneratedTimestamp().AsTime().Equal(testNow.Add(-time.Minute)) || !got[2].GetGeneratedTimestamp().AsTime().Equal(testNow) {
		t.Fatalf("generatedTimestamp %v / %v", got[0].GetGeneratedTimestamp().AsTime(), got[2].GetGeneratedTimestamp().AsTime())
	}
	if got[0].GetProcessingStrategy() != datamodels.ProcessingStrategy_UNSPECIFIED || got[1].GetProcessingStrategy() != datamodels.ProcessingStrategy_STORE_AND_ANALYSE {
		t.Fatalf("strategies %v %v: the gateway, not the relay, normalises UNSPECIFIED", got[0].GetProcessingStrategy(), got[1].GetProcessingStrategy())
	}
	if got[2].GetMetadata()["pci"] != "0000:17:00" {
		t.Fatalf("metadata %v", got[2].GetMetadata())
	}
	for _, ev := range got { // the machine that raised it, as on the agent's own
		if m := ev.GetMetadata()[events.MetaSystemUUID]; m != machine {
			t.Fatalf("%s = %q, want the relay's machine %s", events.MetaSystemUUID, m, machine)
		}
	}
	if n := metric(t, f.reg, "accepted"); n != 3 {
		t.Fatalf("accepted = %v", n)
	}
}

// TestRelayResendIsOneEvent: NVSentinel's monitors resend a call unchanged
// when its answer was lost (commons/pkg/healthpub retries Unavailable,
// DeadlineExceeded and a dropped connection); the resent events carry the
// ids of the first sending, so the gateway stores (events.StoredID) and
// the rules count them once. Events that differ in anything the monitor
// sent — its time above all — are different occurrences; an event the
// monitor sent without generatedTimestamp cannot be told from its resend.
func TestRelayResendIsOneEvent(t *testing.T) {
	base := xid("gpu-node-42", "Xid 31")
	later := base
	later.GeneratedTimestamp = base.GeneratedTimestamp.Add(time.Millisecond)
	otherGPU := base
	otherGPU.Entities = []nvsentinel.Entity{{Type: "GPU", Value: "1"}, {Type: "GPU_UUID", Value: "GPU-77aa"}}
	withMeta := base
	withMeta.Metadata = map[string]string{"a": "1", "b": "2", "c": "3"}
	untimed := base
	untimed.GeneratedTimestamp = time.Time{}
	for _, tc := range []struct {
		name        string
		first, then nvsentinel.Event
		same        bool
	}{
		{"the call resent", base, base, true},
		{"the call resent, metadata in another map order", withMeta, withMeta, true},
		{"a later occurrence", base, later, false},
		{"another GPU", base, otherGPU, false},
		{"without generatedTimestamp", untimed, untimed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, 1<<20)
			if err := f.send(t, tc.first); err != nil {
				t.Fatal(err)
			}
			if err := f.send(t, tc.then); err != nil {
				t.Fatal(err)
			}
			got := f.spooled(t)
			if len(got) != 2 || got[0].GetId() == "" || got[1].GetId() == "" {
				t.Fatalf("spooled %v", got)
			}
			if same := got[0].GetId() == got[1].GetId(); same != tc.same {
				t.Fatalf("ids %q and %q: same %v, want %v", got[0].GetId(), got[1].GetId(), same, tc.same)
			}
		})
	}
}

// TestRelayNormalises: the syslog monitor's Xid 31 (errorCode "31", PCI
// and GPU_UUID entities, health-monitors/syslog-health-monitor/pkg/xid/
// xid_handler.go in NVIDIA/NVSentinel) is spooled in faultline's
// vocabulary (nvsentinel.Normalize), so the Xid rules count it, and its
// resend keeps its id (derived from the event as sent).
func TestRelayNormalises(t *testing.T) {
	f := start(t, 1<<20)
	ev := xid("gpu-node-42", "NVRM: Xid (PCI:0000:17:00): 31, pid=91237, name=python3")
	ev.ErrorCode = []string{"31"}
	ev.Entities = []nvsentinel.Entity{{Type: "PCI", Value: "0000:17:00"}, {Type: "GPU_UUID", Value: "GPU-3f2a"}}
	for range 2 {
		if err := f.send(t, ev); err != nil {
			t.Fatal(err)
		}
	}
	got := f.spooled(t)
	if len(got) != 2 || got[0].GetId() == "" || got[0].GetId() != got[1].GetId() {
		t.Fatalf("spooled %v: want the event and its resend under one id", got)
	}
	if e := got[0]; strings.Join(e.GetErrorCode(), ",") != "XID-31" || events.EntityKey(e) != "PCI=0000:17:00,GPU=GPU-3f2a" ||
		e.GetMetadata()[nvsentinel.MetaErrorCode] != "31" {
		t.Fatalf("spooled errorCode %v, entities %s, metadata %v: not normalised", e.GetErrorCode(), events.EntityKey(e), e.GetMetadata())
	}
}

// TestRelayRefuses: a call is refused whole, with a status that says why,
// and nothing of it is spooled: an event for another node
// (PermissionDenied), an event the gateway would refuse (InvalidArgument,
// naming the field), a full spool (Unavailable: resend later).
func TestRelayRefuses(t *testing.T) {
	f := start(t, 64<<10)
	bad := xid("gpu-node-42", "no check name")
	bad.CheckName = ""
	tests := []struct {
		name   string
		evs    []nvsentinel.Event
		code   codes.Code
		msg    string
		result string
	}{
		{"another node", []nvsentinel.Event{xid("gpu-node-42", "mine"), xid("gpu-node-7", "not mine")}, codes.PermissionDenied,
			`events[1].nodeName: "gpu-node-7" is not this node: the faultline agent on node "gpu-node-42" relays events for its own node only`, "other_node"},
		{"no node", []nvsentinel.Event{xid("", "nobody's")}, codes.InvalidArgument, "events[0].nodeName: required", "invalid"},
		{"invalid", []nvsentinel.Event{xid("gpu-node-42", "fine"), bad}, codes.InvalidArgument, "events[1].checkName: required", "invalid"},
		{"unknown strategy", []nvsentinel.Event{{Agent: "a", ComponentClass: "GPU", CheckName: "c", NodeName: "gpu-node-42", ProcessingStrategy: 7}},
			codes.InvalidArgument, "events[0].processingStrategy: unknown value 7", "invalid"},
		{"too far ahead", []nvsentinel.Event{func() nvsentinel.Event {
			e := xid("gpu-node-42", "future")
			e.GeneratedTimestamp = testNow.Add(time.Hour)
			return e
		}()},
			codes.InvalidArgument, "events[0].generatedTimestamp: 2026-11-22T13:00:00Z is more than 5m0s in the future", "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := metric(t, f.reg, tt.result)
			err := f.send(t, tt.evs...)
			if st, _ := status.FromError(err); st.Code() != tt.code || st.Message() != tt.msg {
				t.Fatalf("got %v, want %v %q", err, tt.code, tt.msg)
			}
			if n := len(f.spooled(t)); n != 0 {
				t.Fatalf("%d events spooled from a refused call", n)
			}
			if n := metric(t, f.reg, tt.result) - before; n != float64(len(tt.evs)) {
				t.Fatalf("%s counted %v, want %d", tt.result, n, len(tt.evs))
			}
		})
	}
	t.Run("spool full", func(t *testing.T) {
		big := xid("gpu-node-42", strings.Repeat("m", 8000))
		var err error
		sent := 0
		for ; sent < 20 && err == nil; sent++ {
			err = f.send(t, big, big)
		}
		if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "resend them later: spool full") {
			t.Fatalf("got %v, want Unavailable, spool full", err)
		}
		if n := len(f.spooled(t)); n != 2*(sent-1) {
			t.Fatalf("%d events spooled after %d accepted calls of 2: a refused call left some", n, sent-1)
		}
	})
}

// TestRelayChecksShapeBeforeDecoding: a call with more elements in a list
// than the validator accepts is refused InvalidArgument, naming the field,
// before it is decoded. Decoding allocates a struct per element however
// small it is on the wire: a 4 MiB message of empty events (two bytes each)
// allocated 835 MB (now 9 MB), and the agent's memory limit is 128 MiB; a
// 200 KB one of 100,000 empty entities 13.6 MB (now 0.3 MB). The events of
// a call over the batch limit count as invalid. A valid batch still passes.
func TestRelayChecksShapeBeforeDecoding(t *testing.T) {
	f := start(t, 1<<20)
	// n empty messages in field num: two bytes each.
	empty := func(num protowire.Number, n int) []byte {
		return bytes.Repeat(protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), nil), n)
	}
	// HealthEvents.events is field 2, HealthEvent.entitiesImpacted 10.
	oneEvent := func(ev []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), ev)
	}
	tests := []struct {
		name     string
		msg      []byte
		code     codes.Code
		want     string // the status message, or its beginning
		maxAlloc uint64 // what the call may allocate, client and relay together
		invalid  float64
		spooled  int
	}{
		{"4 MiB of empty events", empty(2, 2<<20), codes.InvalidArgument,
			"events: 2097152 events exceed the batch limit of 1000", 64 << 20, 2 << 20, 0},
		{"100,000 empty entities", oneEvent(empty(10, 100_000)), codes.InvalidArgument,
			"events[0].entitiesImpacted: 100000 entities exceed the limit of 64", 2 << 20, 0, 0},
		// An event cut short: InvalidArgument, as grpc-go's Internal would
		// have a client retry it for ever.
		{"a message cut short", oneEvent([]byte{0x0a, 0x05, 0x01}), codes.InvalidArgument,
			"the message does not decode: ", 2 << 20, 0, 0}, // protobuf's error text varies on purpose
		{"a valid batch", nvsentinel.Encode(1, []nvsentinel.Event{xid("gpu-node-42", "first"), xid("gpu-node-42", "second")}), codes.OK,
			"", 2 << 20, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			invalid := metric(t, f.reg, "invalid")
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := f.mon.SendEncoded(ctx, tt.msg)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d-byte message: allocated %.1f MB", len(tt.msg), float64(alloc)/1e6)
			if st, _ := status.FromError(err); st.Code() != tt.code || !strings.HasPrefix(st.Message(), tt.want) {
				t.Errorf("got %v, want %v %q", err, tt.code, tt.want)
			}
			if alloc > tt.maxAlloc {
				t.Errorf("the call allocated %.1f MB, want at most %d MiB: the message was decoded before its shape was checked", float64(alloc)/1e6, tt.maxAlloc>>20)
			}
			if n := metric(t, f.reg, "invalid") - invalid; n != tt.invalid {
				t.Errorf("invalid counted %v, want %v", n, tt.invalid)
			}
			if n := len(f.spooled(t)); n != tt.spooled {
				t.Errorf("%d events spooled, want %d", n, tt.spooled)
			}
		})
	}
}

// TestRelaySocket: the socket is 0660 and the relay never replaces a file
// that is not a socket.
func TestRelaySocket(t *testing.T) {
	f := start(t, 1<<20)
	st, err := os.Stat(f.socket)
	if err != nil || st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o660 {
		t.Fatalf("socket %v %v", st.Mode(), err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "nvsentinel.sock")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	_, err = relay.New(relay.Config{Socket: file}, "n", f.spool, log, prometheus.NewRegistry(), nil)
	if err == nil || err.Error() != "nvsentinel_socket: "+file+" exists and is not a socket" {
		t.Fatalf("over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("the file was replaced")
	}
	if _, err := relay.New(relay.Config{Socket: filepath.Join(dir, "s"), Group: "no-such-group-here"}, "n", f.spool, log, prometheus.NewRegistry(), nil); err == nil || !strings.HasPrefix(err.Error(), "nvsentinel_socket_group: ") {
		t.Fatalf("unknown group: %v", err)
	}
	// Nothing else listens: a plain unix client connects to the relay.
	c, err := net.Dial("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// metric returns faultline_agent_relay_events_total{result}.
func metric(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "faultline_agent_relay_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// BenchmarkRelay: calls of one event and of 100, each answered once its
// events are fsync'd into a real spool.
func BenchmarkRelay(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(strconv.Itoa(n)+"_events", func(b *testing.B) {
			dir := b.TempDir()
			log := slog.New(slog.DiscardHandler)
			sp, err := agent.OpenSpool(filepath.Join(dir, "spool"), 1<<30, log, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer sp.Close()
			srv, err := relay.New(relay.Config{Socket: filepath.Join(dir, "s.sock")}, "gpu-node-42", sp, log, prometheus.NewRegistry(), nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx) }()
			defer func() { cancel(); <-done }()
			mon, err := nvsentinel.Dial(filepath.Join(dir, "s.sock"))
			if err != nil {
				b.Fatal(err)
			}
			defer mon.Close()
			evs := make([]nvsentinel.Event, n)
			for i := range evs {
				evs[i] = xid("gpu-node-42", "Xid 79 on GPU 0")
				evs[i].GeneratedTimestamp = time.Now()
			}
			b.ResetTimer()
			for range b.N {
				if err := mon.Send(ctx, evs...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// TestRelayTakesPreflightEvents: faultline's preflight checks, injected
// into tenants' pods, send through the agent's relay (their relay_socket)
// instead of holding a gateway token that every node's checks share. A
// check's event for the agent's node is spooled as the check sent it
// (nvsentinel.Normalize rewrites NVSentinel's checkNames only), but for the
// relay's key and the machine's UUID; one for any other node is refused
// PermissionDenied and nothing of its call is spooled: a tenant's pod on
// one node cannot have another node quarantined.
func TestRelayTakesPreflightEvents(t *testing.T) {
	for _, check := range checks.Names() {
		t.Run(check, func(t *testing.T) {
			f := start(t, 1<<20)
			conn, err := grpc.NewClient("unix://"+f.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			client := datamodels.NewPlatformConnectorClient(conn)
			ev := func(node string) *datamodels.HealthEvent {
				return &datamodels.HealthEvent{Version: 1, Agent: checks.AgentName(check), ComponentClass: "GPU", CheckName: check,
					NodeName: node, IsFatal: true, Message: check + " failed", ErrorCode: []string{"79", "XID-79"},
					RecommendedAction:  datamodels.RecommendedAction_RESTART_BM,
					ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION,
					EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU_UUID", EntityValue: "GPU-3f2a"}, {EntityType: "PCI", EntityValue: "0000:17:00.0"}},
					Metadata:           map[string]string{"pod": "training/job-0"},
					GeneratedTimestamp: timestamppb.New(testNow.Add(-time.Second))}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = client.HealthEventOccurredV1(ctx, &datamodels.HealthEvents{Version: 1, Events: []*datamodels.HealthEvent{ev("gpu-node-42"), ev("gpu-node-7")}})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("a call with another node's event: %v, want PermissionDenied", err)
			}
			if n := len(f.spooled(t)); n != 0 {
				t.Fatalf("%d events spooled from a refused call", n)
			}
			if _, err := client.HealthEventOccurredV1(ctx, &datamodels.HealthEvents{Version: 1, Events: []*datamodels.HealthEvent{ev("gpu-node-42")}}); err != nil {
				t.Fatal(err)
			}
			got := f.spooled(t)
			if len(got) != 1 || got[0].GetId() == "" {
				t.Fatalf("spooled %v", got)
			}
			want := ev("gpu-node-42")
			want.Id = got[0].GetId()
			want.Metadata[events.MetaSystemUUID] = machine
			if !proto.Equal(got[0], want) {
				t.Fatalf("spooled\n%v\nwant it as sent\n%v", got[0], want)
			}
		})
	}
}
