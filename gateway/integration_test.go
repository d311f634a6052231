package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func event(node string) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{
		Agent: "faultline-agent", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, NodeName: node, Message: "XID 79 GPU has fallen off the bus",
		RecommendedAction:  datamodels.RecommendedAction_REPLACE_VM,
		ErrorCode:          []string{"79"},
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: "GPU-aaaa"}},
		Metadata:           map[string]string{"gpu_index": "3"},
		GeneratedTimestamp: timestamppb.New(time.Now().Add(-time.Second).Truncate(time.Millisecond)),
	}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// readAll returns every record of the events topic.
func readAll(t *testing.T, k *testenv.Kafka, want int) []*kgo.Record {
	t.Helper()
	cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		out = append(out, fs.Records()...)
	}
	// Anything beyond want would show up within a short extra poll.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	out = append(out, cl.PollFetches(ctx2).Records()...)
	return out
}

func endOffsets(t *testing.T, k *testenv.Kafka) int64 {
	t.Helper()
	ends, err := k.Admin(t).ListEndOffsets(context.Background(), events.TopicEvents)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// TestGateway shares one real broker between its subtests (a broker takes
// seconds to start).
func TestGateway(t *testing.T) {
	k := testenv.StartKafka(t)
	t.Run("SubmitEndToEnd", func(t *testing.T) { testSubmitEndToEnd(t, k) })
	t.Run("Rejections", func(t *testing.T) { testRejections(t, k) })
	t.Run("TLSAndUnixSocket", func(t *testing.T) { testTLSAndUnixSocket(t, k) })
	t.Run("TLSRotation", func(t *testing.T) { testTLSRotation(t, k) })
	t.Run("ClientCARotation", func(t *testing.T) { testClientCARotation(t, k) })
	t.Run("OpenConnectionsReverified", func(t *testing.T) { testOpenConnectionsReverified(t, k) })
	t.Run("NodeBoundCertificates", func(t *testing.T) { testNodeBoundCertificates(t, k) })
	t.Run("Readyz", func(t *testing.T) { testReadyz(t, k) })
	t.Run("InflightBudget", func(t *testing.T) { testInflightBudget(t, k) })
	t.Run("ConcurrentCallsOnOneConnection", func(t *testing.T) { testConcurrentCallsOnOneConnection(t, k) })
}

// testConcurrentCallsOnOneConnection: a client's concurrent calls on one
// connection, at the shipped budgets, are all accepted — a relay or a tool
// with many calls in flight, as BenchmarkIngest's callers. Until a27b7f8
// every call opened while another call of the connection was being read
// was refused RESOURCE_EXHAUSTED (gateway.max_inflight_bytes_per_conn):
// the benchmark failed outright.
func testConcurrentCallsOnOneConnection(t *testing.T, k *testenv.Kafka) {
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) { c.RatePerCaller = 0 }, gateway.Options{})
	cl := faultlinev1.NewEventsClient(dial(t, gw.GRPCAddr()))
	ctx := withToken(context.Background(), gw.Token("alpha"))
	const callers, calls = 64, 5 // 64: gateway.max_streams_per_conn
	evs := make([]*datamodels.HealthEvent, 100)
	for i := range evs {
		evs[i] = event(fmt.Sprintf("n%03d", i))
	}
	var refused atomic.Int64
	var last atomic.Value
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range calls {
				if _, err := cl.SubmitEvents(ctx, &faultlinev1.SubmitEventsRequest{Events: evs}); err != nil {
					refused.Add(1)
					last.Store(err.Error())
				}
			}
		})
	}
	wg.Wait()
	if n := refused.Load(); n > 0 {
		t.Fatalf("%d of %d calls on one connection refused, the last: %v", n, callers*calls, last.Load())
	}
}

