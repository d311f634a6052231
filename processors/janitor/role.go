// Package janitor is the executor of remediation resources (`faultline
// process --role=janitor`): it watches the RebootNode, TerminateNode and
// GPUReset resources of NVIDIA NVSentinel's janitor (deploy/crds) in each
// configured cluster — the ones faultline's remediate role creates — and
// carries each out through a provider picked per node (Redfish BMCs, AWS
// EC2, the node-local faultline agent), writing status exactly as
// NVSentinel's janitor does, so that the remediate role (KindCompletion)
// and NVSentinel's own tooling both read it.
//
// Completion is observed on the node, not assumed: a reboot is over when
// the node is Ready with a new boot ID. Safety: dry-run per cluster,
// concurrency limits per cluster, rack and provider, a cooldown per node,
// no action on a node faultline has not quarantined and drained unless the
// resource says force, an audit Action for every step, and the signal
// recorded on the resource before it is sent, so that a janitor stopped
// mid-operation never sends it twice. README.md has the configuration,
// the providers and the status contract.
package janitor

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/certfile"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
)

// Role is the processor role name written on actions.
const Role = events.RoleJanitor

// Topics are what the role consumes: none (it watches the clusters; it
// produces to events.TopicActions, and the maintenance monitor to
// events.TopicEvents).
var Topics []string

// Open builds the janitor for the clusters of deps.Kube and its providers
// from cfg. The role has no consumer; its loops are the cluster watches
// and, when aws.maintenance_regions is set, the maintenance monitor.
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	deps = deps.WithDefaults()
	if err := cfg.Validate("janitor."); err != nil {
		return nil, err
	}
	provs, err := BuildProviders(cfg, deps.Log)
	if err != nil {
		return nil, err
	}
	deps.Registry.MustRegister(certfile.CAExpiryGauge("janitor.redfish.ca_file", provs[ProviderRedfish].(*Redfish).cas.ExpirySeconds))
	if len(cfg.Redfish.AllowedNetworks) > 0 && !cfg.Redfish.LabelsOnly {
		deps.Log.Warn("janitor: janitor.redfish.labels_only is off: a node without the " + LabelBMCHost + " label is reset at the BMC its own " +
			AnnotationBMC + " annotation names, and any node may pick its provider with " + AnnotationProvider + " (its kubelet may write both; " +
			"SECURITY.md, \"What a node may say about itself\"); each such signal is counted in faultline_janitor_node_named_total. " +
			"Label every node, then set janitor.redfish.labels_only")
	}
	reg := clusters.NewRegistry(deps.Kube, nil).WithLog(deps.Log)
	names := deps.Kube.Names()
	var prod *kgo.Client
	r := &role.Role{Name: Role}
	j, err := New(cfg, deps.Kube, reg, Options{Log: deps.Log, Registerer: deps.Registry, Providers: provs})
	if err != nil {
		return nil, err
	}
	r.Loops = append(r.Loops, role.Loop{Name: "watch", Run: func(ctx context.Context) error {
		p, err := actionsProducer(deps.Kafka, deps.Log)
		if err != nil {
			return fmt.Errorf("janitor: kafka: %w", err)
		}
		prod = p
		j.prod = p
		return j.Run(ctx, names)
	}})
	if len(cfg.AWS.MaintenanceRegions) > 0 {
		mon, err := j.MaintenanceMonitor(cfg.AWS)
		if err != nil {
			return nil, err
		}
		r.Loops = append(r.Loops, role.Loop{Name: "maintenance", Run: func(ctx context.Context) error {
			p, err := kafka.NewClient(deps.Kafka, deps.Log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
			if err != nil {
				return fmt.Errorf("janitor: kafka: %w", err)
			}
			defer p.Close()
			return mon.Run(ctx, p)
		}})
	}
	r.Close = func() error {
		if prod != nil {
			prod.Close()
		}
		return nil
	}
	return r, nil
}

// actionsProducer is the janitor's producer of its audit actions, each
// try bounded by emit's (kafka.NewBoundedProducer): an action not
// produced is kept on its resource and produced again with its id.
func actionsProducer(cfg kafka.Config, log *slog.Logger) (*kgo.Client, error) {
	return kafka.NewBoundedProducer(cfg, log, kgo.DefaultProduceTopic(events.TopicActions))
}
