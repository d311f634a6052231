package janitor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/faultline/faultline/agents/localaction"
)

// AnnotationAgent overrides the address (host:port) of a node's agent
// local action endpoint; default the node's InternalIP and local.port.
const AnnotationAgent = "faultline.io/agent-address"

// Reasons the local provider writes besides the agent's own (GPUInUse,
// CommandFailed, InvalidRequest, StateNotRecorded).
const (
	ReasonAgentUnreachable = "AgentUnreachable"
	ReasonAgentAuthFailed  = "AgentAuthFailed"
	ReasonNoAddress        = "NoAddress"
)

// Local carries operations out through the faultline agent on the node
// (agents/localaction): a reboot (the agent's reboot_command, systemd's
// `systemctl reboot` by default) and GPU resets (`nvidia-smi -r -i
// <uuid>` once the GPU's pods are gone). The request id is the
// resource's, so asking again gets the first answer, never a second
// reboot or reset. The agent answers within seconds: a reset still
// running is ErrInProgress, asked again at the next poll. Every request
// names its node and the time and is signed with local.signing_key_file;
// the agent of another node refuses it.
type Local struct {
	cfg    LocalConfig
	client *http.Client
	nets   networks
	lookup lookupFunc
}

// keyAgentNetworks names the agent allowlist in refusals.
const keyAgentNetworks = "janitor.local.allowed_networks"

// NewLocal builds the provider.
func NewLocal(cfg LocalConfig) (*Local, error) {
	nets, err := parseNetworks(keyAgentNetworks, cfg.AllowedNetworks)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if len(nets) > 0 {
		tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: nets.control(keyAgentNetworks)}).DialContext
	}
	return &Local{cfg: cfg, client: &http.Client{Transport: tr, Timeout: cfg.Timeout}, nets: nets, lookup: defaultLookup}, nil
}

// address is the node's agent: the annotation, only into
// local.allowed_networks (the node's kubelet may edit it), else its
// InternalIP (checked too when the allowlist is set).
func (l *Local) address(ctx context.Context, n *corev1.Node) (string, error) {
	if a := n.Annotations[AnnotationAgent]; a != "" {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return "", perr(ReasonNoAddress, "node %s: %s %q is not host:port", n.Name, AnnotationAgent, a)
		}
		if err := l.nets.check(ctx, l.lookup, keyAgentNetworks, host); err != nil {
			return "", perr(ReasonAgentAddressNotAllowed, "node %s: %s %q refused: %v", n.Name, AnnotationAgent, a, err)
		}
		return a, nil
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && a.Address != "" {
			if len(l.nets) > 0 {
				if err := l.nets.check(ctx, l.lookup, keyAgentNetworks, a.Address); err != nil {
					return "", perr(ReasonAgentAddressNotAllowed, "node %s: InternalIP refused: %v", n.Name, err)
				}
			}
			return net.JoinHostPort(a.Address, strconv.Itoa(l.cfg.Port)), nil
		}
	}
	return "", perr(ReasonNoAddress, "node %s has no InternalIP (or %s annotation)", n.Name, AnnotationAgent)
}

func (l *Local) call(ctx context.Context, t Target, req localaction.Request) error {
	addr, err := l.address(ctx, t.Node)
	if err != nil {
		return err
	}
	if l.cfg.SigningKeyFile == "" {
		return perr(ReasonAgentAuthFailed, "janitor.local.signing_key_file is not set: the local provider signs every request to an agent")
	}
	// Read for every request, as the agents read the public key: a new
	// key mounted in its place is used without a restart.
	key, err := localaction.LoadSigningKey(l.cfg.SigningKeyFile)
	if err != nil {
		return perr(ReasonAgentAuthFailed, "janitor.local.signing_key_file: %v", err)
	}
	req.Node, req.Issued = t.Node.Name, time.Now().UTC()
	path := "/v1/local/" + req.Action
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Authorization", localaction.Sign(key, http.MethodPost, path, body))
	resp, unanswered, err := doTracked(hr, nil, l.client.Do)
	if na := notAllowed(err); na != nil {
		return perr(ReasonAgentAddressNotAllowed, "agent %s of node %s: %s", addr, t.Node.Name, na.msg)
	}
	if err != nil {
		err = perr(ReasonAgentUnreachable, "agent %s of node %s: %v", addr, t.Node.Name, err)
		if unanswered {
			// Written, no answer: a reboot kills the agent (and its
			// connection) as it starts.
			return maybeSent(err)
		}
		return err
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if rerr != nil && resp.StatusCode < 300 {
		// Accepted, the answer cut off: done or doing.
		return maybeSent(perr(ReasonAgentUnreachable, "agent %s of node %s: %s, answer cut off: %v", addr, t.Node.Name, resp.Status, rerr))
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		var a localaction.Answer
		_ = json.Unmarshal(b, &a)
		return perr(ReasonAgentAuthFailed, "agent %s of node %s refused the request (%s): %s %s", addr, t.Node.Name, resp.Status, a.Reason, a.Message)
	}
	var a localaction.Answer
	if err := json.Unmarshal(b, &a); err != nil {
		return fmt.Errorf("agent %s of node %s: %s: %q", addr, t.Node.Name, resp.Status, b)
	}
	if a.InProgress {
		return fmt.Errorf("agent %s of node %s: %s: %w", addr, t.Node.Name, a.Message, ErrInProgress)
	}
	if !a.OK {
		reason := a.Reason
		if reason == "" {
			reason = ReasonFailed
		}
		return perr(reason, "agent %s of node %s: %s", addr, t.Node.Name, a.Message)
	}
	return nil
}

// Reboot asks the agent to reboot the node (Force: ErrUnsupported; a
// node whose OS hangs needs its BMC). A reboot the agent answers in
// progress (accepted, not yet recorded) is sent: the node's boot ID tells
// the rest.
func (l *Local) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if mode == Force {
		return ErrUnsupported
	}
	if err := l.call(ctx, t, localaction.Request{ID: t.RequestID, Action: localaction.ActionReboot}); !errors.Is(err, ErrInProgress) {
		return err
	}
	return nil
}

func (*Local) forceless() {}

// Terminate is not the agent's.
func (l *Local) Terminate(context.Context, Target) error { return ErrUnsupported }

// ResetGPUs asks the agent to reset the GPUs (none: every GPU).
func (l *Local) ResetGPUs(ctx context.Context, t Target, uuids []string) error {
	return l.call(ctx, t, localaction.Request{ID: t.RequestID, Action: localaction.ActionGPUReset, GPUs: uuids})
}
