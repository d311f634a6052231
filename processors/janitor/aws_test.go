package janitor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// startMoto starts moto (the credentials are TestMain's) and
// returns an EC2 client of it.
func startMoto(t *testing.T) (*testenv.Moto, *ec2.Client) {
	t.Helper()
	m := testenv.StartMoto(t)
	c, err := newEC2(context.Background(), AWSConfig{Endpoint: m.URL}, "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	return m, c
}

// runInstances starts n instances in moto and returns their ids.
func runInstances(t *testing.T, c *ec2.Client, n int) []string {
	t.Helper()
	ctx := context.Background()
	imgs, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{})
	if err != nil || len(imgs.Images) == 0 {
		t.Fatalf("moto images: %v", err)
	}
	out, err := c.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: imgs.Images[0].ImageId, MinCount: aws.Int32(int32(n)), MaxCount: aws.Int32(int32(n)),
		InstanceType: ec2types.InstanceTypeP4d24xlarge, Placement: &ec2types.Placement{AvailabilityZone: aws.String("us-east-1a")}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range out.Instances {
		ids = append(ids, *i.InstanceId)
	}
	return ids
}

// instances stands in for the EC2 instances behind the nodes: it reads
// moto's recording of the requests it received, and for every
// RebootInstances of a node's instance gives the node a new boot ID (what
// the rebooted instance's kubelet reports).
type instances struct {
	moto *testenv.Moto
	e    *env
	mu   sync.Mutex
	node map[string]string // instance → node
	seen map[string]int    // instance → reboots acted on
}

func (s *instances) reboots(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[id]
}

