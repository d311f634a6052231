package checks

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are ADR-026's check-container metrics, on their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	total        *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	failures     *prometheus.CounterVec
	gangWait     *prometheus.HistogramVec
	configErrors *prometheus.CounterVec
}

// NewMetrics registers preflight_check_total{check,result},
// preflight_check_duration_seconds{check},
// preflight_check_failures_total{check,node,error_code},
// preflight_gang_wait_seconds{workload} and
// preflight_config_errors_total{error}.
func NewMetrics() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "preflight_check_total",
			Help: "Preflight check runs by result (pass, fail, error)."}, []string{"check", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "preflight_check_duration_seconds",
			Help: "Duration of a preflight check run.", Buckets: []float64{1, 5, 15, 30, 60, 120, 180, 300, 600, 1200}}, []string{"check"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "preflight_check_failures_total",
			Help: "Failed preflight checks by error code."}, []string{"check", "node", "error_code"}),
		gangWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "preflight_gang_wait_seconds",
			Help: "Time nccl-allreduce waited for its gang to form.", Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200}}, []string{"workload"}),
		configErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "preflight_config_errors_total",
			Help: "Preflight checks that stopped on a configuration error, by kind."}, []string{"error"}),
	}
	m.Registry.MustRegister(m.total, m.duration, m.failures, m.gangWait, m.configErrors)
	return m
}

// pushTimeout bounds a push to the Pushgateway.
var pushTimeout = 10 * time.Second

// Publish pushes the metrics to a Pushgateway and/or writes them to a
// textfile; both are optional. The push replaces the group
// job="faultline_preflight",node,check: its series are that check's latest
// run on the node (the Pushgateway never expires a group, so one per pod
// grew without bound and kept the failures of pods long gone).
func (m *Metrics) Publish(cfg MetricsConfig, node, check string) error {
	if cfg.Pushgateway != "" {
		// Bounded: a Pushgateway that accepts and never answers held the
		// init container — its check done — for ever.
		group := map[string]string{"node": node, "check": check}
		p := push.New(cfg.Pushgateway, "faultline_preflight").Client(&http.Client{Timeout: pushTimeout}).
			Gatherer(withoutGroupLabels(m.Registry, group)).Grouping("node", node).Grouping("check", check)
		if err := p.Push(); err != nil {
			return fmt.Errorf("metrics.pushgateway: %w", err)
		}
	}
	if cfg.Textfile != "" {
		if err := prometheus.WriteToTextfile(cfg.Textfile, m.Registry); err != nil {
			return fmt.Errorf("metrics.textfile: %w", err)
		}
	}
	return nil
}

// withoutGroupLabels gathers g without the labels the push's group gives
// every series (the Pushgateway adds them back): push refuses a metric
// that carries a grouping label, so every run that counted a failure
// ({check,node,error_code}) went unpushed.
func withoutGroupLabels(g prometheus.Gatherer, group map[string]string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				// A new slice: the metric's own labels are shared with
				// the registry, which the textfile still reads.
				var kept []*dto.LabelPair
				for _, l := range mt.Label {
					if v, ok := group[l.GetName()]; !ok || v != l.GetValue() {
						kept = append(kept, l)
					}
				}
				mt.Label = kept
			}
		}
		return mfs, err
	})
}
