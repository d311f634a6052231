// Package events holds the helpers every faultline component shares around
// the HealthEvent contract: Kafka topic names and keys, entity types, ids,
// and the wire encoding of records.
package events

import (
	"crypto/sha256"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Kafka topics. Records are keyed by Key(cluster, node) so one node's records
// stay ordered in one partition.
const (
	// TopicEvents carries accepted HealthEvents, raw and derived (protobuf).
	TopicEvents = "faultline.events"
	// TopicActions carries remediation decisions and outcomes, the audit
	// trail (protobuf faultline.v1.Action).
	TopicActions = "faultline.actions"
	// TopicDeadLetter carries records that could not be processed; the
	// original key and value are kept and the reason is in the
	// "faultline-error" header.
	TopicDeadLetter = "faultline.deadletter"
)

// Header names used on Kafka records.
const (
	HeaderError      = "faultline-error"
	HeaderSource     = "faultline-source-topic"
	HeaderSourcePart = "faultline-source-partition"
	HeaderSourceOff  = "faultline-source-offset"
	// A dead letter too large to carry its record's value carries these
	// instead (the source position finds the record while it is kept).
	HeaderValueBytes  = "faultline-value-bytes"
	HeaderValueSHA256 = "faultline-value-sha256"
)

// Entity types reported in entitiesImpacted.
const (
	EntityGPU      = "GPU"
	EntityNIC      = "NIC"
	EntityNICPort  = "NICPort"
	EntityNVSwitch = "NVSwitch"
	EntityPCI      = "PCI"
	EntityNode     = "NODE"
)

// MetaGPUPods is the event metadata (and quarantine action detail) that
// lists the pods holding the event's GPUs when the event was raised,
// "namespace/name" comma-separated, from the kubelet's pod-resources API
// (agents/podres). Present means known (an empty value: no pod held
// them); absent means unknown. The drain of a GPU reset evicts exactly
// these pods.
const MetaGPUPods = "faultline.io/gpu-pods"

// MetaGPUPodsAt is when the kubelet was asked for MetaGPUPods (RFC 3339):
// a pod created later is not in the list whatever GPU it holds.
const MetaGPUPodsAt = "faultline.io/gpu-pods-at"

// MetaAgentGeneratedAt is the event metadata holding, RFC 3339, the
// generatedTimestamp the node's agent gave the event where the gateway
// refused it as more than its gateway.max_future_skew in the future (the
// node's clock ahead of the gateway's): the agent resends such an event
// without it, and the gateway stamps its receive time instead.
const MetaAgentGeneratedAt = "faultline.io/agent-generated-timestamp"

// MetaSystemUUID is the event metadata naming the machine that raised it:
// its system UUID (/sys/class/dmi/id/product_uuid, what the kubelet
// reports as the Node's status.nodeInfo.systemUUID), stamped by the
// node's agent where it can read it (as root). A Node object kept across
// a machine swap then tells the earlier machine's late events apart: the
// quarantine role does not act on a fault whose machine is not the one
// its node reports.
const MetaSystemUUID = "faultline.io/system-uuid"

// MetaNICCrossingsOnly ("1") marks a NIC port state event
// (InfiniBandStateCheck, EthernetStateCheck) of a source that reports only
// a port's healthy <-> unhealthy crossings: NVIDIA NVSentinel's NIC health
// monitor, whose events nvsentinel.Normalize stamps with it (the gateway's
// HealthEventOccurredV1, the agent's relay). Such a source reports nothing
// when a port goes on from a non-fatal unhealthy state (ACTIVE/
// LinkErrorRecovery, INIT, ARMED, Polling) to DOWN, so the NIC correlation
// rules (sql/rules: nic_link_flap, nic_port_drop, fabric_incident) take its
// marked non-fatal unhealthy state event for a link-down: nothing may
// follow it while the port stays down. An unmarked one (faultline's nic
// check, which reports that escalation as an event of its own; and every
// event stored before the mark) is no down. The gateway does not reserve
// the key (the relay's events reach it through SubmitEvents, marked): a
// client that sends it makes only the non-fatal port events it sends (for
// the nodes its credential may report for) count as downs, as sending them
// fatal would. The SQL and FabricIncident's
// trigger name the key as a literal: keep them in step.
const MetaNICCrossingsOnly = "faultline.io/nic-crossings-only"

// SetSystemUUID stamps ev with the machine's system UUID (MetaSystemUUID)
// where it has room for one more metadata key than it has (below
// maxKeys: validate.MaxMetadata); "" stamps nothing.
func SetSystemUUID(ev *datamodels.HealthEvent, uuid string, maxKeys int) {
	if _, ok := ev.Metadata[MetaSystemUUID]; uuid == "" || (!ok && len(ev.Metadata) >= maxKeys) {
		return
	}
	if ev.Metadata == nil {
		ev.Metadata = map[string]string{}
	}
	ev.Metadata[MetaSystemUUID] = uuid
}

// NormalizePCI returns a PCI address as "dddd:bb:dd" (or "dddd:bb:dd.f" with
// keepFunc), lower case, with the domain cut or padded to four digits:
// "00000000:3B:00.0", "0000:3b:00" and "3b:00.0" all become "0000:3b:00".
// It is the form of a GPU event's PCI entity (the kmsg check's, and
// NVSentinel's once schemas/nvsentinel normalised it), by which the Xid
// rules match a GPU.
func NormalizePCI(s string, keepFunc bool) string {
	if canonicalPCI(s, keepFunc) {
		return s
	}
	s = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(s, "PCI:")))
	fn := ""
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		fn = s[i:]
		s = s[:i]
	}
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		parts = append([]string{"0000"}, parts...)
	case 3:
	default:
		return s + fn
	}
	d := parts[0]
	if len(d) > 4 {
		d = d[len(d)-4:]
	}
	for len(d) < 4 {
		d = "0" + d
	}
	out := d + ":" + parts[1] + ":" + parts[2]
	if keepFunc {
		if fn == "" {
			fn = ".0"
		}
		out += fn
	}
	return out
}