func (s *instances) run(ctx context.Context) {
	for ctx.Err() == nil {
		rec, err := s.moto.Requests(ctx)
		if err == nil {
			s.mu.Lock()
			for id, node := range s.node {
				n := 0
				for _, r := range rec {
					if strings.Contains(r.Body, "Action=RebootInstances") && strings.Contains(r.Body, "="+id) {
						n++
					}
				}
				for s.seen[id] < n {
					s.seen[id]++
					s.e.m.setNode(ctx, node, corev1.ConditionTrue, uuid.NewString())
				}
			}
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestJanitorAWS is the AWS provider end to end on a real kube-apiserver
// with moto's EC2 as the cloud: a RebootNode of a node whose providerID
// names a moto instance sends RebootInstances (seen in moto's recording)
// and completes when the node is back with a new boot ID; a TerminateNode
// terminates the instance (moto reports it shutting-down/terminated) and
// deletes the Node; an instance that does not exist fails with
// InstanceNotFound.
func TestJanitorAWS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	moto, ec := startMoto(t)
	ids := runInstances(t, ec, 2)
	cfg := e.config()
	cfg.AWS.Endpoint = moto.URL
	j, rec := e.janitor(cfg, false, nil)
	run(t, j)
	st := &instances{moto: moto, e: e, node: map[string]string{}, seen: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go st.run(ctx)
	awsNode := func(name, id string) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{events.LabelQuarantined: "true", labelDrain: "succeeded"}},
			Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/" + id}}
		// Created with its status: a status written after the create
		// could reach the janitor's watch after the RebootNode does, which
		// then waits for the boot ID (a deferred action the test does not
		// expect).
		if _, err := e.kube.CoreV1().Nodes().Create(context.Background(), booted(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		st.node[id] = name
		st.mu.Unlock()
	}

	t.Run("Reboot", func(t *testing.T) {
		awsNode("ip-10-0-0-1", ids[0])
		e.create(kindReboot, "reboot-aws-1", "ip-10-0-0-1", false)
		o := e.wait(kindReboot, "reboot-aws-1", 30*time.Second)
		if condOf(o, CondSignalSent) != "True/Succeeded" || condOf(o, CondNodeReady) != "True/Succeeded" {
			t.Fatalf("status %v", o.Object["status"])
		}
		if n := st.reboots(ids[0]); n != 1 {
			t.Fatalf("moto received %d RebootInstances for %s, want 1", n, ids[0])
		}
		rec.expect(t, "ip-10-0-0-1", []string{"reboot/applied", "reboot/succeeded"})
	})

	t.Run("Terminate", func(t *testing.T) {
		awsNode("ip-10-0-0-2", ids[1])
		e.create(kindTerminate, "terminate-aws-2", "ip-10-0-0-2", false)
		o := e.wait(kindTerminate, "terminate-aws-2", 30*time.Second)
		if condOf(o, CondNodeTerminated) != "True/Succeeded" {
			t.Fatalf("status %v", o.Object["status"])
		}
		out, err := ec.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{InstanceIds: []string{ids[1]}})
		if err != nil {
			t.Fatal(err)
		}
		if s := out.Reservations[0].Instances[0].State.Name; s != ec2types.InstanceStateNameTerminated && s != ec2types.InstanceStateNameShuttingDown {
			t.Fatalf("instance %s is %s", ids[1], s)
		}
		if _, err := e.kube.CoreV1().Nodes().Get(context.Background(), "ip-10-0-0-2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("node still there: %v", err)
		}
	})

	t.Run("InstanceNotFound", func(t *testing.T) {
		awsNode("ip-10-0-0-3", "i-0123456789abcdef0")
		e.create(kindReboot, "reboot-aws-3", "ip-10-0-0-3", false)
		o := e.wait(kindReboot, "reboot-aws-3", 30*time.Second)
		if got := condOf(o, CondSignalSent); got != "False/"+ReasonInstanceNotFound {
			t.Fatalf("SignalSent %s; status %v", got, o.Object["status"])
		}
		rec.expect(t, "ip-10-0-0-3", []string{"reboot/failed"})
	})
}

// withEvents is moto's EC2 with scheduled events added to its real
// DescribeInstanceStatus answers: moto does not model scheduled events
// (its InstanceStatus has no Events), so the test adds them to what moto
// answered for the instance.
type withEvents struct {
	EC2API
	mu     sync.Mutex
	events map[string][]ec2types.InstanceStatusEvent
}

func (w *withEvents) set(id string, evs ...ec2types.InstanceStatusEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events[id] = evs
}

func (w *withEvents) DescribeInstanceStatus(ctx context.Context, in *ec2.DescribeInstanceStatusInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	out, err := w.EC2API.DescribeInstanceStatus(ctx, in, opts...)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range out.InstanceStatuses {
		out.InstanceStatuses[i].Events = w.events[aws.ToString(out.InstanceStatuses[i].InstanceId)]
	}
	return out, nil
}

// TestMaintenanceMonitor: scheduled EC2 events (DescribeInstanceStatus on
// moto, events added to its answers) become a non-fatal HealthEvent naming
// the node, the kind and the window, once while they stand; a recovery
// when the event is gone or completed; nothing for instances of no node,
// or for an event whose window has passed without it being seen.
func TestMaintenanceMonitor(t *testing.T) {
	t.Parallel()
	moto, ec := startMoto(t)
	ids := runInstances(t, ec, 3)
	cfg := DefaultConfig().AWS
	cfg.Endpoint, cfg.MaintenanceRegions, cfg.MaintenanceCluster = moto.URL, []string{"us-east-1"}, "c1"
	nodes := map[string]string{ids[0]: "ip-10-0-1-1", ids[1]: "ip-10-0-1-2"}
	mon, err := newMaintenanceMonitor(cfg, testLog, func() (map[string]string, bool) { return nodes, true }, nil)
	if err != nil {
		t.Fatal(err)
	}
	real, err := newEC2(context.Background(), cfg, "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	w := &withEvents{EC2API: real, events: map[string][]ec2types.InstanceStatusEvent{}}
	mon.build = func(string) (EC2API, error) { return w, nil }
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	mon.now = func() time.Time { return now }
	poll := func() []*kgo.Record {
		t.Helper()
		recs, commit, err := mon.Poll(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		commit()
		return recs
	}
	start, end := now.Add(2*time.Hour), now.Add(4*time.Hour)
	ev := ec2types.InstanceStatusEvent{Code: ec2types.EventCodeSystemReboot, InstanceEventId: aws.String("instance-event-0abc"),
		Description: aws.String("scheduled reboot"), NotBefore: aws.Time(start), NotAfter: aws.Time(end)}
	w.set(ids[0], ev)
	w.set(ids[2], ev) // an instance of no node of the cluster
	decode := func(recs []*kgo.Record) []*datamodels.HealthEvent {
		t.Helper()
		var out []*datamodels.HealthEvent
		for _, r := range recs {
			if r.Topic != events.TopicEvents {
				t.Fatalf("topic %s", r.Topic)
			}
			he, err := events.Unmarshal(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if c, n, _ := events.SplitKey(r.Key); c != "c1" || n != he.GetNodeName() {
				t.Fatalf("key %s for node %s", r.Key, he.GetNodeName())
			}
			out = append(out, he)
		}
		return out
	}
	got := decode(poll())
	if len(got) != 1 {
		t.Fatalf("%d events, want 1 (the node's; the other instance has no node)", len(got))
	}
	he := got[0]
	md := he.GetMetadata()
	if he.GetNodeName() != "ip-10-0-1-1" || he.GetIsFatal() || he.GetIsHealthy() || he.GetAgent() != MaintenanceAgent ||
		he.GetComponentClass() != MaintenanceClass || he.GetCheckName() != MaintenanceCheck || he.GetCluster() != "c1" ||
		md[MetaMaintenanceKind] != "system-reboot" || md[MetaMaintenanceStart] != start.Format(time.RFC3339) ||
		md[MetaMaintenanceEnd] != end.Format(time.RFC3339) || md[MetaInstance] != ids[0] {
		t.Fatalf("event %v", he)
	}
	if recs := poll(); len(recs) != 0 {
		t.Fatalf("a standing event reported again: %d records", len(recs))
	}
	// Completed: the recovery.
	done := ev
	done.Description = aws.String("[Completed] scheduled reboot")
	w.set(ids[0], done)
	got = decode(poll())
	if len(got) != 1 || !got[0].GetIsHealthy() || got[0].GetNodeName() != "ip-10-0-1-1" || got[0].GetMetadata()[MetaMaintenanceKind] != "system-reboot" {
		t.Fatalf("recovery %v", got)
	}
	if recs := poll(); len(recs) != 0 {
		t.Fatalf("recovery reported again: %d", len(recs))
	}
	// A window that ends while it stands: recovered when it has passed.
	ev2 := ev
	ev2.InstanceEventId, ev2.Code = aws.String("instance-event-0def"), ec2types.EventCodeInstanceRetirement
	w.set(ids[1], ev2)
	if got := decode(poll()); len(got) != 1 || got[0].GetNodeName() != "ip-10-0-1-2" || got[0].GetMetadata()[MetaMaintenanceKind] != "instance-retirement" {
		t.Fatalf("retirement %v", got)
	}
	now = end.Add(time.Minute)
	if got := decode(poll()); len(got) != 1 || !got[0].GetIsHealthy() {
		t.Fatalf("after the window: %v", got)
	}
}

// TestMaintenanceReported: what could not be produced is reported at the
// next poll, and an event produced before stays standing, so its recovery
// still comes; a janitor that stops working the cluster (its Lease lost)
// reports nothing, no recovery either, until it works it again (no
// server: the monitor's own bookkeeping, EC2's answers made up). Before,
// a failed produce forgot every standing event, and one that ended before
// the next poll never had its recovery reported; and a janitor that lost
// the Lease took every standing event for gone and reported its recovery
// beside the new holder's reports.
func TestMaintenanceReported(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig().AWS
	cfg.MaintenanceRegions, cfg.MaintenanceCluster = []string{"us-east-1"}, "c1"
	worked := true
	mon, err := newMaintenanceMonitor(cfg, testLog, func() (map[string]string, bool) {
		return map[string]string{"i-a": "node-i-a", "i-b": "node-i-b", "i-c": "node-i-c"}, worked
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &withEvents{EC2API: instancesOnly{"i-a", "i-b", "i-c"}, events: map[string][]ec2types.InstanceStatusEvent{}}
	mon.build = func(string) (EC2API, error) { return w, nil }
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	mon.now = func() time.Time { return now }
	scheduled := func(id string, code ec2types.EventCode) ec2types.InstanceStatusEvent {
		return ec2types.InstanceStatusEvent{Code: code, InstanceEventId: aws.String(id),
			NotBefore: aws.Time(now.Add(2 * time.Hour)), NotAfter: aws.Time(now.Add(4 * time.Hour))}
	}
	p := &flakyProducer{}
	report := func(want ...string) {
		t.Helper()
		if got := reportedBy(t, mon, p); !slices.Equal(got, want) {
			t.Fatalf("produced %q, want %q", got, want)
		}
	}
	w.set("i-a", scheduled("ev-a", ec2types.EventCodeSystemReboot))
	report("node-i-a healthy=false")
	w.set("i-b", scheduled("ev-b", ec2types.EventCodeInstanceRetirement))
	p.err = errors.New("broker down")
	report()
	p.err = nil
	w.set("i-a") // its reboot done, gone from EC2's answer
	report("node-i-a healthy=true", "node-i-b healthy=false")
	report()
	worked = false // the Lease lost
	w.set("i-b")
	w.set("i-c", scheduled("ev-c", ec2types.EventCodeSystemMaintenance))
	report()
	worked = true
	report("node-i-b healthy=true", "node-i-c healthy=false")
}

// TestMaintenanceStateWrites: the monitor reads its state when it starts
// to work the cluster and writes each change ahead of its produce; a write
// that fails is tried again after the next poll, one another janitor's
// write beat is not produced and has the state read again, while the state
// cannot be read nothing is reported, and what was written ahead and not
// known to be produced (a crash before or after the produce) is produced
// again after a restart, the same records (no server: the state in
// memory; the ConfigMap's are TestMaintenanceFollowsTheLease's).
func TestMaintenanceStateWrites(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig().AWS
	cfg.MaintenanceRegions, cfg.MaintenanceCluster = []string{"us-east-1"}, "c1"
	state := &memState{}
	polls := newMetrics(nil).maintenancePolls
	w := &withEvents{EC2API: instancesOnly{"i-a", "i-b"}, events: map[string][]ec2types.InstanceStatusEvent{}}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	monitor := func() *MaintenanceMonitor {
		mon, err := newMaintenanceMonitor(cfg, testLog, func() (map[string]string, bool) {
			return map[string]string{"i-a": "node-i-a", "i-b": "node-i-b"}, true
		}, state)
		if err != nil {
			t.Fatal(err)
		}
		mon.build = func(string) (EC2API, error) { return w, nil }
		mon.now = func() time.Time { now = now.Add(time.Second); return now }
		mon.polls = polls
		return mon
	}
	scheduled := func(id string) ec2types.InstanceStatusEvent {
		return ec2types.InstanceStatusEvent{Code: ec2types.EventCodeSystemReboot, InstanceEventId: aws.String(id),
			NotBefore: aws.Time(now.Add(2 * time.Hour)), NotAfter: aws.Time(now.Add(4 * time.Hour))}
	}
	p := &flakyProducer{}
	mon := monitor()
	report := func(want ...string) {
		t.Helper()
		if got := reportedBy(t, mon, p); !slices.Equal(got, want) {
			t.Fatalf("produced %q, want %q", got, want)
		}
	}
	kept := func(want ...string) {
		t.Helper()
		if got := slices.Sorted(maps.Keys(state.kept.standing)); !slices.Equal(got, want) {
			t.Fatalf("state keeps %q, want %q", got, want)
		}
	}
	down := errors.New("apiserver down")
	w.set("i-a", scheduled("ev-a"))
	state.saveErrs = []error{down, down} // ahead of the produce, and after it
	report("node-i-a healthy=false")     // produced all the same
	kept()
	report() // nothing new, the write tried again
	kept("i-a/ev-a")
	mon = monitor() // restarted
	report()
	w.set("i-b", scheduled("ev-b"))
	state.loadErr = errors.New("forbidden")
	mon = monitor()
	report() // nothing known: nothing reported
	state.loadErr = nil
	report("node-i-b healthy=false")
	kept("i-a/ev-a", "i-b/ev-b")
	// Another janitor (a handover's race) reported i-b's end and wrote so:
	// this one's write ahead is beaten, and it produces nothing.
	w.set("i-b")
	delete(state.kept.standing, "i-b/ev-b")
	state.version++
	report()
	kept("i-a/ev-a") // not overwritten
	report()         // read again: nothing more to report
	// The broker down: written ahead and not produced; the janitor
	// crashes, and the next produces the record written.
	w.set("i-a")
	p.err = errors.New("broker down")
	report()
	kept()
	if len(state.kept.pending) != 1 {
		t.Fatalf("%d records written ahead, want i-a's recovery", len(state.kept.pending))
	}
	ahead := state.kept.pending[0]
	p.err = nil
	mon = monitor()
	report("node-i-a healthy=true")
	if !bytes.Equal(p.got[0].Value, ahead.Value) || !bytes.Equal(p.got[0].Key, ahead.Key) {
		t.Fatal("the record written ahead was produced anew, not as it was written")
	}
	if len(state.kept.pending) != 0 {
		t.Fatalf("%d records still pending once produced", len(state.kept.pending))
	}
	// Produced, then the write that says so fails and the janitor
	// crashes: the next produces the same record again.
	w.set("i-b", scheduled("ev-b2"))
	state.saveErrs = []error{nil, down}
	report("node-i-b healthy=false")
	first := p.got[0]
	mon = monitor()
	report("node-i-b healthy=false")
	if !bytes.Equal(p.got[0].Value, first.Value) {
		t.Fatal("produced again after a crash as a new record (a second row), want the record written ahead")
	}
	report()
	kept("i-b/ev-b2")
	// Counted: the failed writes, the failed read and the failed produce; a
	// write another's beat is not a failure.
	if ok, failed := testutil.ToFloat64(polls.WithLabelValues("ok")), testutil.ToFloat64(polls.WithLabelValues("failed")); ok != 8 || failed != 4 {
		t.Fatalf("counted %v polls ok and %v failed, want 8 and 4", ok, failed)
	}
}

// memState is a reportedState in memory with a version, as a ConfigMap's
// resourceVersion, and errors on demand.
type memState struct {
	kept          keptReports
	version, read int
	loadErr       error
	saveErrs      []error // the next saves' errors, in turn
}

func (s *memState) Load(context.Context) (keptReports, error) {
	if s.loadErr != nil {
		return keptReports{}, s.loadErr
	}
	s.read = s.version
	return keptReports{standing: maps.Clone(s.kept.standing), pending: slices.Clone(s.kept.pending)}, nil
}

func (s *memState) Save(_ context.Context, k keptReports) error {
	if len(s.saveErrs) > 0 {
		err := s.saveErrs[0]
		s.saveErrs = s.saveErrs[1:]
		if err != nil {
			return err
		}
	}
	if s.read != s.version {
		return errStateChanged
	}
	s.kept = keptReports{standing: maps.Clone(k.standing), pending: slices.Clone(k.pending)}
	s.version++
	s.read = s.version
	return nil
}

// reportedBy polls mon once, producing to p, and returns what it produced
// as "<node> healthy=<bool>", sorted.
func reportedBy(t *testing.T, mon *MaintenanceMonitor, p *flakyProducer) []string {
	t.Helper()
	p.got = nil
	mon.report(context.Background(), p)
	var got []string
	for _, r := range p.got {
		he, err := events.Unmarshal(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s healthy=%t", he.GetNodeName(), he.GetIsHealthy()))
	}
	slices.Sort(got)
	return got
}

// instancesOnly answers DescribeInstanceStatus with its instances and no
// events (withEvents adds them).
type instancesOnly []string

func (o instancesOnly) RebootInstances(context.Context, *ec2.RebootInstancesInput, ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error) {
	return nil, errors.ErrUnsupported
}

func (o instancesOnly) TerminateInstances(context.Context, *ec2.TerminateInstancesInput, ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error) {
	return nil, errors.ErrUnsupported
}

func (o instancesOnly) DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range o {
		out.InstanceStatuses = append(out.InstanceStatuses, ec2types.InstanceStatus{InstanceId: aws.String(id)})
	}
	return out, nil
}

// flakyProducer fails every record with err, as a broker that refuses
// them (a partition without its in-sync replicas); with err nil it keeps
// them in got (not safe for concurrent use then).
type flakyProducer struct {
	err error
	got []*kgo.Record
}

func (p *flakyProducer) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	var res kgo.ProduceResults
	for _, r := range rs {
		res = append(res, kgo.ProduceResult{Record: r, Err: p.err})
		if p.err == nil {
			p.got = append(p.got, r)
		}
	}
	return res
}

// TestAWSAnswerNeverComes: an EC2 endpoint that takes the request and
// never answers (a hung proxy, a VPC endpoint in trouble) fails the call
// CloudUnreachable after aws.timeout, once: the request went out, so it
// may have been carried out (ErrMaybeSent), and is not tried again. The SDK's client has no
// timeout of its own: the worker (and, for DescribeInstanceStatus, the
// maintenance monitor) waited for ever.
func TestAWSAnswerNeverComes(t *testing.T) {
	t.Parallel()
	hung := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hung) })
	cfg := DefaultConfig().AWS
	cfg.Endpoint = srv.URL
	cfg.Timeout = 500 * time.Millisecond
	a := NewAWS(cfg, testLog)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/i-0123456789abcdef0"}}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- a.Reboot(ctx, Target{Cluster: "c1", Node: n}, Graceful) }()
	select {
	case err := <-done:
		if got := reasonOf(err); got != ReasonCloudUnreachable || !errors.Is(err, ErrMaybeSent) {
			t.Fatalf("reason %s (%v), want %s, may have been sent", got, err, ReasonCloudUnreachable)
		}
	case <-time.After(15 * time.Second):
		cancel()
		t.Fatalf("RebootInstances still waits for the endpoint after 15 s (aws.timeout %v)", cfg.Timeout)
	}
}

// TestInstanceNodes: the maintenance cluster's nodes by the instance their
// providerID names, from the node cache of the janitor that works the
// cluster; nothing (not ok) while it does not.
func TestInstanceNodes(t *testing.T) {
	t.Parallel()
	j := &Janitor{running: map[string]*clusterRun{}}
	resolve := j.InstanceNodes("c1")
	if got, ok := resolve(); ok || got != nil {
		t.Fatalf("a cluster not worked: %v, %t", got, ok)
	}
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, pid := range map[string]string{"n1": "aws:///us-east-1a/i-0abc", "n2": "aws:///us-east-1b/i-0def", "n3": "", "n4": "aws:///us-east-1a/"} {
		if err := nodes.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: pid}}); err != nil {
			t.Fatal(err)
		}
	}
	j.running["c1"] = &clusterRun{nodes: nodes}
	got, ok := resolve()
	if want := map[string]string{"i-0abc": "n1", "i-0def": "n2"}; !ok || !maps.Equal(got, want) {
		t.Fatalf("got %v, %t; want %v", got, ok, want)
	}
}

