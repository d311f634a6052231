package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/agents/preflight/gang"
	"github.com/faultline/faultline/agents/preflight/injection"
)

// Metrics are the injector's metrics (ADR-026).
type Metrics struct {
	injections *prometheus.CounterVec
	latency    prometheus.Histogram
}

// NewMetrics registers preflight_injection_total{result} and
// preflight_webhook_latency_seconds on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		injections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "preflight_injection_total",
			Help: "Admission requests by result: injected, unchanged, removed, no_gpu, no_check, excluded, ignored, denied, error, malformed."}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "preflight_webhook_latency_seconds",
			Help:    "Time to answer one AdmissionReview, from the request to the last byte written.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5}}),
	}
	if reg != nil {
		reg.MustRegister(m.injections, m.latency)
	}
	return m
}

// Handler answers AdmissionReviews for pod CREATE.
type Handler struct {
	cfg      *Config
	inj      *injection.Injector
	log      *slog.Logger
	m        *Metrics
	included []string
	excluded []string
}

// NewHandler builds the admission handler.
func NewHandler(cfg *Config, inj *injection.Injector, log *slog.Logger, m *Metrics) *Handler {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Handler{cfg: cfg, inj: inj, log: log, m: m, included: slices.Clone(cfg.Namespaces.Include), excluded: cfg.excluded()}
}

// reviewError is an AdmissionReview the handler cannot answer in kind.
func reviewError(w http.ResponseWriter, code int, format string, a ...any) {
	http.Error(w, "faultline-preflight webhook: "+fmt.Sprintf(format, a...), code)
}

// ServeHTTP implements the admission endpoint.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	result := "error"
	defer func() {
		h.m.injections.WithLabelValues(result).Inc()
		h.m.latency.Observe(time.Since(start).Seconds())
	}()
	if r.Method != http.MethodPost {
		result = "malformed"
		reviewError(w, http.StatusMethodNotAllowed, "POST an admission.k8s.io/v1 AdmissionReview, not %s", r.Method)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		result = "malformed"
		reviewError(w, http.StatusUnsupportedMediaType, "Content-Type %q is not application/json", r.Header.Get("Content-Type"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.Webhook.MaxBodyBytes))
	if err != nil {
		result = "malformed"
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			reviewError(w, http.StatusRequestEntityTooLarge, "AdmissionReview larger than %d bytes (webhook.max_body_bytes)", mbe.Limit)
			return
		}
		reviewError(w, http.StatusBadRequest, "reading the AdmissionReview: %v", err)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		result = "malformed"
		reviewError(w, http.StatusBadRequest, "malformed AdmissionReview: %v", err)
		return
	}
	switch {
	case review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview":
		result = "malformed"
		reviewError(w, http.StatusBadRequest, "malformed AdmissionReview: apiVersion %q kind %q, want admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind)
		return
	case review.Request == nil:
		result = "malformed"
		reviewError(w, http.StatusBadRequest, "malformed AdmissionReview: no request")
		return
	case review.Request.UID == "":
		result = "malformed"
		reviewError(w, http.StatusBadRequest, "malformed AdmissionReview: request.uid is empty")
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	result = h.admit(r.Context(), req, resp)
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		result = "error"
		reviewError(w, http.StatusInternalServerError, "encoding the response: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// admit fills resp and returns the result label.
func (h *Handler) admit(ctx context.Context, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) string {
	if req.Resource.Group != "" || req.Resource.Resource != "pods" || req.SubResource != "" || req.Operation != admissionv1.Create {
		return "ignored"
	}
	ns := req.Namespace
	if !slices.Contains(h.included, ns) || slices.Contains(h.excluded, ns) {
		return "excluded"
	}
	if len(req.Object.Raw) == 0 {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Message: "faultline-preflight webhook: request.object is empty"}
		return "malformed"
	}
	p, err := gang.DecodePod(req.Object.Raw)
	if err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Message: "faultline-preflight webhook: request.object is not a Pod: " + err.Error()}
		return "malformed"
	}
	if p.Namespace == "" {
		p.Namespace = ns
	}
	deadline := h.cfg.Webhook.Timeout - 500*time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, max(deadline, 500*time.Millisecond))
	defer cancel()
	res, err := h.inj.Mutate(cctx, p)
	if err != nil {
		who := p.Namespace + "/" + p.Name + p.GenerateName
		if h.cfg.Webhook.FailurePolicy == "Ignore" {
			h.log.Warn("cannot inject preflight checks; admitting without them (failure_policy Ignore)", "pod", who, "err", err)
			resp.Warnings = []string{"faultline-preflight: preflight checks not injected: " + err.Error()}
			return "error"
		}
		h.log.Warn("cannot inject preflight checks; denying (failure_policy Fail)", "pod", who, "err", err)
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError,
			Message: "faultline-preflight webhook: cannot inject preflight checks: " + err.Error()}
		return "denied"
	}
	if res.Patch != nil {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = res.Patch, &pt
	}
	if res.Outcome == "injected" {
		h.log.Debug("preflight checks injected", "pod", p.Namespace+"/"+p.Name+p.GenerateName, "checks", res.Injected, "gang", res.Gang, "skipped", res.Skipped)
	}
	return res.Outcome
}
