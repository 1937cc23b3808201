package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/gateway/store"
)

type metrics struct {
	policyVersions     prometheus.Counter
	policyLoadFailures prometheus.Counter
	logsReceived       prometheus.Counter
	logsDropped        prometheus.Counter
	connections        *prometheus.CounterVec
	rpcDuration        *prometheus.HistogramVec
	refused            *prometheus.CounterVec

	mu      sync.Mutex
	reasons map[string]bool // reason label values in use
}

// maxReasons bounds the reason label's values; supervisors push reason
// codes from a short fixed list, so more means a misbehaving one.
const maxReasons = 64

var reasonCode = regexp.MustCompile(`^[a-z0-9_]{1,48}$`)

func newMetrics(reg prometheus.Registerer, st store.Store) (*metrics, error) {
	m := &metrics{
		policyVersions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_gateway_policy_versions_total",
			Help: "Policy versions stored (sandbox creations and policy sets).",
		}),
		policyLoadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_gateway_policy_load_failures_total",
			Help: "Policy versions supervisors reported as FAILED to load.",
		}),
		logsReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_gateway_log_lines_received_total",
			Help: "Log lines and audit events pushed by supervisors.",
		}),
		logsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_gateway_log_lines_dropped_total",
			Help: "Log lines supervisors reported dropping before they reached the gateway.",
		}),
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_gateway_connections_total",
			Help: "Connections supervisors audited as allowed or denied, by reason.",
		}, []string{"decision", "reason"}),
		reasons: map[string]bool{},
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_gateway_rpc_duration_seconds",
			Help:    "RPC latency by procedure and result code (streams: their whole life).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"procedure", "code"}),
		// By code only: the procedure of a refused call is whatever URL
		// path its sender chose.
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_gateway_rpc_refused_total",
			Help: "Calls refused before reaching a procedure (no valid credential, or one that may not call it), by code.",
		}, []string{"code"}),
	}
	for _, c := range []prometheus.Collector{m.policyVersions, m.policyLoadFailures, m.logsReceived, m.logsDropped, m.connections, m.rpcDuration, m.refused, phaseCollector{st}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// phaseCollector counts sandboxes by phase from the store at each scrape,
// so the figure cannot drift from the truth.
type phaseCollector struct{ st store.Store }

var phaseDesc = prometheus.NewDesc("corral_gateway_sandboxes", "Sandboxes by phase.", []string{"phase"}, nil)

func (c phaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- phaseDesc }

func (c phaseCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sbs, err := c.st.ListSandboxes(ctx, nil)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(phaseDesc, err)
		return
	}
	counts := map[store.Phase]int{store.PhaseProvisioning: 0, store.PhaseReady: 0, store.PhaseExited: 0, store.PhaseFailed: 0}
	for _, sb := range sbs {
		counts[sb.Phase]++
	}
	for p, n := range counts {
		ch <- prometheus.MustNewConstMetric(phaseDesc, prometheus.GaugeValue, float64(n), string(p))
	}
}

func (m *metrics) interceptor() connect.Interceptor { return metricsInterceptor{m} }

type metricsInterceptor struct{ m *metrics }

func (i metricsInterceptor) observe(procedure string, start time.Time, err error) {
	code := "ok"
	var ce *connect.Error
	if errors.As(err, &ce) {
		code = ce.Code().String()
	} else if err != nil {
		code = connect.CodeUnknown.String()
	}
	i.m.rpcDuration.WithLabelValues(procedure, code).Observe(time.Since(start).Seconds())
}

func (i metricsInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		i.observe(req.Spec().Procedure, start, err)
		return resp, err
	}
}

func (i metricsInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i metricsInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		i.observe(conn.Spec().Procedure, start, err)
		return err
	}
}

// observeAudit counts the connection decisions among pushed audit
// entries.
func (m *metrics) observeAudit(entries []store.LogEntry) {
	for _, e := range entries {
		var decision string
		switch {
		case e.Source != "audit":
			continue
		case e.Event == audit.NetConnectAllowed:
			decision = "allowed"
		case e.Event == audit.NetConnectDenied:
			decision = "denied"
		default:
			continue
		}
		var f struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(e.Fields, &f) // no reason is a reason too
		m.connections.WithLabelValues(decision, m.reasonLabel(f.Reason)).Inc()
	}
}

func (m *metrics) reasonLabel(r string) string {
	if r == "" {
		return "none"
	}
	if !reasonCode.MatchString(r) {
		return "other"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.reasons[r] {
		if len(m.reasons) >= maxReasons {
			return "other"
		}
		m.reasons[r] = true
	}
	return r
}
