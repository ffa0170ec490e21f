package app

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpMux returns the worker's HTTP handlers: /healthz, /readyz, /metrics,
// /api/assignment and /api/tables/{table}/{key} (global_http.go).
func (w *Worker) httpMux() *http.ServeMux {
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
	return mux
}
