package app

import (
	"embed"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/runnel-dev/runnel/assignor"
)

// web holds the status page's template: HTML, a little CSS and a script,
// no build step (status_page.go).
//
//go:embed web/index.html
var web embed.FS

// httpMux returns the worker's HTTP handlers (docs/http-api.md): /healthz,
// /readyz, /metrics, the status page at /, /api/status, /api/assignment,
// /api/tables/{table}/{key} (tables_http.go), and /debug/pprof/ when
// Config.Pprof is set. Every JSON key is snake_case.
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
	w.serveTables(mux) // GET /api/tables/{table}/{key} (tables_http.go)
	mux.HandleFunc("GET /api/assignment", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, struct {
			Assignment AssignmentView `json:"assignment"`
			Tasks      []TaskStatus   `json:"tasks"`
		}{viewAssignment(w.Assignment()), w.Tasks()})
	})
	mux.HandleFunc("GET /api/status", func(rw http.ResponseWriter, _ *http.Request) { writeJSON(rw, w.Status()) })
	mux.HandleFunc("GET /{$}", w.servePage) // status_page.go
	if w.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func writeJSON(rw http.ResponseWriter, v any) {
	rw.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(rw)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// AssignmentView is assignor.Assignment as the HTTP API shows it (snake_case
// keys). Maps are topic -> sorted partitions.
type AssignmentView struct {
	Generation int32  `json:"generation"`
	MemberID   string `json:"member_id"`
	LeaderID   string `json:"leader_id"`
	Leader     bool   `json:"leader"`
	// Actives include the changelog partitions co-partitioned with the
	// source partitions; Standbys and Warmups are changelog partitions this
	// member replicates; Pending are actives withheld until their previous
	// owner revoked them (cooperative protocol).
	Actives  map[string][]int32 `json:"actives"`
	Standbys map[string][]int32 `json:"standbys"`
	Warmups  map[string][]int32 `json:"warmups"`
	Globals  map[string][]int32 `json:"globals"`
	Pending  map[string][]int32 `json:"pending"`
	// URLs maps topic -> partition -> HTTP address of the member holding the
	// active.
	URLs        map[string]map[int32]string `json:"urls"`
	URLsOmitted bool                        `json:"urls_omitted"`
}

func viewAssignment(a assignor.Assignment) AssignmentView {
	nonNil := func(m map[string][]int32) map[string][]int32 {
		if m == nil {
			return map[string][]int32{}
		}
		return m
	}
	return AssignmentView{Generation: a.Generation, MemberID: a.MemberID, LeaderID: a.LeaderID, Leader: a.Leader,
		Actives: nonNil(a.Actives), Standbys: nonNil(a.Standbys), Warmups: nonNil(a.Warmups), Globals: nonNil(a.Globals),
		Pending: nonNil(a.Pending), URLs: a.URLs, URLsOmitted: a.URLsOmitted}
}

// Status is what the status page shows of one worker (GET /api/status).
type Status struct {
	App       string `json:"app"`
	ProcessID string `json:"process_id"`
	HTTPAddr  string `json:"http_addr"`
	// At is when the status was taken.
	At    time.Time `json:"at"`
	Ready bool      `json:"ready"`
	// Members are the consumer group's members (DescribeGroups, cached:
	// Broker); empty with MembersError set when the coordinator did not
	// answer.
	Members      []Member       `json:"members"`
	MembersError string         `json:"members_error,omitempty"`
	Assignment   AssignmentView `json:"assignment"`
	Tasks        []TaskStatus   `json:"tasks"`
	// Lag is the consumer lag of each source partition this worker claims;
	// StandbyLag that of each changelog partition it follows.
	Lag        []PartitionLag  `json:"lag"`
	StandbyLag []StandbyLag    `json:"standby_lag"`
	Restores   []RestoreStatus `json:"restores"`
	// TablePartitions are the table partitions this worker holds a copy
	// of, with their role (active, restoring, standby, warmup, pending) and
	// restored offset against the changelog's end.
	TablePartitions []TablePartitionStatus `json:"table_partitions"`
	// Rebalances are the latest rebalances this worker took part in, newest
	// first.
	Rebalances  []RebalanceEvent   `json:"rebalances"`
	DeadLetters []DeadLetterStatus `json:"dead_letters"`
	// Processed, Retried and DeadLettered are this worker's totals (Worker
	// methods of the same names).
	Processed    int64 `json:"processed"`
	Retried      int64 `json:"retried"`
	DeadLettered int64 `json:"dead_lettered"`
	// ProcessedPerSecond, RetriedPerSecond and DeadLetteredPerSecond are
	// the totals' rates over the last RateWindowMS (about 10 s; 0 in the
	// worker's first second), from samples the worker takes of its counters
	// once a second.
	ProcessedPerSecond    float64 `json:"processed_per_second"`
	RetriedPerSecond      float64 `json:"retried_per_second"`
	DeadLetteredPerSecond float64 `json:"dead_lettered_per_second"`
	RateWindowMS          float64 `json:"rate_window_ms"`
	// Broker says how old the answers from the brokers are (Members and the
	// end offsets), which are cached.
	Broker BrokerAnswers `json:"broker"`
}

// Member is one member of the consumer group.
type Member struct {
	MemberID   string `json:"member_id"`
	ClientID   string `json:"client_id"`
	ClientHost string `json:"client_host"`
	// Partitions are the source partitions the member was assigned (topic ->
	// partitions); URL is its HTTP address: the one it published when it
	// joined (assignor.MemberURL), else the assignment's address of the
	// active of one of its partitions.
	Partitions map[string][]int32 `json:"partitions"`
	URL        string             `json:"url,omitempty"`
	Self       bool               `json:"self"`

	published string // the URL of the member's subscription (describeMembers)
}

// RestoreStatus is the latest progress report of an active restore of one
// changelog partition on this worker.
type RestoreStatus struct {
	Table     string  `json:"table"`
	Partition int32   `json:"partition"`
	Records   int64   `json:"records"`
	Position  int64   `json:"position"`
	Target    int64   `json:"target"`
	Remaining int64   `json:"remaining"`
	Rate      float64 `json:"records_per_second"`
	ElapsedMS float64 `json:"elapsed_ms"`
	Done      bool    `json:"done"`
}

// DeadLetterStatus is one agent's dead-letter topic and the dead letters this
// worker wrote to it.
type DeadLetterStatus struct {
	Agent   string `json:"agent"`
	Topic   string `json:"topic"`
	Written int64  `json:"written"`
}

// Status returns what the status page shows: the group's members, this
// worker's assignment, tasks, lags, restores, recent rebalances, dead
// letters, and its totals with their rates. What comes from the brokers (the
// members, the changelogs' end offsets) is cached: refreshed when older than
// 1 s, waiting at most 300 ms for the brokers, so that Status answers at once
// when they are slow; Broker says how old those answers are.
func (w *Worker) Status() Status {
	a := w.Assignment()
	view := w.answers.get(w.heldCopies(a))
	now := time.Now()
	hw := view.snap.highwater
	tps := w.tablePartitions(a, hw)
	r := w.rates.rates()
	s := Status{App: w.app.id, ProcessID: w.procID, HTTPAddr: w.cfg.HTTPAddr, At: now.UTC(), Ready: w.Ready(),
		Assignment: viewAssignment(a), Tasks: w.tasksWith(a, tps, hw), Lag: w.metrics.lags(), StandbyLag: w.standbyLags(a, hw),
		Processed: w.Processed(), Retried: w.Retried(), DeadLettered: w.DeadLettered(),
		ProcessedPerSecond: r.processed, RetriedPerSecond: r.retried, DeadLetteredPerSecond: r.deadLettered,
		RateWindowMS: ms(r.window), TablePartitions: tps, Broker: answersOf(view, now), Members: []Member{}}
	switch sn := view.snap; {
	case sn == nil:
		s.MembersError = fmt.Sprintf("describe group %s: %s", w.app.id, s.Broker.Error)
	case sn.membersErr != nil:
		s.MembersError = sn.membersErr.Error()
	default:
		s.Members = membersAt(sn.members, a)
	}
	m := w.metrics
	m.mu.Lock()
	for k, pr := range m.restores {
		if !holdsCopy(a, k.table, k.p) {
			continue // moved away since (forgetRestores drops it at the assignment; this one reported after)
		}
		left := max(pr.Target-pr.Position, 0)
		if pr.Done {
			left = 0
		}
		s.Restores = append(s.Restores, RestoreStatus{Table: w.tableOfChangelog(k.table), Partition: k.p, Records: pr.Records,
			Position: pr.Position, Target: pr.Target, Remaining: left, Rate: pr.Rate,
			ElapsedMS: ms(pr.Elapsed), Done: pr.Done})
	}
	s.Rebalances = slices.Clone(m.history)
	byAgent := m.dlqByAgent
	for _, r := range w.app.agents {
		s.DeadLetters = append(s.DeadLetters, DeadLetterStatus{Agent: r.Name(), Topic: w.app.DeadLetterTopic(r.Name()), Written: byAgent[r.Name()]})
	}
	m.mu.Unlock()
	slices.Reverse(s.Rebalances)
	sort.Slice(s.Restores, func(i, j int) bool {
		if s.Restores[i].Table != s.Restores[j].Table {
			return s.Restores[i].Table < s.Restores[j].Table
		}
		return s.Restores[i].Partition < s.Restores[j].Partition
	})
	if s.Restores == nil {
		s.Restores = []RestoreStatus{}
	}
	if s.Rebalances == nil {
		s.Rebalances = []RebalanceEvent{}
	}
	return s
}

// holdsCopy reports whether a gives this worker a copy of partition p of
// changelog topic: active, standby, warm-up or pending (partState's roles
// other than RoleNone).
func holdsCopy(a assignor.Assignment, topic string, p int32) bool {
	for _, m := range []map[string][]int32{a.Actives, a.Standbys, a.Warmups, a.Pending} {
		if slices.Contains(m[topic], p) {
			return true
		}
	}
	return false
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// listenAddr is the address the HTTP server binds: addr, with localhost
// when addr names no host (":8080"), so that a worker exposes its API to
// other hosts only when told to.
func listenAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}
