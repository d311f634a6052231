package quarantine

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	decisions    *prometheus.CounterVec
	held         *prometheus.CounterVec
	deferred     *prometheus.CounterVec
	apiErrors    *prometheus.CounterVec
	conflicts    *prometheus.CounterVec
	breakerTrips *prometheus.CounterVec
	breakerOpen  *prometheus.GaugeVec
	// selectorUnmatched is 1 while quarantine.breaker.gpu_node_selector
	// matches no node of the cluster (the breaker counts all its nodes).
	selectorUnmatched *prometheus.GaugeVec
	clusterSlow       *prometheus.GaugeVec
	cacheHits         *prometheus.CounterVec
	warnCache         *prometheus.CounterVec
	eventsMerged      *prometheus.CounterVec
	eventsDropped     *prometheus.CounterVec
	eventsFailed      *prometheus.CounterVec
	ruleErrors        *prometheus.CounterVec
	stateTrimmed      *prometheus.CounterVec
	// faultsDropped counts standing faults dropped to keep a node's state
	// bounded (State.trim, State.Fit).
	faultsDropped *prometheus.CounterVec
	// overridesIgnored counts events whose overrides were ignored (not an
	// operator's).
	overridesIgnored *prometheus.CounterVec
	// stale counts unhealthy events not acted on for their age
	// (Config.MaxEventAge).
	stale *prometheus.CounterVec
	// retryTopic is 1 for each configured cluster, labelled with its
	// retry topic (RetryTopic): the retry consumer's lag is by topic, and
	// a cluster whose name is not a DNS label has a hashed topic, so
	// alerts join the lag to the cluster by this series.
	retryTopic *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_decisions_total", Help: "Quarantine decisions by kind and outcome."}, []string{"cluster", "kind", "outcome"}),
		held:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_held_total", Help: "Quarantines held back by the circuit breaker."}, []string{"cluster"}),
		warnCache:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_warnings_from_cache_total", Help: "Non-fatal events no rule set matched, decided from the node watch without reading the node."}, []string{"cluster"}),
		eventsMerged:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_node_events_merged_total", Help: "Kubernetes Events not created because the node already got one of the same reason within node_event_interval."}, []string{"cluster"}),
		eventsDropped:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_node_events_dropped_total", Help: "Kubernetes Events dropped because the cluster's Event queue was full."}, []string{"cluster"}),
		eventsFailed:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_node_events_failed_total", Help: "Kubernetes Events the API refused or did not answer (best effort: not retried)."}, []string{"cluster"}),
		deferred:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_deferred_total", Help: "Records deferred to the retry topic because their cluster was unreachable, failing or slow."}, []string{"cluster"}),
		clusterSlow:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_quarantine_cluster_slow", Help: "1 while the cluster's API writes take longer than quarantine.slow_cluster on average, its records deferred to its retry topic for it."}, []string{"cluster"}),
		apiErrors:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_api_errors_total", Help: "Retriable Kubernetes API errors."}, []string{"cluster"}),
		conflicts:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_conflicts_total", Help: "Node updates retried after a resourceVersion conflict."}, []string{"cluster"}),
		breakerTrips:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_breaker_trips_total", Help: "Times the circuit breaker opened."}, []string{"cluster"}),
		breakerOpen:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_quarantine_breaker_open", Help: "1 while the cluster's circuit breaker holds new quarantines."}, []string{"cluster"}),
		selectorUnmatched: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_quarantine_breaker_selector_unmatched", Help: "1 while quarantine.breaker.gpu_node_selector matches no node of the cluster: the circuit breaker counts all its nodes instead."}, []string{"cluster"}),
		cacheHits:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_recoveries_from_cache_total", Help: "Healthy events decided from the node watch without an API request (nothing standing)."}, []string{"cluster"}),
		stateTrimmed:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_state_trimmed_total", Help: "Node state writes that compacted or dropped old faults to stay within the annotation budget."}, []string{"cluster"}),
		faultsDropped:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_faults_dropped_total", Help: "Standing faults dropped to keep a node's state bounded (more than 64, or over the annotation budget); a cordoning or tainting one holds the node quarantined until a manual uncordon."}, []string{"cluster"}),
		ruleErrors:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_rule_errors_total", Help: "Rule expressions that failed on an event (missing key, type error, cost limit); the rule set did not match."}, []string{"rule"}),
		overridesIgnored:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_overrides_ignored_total", Help: "Events whose quarantineOverrides/drainOverrides were ignored because no operator credential sent them."}, []string{"cluster"}),
		stale:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_stale_events_total", Help: "Unhealthy events not acted on because the gateway received them longer ago than quarantine.max_event_age (a replay or a long delay)."}, []string{"cluster"}),
		retryTopic:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_quarantine_retry_topic", Help: "1 for each configured cluster, with the retry topic its deferred records wait on (a name that is not a DNS label has a hashed topic)."}, []string{"cluster", "topic"}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.held, m.deferred, m.apiErrors, m.conflicts, m.breakerTrips, m.breakerOpen, m.selectorUnmatched, m.clusterSlow, m.cacheHits, m.warnCache, m.eventsMerged, m.eventsDropped, m.eventsFailed, m.ruleErrors, m.overridesIgnored, m.stateTrimmed, m.faultsDropped, m.stale, m.retryTopic)
	}
	return m
}
