package janitor

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/schemas/events"
)

// Provider names.
const (
	ProviderRedfish = "redfish"
	ProviderAWS     = "aws"
	ProviderLocal   = "local"
)

// Node annotations and labels the janitor reads to carry out an operation.
const (
	// AnnotationProvider (or the label of the same name) picks the node's
	// provider; it wins over the providerID prefix and default_provider,
	// not over LabelProvider. It is the node's own (its kubelet may write
	// it): not followed with redfish.labels_only.
	AnnotationProvider = "faultline.io/janitor-provider"
	// AnnotationBMC is the node's BMC: its Redfish base URL
	// ("https://10.0.0.5"), optionally with the system's path
	// ("https://10.0.0.5/redfish/v1/Systems/1").
	AnnotationBMC = "faultline.io/bmc-address"
	// AnnotationBMCSecret names the Secret (in redfish.secret_namespace)
	// with the BMC's username and password; default redfish.default_secret.
	AnnotationBMCSecret = "faultline.io/bmc-secret"
)

// Node labels an administrator sets to name a node's BMC. They are under
// node-restriction.kubernetes.io/, the prefix the NodeRestriction
// admission plugin forbids kubelets to add, change or remove
// (https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction),
// so, unlike the annotations above, a compromised node cannot point them at
// another node's BMC. A node with LabelBMCHost takes its BMC from these
// labels alone (its annotations are not read). A label value cannot hold
// ':' or '/': the host is an IPv4 address or a DNS name (an IPv6 BMC is
// named by a DNS name), the port and the system are labels of their own.
const (
	// LabelBMCHost is the BMC's IPv4 address or DNS name (HTTPS).
	LabelBMCHost = corev1.LabelNamespaceNodeRestriction + "/faultline-bmc-host"
	// LabelBMCPort is the BMC's HTTPS port; default 443.
	LabelBMCPort = corev1.LabelNamespaceNodeRestriction + "/faultline-bmc-port"
	// LabelBMCSystem is the Id of the node's ComputerSystem
	// (/redfish/v1/Systems/<Id>: "1", "System.Embedded.1"); default the
	// BMC's only system (or, unless redfish.labels_only, the one whose
	// UUID is the node's status.nodeInfo.systemUUID).
	LabelBMCSystem = corev1.LabelNamespaceNodeRestriction + "/faultline-bmc-system"
	// LabelBMCSecret names the Secret with the BMC's credentials, as
	// AnnotationBMCSecret; default redfish.default_secret.
	LabelBMCSecret = corev1.LabelNamespaceNodeRestriction + "/faultline-bmc-secret"
	// LabelProvider names the node's provider, as AnnotationProvider,
	// and wins over it.
	LabelProvider = corev1.LabelNamespaceNodeRestriction + "/faultline-janitor-provider"
)

// Target is the node an operation acts on, with its cluster's client (to
// read a BMC Secret).
type Target struct {
	Cluster string
	Node    *corev1.Node
	Kube    kubernetes.Interface
	// RequestID identifies the operation (the resource's UID and step), so
	// a provider that can deduplicate (the node-local agent) does.
	RequestID string
}

// RebootMode is how hard a reboot is asked for.
type RebootMode int

const (
	// Graceful lets the OS shut down (Redfish GracefulRestart, EC2
	// RebootInstances).
	Graceful RebootMode = iota
	// Force restarts at once (Redfish ForceRestart).
	Force
)

func (m RebootMode) String() string {
	if m == Force {
		return "force"
	}
	return "graceful"
}

// Provider carries out operations on a node's machine. Each call sends
// the signal and returns once the machine's controller (BMC, cloud API,
// agent) accepted it; completion is observed on the node.
type Provider interface {
	Reboot(ctx context.Context, t Target, mode RebootMode) error
	Terminate(ctx context.Context, t Target) error
	ResetGPUs(ctx context.Context, t Target, uuids []string) error
}

// ErrUnsupported is returned by a provider for an operation it has not.
var ErrUnsupported = errors.New("not supported by this provider")

