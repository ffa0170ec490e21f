package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are one worker's Prometheus collectors (a registry per worker, so
// that several workers in one process, as in dev mode, do not collide).
type metrics struct {
	reg       *prometheus.Registry
	committed *prometheus.CounterVec
	restored  *prometheus.CounterVec

	restarts        *prometheus.CounterVec
	taskTransitions *prometheus.CounterVec
	cycleRecords    prometheus.Counter
	cycleSeconds    prometheus.Histogram
	txn             txnMetrics
}

// txnMetrics are the ExactlyOnce transactions' collectors (txn.go).
type txnMetrics struct {
	commits, aborts prometheus.Counter
	seconds         prometheus.Histogram
}

func newTxnMetrics(reg *prometheus.Registry) txnMetrics {
	t := txnMetrics{
		commits: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_transactions_committed_total",
			Help: "ExactlyOnce: transactions committed (one per worker commit cycle)."}),
		aborts: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_transactions_aborted_total",
			Help: "ExactlyOnce: transactions aborted (every partition then restarts from its committed offsets)."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnel_transaction_commit_seconds",
			Help: "ExactlyOnce: time to add the offsets to a transaction and commit it.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
	}
	reg.MustRegister(t.commits, t.aborts, t.seconds)
	return t
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(),
		committed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runnel_records_advanced_total",
			Help: "Source records advanced (resolved by every agent and marked for commit)."}, []string{"topic"}),
		restored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runnel_restore_records_total",
			Help: "Changelog records replayed into local stores by active restores."}, []string{"table"}),
	}
	m.cycleRecords = prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_cycle_changelog_records_total",
		Help: "Changelog records written by commit cycles (one per dirty key per cycle)."})
	m.cycleSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnel_cycle_duration_seconds",
		Help: "Duration of commit cycles that wrote records: cut, flush, commit, apply.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runnel_partition_restarts_total",
		Help: "Partition restarts in place after a failed record (redelivery from the last commit point)."}, []string{"topic"})
	m.taskTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runnel_task_transitions_total",
		Help: "Task state transitions, by the state entered."}, []string{"to"})
	m.reg.MustRegister(m.committed, m.restored, m.restarts, m.taskTransitions, m.cycleRecords, m.cycleSeconds)
	m.txn = newTxnMetrics(m.reg)
	return m
}

// serveHTTP serves /healthz, /readyz, /metrics and /api/assignment on addr.
func (w *Worker) serveHTTP(addr string) (func() error, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.Ready() {
			http.Error(rw, "restoring", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.metrics.reg, promhttp.HandlerOpts{}))
	w.serveTables(mux) // GET /api/tables/{table}/{key} (global_http.go)
	mux.HandleFunc("GET /api/assignment", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(struct {
			Assignment any          `json:"assignment"`
			Tasks      []TaskStatus `json:"tasks"`
		}{w.Assignment(), w.Tasks()})
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	w.log.Info("http listening", "addr", ln.Addr().String())
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	}, nil
}

func joinErrors(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	var m *multierror.Error
	for _, e := range errs {
		m = multierror.Append(m, e)
	}
	return m
}

// errEmbedded is returned when a worker is pointed at "embedded" outside dev mode.
var errEmbedded = errors.New(`brokers "embedded" start an in-process broker only in dev mode; run "dev", or point --brokers at a Kafka cluster`)

func resolveBrokers(b []string) ([]string, error) {
	if len(b) == 0 {
		return nil, errors.New("no brokers configured (RUNNEL_BROKERS or --brokers)")
	}
	if len(b) == 1 && b[0] == "embedded" {
		return nil, errEmbedded
	}
	return b, nil
}
