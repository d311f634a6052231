package gateway

import "github.com/faultline/faultline/schemas/validate"

// The gateway validates events with schemas/validate, the rules the agent's
// NVSentinel relay applies too.
type (
	// Validator checks submitted events (validate.Validator).
	Validator = validate.Validator
	// FieldError is a validation failure of one field (validate.FieldError).
	FieldError = validate.FieldError
)

// Limits the gateway's other checks share with the validator.
const (
	maxNodeNameLen = validate.MaxNodeNameLen
	maxErrorCodes  = validate.MaxErrorCodes
	maxEntities    = validate.MaxEntities
	maxMetadata    = validate.MaxMetadata
)

// nodeNamePattern is a Kubernetes node name (validate.NodeNamePattern).
var nodeNamePattern = validate.NodeNamePattern

// truncate shortens a client string quoted in an error (validate.Short).
func truncate(s string) string { return validate.Short(s) }
