// Command fleetload runs one load scenario of loadtest/fleet end to end
// against real servers — a Kafka broker, ClickHouse where the scenario
// needs it, one kube-apiserver per simulated cluster, the gateway (gRPC
// and REST) and the processor roles as processors.Run starts them — and
// prints every figure with the machine's cores and load:
//
//	eval "$(scripts/testenv/env.sh)"
//	go run ./loadtest/cmd/fleetload -scenario fault-to-cordon -rate 1000
//	go run ./loadtest/cmd/fleetload -list
//
// Zero flags take the scenario's defaults (its full size). The exit status
// is 1 when a scenario's check fails (a node cordoned twice, a held node
// missing, a load that did not deliver its rate).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"

	"github.com/faultline/faultline/loadtest/fleet"
	"github.com/faultline/faultline/loadtest/standalone"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-replica" {
		os.Exit(replicaMain(os.Args[2:]))
	}
	var p fleet.Params
	name := flag.String("scenario", "", "scenario: "+strings.Join(fleet.Names(), ", "))
	list := flag.Bool("list", false, "list the scenarios and exit")
	flag.IntVar(&p.Clusters, "clusters", 0, "simulated clusters, one kube-apiserver each")
	flag.IntVar(&p.Nodes, "nodes", 0, "nodes per cluster")
	flag.Float64Var(&p.Rate, "rate", 0, "background events/s")
	flag.DurationVar(&p.Duration, "duration", 0, "duration of the load (broker-restart: how long the broker stays down; burst: bound of the wait for the drain)")
	flag.IntVar(&p.Faults, "faults", 0, "nodes that fail")
	flag.IntVar(&p.Events, "events", 0, "burst: events sent in all")
	kubeQPS := flag.Float64("kube-qps", 0, "burst: the roles' client QPS per cluster, burst 2x (default: shipped 200/400)")
	flag.StringVar(&p.Roles, "roles", "", "burst, broker-roll, slow-cluster: processor roles run (default store,correlate,quarantine; store,quarantine,drain,remediate; quarantine — with drain,remediate slow-cluster follows each fault to its RebootNode)")
	flag.BoolVar(&p.BreakerOff, "breaker-off", false, "disable quarantine's circuit breaker")
	transport := flag.String("transport", "", "grpc or rest (scenario default)")
	nodeEvents := flag.String("node-events", "", "quarantine.node_events: true or false (default: shipped)")
	verbose := flag.Bool("v", false, "print the servers' log lines")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (load generator, gateway, roles; not the broker or ClickHouse) for the whole scenario to this file")
	replicas := flag.String("replicas", "1,2,4", "scale: replica counts")
	flag.DurationVar(&p.Latency, "latency", 0, "scale: apiserver latency per request (default 50ms); slow-cluster: the first cluster's (default 1.5s)")
	slowCluster := flag.String("slow-cluster", "", "slow-cluster: quarantine.slow_cluster, drain.slow_cluster and remediate.slow_cluster (default: shipped)")
	kill := flag.Bool("kill", true, "scale: add a round in which one of two replicas is SIGKILLed")
	role := flag.String("role", "quarantine", "scale: the replicas' role, quarantine, remediate, drain, store or correlate")
	flag.Parse()
	if *name == "scale" {
		latency := p.Latency
		if latency == 0 {
			latency = 50 * time.Millisecond
		}
		os.Exit(runScale(p, *role, *replicas, latency, *kill, *verbose))
	}
	if *list {
		for _, s := range fleet.Scenarios {
			fmt.Printf("%-18s %s\n", s.Name, s.Doc)
		}
		fmt.Printf("%-18s %s\n", "scale", "quarantine replicas (-replicas 1,2,4) as processes against an apiserver behind a latency proxy (-latency), -nodes failing per round, breaker off; then one of two replicas SIGKILLed mid-run (-kill): every node cordoned once; -role remediate: remediate replicas, drain/succeeded actions in, RebootNodes/s, every node one RebootNode created once; -role drain: drain replicas, quarantine/applied actions in, each node's pods evicted, nodes drained/s, evictions counted at the proxy by answer; -role store: store replicas, -nodes events per round produced to the events topic, events stored/s as distinct ids in ClickHouse, none lost after the SIGKILL; -role correlate: correlate replicas (the store role in the fleet), -nodes nodes per round each with two Xid 31 on a GPU, verdicts/s read back from the events topic, every node judged once")
		return
	}
	s, ok := fleet.Lookup(*name)
	if !ok {
		fmt.Fprintf(os.Stderr, "fleetload: -scenario must be one of %s\n", strings.Join(fleet.Names(), ", "))
		os.Exit(2)
	}
	var err error
	if p.Transport, err = parseTransport(*transport); err != nil {
		fmt.Fprintln(os.Stderr, "fleetload:", err)
		os.Exit(2)
	}
	p.KubeQPS = float32(*kubeQPS)
	if p.NodeEvents, err = parseNodeEvents(*nodeEvents); err != nil {
		fmt.Fprintln(os.Stderr, "fleetload:", err)
		os.Exit(2)
	}
	if *slowCluster != "" {
		d, err := time.ParseDuration(*slowCluster)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetload: -slow-cluster:", err)
			os.Exit(2)
		}
		p.SlowCluster = &d
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetload: -cpuprofile:", err)
			os.Exit(2)
		}
		defer f.Close()
	}
	tb := standalone.New("fleetload")
	tb.Verbose = *verbose
	fmt.Printf("fleetload %s: %+v\n", s.Name, s.Prepare(p))
	t0 := time.Now()
	r, err := s.Execute(tb, p, func(l string) { fmt.Println(l) })
	pprof.StopCPUProfile() // before os.Exit; a no-op without -cpuprofile
	tb.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetload:", err)
		os.Exit(1)
	}
	fmt.Printf("fleetload %s done in %s: %d figures, %d failed checks\n", s.Name, time.Since(t0).Round(time.Millisecond), len(r.Lines), len(r.Failures))
	if len(r.Failures) > 0 {
		os.Exit(1)
	}
}

