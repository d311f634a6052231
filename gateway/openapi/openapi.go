// Package openapi embeds the OpenAPI document generated from the protos
// (scripts/generate.sh), served at /openapi.json, merged with the paths
// the gateway serves outside grpc-gateway (extra.json: GET
// /v1/conformance/score), which generation does not overwrite.
package openapi

import (
	_ "embed"
	"encoding/json"
)

//go:embed openapi.json
var generated []byte

//go:embed extra.json
var extra []byte

// JSON is the OpenAPI (Swagger 2.0) document of the REST API.
var JSON = merge(generated, extra)

// merge adds extra's paths and definitions to doc (doc's win on a clash);
// a document that does not parse is served as generated.
func merge(doc, extra []byte) []byte {
	var d, e map[string]any
	if json.Unmarshal(doc, &d) != nil || json.Unmarshal(extra, &e) != nil {
		return doc
	}
	for _, k := range []string{"paths", "definitions"} {
		dst, _ := d[k].(map[string]any)
		if dst == nil {
			dst = map[string]any{}
			d[k] = dst
		}
		src, _ := e[k].(map[string]any)
		for name, v := range src {
			if _, ok := dst[name]; !ok {
				dst[name] = v
			}
		}
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return doc
	}
	return out
}
