// Package openapi embeds the OpenAPI document generated from the protos
// (scripts/generate.sh), served at /openapi.json.
package openapi

import _ "embed"

// JSON is the OpenAPI (Swagger 2.0) document of the REST API.
//
//go:embed openapi.json
var JSON []byte
