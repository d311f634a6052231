package nic

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Report is what `faultline-agent nic check --once` prints: the discovered
// NICs with role and monitoring decision, and the events of the poll.
type Report struct {
	NICs   []NIC             `json:"nics"`
	Events []json.RawMessage `json:"events"`
}

// MarshalReport renders a poll as indented JSON; events use the HealthEvent
// JSON names (agent, componentClass, checkName, ... recommendedAction by
// name).
func MarshalReport(nics []NIC, evs []*datamodels.HealthEvent) ([]byte, error) {
	r := Report{NICs: nics, Events: make([]json.RawMessage, 0, len(evs))}
	if r.NICs == nil {
		r.NICs = []NIC{}
	}
	for _, ev := range evs {
		b, err := protojson.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("encode event: %w", err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err != nil {
			return nil, fmt.Errorf("encode event: %w", err)
		}
		r.Events = append(r.Events, buf.Bytes())
	}
	out, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	return append(out, '\n'), nil
}