// parseTransport is -transport: grpc, rest or empty (the scenario's
// default). Anything else is an error: the load would send through REST.
func parseTransport(s string) (fleet.Transport, error) {
	switch t := fleet.Transport(s); t {
	case "", fleet.GRPC, fleet.REST:
		return t, nil
	}
	return "", fmt.Errorf("-transport must be %s or %s, not %q", fleet.GRPC, fleet.REST, s)
}

// parseNodeEvents is -node-events: empty (nil: the shipped setting) or a
// boolean as strconv.ParseBool reads it.
func parseNodeEvents(s string) (*bool, error) {
	if s == "" {
		return nil, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return nil, fmt.Errorf("-node-events must be true or false, not %q", s)
	}
	return &v, nil
}

// replicaMain is "fleetload -replica ...": one replica, started by the
// scale scenario (the command itself, or the test binary in its smoke
// tests).
func replicaMain(args []string) int {
	fs := flag.NewFlagSet("fleetload -replica", flag.ExitOnError)
	brokers := fs.String("replica.brokers", "", "Kafka brokers")
	kube := fs.String("replica.kube", "", "cluster=kubeconfig (roles quarantine, remediate, drain)")
	ch := fs.String("replica.clickhouse", "", "ClickHouse address (roles store, correlate)")
	identity := fs.String("replica.identity", "", "identity on nodes")
	role := fs.String("replica.role", "quarantine", "quarantine, remediate, drain, store or correlate")
	fs.Parse(args)
	if err := runReplica(*brokers, *kube, *ch, *identity, *role); err != nil {
		fmt.Fprintln(os.Stderr, "fleetload replica:", err)
		return 1
	}
	return 0
}

