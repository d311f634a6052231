package gateway

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// restJSONSeeds are bodies decodeSubmitFast takes or leaves to protojson.
var restJSONSeeds = []string{
	`{"events":[` + fastEvent + `]}`,
	`{"events":[{"agent":"a","componentClass":"GPU","checkName":"XID","nodeName":"n1","isFatal":true,"isHealthy":false,"recommendedAction":"REPLACE_VM",` +
		`"entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-1"},{}],"metadata":{"k":"v","k2":""},"errorCode":["79",""],` +
		`"generatedTimestamp":"2026-11-22T10:00:00.123456789Z","processingStrategy":"STORE_ONLY","id":"x","customRecommendedAction":"y","message":"é ☃"}]}`,
	" \n\t{ \"events\" : [ { } , { \"agent\" : \"a\" } ] } \r\n",
	`{"events":[]}`, `{}`, `[]`, ``, `{"events":[null]}`, `{"events":null}`,
	`{"events":[{"agent":"a"}]} x`, `{"events":[{"agent":"a"}]`, `{"events":[{"agent":"a",}]}`, `{"events":[{"agent":"a"},]}`,
	`{"events":[{"agent":"a","agent":"b"}]}`, `{"events":[{"metadata":{"k":"a","k":"b"}}]}`, `{"events":[{"metadata":{"":"a"}}]}`,
	`{"events":[{"agent":"\u0061"}]}`, `{"events":[{"ag\u0065nt":"a"}]}`, `{"events":[{"agent":"a\"b"}]}`,
	"{\"events\":[{\"agent\":\"\xff\"}]}", "{\"events\":[{\"agent\":\"a\x01\"}]}", "\xef\xbb\xbf{\"events\":[]}",
	`{"events":[{"recommendedAction":27}]}`, `{"events":[{"recommendedAction":"FOO"}]}`, `{"events":[{"recommendedAction":null}]}`,
	`{"events":[{"isFatal":"true"}]}`, `{"events":[{"isFatal":truex}]}`, `{"events":[{"isFatal":tru}]}`, `{"events":[{"isFatal":True}]}`,
	`{"events":[{"version":1}]}`, `{"events":[{"version":0}]}`, `{"events":[{"version":4294967295}]}`, `{"events":[{"version":4294967296}]}`,
	`{"events":[{"version":01}]}`, `{"events":[{"version":1.0}]}`, `{"events":[{"version":1e0}]}`, `{"events":[{"version":-1}]}`,
	`{"events":[{"version":"1"}]}`, `{"events":[{"version":12345678901}]}`, `{"events":[{"version":1E2}]}`, `{"events":[{"version":1 }]}`, `{"events":[{"cluster":"c"}]}`, `{"events":[{"component_class":"c"}]}`, `{"events":[{"bogus":1}]}`,
	`{"events":[{"generatedTimestamp":"2026-11-22T10:00:00+01:00"}]}`, `{"events":[{"generatedTimestamp":"2026-11-22"}]}`,
	`{"events":[{"generatedTimestamp":"0000-01-01T00:00:00Z"}]}`, `{"events":[{"generatedTimestamp":"2026-11-22T10:00:00.1234567890Z"}]}`,
	`{"events":[{"generatedTimestamp":1}]}`, `{"events":[{"entitiesImpacted":[{"entityType":"a","entityType":"b"}]}]}`,
	`{"events":[{"entitiesImpacted":[{"entityType":"a","x":"b"}]}]}`, `{"events":[{"errorCode":["a",1]}]}`, `{"events":[{"errorCode":"a"}]}`,
	`{"events":[{}],"events":[{}]}`, `{"Events":[]}`, `{"events":[{"metadata":{"k":1}}]}`, `{"events":[{"metadata":[]}]}`,
}

// checkFastMatchesProtojson fails when decodeSubmitFast takes a body that
// protojson refuses or decodes differently.
func checkFastMatchesProtojson(t *testing.T, body []byte) (took bool) {
	t.Helper()
	fast := &faultlinev1.SubmitEventsRequest{}
	if !decodeSubmitFast(body, fast) {
		return false
	}
	std := &faultlinev1.SubmitEventsRequest{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(body, std); err != nil {
		t.Fatalf("decodeSubmitFast took %q, protojson refuses it: %v", body, err)
	}
	if !proto.Equal(fast, std) {
		t.Fatalf("decodeSubmitFast and protojson disagree on %q:\nfast     %v\nprotojson %v", body, fast, std)
	}
	return true
}

func TestDecodeSubmitFast(t *testing.T) {
	want := map[string]bool{ // the seeds it takes; every other one goes to protojson
		restJSONSeeds[0]: true, restJSONSeeds[1]: true, restJSONSeeds[2]: true, `{"events":[]}`: true,
		`{"events":[{"generatedTimestamp":"2026-11-22T10:00:00+01:00"}]}`: true,
		`{"events":[{"version":1}]}`:                                      true, `{"events":[{"version":0}]}`: true, `{"events":[{"version":4294967295}]}`: true,
		`{"events":[{"version":1 }]}`: true,
	}
	for _, body := range restJSONSeeds {
		if took := checkFastMatchesProtojson(t, []byte(body)); took != want[body] {
			t.Errorf("decodeSubmitFast(%q) took it: %v, want %v", body, took, want[body])
		}
	}
	// A refused body leaves the request as it was.
	req := &faultlinev1.SubmitEventsRequest{}
	if decodeSubmitFast([]byte(`{"events":[{"agent":"a"},{"bogus":1}]}`), req) || len(req.Events) != 0 {
		t.Errorf("a refused body filled the request: %v", req)
	}
	// What protojson writes (a client built on it, e.g. the load
	// generator) takes the fast path.
	versioned := validEvent()
	versioned.Version = 1
	written, err := protojson.Marshal(&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{validEvent(), versioned}})
	if err != nil {
		t.Fatal(err)
	}
	if !checkFastMatchesProtojson(t, written) {
		t.Errorf("decodeSubmitFast refused protojson's own output %s", written)
	}
	// Many events.
	many := `{"events":[` + strings.Repeat(fastEvent+",", 999) + fastEvent + `]}`
	if !checkFastMatchesProtojson(t, []byte(many)) {
		t.Error("decodeSubmitFast refused 1000 ordinary events")
	}
}

// FuzzDecodeSubmitFastMatchesProtojson holds the fast decoder to
// protojson: whatever it takes, protojson accepts and decodes the same.
func FuzzDecodeSubmitFastMatchesProtojson(f *testing.F) {
	for _, s := range restJSONSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastMatchesProtojson(t, body)
	})
}
