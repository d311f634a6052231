// Package nvsentinel speaks NVIDIA NVSentinel's wire contract without
// faultline's generated code, so that tests can hold faultline to it:
//
//   - a stand-in NVSentinel health monitor (Monitor): HealthEvents encoded
//     with protowire from NVSentinel's field numbers (Encode), sent to
//     datamodels.PlatformConnector/HealthEventOccurredV1 over a unix socket
//     with insecure credentials, exactly as NVSentinel's monitors dial
//     their platform-connector socket;
//   - the snapshot of NVSentinel's data-models (testdata/datamodels.txt,
//     with the commits it was taken from) that TestMatchesNVSentinel holds
//     faultline's schemas/proto/datamodels to, by descriptor: every name,
//     number, type and enum value;
//   - Normalize, which gives the events of NVSentinel's syslog monitor
//     faultline's vocabulary ("XID-31" for its "31"), for both doors of
//     NVSentinel's events (agents/relay, the gateway).
package nvsentinel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// Method is the full gRPC method NVSentinel's monitors call.
const Method = "/datamodels.PlatformConnector/HealthEventOccurredV1"

// DefaultSocket is where NVSentinel's monitors dial their platform
// connector (their --platform-connector-socket default,
// unix:///var/run/nvsentinel.sock, inside their containers).
const DefaultSocket = "/var/run/nvsentinel.sock"

// Field numbers of NVSentinel's messages (testdata/datamodels.txt).
const (
	fieldEventsVersion = 1 // HealthEvents.version
	fieldEventsEvents  = 2 // HealthEvents.events

	fieldVersion                 = 1  // HealthEvent.version
	fieldAgent                   = 2  // HealthEvent.agent
	fieldComponentClass          = 3  // HealthEvent.componentClass
	fieldCheckName               = 4  // HealthEvent.checkName
	fieldIsFatal                 = 5  // HealthEvent.isFatal
	fieldIsHealthy               = 6  // HealthEvent.isHealthy
	fieldMessage                 = 7  // HealthEvent.message
	fieldRecommendedAction       = 8  // HealthEvent.recommendedAction
	fieldErrorCode               = 9  // HealthEvent.errorCode
	fieldEntitiesImpacted        = 10 // HealthEvent.entitiesImpacted
	fieldMetadata                = 11 // HealthEvent.metadata
	fieldGeneratedTimestamp      = 12 // HealthEvent.generatedTimestamp
	fieldNodeName                = 13 // HealthEvent.nodeName
	fieldQuarantineOverrides     = 14 // HealthEvent.quarantineOverrides
	fieldDrainOverrides          = 15 // HealthEvent.drainOverrides
	fieldProcessingStrategy      = 16 // HealthEvent.processingStrategy
	fieldID                      = 17 // HealthEvent.id
	fieldCustomRecommendedAction = 18 // HealthEvent.customRecommendedAction

	fieldEntityType  = 1 // Entity.entityType
	fieldEntityValue = 2 // Entity.entityValue

	fieldForce = 1 // BehaviourOverrides.force
	fieldSkip  = 2 // BehaviourOverrides.skip

	fieldSeconds = 1 // google.protobuf.Timestamp.seconds
	fieldNanos   = 2 // google.protobuf.Timestamp.nanos
	fieldKey     = 1 // map entry key
	fieldValue   = 2 // map entry value
)

// NVSentinel's ProcessingStrategy values.
const (
	StrategyUnspecified        = 0
	StrategyExecuteRemediation = 1
	StrategyStoreOnly          = 2
	StrategyStoreAndAnalyse    = 3
)

// Some of NVSentinel's RecommendedAction values.
const (
	ActionNone           = 0
	ActionComponentReset = 2
	ActionContactSupport = 5
	ActionRestartVM      = 15
	ActionRestartBM      = 24
	ActionReplaceVM      = 25
	ActionCustom         = 27
)

// Entity is one of an event's entitiesImpacted.
type Entity struct{ Type, Value string }

// Overrides is a BehaviourOverrides.
type Overrides struct{ Force, Skip bool }

// Event is a HealthEvent as an NVSentinel monitor fills it. Zero values
// are left out of the encoding, as proto3 does.
type Event struct {
	Version                 uint32
	Agent                   string
	ComponentClass          string
	CheckName               string
	IsFatal                 bool
	IsHealthy               bool
	Message                 string
	RecommendedAction       int32
	ErrorCode               []string
	Entities                []Entity
	Metadata                map[string]string
	GeneratedTimestamp      time.Time
	NodeName                string
	QuarantineOverrides     *Overrides
	DrainOverrides          *Overrides
	ProcessingStrategy      int32
	ID                      string
	CustomRecommendedAction string
}