// offPowerer is a provider that can tell a machine that is off (a BMC's
// PowerState) and power it on: the janitor asks it about a reboot whose
// node stays down past force_after (a graceful reset that left the machine
// off) or hung_after (on: a shutdown that hung, forced once). Only the
// redfish provider is one.
type offPowerer interface {
	// PowerOnIfOff powers the machine on if it is off, and returns
	// ErrNotOff, nothing sent, otherwise.
	PowerOnIfOff(ctx context.Context, t Target) error
}

// forceless is a provider without a forced reboot: Reboot with Force is
// ErrUnsupported, nothing sent (AWS: EC2 forces by itself; Local: a hung
// OS needs its BMC). A forced reboot recorded for one is not audited as
// resumed: it was never sent.
type forceless interface{ forceless() }

// ErrNotOff is returned by PowerOnIfOff for a machine that is not off.
var ErrNotOff = errors.New("the machine is not off")

// ErrInProgress is returned by ResetGPUs while the reset runs: the janitor
// asks again (the same request id) at its next poll.
var ErrInProgress = errors.New("in progress")

// ProviderError is a provider's failure with the condition reason it
// writes (CamelCase, the CRDs' reason pattern).
type ProviderError struct {
	Reason string
	Err    error
}

func (e *ProviderError) Error() string {
	if e.Reason != "" && !validReason(e.Reason) {
		// A node agent's own words (Local): quoted, cut short.
		return fmt.Sprintf("%q: %v", events.Truncate(e.Reason, quotedReasonMax), e.Err)
	}
	return e.Reason + ": " + e.Err.Error()
}
func (e *ProviderError) Unwrap() error { return e.Err }

func perr(reason string, format string, args ...any) error {
	return &ProviderError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// reasonOf is the condition reason of a provider error (default "Failed",
// also for a reason the CRDs would refuse: validReason; its error, which
// the message holds, quotes it).
func reasonOf(err error) string {
	var pe *ProviderError
	if errors.As(err, &pe) && pe.Reason != "" {
		if !validReason(pe.Reason) {
			return ReasonFailed
		}
		return pe.Reason
	}
	if errors.Is(err, ErrUnsupported) {
		return "Unsupported"
	}
	return "Failed"
}

// providerName picks the provider of a node: the label LabelProvider (an
// administrator's: no kubelet may set it), then the annotation, then the
// label AnnotationProvider (the node's own), then the providerID prefix,
// then the default. nodeKey is the node's own key when it decided ("" when
// it named nothing or what the rest would pick). With redfish.labels_only
// the node's own key is not followed: one naming another provider than
// the rest would pick is refused (nothing is sent through either).
func (c Config) providerName(n *corev1.Node) (name, nodeKey string, err error) {
	if v := n.Labels[LabelProvider]; v != "" {
		return v, "", nil
	}
	own, where := n.Annotations[AnnotationProvider], "annotation"
	if own == "" {
		own, where = n.Labels[AnnotationProvider], "label"
	}
	name = c.providerForPrefix(n.Spec.ProviderID)
	if name == "" {
		name = c.DefaultProvider
	}
	switch {
	case own == "" || own == name:
		return name, "", nil
	case c.Redfish.LabelsOnly:
		return "", "", fmt.Errorf("node %s: its %s %s %q is the node's own (its kubelet may write it) and janitor.redfish.labels_only is set: "+
			"not followed, and it names another provider than providerID/default_provider (%q); label the node %s",
			n.Name, where, AnnotationProvider, own, name, LabelProvider)
	}
	return own, AnnotationProvider, nil
}

// nodeNamed lists the node's own keys (its kubelet may write them) that
// an operation through provider on n follows: nodeKey (the provider's
// pick), and for redfish the BMC's annotation (no LabelBMCHost; not
// redfish.labels_only).
func (c Config) nodeNamed(n *corev1.Node, provider, nodeKey string) []string {
	var keys []string
	if nodeKey != "" {
		keys = append(keys, nodeKey)
	}
	if _, labelled := n.Labels[LabelBMCHost]; provider == ProviderRedfish && !labelled && !c.Redfish.LabelsOnly && n.Annotations[AnnotationBMC] != "" {
		keys = append(keys, AnnotationBMC)
	}
	return keys
}