// canonicalPCI reports whether s is already in NormalizePCI's form.
func canonicalPCI(s string, keepFunc bool) bool {
	n := 10
	if keepFunc {
		n = 12
	}
	if len(s) != n || s[4] != ':' || s[7] != ':' || (keepFunc && s[10] != '.') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 4 || i == 7 || (keepFunc && i == 10) {
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Printable returns s as valid UTF-8 ('?' for each invalid byte run)
// with every control character, newlines included, turned into a space:
// what an agent puts in an event from text it read (a kernel log line, a
// tool's error) passes the gateway's checks on identifiers and free text.
func Printable(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// Truncate returns s cut to at most n bytes, ending in "...", on a UTF-8
// boundary (protobuf strings must stay valid UTF-8), for the free-text
// fields of actions, node annotations and Kubernetes Events.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// clusterName is the form of a cluster name: a lowercase DNS label, dots
// allowed, at most 63 characters.
var clusterName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`)

// IsClusterName reports whether s is a cluster name: what the gateway
// accepts in a tokens file or client certificate and stamps on events,
// and so the only names the processors can find a cluster's events by.
func IsClusterName(s string) bool { return clusterName.MatchString(s) }

// gpuUUID is the form of a GPU UUID, as nvidia-smi -L and NVML name a GPU
// (and spec.selector.uuids of the janitor's GPUReset accepts,
// deploy/crds/gpureset.yaml).
var gpuUUID = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// IsGPUUUID reports whether a GPU entity's value is a GPU UUID, rather
// than a PCI address (the fabric agent's gpuIDByPCI fallback), an index
// (NVLINK-INACTIVE's index:N, NVSentinel's DCGM events without GPU_UUID)
// or anything else: only a UUID can be matched with the GPUs a pod holds
// or a GPUReset selects.
func IsGPUUUID(s string) bool { return gpuUUID.MatchString(s) }

// CanonicalGPUUUID returns the GPU UUID s with its hex digits in lower
// case, as NVML, nvidia-smi and NVIDIA's device plugin write them, so that
// UUIDs compare equal whatever case they were written in (a GPUReset's
// selector accepts either); s that is not a GPU UUID is returned as it
// is.
func CanonicalGPUUUID(s string) string {
	if !IsGPUUUID(s) {
		return s
	}
	return "GPU-" + strings.ToLower(s[len("GPU-"):])
}

// Key is the Kafka record key of a node's records: "cluster/node".
func Key(cluster, node string) []byte {
	return AppendKey(make([]byte, 0, len(cluster)+1+len(node)), cluster, node)
}

// AppendKey appends Key(cluster, node) to dst.
func AppendKey(dst []byte, cluster, node string) []byte {
	dst = append(dst, cluster...)
	dst = append(dst, '/')
	return append(dst, node...)
}

// SplitKey is the inverse of Key.
func SplitKey(key []byte) (cluster, node string, err error) {
	c, n, ok := strings.Cut(string(key), "/")
	if !ok || c == "" || n == "" {
		return "", "", fmt.Errorf("record key %q is not cluster/node", key)
	}
	return c, n, nil
}

// NewID returns a unique, time-ordered id (UUIDv7, text form).
func NewID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// HashID is a deterministic event id (UUIDv8 text): the first 16 bytes of
// the SHA-256 of the parts joined by NUL, so whoever computes it from the
// same parts gets the same id.
func HashID(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	var u uuid.UUID
	copy(u[:], sum[:16])
	u[6] = (u[6] & 0x0f) | 0x80 // version 8: custom
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 4122 variant
	return u.String()
}

// StoredID is the id the gateway gives an event whose client set one: a
// function of the caller's cluster, the event's node and the client's id,
// so the retries of one event (a client resending after a timeout) are one
// event downstream, while one client id on two nodes' events (a per-run
// key) is two events, and no caller can make its events collide with
// another node's or another cluster's. (v1 hashed the cluster and the id
// only: a resend that straddles the upgrade is stored twice, once.)
func StoredID(cluster, nodeName, clientID string) string {
	return HashID("faultline-event/v2", cluster, nodeName, clientID)
}

// OccurrenceID is the id of a client's event that came without one: a
// function of everything the client sent of it (deterministic protobuf
// encoding), so a resend of the same event gets the same id — for a
// client that resends a call unchanged after losing its answer, as
// NVSentinel's monitors do. Only meaningful for an event that carries its
// own generatedTimestamp (two occurrences then never share every field);
// "" when the event cannot be encoded (the caller gives it a new id).
func OccurrenceID(ev *datamodels.HealthEvent) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
	if err != nil {
		return ""
	}
	return HashID("faultline-occurrence/v1", string(b))
}

// Marshal encodes a HealthEvent as a Kafka record value (vtprotobuf's
// generated encoder: the same bytes format as proto.Marshal, without
// reflection).
func Marshal(ev *datamodels.HealthEvent) ([]byte, error) {
	return ev.MarshalVT()
}

// Unmarshal decodes a Kafka record value into a HealthEvent. It uses the
// standard decoder, which also checks that strings are UTF-8.
func Unmarshal(b []byte) (*datamodels.HealthEvent, error) {
	ev := &datamodels.HealthEvent{}
	if err := proto.Unmarshal(b, ev); err != nil {
		return nil, fmt.Errorf("decode HealthEvent: %w", err)
	}
	return ev, nil
}

// MarshalAction encodes an Action as a Kafka record value.
func MarshalAction(a *faultlinev1.Action) ([]byte, error) {
	return a.MarshalVT()
}

// UnmarshalAction decodes a Kafka record value into an Action.
func UnmarshalAction(b []byte) (*faultlinev1.Action, error) {
	a := &faultlinev1.Action{}
	if err := proto.Unmarshal(b, a); err != nil {
		return nil, fmt.Errorf("decode Action: %w", err)
	}
	return a, nil
}

// Entity returns the value of the first impacted entity of the given type,
// or "".
func Entity(ev *datamodels.HealthEvent, typ string) string {
	for _, e := range ev.GetEntitiesImpacted() {
		if e.GetEntityType() == typ {
			return e.GetEntityValue()
		}
	}
	return ""
}

// EntityKey is a stable text form of all impacted entities ("GPU=GPU-1,NIC=mlx5_0"),
// used to tell one entity's fault from another's on the same node. It
// keeps the event's order and escapes nothing (a value may hold ',' or
// '='): compare a key with an event's entities in any order by
// SameEntities, not by splitting it.
func EntityKey(ev *datamodels.HealthEvent) string {
	return strings.Join(EntityParts(ev), ",")
}

// EntityParts is the impacted entities as EntityKey writes each
// ("GPU=GPU-1"), in the event's order.
func EntityParts(ev *datamodels.HealthEvent) []string {
	parts := make([]string, 0, len(ev.GetEntitiesImpacted()))
	for _, e := range ev.GetEntitiesImpacted() {
		parts = append(parts, e.GetEntityType()+"="+e.GetEntityValue())
	}
	return parts
}

// maxSameEntitiesSteps bounds SameEntities' search: only parts that hold
// ',' make it branch, and none of an agent's do.
const maxSameEntitiesSteps = 10000

// SameEntities reports whether key, an EntityKey, lists the entities parts
// (EntityParts) in some order: each part once, as many times as it is in
// parts (the same entities sent by another agent, or by hand, in another
// order). As EntityKey escapes nothing, key is not split on ','; it is
// matched part by part from its start, each part followed by ',' or its
// end, so a ',' inside a value splits nothing. No parts match "" only. A
// search that would take more than maxSameEntitiesSteps steps (parts built
// to make it branch) reports false unless key is parts in their order.
func SameEntities(key string, parts []string) bool {
	if len(parts) == 0 {
		return key == ""
	}
	n := len(parts) - 1
	for _, p := range parts {
		n += len(p)
	}
	if len(key) != n {
		return false
	}
	if key == strings.Join(parts, ",") {
		return true
	}
	sorted := slices.Clone(parts)
	slices.Sort(sorted)
	used := make([]bool, len(sorted))
	steps := 0
	var match func(rest string, left int) bool
	match = func(rest string, left int) bool {
		if steps++; steps > maxSameEntitiesSteps {
			return false
		}
		for i, p := range sorted {
			// A part equal to the one before is tried only after it.
			if used[i] || (i > 0 && sorted[i-1] == p && !used[i-1]) || !strings.HasPrefix(rest, p) {
				continue
			}
			tail := rest[len(p):]
			if left == 1 {
				if tail == "" {
					return true
				}
				continue
			}
			if tail == "" || tail[0] != ',' {
				continue
			}
			used[i] = true
			if match(tail[1:], left-1) {
				return true
			}
			used[i] = false
		}
		return false
	}
	return match(key, len(sorted))
}

// IsDerived reports whether a correlation rule produced the event.
func IsDerived(ev *datamodels.HealthEvent) bool { return ev.GetDerivedBy() != "" }

// StoreOnly reports whether the event is processingStrategy STORE_ONLY:
// stored, never counted by correlation, never acted on.
func StoreOnly(ev *datamodels.HealthEvent) bool {
	return ev.GetProcessingStrategy() == datamodels.ProcessingStrategy_STORE_ONLY
}

// NeverActs reports whether quarantine, drain and remediate must leave the
// event alone: processingStrategy STORE_ONLY or STORE_AND_ANALYSE. The
// store takes every event, and correlation counts STORE_AND_ANALYSE events
// (not STORE_ONLY ones); a verdict it derives from them carries its rule's
// own strategy, so it may act.
func NeverActs(ev *datamodels.HealthEvent) bool {
	switch ev.GetProcessingStrategy() {
	case datamodels.ProcessingStrategy_STORE_ONLY, datamodels.ProcessingStrategy_STORE_AND_ANALYSE:
		return true
	}
	return false
}
