package requeue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestStep: the step's own failure is returned for the role to record; the
// cluster's trouble brings the work back when the cluster may be tried
// again (or at the fallback), counted and logged, never as a failure.
func TestStep(t *testing.T) {
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := clusters.DefaultConfig()
	cfg.Clusters = []clusters.Cluster{{Name: "broken", Kubeconfig: "/does/not/exist"}}
	reg := clusters.NewRegistry(cfg, func() time.Time { return now })
	reg.SetClient("live", kube, false)
	apiErrors := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"cluster"})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fallback := now.Add(time.Minute)
	act := []*faultlinev1.Action{{Id: "a"}}
	for _, tc := range []struct {
		name    string
		cluster string
		err     error
		again   time.Time // the step's own
		want    time.Time // zero: the step's again
		wantErr bool
		counted float64
	}{
		{"done", "live", nil, time.Time{}, time.Time{}, false, 0},
		{"look again", "live", nil, now.Add(5 * time.Second), now.Add(5 * time.Second), false, 0},
		{"the work's own failure", "live", apierrors.NewBadRequest("bad"), time.Time{}, time.Time{}, true, 0},
		{"the cluster's trouble", "live", apierrors.NewServiceUnavailable("down"), time.Time{}, time.Time{} /* the gate's */, false, 1},
		{"client not built (logged, not an API error)", "broken", nil, time.Time{}, fallback, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acts, ag, err := Step(context.Background(), reg, tc.cluster, "n1", "drain", fallback, log, apiErrors, nil,
				func(context.Context, *clusters.Client) ([]*faultlinev1.Action, time.Time, error) {
					return act, tc.again, tc.err
				})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v", err)
			}
			// The work waits for its cluster exactly when the cluster was
			// in trouble.
			want := ""
			if tc.name == "the cluster's trouble" || tc.cluster == "broken" {
				want = tc.cluster
			}
			if ag.Cluster != want {
				t.Fatalf("waits for cluster %q, want %q", ag.Cluster, want)
			}
			again := ag.At
			switch {
			case tc.name == "the cluster's trouble":
				if again.IsZero() || !again.After(now) {
					t.Fatalf("again %v, want the gate's backoff", again)
				}
				now = now.Add(time.Hour) // past the backoff for the next cases
				cl, _ := reg.Get("live")
				cl.Gate.OK()
			case tc.cluster == "broken":
				if !again.Equal(fallback) || len(acts) != 0 {
					t.Fatalf("again %v acts %v", again, acts)
				}
			default:
				if !again.Equal(tc.want) || len(acts) != 1 {
					t.Fatalf("again %v, want %v; acts %v", again, tc.want, acts)
				}
			}
			var m dto.Metric
			if err := apiErrors.WithLabelValues(tc.cluster).Write(&m); err != nil {
				t.Fatal(err)
			}
			if got := m.GetCounter().GetValue(); got != tc.counted {
				t.Fatalf("api errors of %s: %v, want %v", tc.cluster, got, tc.counted)
			}
		})
	}
}

// TestStepRedoesConflicts: a step whose write met a conflict is redone at
// once (it reads again), each redo counted; one that keeps conflicting is
// returned as the work's failure after maxRedo tries.
func TestStepRedoesConflicts(t *testing.T) {
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	reg := clusters.NewRegistry(clusters.DefaultConfig(), time.Now)
	reg.SetClient("live", kube, false)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "rebootnodes"}, "r", errors.New("changed"))
	for _, tc := range []struct {
		name      string
		conflicts int // the step's first calls that conflict
		calls     int
		wantErr   bool
	}{
		{"redone until it passes", 2, 3, false},
		{"given up after maxRedo", 1000, maxRedo, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"cluster"})
			apiErrors := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"cluster"})
			calls := 0
			acts, _, err := Step(context.Background(), reg, "live", "n1", "remediation", time.Now(), log, apiErrors, counted,
				func(context.Context, *clusters.Client) ([]*faultlinev1.Action, time.Time, error) {
					calls++
					if calls <= tc.conflicts {
						return nil, time.Time{}, conflict
					}
					return []*faultlinev1.Action{{Id: "a"}}, time.Time{}, nil
				})
			if calls != tc.calls || (err != nil) != tc.wantErr || (!tc.wantErr && len(acts) != 1) {
				t.Fatalf("%d calls, err %v, acts %v; want %d calls, error %v", calls, err, acts, tc.calls, tc.wantErr)
			}
			var m dto.Metric
			if err := counted.WithLabelValues("live").Write(&m); err != nil {
				t.Fatal(err)
			}
			if got := int(m.GetCounter().GetValue()); got != min(tc.conflicts, tc.calls-1) {
				t.Fatalf("%d conflicts counted, want %d", got, min(tc.conflicts, tc.calls-1))
			}
		})
	}
}

// TestLanePipeline: the slow lane's consumer reads only its topic, in a
// group of its own (role "<role>-slow"), with the role's other settings.
func TestLanePipeline(t *testing.T) {
	main := pipeline.Config{Role: "drain", Topics: []string{"a", "b"}, BatchTimeout: time.Minute, FetchMaxWait: FetchMaxWait}
	got := LanePipeline(main, "lane")
	if got.Role != "drain-slow" || len(got.Topics) != 1 || got.Topics[0] != "lane" ||
		got.BatchTimeout != time.Minute || got.FetchMaxWait != FetchMaxWait {
		t.Fatalf("lane pipeline %+v", got)
	}
	if main.Role != "drain" || len(main.Topics) != 2 {
		t.Fatalf("the role's own pipeline changed: %+v", main)
	}
}