func testSubmitEndToEnd(t *testing.T, k *testenv.Kafka) {
	gw := gatewaytest.Start(t, k.Addr(), nil, gateway.Options{})

	// gRPC, faultline's service: ids come back in order.
	cl := faultlinev1.NewEventsClient(dial(t, gw.GRPCAddr()))
	ctx := withToken(context.Background(), gw.Token("alpha"))
	grpcEvs := []*datamodels.HealthEvent{event("node-a"), event("node-b")}
	grpcEvs[1].Cluster = "beta" // a payload cannot choose its cluster
	resp, err := cl.SubmitEvents(ctx, &faultlinev1.SubmitEventsRequest{Events: grpcEvs})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Ids) != 2 {
		t.Fatalf("ids = %v", resp.Ids)
	}

	// gRPC, NVSentinel's service.
	nv := datamodels.NewPlatformConnectorClient(dial(t, gw.GRPCAddr()))
	if _, err := nv.HealthEventOccurredV1(withToken(context.Background(), gw.Token("beta")),
		&datamodels.HealthEvents{Version: 1, Events: []*datamodels.HealthEvent{event("node-c")}}); err != nil {
		t.Fatal(err)
	}

	// REST.
	body := `{"events":[{"agent":"nvsentinel-syslog","componentClass":"NIC","checkName":"InfiniBandStateCheck","isFatal":true,"isHealthy":false,
	  "message":"port down","recommendedAction":"REPLACE_VM","errorCode":["IB-DOWN"],
	  "entitiesImpacted":[{"entityType":"NIC","entityValue":"mlx5_0"},{"entityType":"NICPort","entityValue":"mlx5_0/1"}],
	  "metadata":{"k":"v"},"generatedTimestamp":"2026-11-22T10:15:30Z","nodeName":"node-d"}]}`
	code, out := post(t, gw, gw.Token("alpha"), body)
	if code != http.StatusOK {
		t.Fatalf("REST status %d: %s", code, out)
	}
	var restResp struct{ Ids []string }
	if err := json.Unmarshal([]byte(out), &restResp); err != nil || len(restResp.Ids) != 1 {
		t.Fatalf("REST response %s: %v", out, err)
	}

	recs := readAll(t, k, 4)
	if len(recs) != 4 {
		t.Fatalf("want 4 records, got %d", len(recs))
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		ev, err := events.Unmarshal(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		byID[ev.Id] = r
	}
	check := func(id, cluster, node string) *datamodels.HealthEvent {
		t.Helper()
		r, ok := byID[id]
		if !ok {
			t.Fatalf("id %s not in Kafka", id)
		}
		ev, _ := events.Unmarshal(r.Value)
		if string(r.Key) != cluster+"/"+node || ev.Cluster != cluster || ev.NodeName != node {
			t.Fatalf("record key %q cluster %q node %q, want %s/%s", r.Key, ev.Cluster, ev.NodeName, cluster, node)
		}
		if ev.ReceivedTimestamp == nil || ev.ProcessingStrategy != datamodels.ProcessingStrategy_EXECUTE_REMEDIATION {
			t.Fatalf("not stamped: %v", ev)
		}
		return ev
	}
	check(resp.Ids[0], "alpha", "node-a")
	check(resp.Ids[1], "alpha", "node-b") // not beta
	ev := check(restResp.Ids[0], "alpha", "node-d")
	if ev.CheckName != "InfiniBandStateCheck" || ev.RecommendedAction != datamodels.RecommendedAction_REPLACE_VM ||
		len(ev.EntitiesImpacted) != 2 || ev.EntitiesImpacted[1].EntityValue != "mlx5_0/1" ||
		ev.Metadata["k"] != "v" || ev.GeneratedTimestamp.AsTime().Format(time.RFC3339) != "2026-11-22T10:15:30Z" {
		t.Fatalf("REST event fields not intact: %v", ev)
	}
	var nvCount int
	for _, r := range recs {
		if strings.HasPrefix(string(r.Key), "beta/node-c") {
			nvCount++
		}
	}
	if nvCount != 1 {
		t.Fatalf("NVSentinel event for beta/node-c: %d records", nvCount)
	}
}

func post(t *testing.T, gw *gatewaytest.Server, token, body string) (int, string) {
	t.Helper()
	return postAs(t, gw, token, "application/json", body)
}

