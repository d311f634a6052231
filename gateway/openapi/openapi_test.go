package openapi

import (
	"encoding/json"
	"testing"
)

func TestMergedDocument(t *testing.T) {
	var d struct {
		Paths       map[string]any `json:"paths"`
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(JSON, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/v1/events", "/v1/actions", "/v1/conformance/score", "/v1/fleet/summary", "/v1/fleet/nodes", "/v1/fleet/nodes/{node}", "/v1/fleet/analytics", "/v1/fleet/analytics/{name}"} {
		if d.Paths[p] == nil {
			t.Errorf("path %s missing", p)
		}
	}
	if d.Definitions["conformanceScore"] == nil || d.Definitions["rpcStatus"] == nil {
		t.Error("definitions missing")
	}
}
