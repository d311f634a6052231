package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus metrics.
type metrics struct {
	requests       *prometheus.CounterVec
	accepted       *prometheus.CounterVec
	rejects        *prometheus.CounterVec
	produceLatency prometheus.Histogram
	connsRefused   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faultline_gateway_requests_total", Help: "Requests by door, method (gRPC method, or REST method and route pattern; never a raw path) and status code.",
		}, []string{"door", "method", "code"}),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faultline_gateway_events_accepted_total", Help: "Events acknowledged by Kafka and answered with success.",
		}, []string{"cluster", "method"}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faultline_gateway_events_rejected_total", Help: "Events refused, by reason.",
		}, []string{"reason"}),
		produceLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "faultline_gateway_produce_seconds", Help: "Time from produce to Kafka acknowledgement of a batch.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faultline_gateway_connections_refused_total", Help: "Connections closed on accept: over gateway.max_conns or gateway.max_conns_per_address.",
		}, []string{"door"}),
	}
	// Every refusal reason is exported from the start (at 0), so alerts
	// on their rate (deploy/monitoring) see them before the first one.
	for _, r := range rejectReasons {
		m.rejects.WithLabelValues(r)
	}
	reg.MustRegister(m.requests, m.accepted, m.rejects, m.produceLatency, m.connsRefused)
	return m
}

// rejectReasons are the reason labels of faultline_gateway_events_rejected_total.
var rejectReasons = []string{"busy", "content_type", "invalid", "kafka_unavailable", "overloaded", "rate_limited",
	"read_rate_limited", "reads_busy", "too_large", "too_many_elements", "unauthenticated", "unreadable", "wrong_node"}

func (m *metrics) rejected(reason string, n int) {
	m.rejects.WithLabelValues(reason).Add(float64(max(n, 1)))
}