// Encode returns the wire bytes of HealthEvents{version, events}. Map
// entries are written in key order, so the bytes are deterministic.
func Encode(version uint32, evs []Event) []byte {
	var b []byte
	b = appendVarint(b, fieldEventsVersion, uint64(version))
	for _, ev := range evs {
		b = appendMessage(b, fieldEventsEvents, encodeEvent(ev))
	}
	return b
}

func encodeEvent(ev Event) []byte {
	var b []byte
	b = appendVarint(b, fieldVersion, uint64(ev.Version))
	b = appendString(b, fieldAgent, ev.Agent)
	b = appendString(b, fieldComponentClass, ev.ComponentClass)
	b = appendString(b, fieldCheckName, ev.CheckName)
	b = appendBool(b, fieldIsFatal, ev.IsFatal)
	b = appendBool(b, fieldIsHealthy, ev.IsHealthy)
	b = appendString(b, fieldMessage, ev.Message)
	b = appendVarint(b, fieldRecommendedAction, uint64(ev.RecommendedAction))
	for _, c := range ev.ErrorCode {
		b = protowire.AppendTag(b, fieldErrorCode, protowire.BytesType)
		b = protowire.AppendString(b, c)
	}
	for _, e := range ev.Entities {
		var m []byte
		m = appendString(m, fieldEntityType, e.Type)
		m = appendString(m, fieldEntityValue, e.Value)
		b = appendMessage(b, fieldEntitiesImpacted, m)
	}
	keys := make([]string, 0, len(ev.Metadata))
	for k := range ev.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var m []byte
		m = appendString(m, fieldKey, k)
		m = appendString(m, fieldValue, ev.Metadata[k])
		b = appendMessage(b, fieldMetadata, m)
	}
	if !ev.GeneratedTimestamp.IsZero() {
		var m []byte
		m = appendVarint(m, fieldSeconds, uint64(ev.GeneratedTimestamp.Unix()))
		m = appendVarint(m, fieldNanos, uint64(ev.GeneratedTimestamp.Nanosecond()))
		b = appendMessage(b, fieldGeneratedTimestamp, m)
	}
	b = appendString(b, fieldNodeName, ev.NodeName)
	b = appendOverrides(b, fieldQuarantineOverrides, ev.QuarantineOverrides)
	b = appendOverrides(b, fieldDrainOverrides, ev.DrainOverrides)
	b = appendVarint(b, fieldProcessingStrategy, uint64(ev.ProcessingStrategy))
	b = appendString(b, fieldID, ev.ID)
	b = appendString(b, fieldCustomRecommendedAction, ev.CustomRecommendedAction)
	return b
}

func appendVarint(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendBool(b []byte, n protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return appendVarint(b, n, 1)
}

func appendString(b []byte, n protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendMessage(b []byte, n protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

func appendOverrides(b []byte, n protowire.Number, o *Overrides) []byte {
	if o == nil {
		return b
	}
	var m []byte
	m = appendBool(m, fieldForce, o.Force)
	m = appendBool(m, fieldSkip, o.Skip)
	return appendMessage(b, n, m)
}

// Monitor is a stand-in NVSentinel health monitor: a gRPC client of the
// platform connector's unix socket, with insecure credentials and no
// token, as NVSentinel's monitors are.
type Monitor struct {
	conn *grpc.ClientConn
}

// Dial connects (lazily, like grpc.NewClient) to the unix socket at path.
func Dial(path string) (*Monitor, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("nvsentinel monitor: %w", err)
	}
	return &Monitor{conn: conn}, nil
}

// Send calls HealthEventOccurredV1 with HealthEvents{version 1, evs}; the
// error is the call's gRPC status.
func (m *Monitor) Send(ctx context.Context, evs ...Event) error {
	return m.SendEncoded(ctx, Encode(1, evs))
}

// SendEncoded calls HealthEventOccurredV1 with msg, an already encoded
// HealthEvents (any bytes: a hostile or broken monitor's too); the error
// is the call's gRPC status.
func (m *Monitor) SendEncoded(ctx context.Context, msg []byte) error {
	var out []byte
	return m.conn.Invoke(ctx, Method, msg, &out, grpc.ForceCodec(rawCodec{}))
}

// Close closes the connection.
func (m *Monitor) Close() error { return m.conn.Close() }

// rawCodec sends and receives already encoded protobuf bytes.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: %T is not []byte", v)
	}
	return b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return errors.New("rawCodec: want *[]byte")
	}
	*p = append((*p)[:0], data...)
	return nil
}

// String describes an event for test failures.
func (ev Event) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s/%s node=%s fatal=%t healthy=%t strategy=%d %q", ev.Agent, ev.CheckName, ev.NodeName, ev.IsFatal, ev.IsHealthy, ev.ProcessingStrategy, ev.Message)
	return sb.String()
}