func postAs(t *testing.T, gw *gatewaytest.Server, token, contentType, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, gw.URL()+"/v1/events", strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func testRejections(t *testing.T, k *testenv.Kafka) {
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		c.MaxBatch = 5
		c.MaxBodyBytes = 64 << 10
	}, gateway.Options{})
	valid := `{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1"}]}`
	many := `{"events":[` + strings.Repeat(`{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1"},`, 5) +
		`{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1"}]}`
	huge := `{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1","message":"` + strings.Repeat("x", 70<<10) + `"}]}`
	tests := []struct {
		name, token, body string
		wantCode          int
		wantMsg           string
		contentType       string // default application/json
	}{
		{"no token", "", valid, 401, "missing credential", ""},
		{"text/plain", gw.Token("alpha"), valid, 415, `Content-Type must be application/json, got \"text/plain\"`, "text/plain"},
		{"form", gw.Token("alpha"), valid, 415, "Content-Type must be application/json", "application/x-www-form-urlencoded"},
		{"no content type", gw.Token("alpha"), valid, 415, `got \"\"`, "-"},
		{"json with charset", gw.Token("alpha"), `{"events":[]}`, 400, "events: at least one event", "application/json; charset=utf-8"},
		{"more events than the batch limit, refused before decoding", gw.Token("alpha"),
			`{"events":[` + strings.Repeat(`{},`, 20000) + `{}]}`, 400, "events: 20001 events exceed the batch limit of 5", ""},
		{"more entities than the limit, refused before decoding", gw.Token("alpha"),
			`{"events":[{"entitiesImpacted":[` + strings.Repeat(`{},`, 99) + `{}]}]}`, 400, "events[0].entitiesImpacted: 100 entities exceed the limit of 64", ""},
		{"escaped key is still counted", gw.Token("alpha"),
			`{"\u0065vents":[` + strings.Repeat(`{},`, 9) + `{}]}`, 400, "events: 10 events exceed the batch limit of 5", ""},
		{"wrong token", "not-a-real-token-of-anyone", valid, 401, "invalid token", ""},
		{"malformed JSON", gw.Token("alpha"), `{"events":[{"agent":`, 400, "request body: unexpected EOF", ""},
		{"not JSON", gw.Token("alpha"), `events=1`, 400, "request body: ", ""},
		{"unknown enum", gw.Token("alpha"), `{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1","recommendedAction":"REBOOT_IT"}]}`, 400, "invalid value for enum field recommendedAction", ""},
		{"unknown enum number", gw.Token("alpha"), `{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1","recommendedAction":7}]}`, 400, "events[0].recommendedAction: unknown value 7", ""},
		{"missing required field", gw.Token("alpha"), `{"events":[{"agent":"a","componentClass":"GPU","nodeName":"n1"}]}`, 400, "events[0].checkName: required", ""},
		{"unknown field", gw.Token("alpha"), `{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1","severity":"high"}]}`, 400, `unknown field \"severity\"`, ""},
		{"oversized batch", gw.Token("alpha"), many, 400, "6 events exceed the batch limit of 5", ""},
		{"body too large", gw.Token("alpha"), huge, 413, "exceeds the limit of 65536", ""},
	}
	before := endOffsets(t, k)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := tt.contentType
			switch ct {
			case "":
				ct = "application/json"
			case "-":
				ct = ""
			}
			code, body := postAs(t, gw, tt.token, ct, tt.body)
			if code != tt.wantCode || !strings.Contains(body, tt.wantMsg) {
				t.Fatalf("got %d %s; want %d containing %q", code, body, tt.wantCode, tt.wantMsg)
			}
		})
	}
	// gRPC: a token for alpha and a payload claiming beta is stamped alpha
	// (checked in TestSubmitEndToEnd); no token and a bad batch are refused.
	cl := faultlinev1.NewEventsClient(dial(t, gw.GRPCAddr()))
	_, err := cl.SubmitEvents(context.Background(), &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("n1")}})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC without token: %v", err)
	}
	bad := event("n1")
	bad.NodeName = ""
	_, err = cl.SubmitEvents(withToken(context.Background(), gw.Token("alpha")), &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("n2"), bad}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "events[1].nodeName: required") {
		t.Fatalf("gRPC invalid: %v", err)
	}
	if after := endOffsets(t, k); after != before {
		t.Fatalf("rejected requests produced %d records", after-before)
	}
}