// TestInstanceRegion: a providerID's zone gives its instance's region:
// an availability zone less its letter, a Local or Wavelength Zone the
// fields up to its region's number; none, aws.region. Before, a Local
// Zone's region was its zone less its letter (us-west-2-lax-1), and a
// Wavelength Zone's aws.region.
func TestInstanceRegion(t *testing.T) {
	t.Parallel()
	a := &AWS{cfg: AWSConfig{Region: "eu-central-1"}}
	for zone, want := range map[string]string{
		"us-east-1a":                  "us-east-1",
		"ap-southeast-2c":             "ap-southeast-2",
		"us-gov-west-1a":              "us-gov-west-1",
		"us-west-2-lax-1a":            "us-west-2",
		"us-east-1-bos-1a":            "us-east-1",
		"us-west-2-wl1-las-wlz-1":     "us-west-2",
		"ap-northeast-1-wl1-kix-wlz1": "ap-northeast-1",
		"":                            "eu-central-1",
		"us-east-1":                   "eu-central-1",
		"local":                       "eu-central-1",
	} {
		pid := "aws:///" + zone + "/i-0123456789abcdef0"
		if zone == "" {
			pid = "aws:///i-0123456789abcdef0"
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{ProviderID: pid}}
		id, region, err := a.instanceOf(Target{Node: n})
		if err != nil || id != "i-0123456789abcdef0" || region != want {
			t.Errorf("%s: instance %q region %q (%v), want region %q", pid, id, region, err, want)
		}
	}
}
