package store

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/rows/rowstest"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestRoundTripThroughGateway: events POSTed to the real gateway's REST
// API go through a real Kafka broker and the store role into ClickHouse,
// and GET /v1/events (served by the ClickHouse History) returns them with
// every field the client sent, plus the id, cluster and received time the
// gateway stamped; another cluster's token sees none of them.
func TestRoundTripThroughGateway(t *testing.T) {
	k := testenv.StartKafka(t)
	srv := chtest.Start(t)
	gw := gatewaytest.Start(t, k.Addr(), nil, gateway.Options{History: history.New(srv.Conn, slog.Default())})
	runStore(t, k.Addr(), New(srv.Conn, slog.Default(), nil), nil)

	sent := rowstest.Events(t)
	for _, ev := range sent { // what the gateway stamps, a client cannot set
		ev.Id, ev.Cluster, ev.ReceivedTimestamp = "", "", nil
		if ev.GeneratedTimestamp == nil {
			ev.GeneratedTimestamp = ev.GetReceivedTimestamp()
		}
	}
	sent = sent[:3] // the fourth has no generatedTimestamp, which the gateway requires
	body, err := protojson.Marshal(&faultlinev1.SubmitEventsRequest{Events: sent})
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, cluster string, body []byte) []byte {
		t.Helper()
		req, _ := http.NewRequest(method, gw.URL()+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+gw.Token(cluster))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return b
	}
	before := time.Now()
	var ids faultlinev1.SubmitEventsResponse
	if err := protojson.Unmarshal(do("POST", "/v1/events", "alpha", body), &ids); err != nil {
		t.Fatal(err)
	}
	if len(ids.Ids) != len(sent) {
		t.Fatalf("%d ids for %d events", len(ids.Ids), len(sent))
	}
	waitCount(t, srv, uint64(len(sent)), time.Minute, "SELECT uniqExact(id) FROM events")

	var list faultlinev1.ListEventsResponse
	if err := protojson.Unmarshal(do("GET", "/v1/events?node=gpu-node-42", "alpha", nil), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]*datamodels.HealthEvent{}
	for _, ev := range list.Events {
		got[ev.GetId()] = ev
	}
	for i, want := range sent {
		g, ok := got[ids.Ids[i]]
		if !ok {
			t.Errorf("event %d (%s) not listed", i, ids.Ids[i])
			continue
		}
		if g.GetCluster() != "alpha" {
			t.Errorf("event %d: cluster %q, want the token's alpha", i, g.GetCluster())
		}
		if rt := g.GetReceivedTimestamp().AsTime(); rt.Before(before.Add(-time.Second)) || rt.After(time.Now()) {
			t.Errorf("event %d: received %s, not stamped during the test", i, rt)
		}
		// The submitter is the posting credential (an agent token of
		// alpha), whatever the client claimed.
		if s := g.GetSubmitter(); s.GetRole() != datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT || !strings.HasPrefix(s.GetName(), "token:alpha") {
			t.Errorf("event %d: submitter %v, want the agent token of alpha", i, s)
		}
		want = proto.Clone(want).(*datamodels.HealthEvent)
		want.Id, want.Cluster, want.ReceivedTimestamp, want.Submitter = g.Id, g.Cluster, g.ReceivedTimestamp, g.Submitter
		// Only the correlate role derives events (through Kafka, covered by
		// TestRoundTrip); the gateway drops what a client claims.
		want.DerivedBy, want.CauseIds = "", nil
		if want.ProcessingStrategy == datamodels.ProcessingStrategy_UNSPECIFIED {
			want.ProcessingStrategy = datamodels.ProcessingStrategy_EXECUTE_REMEDIATION
		}
		if !proto.Equal(g, want) {
			t.Errorf("event %d changed on the way:\n got  %v\n want %v", i, g, want)
		}
	}
	var other faultlinev1.ListEventsResponse
	if err := protojson.Unmarshal(do("GET", "/v1/events", "beta", nil), &other); err != nil {
		t.Fatal(err)
	}
	if len(other.Events) != 0 {
		t.Fatalf("cluster beta sees %d of alpha's events", len(other.Events))
	}
}
