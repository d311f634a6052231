// Package fleetsim simulates a GPU fleet's node agents: every node sends
// what faultline-agent would send to the gateway over gRPC — XID errors
// (fatal and not), NIC ports flapping and recovering, NVSwitch SXids — at a
// configured rate, so `make run` has a live stream to act on. The load tests
// do not use Run: they build their events with this package's helpers and
// send them with loadtest/fleet's Load, which keeps an absolute schedule and
// counts what the gateway acknowledged.
package fleetsim

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Options configure a simulated fleet.
type Options struct {
	// GRPCAddr of the gateway.
	GRPCAddr string
	// Token is the bearer token of the fleet's cluster.
	Token string
	// Nodes in the fleet. Default 64.
	Nodes int
	// EventsPerSecond across the fleet, sent in BatchesPerSecond requests
	// of EventsPerSecond/BatchesPerSecond events (so at most the gateway's
	// max batch × BatchesPerSecond). Default 20.
	EventsPerSecond float64
	// FaultRatio is the share of events that report a fault (the rest are
	// recoveries and non-fatal noise). Default 0.3.
	FaultRatio float64
	// Seed makes a run repeatable. Default 1.
	Seed uint64
}

// BatchesPerSecond is how many requests a second Run sends.
const BatchesPerSecond = 10

// Stats count what the simulator sent.
type Stats struct {
	Sent, Failed atomic.Int64
}

// Run sends events until ctx ends. It paces with a time.Ticker, which drops
// the ticks that come while a call is in flight: behind a slow gateway it
// sends fewer than EventsPerSecond, and only Stats.Sent says so. That is
// fine for a demo stream, not for a measured load.
func Run(ctx context.Context, o Options, stats *Stats, log *slog.Logger) error {
	if o.Nodes <= 0 {
		o.Nodes = 64
	}
	if o.EventsPerSecond <= 0 {
		o.EventsPerSecond = 20
	}
	if o.FaultRatio <= 0 {
		o.FaultRatio = 0.3
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	conn, err := grpc.NewClient(o.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("fleetsim: dial %s: %w", o.GRPCAddr, err)
	}
	defer conn.Close()
	cl := faultlinev1.NewEventsClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+o.Token)
	f := newFleet(o)
	tick := time.NewTicker(time.Second / BatchesPerSecond)
	defer tick.Stop()
	var owed float64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		owed += o.EventsPerSecond / BatchesPerSecond
		var batch []*datamodels.HealthEvent
		for ; owed >= 1; owed-- {
			batch = append(batch, f.next())
		}
		if len(batch) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := cl.SubmitEvents(rctx, &faultlinev1.SubmitEventsRequest{Events: batch})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				stats.Failed.Add(int64(len(batch)))
				log.Warn("fleetsim: submit failed", "events", len(batch), "err", err)
			}
			continue
		}
		stats.Sent.Add(int64(len(batch)))
	}
}

// fleet remembers which faults stand, so it can recover them later.
type fleet struct {
	o      Options
	rng    *rand.Rand
	faults []fault // standing faults, oldest first
}

type fault struct {
	node     string
	check    string
	class    string
	entities []*datamodels.Entity
}

func newFleet(o Options) *fleet {
	return &fleet{o: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))}
}

func (f *fleet) node() string { return fmt.Sprintf("sim-node-%03d", f.rng.IntN(f.o.Nodes)) }

func (f *fleet) next() *datamodels.HealthEvent {
	r := f.rng.Float64()
	switch {
	case r < f.o.FaultRatio:
		return f.fault()
	case r < f.o.FaultRatio*2 && len(f.faults) > 0:
		return f.recover()
	default:
		return f.noise()
	}
}

func gpu(n int) string { return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012d", n, n) }

func (f *fleet) fault() *datamodels.HealthEvent {
	node := f.node()
	var ev *datamodels.HealthEvent
	switch f.rng.IntN(4) {
	case 0: // a fatal XID
		code := []int{48, 79, 94, 95, 119}[f.rng.IntN(5)]
		g := f.rng.IntN(8)
		ev = event(node, "GPU", "SysLogsXIDError", true, fmt.Sprintf("Xid (PCI:0000:%02x:00): %d", 0x18+g, code),
			datamodels.RecommendedAction_REPLACE_VM, []string{fmt.Sprintf("XID-%d", code)}, entity(events.EntityGPU, gpu(g)))
	case 1: // an InfiniBand port goes down
		nic := fmt.Sprintf("mlx5_%d", f.rng.IntN(8))
		ev = event(node, "NIC", "InfiniBandStateCheck", true, "Port "+nic+" port 1: state DOWN, phys_state Disabled",
			datamodels.RecommendedAction_REPLACE_VM, nil, entity(events.EntityNIC, nic), entity(events.EntityNICPort, nic+"/1"))
	case 2: // an NVSwitch fatal SXid
		ev = event(node, "NVSwitch", "SysLogsSXIDError", true, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Fatal",
			datamodels.RecommendedAction_RESTART_BM, []string{"SXID-12028"}, entity(events.EntityNVSwitch, "nvswitch0"))
	default: // XID 31, not fatal on its own
		g := f.rng.IntN(8)
		ev = event(node, "GPU", "SysLogsXIDError", false, "Xid 31: MMU fault", datamodels.RecommendedAction_NONE,
			[]string{"XID-31"}, entity(events.EntityGPU, gpu(g)))
	}
	if ev.IsFatal {
		f.faults = append(f.faults, fault{node: node, check: ev.CheckName, class: ev.ComponentClass, entities: ev.EntitiesImpacted})
	}
	return ev
}

func (f *fleet) recover() *datamodels.HealthEvent {
	ft := f.faults[0]
	f.faults = f.faults[1:]
	ev := event(ft.node, ft.class, ft.check, false, "recovered", datamodels.RecommendedAction_NONE, nil, ft.entities...)
	ev.IsHealthy = true
	return ev
}

func (f *fleet) noise() *datamodels.HealthEvent {
	ev := event(f.node(), "GPU", "GpuThermalWatch", false, "GPU temperature back in range",
		datamodels.RecommendedAction_NONE, nil, entity(events.EntityGPU, gpu(f.rng.IntN(8))))
	ev.IsHealthy = true
	return ev
}

func entity(typ, val string) *datamodels.Entity {
	return &datamodels.Entity{EntityType: typ, EntityValue: val}
}

func event(node, class, check string, fatal bool, msg string, action datamodels.RecommendedAction, codes []string, ents ...*datamodels.Entity) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{
		Version: 1, Agent: "faultline-agent", ComponentClass: class, CheckName: check,
		IsFatal: fatal, IsHealthy: false, Message: msg, RecommendedAction: action,
		ErrorCode: codes, EntitiesImpacted: ents, NodeName: node,
		GeneratedTimestamp: timestamppb.Now(),
	}
}