// TestBrokerRestart streams events while the broker stops and starts again:
// every acknowledged id must be in Kafka afterwards, and requests made while
// it was down must have been refused.
func TestBrokerRestart(t *testing.T) {
	k := testenv.StartKafka(t)
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) { c.ProduceTimeout = 2 * time.Second }, gateway.Options{})
	cl := faultlinev1.NewEventsClient(dial(t, gw.GRPCAddr()))
	ctx := withToken(context.Background(), gw.Token("alpha"))

	var (
		mu       sync.Mutex
		acked    = map[string]bool{}
		refused  int
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		downMu   sync.Mutex
		down     bool
		refusedD int
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				batch := make([]*datamodels.HealthEvent, 10)
				for j := range batch {
					batch[j] = event(fmt.Sprintf("node-%d-%d", w, j))
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := cl.SubmitEvents(rctx, &faultlinev1.SubmitEventsRequest{Events: batch})
				cancel()
				mu.Lock()
				if err == nil {
					for _, id := range resp.Ids {
						acked[id] = true
					}
				} else {
					if c := status.Code(err); c != codes.Unavailable && c != codes.ResourceExhausted {
						t.Errorf("unexpected error: %v", err)
					}
					refused++
					downMu.Lock()
					if down {
						refusedD++
					}
					downMu.Unlock()
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	downMu.Lock()
	down = true
	downMu.Unlock()
	k.Stop()
	time.Sleep(4 * time.Second)
	k.Start()
	downMu.Lock()
	down = false
	downMu.Unlock()
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("acknowledged %d events, refused %d requests (%d while the broker was down)", len(acked), refused, refusedD)
	if refusedD == 0 {
		t.Fatalf("no request was refused while the broker was down")
	}
	recs := readAll(t, k, len(acked))
	inKafka := map[string]bool{}
	for _, r := range recs {
		ev, err := events.Unmarshal(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		inKafka[ev.Id] = true
	}
	var lost int
	for id := range acked {
		if !inKafka[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged events are not in Kafka", lost, len(acked))
	}
	// The gateway recovers: a request after the restart succeeds (within
	// seconds: its producer may still be reconnecting).
	waitUntil(t, func() bool {
		_, err := cl.SubmitEvents(ctx, &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("after")}})
		return err == nil
	})
}

// testInflightBudget: while a slow REST body holds the gateway's whole
// in-flight budget, other requests are refused at once (REST 429 with
// Retry-After, gRPC RESOURCE_EXHAUSTED before the message is read), and
// accepted again once it is gone.
func testInflightBudget(t *testing.T, k *testenv.Kafka) {
	const budget = 64 << 10
	gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) {
		c.MaxBodyBytes, c.MaxInflightBytesPerConn, c.MaxReadBytesPerCaller, c.MaxInflightBytes = budget, budget, budget, budget
	}, gateway.Options{})
	slow, err := net.Dial("tcp", gw.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
		gw.Token("alpha"), budget-10)
	// The slow body holds the budget before any other request is sent: a
	// request answered meanwhile would hold bytes the slow body needs,
	// and the slow body would be the one refused.
	waitUntil(t, func() bool { return inflightBytes(t, gw.URL()) >= budget-10 }, func() string {
		slow.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		b, err := io.ReadAll(slow)
		return fmt.Sprintf("%d bytes held; the slow connection: %q (%v)", inflightBytes(t, gw.URL()), b, err)
	})
	valid := `{"events":[{"agent":"a","componentClass":"GPU","checkName":"c","nodeName":"n1"}]}`
	cl := faultlinev1.NewEventsClient(dial(t, gw.GRPCAddr()))
	var last string // the last answer, said if the 429 never comes
	waitUntil(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, gw.URL()+"/v1/events", strings.NewReader(valid))
		req.Header.Set("Authorization", "Bearer "+gw.Token("beta"))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = fmt.Sprintf("%d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
		return resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "1" && strings.Contains(string(b), "retry later")
	}, func() string { return last })
	_, err = cl.SubmitEvents(withToken(context.Background(), gw.Token("alpha")), &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("n1")}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC while the budget is held: %v", err)
	}
	slow.Close()
	waitUntil(t, func() bool {
		code, _ := post(t, gw, gw.Token("beta"), valid)
		return code == http.StatusOK
	})
	if _, err := cl.SubmitEvents(withToken(context.Background(), gw.Token("alpha")), &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{event("n1")}}); err != nil {
		t.Fatalf("gRPC once the budget is free: %v", err)
	}
	// Every answered request gave its bytes back.
	waitBudgetFree(t, gw.URL())
}

// waitBudgetFree waits until the gateway at base holds no request bytes.
func waitBudgetFree(t *testing.T, base string) {
	t.Helper()
	waitUntil(t, func() bool { return inflightBytes(t, base) == 0 }, func() string {
		return fmt.Sprintf("%d bytes still held", inflightBytes(t, base))
	})
}

// inflightBytes reads faultline_gateway_inflight_bytes from the gateway
// at base (http://host:port).
func inflightBytes(t *testing.T, base string) int64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	fam := fams["faultline_gateway_inflight_bytes"]
	if fam == nil || len(fam.GetMetric()) != 1 {
		t.Fatal("/metrics has no faultline_gateway_inflight_bytes")
	}
	return int64(fam.GetMetric()[0].GetGauge().GetValue())
}

// waitUntil waits up to 10s for ok; state, when given, says on failure
// what was seen last.
func waitUntil(t *testing.T, ok func() bool, state ...func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			for _, s := range state {
				t.Errorf("last seen: %s", s())
			}
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
