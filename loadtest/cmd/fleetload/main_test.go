package main

import (
	"os"
	"testing"
	"time"

	"github.com/faultline/faultline/loadtest/fleet"
)

// TestMain lets the test binary be a scale replica too: RunScale starts
// os.Args[0] -replica ..., as the command starts itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-replica" {
		os.Exit(replicaMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// scaleSmoke starts a fleet with o, runs the scale rounds of sp (replicas
// are this test binary's -replica mode) and checks that every round
// passed and printed want figures (why: which they are). The smoke tests
// that call it run in parallel: each starts a fleet of its own, and much of
// their time is waiting (a killed replica's session timeout).
func scaleSmoke(t *testing.T, o fleet.Options, sp fleet.ScaleParams, want int, why string) {
	t.Helper()
	e := fleet.Start(t, o)
	if err := e.WarmUp(e.Context()); err != nil {
		t.Fatal(err)
	}
	r := &fleet.Report{Print: func(l string) { t.Log(l) }}
	sp.Exe = os.Args[0]
	if err := fleet.RunScale(e.Context(), e, sp, r); err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Error(f)
	}
	if len(r.Lines) != want {
		t.Errorf("%d figures, want %d (%s)", len(r.Lines), want, why)
	}
}

// TestScaleSmoke runs the scale scenario tiny: one replica process, then
// two with one SIGKILLed (the survivor takes its partitions after the
// consumer group's session timeout, kafka.session_timeout 15s): every
// node cordoned once; then the ceiling.
func TestScaleSmoke(t *testing.T) {
	t.Parallel()
	scaleSmoke(t, fleet.Options{Clusters: 1, Nodes: 2 * 20, Roles: "none", Kube: true},
		fleet.ScaleParams{Replicas: []int{1}, Nodes: 20, Latency: 10 * time.Millisecond, Kill: true}, 3, "one round, one SIGKILL round, the ceiling")
}

// TestScaleRemediateSmoke runs the scale scenario's remediate rounds tiny:
// two remediate replica processes, drain results in, one RebootNode per
// node created once, each followed to remediate/succeeded once the test
// completes it. (The SIGKILL round is TestScaleSmoke's mechanism; here it
// would add the group's session timeout.)
func TestScaleRemediateSmoke(t *testing.T) {
	t.Parallel()
	scaleSmoke(t, fleet.Options{Clusters: 1, Nodes: 20, Roles: "none", Kube: true},
		fleet.ScaleParams{Role: "remediate", Replicas: []int{2}, Nodes: 20, Latency: 10 * time.Millisecond}, 3, "one round, the ceiling without and with four more watches")
}

// TestScaleDrainSmoke runs the scale scenario's drain rounds tiny: two
// drain replica processes, quarantine/applied actions in, every node's
// pods evicted once (counted at the proxy and on a pod watch) and a
// drain/succeeded for every node. (No SIGKILL round: it would add the
// group's session timeout; TestScaleSmoke covers the mechanism.)
func TestScaleDrainSmoke(t *testing.T) {
	t.Parallel()
	scaleSmoke(t, fleet.Options{Clusters: 1, Nodes: 20, Roles: "none", Kube: true},
		fleet.ScaleParams{Role: "drain", Replicas: []int{2}, Nodes: 20, Latency: 10 * time.Millisecond}, 2, "one round, the ceiling")
}

// TestScaleStoreSmoke runs the scale scenario's store rounds tiny: one
// store replica process, then two with one SIGKILLed a third of the way
// (the survivor takes its partitions after the group's session timeout):
// every event stored (distinct ids in ClickHouse), then the ceiling.
func TestScaleStoreSmoke(t *testing.T) {
	t.Parallel()
	scaleSmoke(t, fleet.Options{Clusters: 1, Roles: "none", ClickHouse: true},
		fleet.ScaleParams{Role: "store", Replicas: []int{1}, Nodes: 30_000, Kill: true}, 4, "one round, the SIGKILL round, the ceiling with 1 and 4 writers")
}

// TestScaleCorrelateSmoke runs the scale scenario's correlate rounds tiny:
// one correlate replica process beside the fleet's store role, every
// node's pair of Xid 31 judged once, its verdict read back from the
// events topic. (No SIGKILL round: TestScaleSmoke covers the mechanism.)
func TestScaleCorrelateSmoke(t *testing.T) {
	t.Parallel()
	scaleSmoke(t, fleet.Options{Clusters: 1, Roles: "store", ClickHouse: true},
		fleet.ScaleParams{Role: "correlate", Replicas: []int{1}, Nodes: 200}, 1, "one round")
}