// TestRecordHeaders: a requeue record carries the role's own headers
// (Again.Headers), beside its not-before time, one more attempt and the
// cluster it waits for; a record handed on unchanged keeps them.
func TestRecordHeaders(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	in := &kgo.Record{Key: []byte("c/n"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: HeaderAttempt, Value: []byte("2")}, {Key: "role-note", Value: []byte("old")}}}
	r := Record("rq", in, Again{At: at, Cluster: "c", Headers: []kgo.RecordHeader{{Key: "role-note", Value: []byte("new")}}})
	if !NotBefore(r).Equal(at) || Attempt(r) != 3 || !AfterTrouble(r) || header(r, "role-note") != "new" || len(r.Headers) != 4 {
		t.Fatalf("requeue record headers %v", r.Headers)
	}
	if f := Forward("lane", r); len(f.Headers) != 4 || header(f, "role-note") != "new" {
		t.Fatalf("handed on: headers %v", f.Headers)
	}
	if r := Record("rq", in, Again{At: at}); header(r, "role-note") != "" || len(r.Headers) != 2 {
		t.Fatalf("without the role's headers: %v", r.Headers)
	}
}

// TestStepCutShort: a step cut short by the role's shutdown (its context
// cancelled) is requeued, not counted as the cluster's API error.
func TestStepCutShort(t *testing.T) {
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient("live", kube, false)
	apiErrors := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"cluster"})
	fallback := time.Now().Add(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	_, ag, err := Step(ctx, reg, "live", "n1", "drain", fallback, slog.New(slog.NewTextHandler(io.Discard, nil)), apiErrors, nil,
		func(ctx context.Context, _ *clusters.Client) ([]*faultlinev1.Action, time.Time, error) {
			cancel()
			return nil, time.Time{}, ctx.Err()
		})
	if err != nil || ag.At.IsZero() {
		t.Fatalf("cut short: err %v, again %+v; want requeued", err, ag)
	}
	var m dto.Metric
	if err := apiErrors.WithLabelValues("live").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 0 {
		t.Fatalf("api errors of live: %v, want 0", got)
	}
}

// TestStepWhileProbing: work waiting on a cluster whose request timed out,
// past its backoff and probed in the background (the probe silent, going
// on up to kube.timeout), is requeued for a time still ahead — the gate's
// (a probe's interval on) or, where the gate gives none, the fallback —
// not for the backoff's past end: ByNode rests on it instead of stepping
// it again at once, round after round.
func TestStepWhileProbing(t *testing.T) {
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	const poll = 200 * time.Millisecond // the role's fallback
	for _, tc := range []struct {
		name          string
		probeInterval time.Duration
		every         time.Duration // the least time between two steps
	}{
		{"the gate's time: a probe's interval on", 100 * time.Millisecond, 100 * time.Millisecond},
		{"none ahead from the gate: the fallback", 0, poll},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
			cl := reg.SetClient("silent", kube, false)
			silent := make(chan struct{})
			defer close(silent)
			cl.Gate.MinBackoff, cl.Gate.MaxBackoff, cl.Gate.ProbeInterval = 10*time.Millisecond, 10*time.Millisecond, tc.probeInterval
			cl.Gate.Probe = func(ctx context.Context) error {
				select {
				case <-ctx.Done():
				case <-silent:
				}
				return context.DeadlineExceeded
			}
			cl.Gate.Fail(context.DeadlineExceeded)
			time.Sleep(30 * time.Millisecond) // past the backoff
			apiErrors := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"cluster"})
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			var steps, ran atomic.Int64
			step := func(ctx context.Context, _ *kgo.Record) ([]*faultlinev1.Action, Again) {
				steps.Add(1)
				_, again, err := Step(ctx, reg, "silent", "n1", "drain", time.Now().Add(poll), log, apiErrors, nil,
					func(context.Context, *clusters.Client) ([]*faultlinev1.Action, time.Time, error) {
						ran.Add(1)
						return nil, time.Time{}, nil
					})
				if now := time.Now(); err != nil || !again.At.After(now) || again.Cluster != "silent" {
					t.Errorf("err %v, again %+v at %v; want requeued for later, waiting for silent", err, again, now)
				}
				return nil, again
			}
			rec := &kgo.Record{Topic: "drain", Key: []byte("n1"), Value: []byte("a")}
			start := time.Now()
			for passes := 0; time.Since(start) < 400*time.Millisecond; passes++ {
				out, rest, err := ByNode(context.Background(), 1, "rq", 0, time.Now, reg.Ready,
					func(*kgo.Record) string { return "" }, []*kgo.Record{rec}, func(r *kgo.Record) *kgo.Record { return r }, step)
				if err != nil || len(out) != 1 {
					t.Fatalf("pass %d: err %v, %d records out; want the work requeued", passes, err, len(out))
				}
				rec = out[0]
				if n, most := steps.Load(), int64(time.Since(start)/tc.every)+2; n > most {
					t.Fatalf("%d steps in %d passes over %v, want at most %d (attempt %d)", n, passes+1, time.Since(start), most, Attempt(rec))
				}
				time.Sleep(time.Until(rest)) // the topic rests (none asked: polled again at once)
			}
			if ran.Load() != 0 || steps.Load() == 0 {
				t.Fatalf("%d steps, the work run %d times; want stepped, never run", steps.Load(), ran.Load())
			}
		})
	}
}
