package fedsched

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Metrics on kube-scheduler's own /metrics endpoint (legacyregistry), one series per result:
//
//	fedsched_score_plugin_requests_total{mode, result}   mode: scores, weights, or filter (PreFilter's
//	                                                     FilterNodes); result: ok, or the fallback reason
//	fedsched_score_plugin_request_duration_seconds{mode} the RPC's round trip
var (
	requestsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "fedsched",
		Subsystem:      "score_plugin",
		Name:           "requests_total",
		Help:           "RPCs to the fedsched agent by mode and result (ok, or why the fallback scored the pod).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"mode", "result"})
	requestDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Namespace:      "fedsched",
		Subsystem:      "score_plugin",
		Name:           "request_duration_seconds",
		Help:           "Round trip of the RPCs to the fedsched agent.",
		Buckets:        metrics.ExponentialBuckets(0.0005, 2, 12), // 0.5 ms .. 1 s
		StabilityLevel: metrics.ALPHA,
	}, []string{"mode"})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(requestsTotal, requestDuration)
	})
}
