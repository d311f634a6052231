package agent

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/faultline/faultline/internal/certfile"
)

// Metrics are the agent's Prometheus metrics, on their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	checkSuccess  *prometheus.GaugeVec
	checkDuration *prometheus.GaugeVec
	checkRuns     *prometheus.CounterVec
	checkEvents   *prometheus.CounterVec

	spoolBytes   prometheus.Gauge
	spoolFull    prometheus.Gauge
	spoolDropped *prometheus.CounterVec
	spoolCorrupt prometheus.Counter
	keptDropped  *prometheus.CounterVec

	sent       prometheus.Counter
	sendErrors *prometheus.CounterVec
	rejected   prometheus.Counter
	clockAhead prometheus.Counter

	gatewayInsecure prometheus.Gauge
	// gatewayCert is the client certificate presented to the gateway
	// (nil: none), whose expiry gatewayCertExpiry reports.
	gatewayCert       atomic.Pointer[certfile.Pair]
	gatewayCertExpiry prometheus.GaugeFunc
	// gatewayCAs is the gateway.ca_file bundle the connection verifies
	// the gateway with (nil: none, the system roots), whose first expiry
	// gatewayCAExpiry reports.
	gatewayCAs      atomic.Pointer[certfile.Pool]
	gatewayCAExpiry prometheus.GaugeFunc
}

// NewMetrics registers the agent's metrics, plus the Go and process
// collectors, on a new registry.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	m := &Metrics{Registry: r,
		checkSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_agent_check_success",
			Help: "1 if the check's last run succeeded, 0 if it failed, timed out or panicked."}, []string{"check"}),
		checkDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_agent_check_duration_seconds",
			Help: "Duration of the check's last run."}, []string{"check"}),
		checkRuns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_agent_check_runs_total",
			Help: "Check runs by result (ok, error, timeout, panic)."}, []string{"check", "result"}),
		checkEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_agent_check_events_total",
			Help: "Events returned by the check."}, []string{"check"}),
		spoolBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faultline_agent_spool_bytes",
			Help: "Bytes of events in the spool not yet accepted by the gateway."}),
		spoolFull: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faultline_agent_spool_full",
			Help: "1 while the spool refuses new events (full, or above 90% for non-fatal events)."}),
		spoolDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_agent_spool_dropped_events_total",
			Help: "Events refused by a full spool, by reason (full, reserved_for_fatal)."}, []string{"reason"}),
		spoolCorrupt: prometheus.NewCounter(prometheus.CounterOpts{Name: "faultline_agent_spool_corrupt_total",
			Help: "Corrupt spool records skipped."}),
		keptDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_agent_kept_events_dropped_total",
			Help: "Events a check reported that the spool refused (full) and the agent dropped: only non-fatal unhealthy ones, the oldest first, past the 1 MiB of events it keeps in memory per check (fatal and healthy events are never dropped: the check waits for the spool instead)."}, []string{"check"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "faultline_agent_sent_events_total",
			Help: "Events the gateway accepted (returned ids for)."}),
		sendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_agent_send_errors_total",
			Help: "Failed SubmitEvents calls by gRPC code."}, []string{"code"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "faultline_agent_rejected_events_total",
			Help: "Events the gateway rejected as invalid, larger alone than its gateway.max_body_bytes, or another node's than this one (dropped from the spool)."}),
		clockAhead: prometheus.NewCounter(prometheus.CounterOpts{Name: "faultline_agent_clock_ahead_events_total",
			Help: "Events the gateway refused as generated in its future (this node's clock ahead of the gateway's by more than its gateway.max_future_skew), delivered again with the gateway's receive time, the node's kept in their metadata (faultline.io/agent-generated-timestamp)."}),
		gatewayInsecure: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faultline_agent_gateway_insecure",
			Help: "1 if the agent sends to the gateway without TLS (gateway.insecure = true): token and events in clear."}),
	}
	m.gatewayCertExpiry = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "faultline_agent_gateway_client_certificate_expiry_timestamp_seconds",
		Help: "When the client certificate presented to the gateway (gateway.cert_file) expires (Unix seconds; re-read when its files change); 0 without one."},
		func() float64 { return m.gatewayCert.Load().ExpirySeconds() })
	m.gatewayCAExpiry = certfile.CAExpiryGauge("gateway.ca_file", func() float64 { return m.gatewayCAs.Load().ExpirySeconds() })
	for _, c := range []prometheus.Collector{m.checkSuccess, m.checkDuration, m.checkRuns, m.checkEvents,
		m.spoolBytes, m.spoolFull, m.spoolDropped, m.spoolCorrupt, m.keptDropped, m.sent, m.sendErrors, m.rejected, m.clockAhead, m.gatewayInsecure, m.gatewayCertExpiry, m.gatewayCAExpiry,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}
