package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"
)

// Reasons the AWS provider writes.
const (
	ReasonNoInstance       = "NoInstance"
	ReasonInstanceNotFound = "InstanceNotFound"
	ReasonCloudAuthFailed  = "CloudAuthFailed"
	ReasonCloudUnreachable = "CloudUnreachable"
	ReasonCloudRejected    = "CloudRejected"
)

// EC2API is the part of the EC2 client the provider and the maintenance
// monitor use.
type EC2API interface {
	RebootInstances(ctx context.Context, in *ec2.RebootInstancesInput, opts ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error)
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, opts ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	DescribeInstanceStatus(ctx context.Context, in *ec2.DescribeInstanceStatusInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// AWS carries operations out through EC2 (aws-sdk-go-v2): RebootInstances
// (EC2 itself hard-reboots an instance whose OS does not shut down within
// four minutes, so a forced reboot is left to it: ErrUnsupported) and
// TerminateInstances. The instance is the node's providerID
// (aws:///<zone>/<instance-id>); the region is the zone's, else
// aws.region. Credentials are the SDK's default chain (environment, web
// identity / IRSA, instance profile).
type AWS struct {
	cfg AWSConfig
	log *slog.Logger

	mu      sync.Mutex
	clients map[string]EC2API // by region
	build   func(region string) (EC2API, error)
}

// NewAWS builds the provider; clients are made per region on first use.
func NewAWS(cfg AWSConfig, log *slog.Logger) *AWS {
	a := &AWS{cfg: cfg, log: log, clients: map[string]EC2API{}}
	a.build = func(region string) (EC2API, error) { return newEC2(context.Background(), cfg, region) }
	return a
}

func newEC2(ctx context.Context, cfg AWSConfig, region string) (*ec2.Client, error) {
	// The SDK's HTTP client has no timeout: an endpoint that takes a
	// request and never answers would hold the worker for ever.
	hc := awshttp.NewBuildableClient().WithTimeout(cfg.Timeout)
	ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(region), awsconfig.WithHTTPClient(hc))
	if err != nil {
		return nil, fmt.Errorf("aws config: %w", err)
	}
	return ec2.NewFromConfig(ac, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		// Tells a signal's request that went out unanswered (ErrMaybeSent)
		// from one that did not go out. Here, not in the config: the SDK
		// adds AWS_CA_BUNDLE only to its own BuildableClient.
		o.HTTPClient = trackingDoer{o.HTTPClient}
	}), nil
}

func (a *AWS) client(region string) (EC2API, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.clients[region]; ok {
		return c, nil
	}
	c, err := a.build(region)
	if err != nil {
		return nil, err
	}
	a.clients[region] = c
	return c, nil
}

// instanceOf parses a node's providerID: aws:///us-east-1a/i-0abc → the
// instance and its region (the zone less its letter).
func (a *AWS) instanceOf(t Target) (id, region string, err error) {
	pid := t.Node.Spec.ProviderID
	rest, ok := strings.CutPrefix(pid, "aws://")
	if !ok {
		return "", "", perr(ReasonNoInstance, "node %s: providerID %q is not aws:///<zone>/<instance-id>", t.Node.Name, pid)
	}
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	id = parts[len(parts)-1]
	if !strings.HasPrefix(id, "i-") {
		return "", "", perr(ReasonNoInstance, "node %s: providerID %q names no instance", t.Node.Name, pid)
	}
	region = a.cfg.Region
	if len(parts) >= 2 {
		if r := regionOfZone(parts[len(parts)-2]); r != "" {
			region = r
		}
	}
	return id, region, nil
}

// regionOfZone is the region of an availability zone name ("" if it is
// none): the fields up to the region's number, the first that starts with
// a digit — us-east-1a and us-gov-west-1a less their letter, and a Local
// or Wavelength Zone's (us-west-2-lax-1a, us-west-2-wl1-las-wlz-1) less
// what follows the number.
func regionOfZone(z string) string {
	f := strings.Split(z, "-")
	for i := 2; i < len(f); i++ {
		n := len(f[i]) - len(strings.TrimLeft(f[i], "0123456789"))
		switch {
		case n == 0:
			continue
		case n == len(f[i]) && i < len(f)-1: // a Local or Wavelength Zone
			return strings.Join(f[:i+1], "-")
		case n == len(f[i])-1 && i == len(f)-1 && f[i][n] >= 'a' && f[i][n] <= 'z': // an availability zone
			return strings.Join(f[:i], "-") + "-" + f[i][:n]
		}
		return ""
	}
	return ""
}

// classifyAWS turns an EC2 error into its reason.
func classifyAWS(id string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		switch {
		case strings.HasPrefix(code, "InvalidInstanceID"):
			return perr(ReasonInstanceNotFound, "instance %s: %s: %s", id, code, ae.ErrorMessage())
		case code == "AuthFailure" || code == "UnauthorizedOperation" || strings.Contains(code, "InvalidClientTokenId") || code == "SignatureDoesNotMatch":
			return perr(ReasonCloudAuthFailed, "instance %s: %s: %s", id, code, ae.ErrorMessage())
		}
		return perr(ReasonCloudRejected, "instance %s: %s: %s", id, code, ae.ErrorMessage())
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return perr(ReasonCloudUnreachable, "instance %s: %v", id, err)
	}
	return fmt.Errorf("instance %s: %w", id, err)
}

// sendOnce is a signal's call option: no try after one whose request
// went out unanswered (the SDK would retry the timeout, and reboot twice).
func sendOnce(p *sendProbe) func(*ec2.Options) {
	return func(o *ec2.Options) {
		if o.Retryer != nil {
			o.Retryer = onceSent{Retryer: o.Retryer, p: p}
		}
	}
}

// signalError classifies a signal's error: ErrMaybeSent when a try's
// request went out and no answer came (a later try's answer, say a dial
// refused, does not undo it).
func signalError(p *sendProbe, id string, err error) error {
	if p.sentUnanswered() {
		return maybeSent(classifyAWS(id, err))
	}
	return classifyAWS(id, err)
}

func (*AWS) forceless() {}

// Reboot calls RebootInstances (Force: ErrUnsupported, EC2 forces by itself).
func (a *AWS) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if mode == Force {
		return ErrUnsupported
	}
	id, region, err := a.instanceOf(t)
	if err != nil {
		return err
	}
	c, err := a.client(region)
	if err != nil {
		return err
	}
	ctx, probe := withSendProbe(ctx, true)
	if _, err := c.RebootInstances(ctx, &ec2.RebootInstancesInput{InstanceIds: []string{id}}, sendOnce(probe)); err != nil {
		return signalError(probe, id, err)
	}
	a.log.Info("janitor: ec2 reboot sent", "node", t.Node.Name, "instance", id, "region", region)
	return nil
}

// Terminate calls TerminateInstances.
func (a *AWS) Terminate(ctx context.Context, t Target) error {
	id, region, err := a.instanceOf(t)
	if err != nil {
		return err
	}
	c, err := a.client(region)
	if err != nil {
		return err
	}
	ctx, probe := withSendProbe(ctx, true)
	if _, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}, sendOnce(probe)); err != nil {
		return signalError(probe, id, err)
	}
	a.log.Info("janitor: ec2 terminate sent", "node", t.Node.Name, "instance", id, "region", region)
	return nil
}

// ResetGPUs is not EC2's.
func (a *AWS) ResetGPUs(context.Context, Target, []string) error { return ErrUnsupported }