// runReplica is one replica of role (quarantine, remediate, drain, store
// or correlate): processors.Run as production starts it (shipped defaults,
// quarantine's breaker off for the scale rounds) until SIGTERM.
func runReplica(brokers, kube, ch, identity, role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pcfg := processors.DefaultConfig()
	switch role {
	case "store", "correlate":
		if ch == "" {
			return fmt.Errorf("-replica.clickhouse: required for role %s", role)
		}
		pcfg.ClickHouse.Addr, pcfg.ClickHouse.Database = ch, fleet.Database
	case "quarantine", "remediate", "drain":
		cluster, kc, ok := strings.Cut(kube, "=")
		if !ok {
			return fmt.Errorf("-replica.kube: want cluster=kubeconfig, got %q", kube)
		}
		pcfg.Kube.Clusters = []clusters.Cluster{{Name: cluster, Kubeconfig: kc}}
	default:
		return fmt.Errorf("-replica.role: want quarantine, remediate, drain, store or correlate, got %q", role)
	}
	pcfg.Roles = role
	pcfg.Quarantine.Breaker.Enabled = false
	pcfg.Quarantine.Identity = identity
	pcfg.Remediate.Identity = identity
	pcfg.Drain.Identity = identity
	if err := pcfg.Validate(); err != nil {
		return err
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = brokers
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := processors.Run(ctx, pcfg, processors.Deps{Log: log, Registry: reg, Kafka: kcfg, Metrics: pipeline.NewMetrics(reg)})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func runScale(p fleet.Params, role, replicas string, latency time.Duration, kill, verbose bool) int {
	var counts []int
	for _, f := range strings.Split(replicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "fleetload: -replicas: %q is not a replica count\n", f)
			return 2
		}
		counts = append(counts, n)
	}
	if p.Nodes == 0 {
		// Rounds long enough that the rate is the sustained one, not a
		// burst's first polls or the clients' first kube.burst requests
		// (loadtest/RESULTS.md §7).
		p.Nodes = map[string]int{"quarantine": 3000, "remediate": 6000, "drain": 1500, "store": 300_000, "correlate": 20_000}[role]
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetload:", err)
		return 1
	}
	rounds := len(counts)
	if kill {
		rounds++
	}
	tb := standalone.New("fleetload")
	tb.Verbose = verbose
	defer tb.Close()
	opts := fleet.Options{Clusters: 1, Nodes: rounds * p.Nodes, Roles: "none", Kube: true}
	switch role {
	case "store":
		opts = fleet.Options{Clusters: 1, Roles: "none", ClickHouse: true}
	case "correlate":
		opts = fleet.Options{Clusters: 1, Roles: "store", ClickHouse: true}
	}
	e := fleet.Start(tb, opts)
	if err := e.WarmUp(e.Context()); err != nil {
		fmt.Fprintln(os.Stderr, "fleetload:", err)
		return 1
	}
	r := &fleet.Report{Print: func(l string) { fmt.Println(l) }}
	switch role {
	case "store":
		r.Figure("scale: %s; %d events per round; replicas %v", e.Describe(), p.Nodes, counts)
	case "correlate":
		r.Figure("scale: %s; %d nodes with 2 events each per round; replicas %v", e.Describe(), p.Nodes, counts)
	default:
		r.Figure("scale: %s; %d nodes fail per round; replicas %v; apiserver latency %s", e.Describe(), p.Nodes, counts, latency)
	}
	if role != "quarantine" {
		r.Figure("scale: replicas of role %s, shipped defaults", role)
	}
	if err := fleet.RunScale(e.Context(), e, fleet.ScaleParams{Exe: exe, Role: role, Replicas: counts, Nodes: p.Nodes, Latency: latency, Kill: kill}, r); err != nil {
		fmt.Fprintln(os.Stderr, "fleetload:", err)
		return 1
	}
	if len(r.Failures) > 0 {
		return 1
	}
	return 0
}
