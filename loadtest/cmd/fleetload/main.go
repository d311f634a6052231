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
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/faultline/faultline/loadtest/fleet"
	"github.com/faultline/faultline/loadtest/standalone"
)

func main() {
	var p fleet.Params
	name := flag.String("scenario", "", "scenario: "+strings.Join(fleet.Names(), ", "))
	list := flag.Bool("list", false, "list the scenarios and exit")
	flag.IntVar(&p.Clusters, "clusters", 0, "simulated clusters, one kube-apiserver each")
	flag.IntVar(&p.Nodes, "nodes", 0, "nodes per cluster")
	flag.Float64Var(&p.Rate, "rate", 0, "background events/s")
	flag.DurationVar(&p.Duration, "duration", 0, "duration of the load")
	flag.IntVar(&p.Faults, "faults", 0, "nodes that fail")
	flag.BoolVar(&p.BreakerOff, "breaker-off", false, "disable quarantine's circuit breaker")
	transport := flag.String("transport", "", "grpc or rest (scenario default)")
	nodeEvents := flag.String("node-events", "", "quarantine.node_events: true or false (default: shipped)")
	verbose := flag.Bool("v", false, "print the servers' log lines")
	flag.Parse()
	if *list {
		for _, s := range fleet.Scenarios {
			fmt.Printf("%-18s %s\n", s.Name, s.Doc)
		}
		return
	}
	s, ok := fleet.Lookup(*name)
	if !ok {
		fmt.Fprintf(os.Stderr, "fleetload: -scenario must be one of %s\n", strings.Join(fleet.Names(), ", "))
		os.Exit(2)
	}
	p.Transport = fleet.Transport(*transport)
	if *nodeEvents != "" {
		v := *nodeEvents == "true"
		p.NodeEvents = &v
	}
	tb := standalone.New("fleetload")
	tb.Verbose = *verbose
	fmt.Printf("fleetload %s: %+v\n", s.Name, s.Prepare(p))
	t0 := time.Now()
	r, err := s.Execute(tb, p, func(l string) { fmt.Println(l) })
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
