package gateway

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus metrics.
type metrics struct {
	requests       *prometheus.CounterVec
	accepted       *prometheus.CounterVec
	rejects        *prometheus.CounterVec
	produceLatency prometheus.Histogram
	connsRefused   *prometheus.CounterVec
	untrusted      *prometheus.CounterVec

	// The children of the counters above, looked up once per label
	// values instead of hashing them on every call: rejectsBy holds
	// every reason of rejectReasons (read-only after newMetrics); the
	// sync.Maps fill as label values are first seen (their number is
	// that of the metric's series, which the labels already bound).
	rejectsBy  map[string]prometheus.Counter
	restReqs   sync.Map // restReqKey → prometheus.Counter
	reqs       sync.Map // [3]string{door, method, code} → prometheus.Counter
	acceptedBy sync.Map // [2]string{cluster, method} → prometheus.Counter
}

type restReqKey struct {
	method, route string
	code          int
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
		untrusted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faultline_gateway_untrusted_connections_closed_total", Help: "Open TLS connections closed because gateway.client_ca no longer verifies the client certificate they were admitted with (its CA removed, or it expired since).",
		}, []string{"door"}),
	}
	for _, door := range []string{doorGRPC, doorREST} {
		m.untrusted.WithLabelValues(door)
	}
	// Every refusal reason is exported from the start (at 0), so alerts
	// on their rate (deploy/monitoring) see them before the first one.
	m.rejectsBy = make(map[string]prometheus.Counter, len(rejectReasons))
	for _, r := range rejectReasons {
		m.rejectsBy[r] = m.rejects.WithLabelValues(r)
	}
	reg.MustRegister(m.requests, m.accepted, m.rejects, m.produceLatency, m.connsRefused, m.untrusted)
	return m
}

// rejectReasons are the reason labels of faultline_gateway_events_rejected_total.
var rejectReasons = []string{"busy", "caller_busy", "content_type", "invalid", "kafka_unavailable", "overloaded", "rate_limited",
	"read_rate_limited", "reads_busy", "too_large", "too_many_elements", "unauthenticated", "unreadable", "wrong_node"}

func (m *metrics) rejected(reason string, n int) {
	c, ok := m.rejectsBy[reason]
	if !ok {
		c = m.rejects.WithLabelValues(reason)
	}
	c.Add(float64(max(n, 1)))
}

// request counts a request of a door (faultline_gateway_requests_total).
func (m *metrics) request(door, method, code string) {
	k := [3]string{door, method, code}
	c, ok := m.reqs.Load(k)
	if !ok {
		c, _ = m.reqs.LoadOrStore(k, m.requests.WithLabelValues(door, method, code))
	}
	c.(prometheus.Counter).Inc()
}

// restRequest counts a REST request: method (one of restMethods or
// "other"), route pattern and HTTP status.
func (m *metrics) restRequest(method, route string, code int) {
	k := restReqKey{method, route, code}
	c, ok := m.restReqs.Load(k)
	if !ok {
		c, _ = m.restReqs.LoadOrStore(k, m.requests.WithLabelValues(doorREST, method+" "+route, strconv.Itoa(code)))
	}
	c.(prometheus.Counter).Inc()
}

// acceptedEvents counts n events of a cluster accepted by a method.
func (m *metrics) acceptedEvents(cluster, method string, n int) {
	k := [2]string{cluster, method}
	c, ok := m.acceptedBy.Load(k)
	if !ok {
		c, _ = m.acceptedBy.LoadOrStore(k, m.accepted.WithLabelValues(cluster, method))
	}
	c.(prometheus.Counter).Add(float64(n))
}
