package app

import (
	"encoding/json"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// queryWorker is a worker that was never run: two tables (string and int64
// keys, 3 partitions, memory stores), the assignment a, no broker. It answers
// table queries from what the assignment and its partition lifecycles say.
func queryWorker(t *testing.T, a assignor.Assignment) (*Worker, *tableRuntime) {
	t.Helper()
	ap := New("q", WithHTTPAddr("127.0.0.1:18080"), WithLogger(slog.New(slog.DiscardHandler)))
	counts := table.New(ap, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(3))
	ids := table.New(ap, "ids", codec.DecimalInt64(), codec.String(), table.Partitions(3))
	w := &Worker{app: ap, cfg: ap.cfg, log: ap.cfg.Logger, assignment: a}
	for _, d := range []table.Def{counts, ids} {
		st := stores.NewMemory()
		w.tables = append(w.tables, &tableRuntime{def: d, parts: 3, store: st, state: tablestate.NewState(d, 3, st, nil)})
	}
	return w, w.tables[0]
}

// ask sends GET path (with header h) to w's table handler.
func ask(t *testing.T, w *Worker, path string, h http.Header) (*httptest.ResponseRecorder, TableAnswer) {
	t.Helper()
	mux := http.NewServeMux()
	w.serveTables(mux)
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	var ans TableAnswer
	if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, rec.Code, rec.Body.String(), err)
	}
	return rec, ans
}

// Every case in which the key may exist is a typed refusal, never a 404:
// the worker's assignment decides which, the key's partition comes from the
// table's partitioner whatever the owner map holds.
func TestTableQueryRefusalsByAssignment(t *testing.T) {
	const key = "k-7"
	p := kafka.PartitionFor([]byte(key), 3)
	w, ct := queryWorker(t, assignor.Assignment{Generation: 7})
	topic := ct.state.Topic()
	path := "/api/tables/counts/" + key
	check := func(name string, rec *httptest.ResponseRecorder, ans TableAnswer, code int, reason, role string) {
		t.Helper()
		if rec.Code != code || ans.Reason != reason || ans.Found || ans.Partition != p || ans.Generation != 7 {
			t.Fatalf("%s: %d %+v; want %d reason %q partition %d generation 7", name, rec.Code, ans, code, reason, p)
		}
		if got := rec.Header().Get(RoleHeader); got != role {
			t.Fatalf("%s: %s %q, want %q", name, RoleHeader, got, role)
		}
		if rec.Header().Get(PartitionHeader) != strconv.Itoa(int(p)) || rec.Header().Get(GenerationHeader) != "7" {
			t.Fatalf("%s: headers %v, want partition %d generation 7", name, rec.Header(), p)
		}
		if code >= 500 && rec.Header().Get("Retry-After") == "" {
			t.Fatalf("%s: %d without Retry-After", name, code)
		}
	}

	// No owner known (the worker has not been assigned yet, or the map
	// has no entry for the partition): rebalancing.
	rec, ans := ask(t, w, path, nil)
	check("no owner", rec, ans, http.StatusServiceUnavailable, ReasonRebalancing, RoleNone)

	// The URL map names this worker, the assignment does not make it
	// active: the two disagree mid-rebalance.
	w.assignment.URLs = map[string]map[int32]string{topic: {p: w.cfg.HTTPAddr}}
	rec, ans = ask(t, w, path, nil)
	check("map names self", rec, ans, http.StatusServiceUnavailable, ReasonRebalancing, RoleNone)

	// Withheld until its owner revoked it (cooperative protocol).
	w.assignment.Pending = map[string][]int32{topic: {p}}
	rec, ans = ask(t, w, path, nil)
	check("pending", rec, ans, http.StatusServiceUnavailable, ReasonRebalancing, RolePending)
	w.assignment.Pending = nil

	// Active here, the claim has not restored it yet.
	w.assignment.Actives = map[string][]int32{topic: {p}}
	rec, ans = ask(t, w, path, nil)
	check("restoring, no gate", rec, ans, http.StatusServiceUnavailable, ReasonRestoring, RoleRestoring)
	w.parts = &tableParts{w: w, parts: map[restoreKey]*tablePart{{"counts", p}: {gate: &restoreGate{done: make(chan struct{})}}}}
	rec, ans = ask(t, w, path, nil)
	check("restoring", rec, ans, http.StatusServiceUnavailable, ReasonRestoring, RoleRestoring)
	// consistency=any cannot measure the copy without a broker: still
	// restoring, never a read of an unmeasured copy.
	rec, ans = ask(t, w, path+"?consistency=any&maxLag=1000000", nil)
	check("restoring, any", rec, ans, http.StatusServiceUnavailable, ReasonRestoring, RoleRestoring)

	// Restored: the store answers; absent is a 404 with no reason.
	close(w.parts.parts[restoreKey{"counts", p}].gate.done)
	b := &stores.Batch{Offset: 12}
	b.Put([]byte(key), []byte("41"))
	if err := ct.store.Apply(p, b); err != nil {
		t.Fatal(err)
	}
	rec, ans = ask(t, w, path, nil)
	if rec.Code != http.StatusOK || !ans.Found || ans.Value != float64(41) || ans.Role != RoleActive || rec.Header().Get(LagHeader) != "0" {
		t.Fatalf("restored active: %d %+v %v, want 200 value 41 role active lag 0", rec.Code, ans, rec.Header())
	}
	var absent string
	for i := 0; absent == ""; i++ {
		if k := "absent-" + strconv.Itoa(i); kafka.PartitionFor([]byte(k), 3) == p {
			absent = k
		}
	}
	rec, ans = ask(t, w, "/api/tables/counts/"+absent, nil)
	if rec.Code != http.StatusNotFound || ans.Found || ans.Reason != "" || ans.Role != RoleActive {
		t.Fatalf("absent key on the active: %d %+v, want 404 found=false, no reason", rec.Code, ans)
	}

	// Not active here, an owner is known.
	w.assignment.Actives = nil
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := dead.Listener.Addr().String()
	dead.Close()
	w.assignment.URLs = map[string]map[int32]string{topic: {p: deadAddr}}
	rec, ans = ask(t, w, path+"?forward=0", nil)
	check("forward=0", rec, ans, http.StatusServiceUnavailable, ReasonNotOwner, RoleNone)
	if ans.Owner != deadAddr {
		t.Fatalf("forward=0: owner %q, want %q", ans.Owner, deadAddr)
	}
	rec, ans = ask(t, w, path, http.Header{HopsHeader: {"1"}})
	check("hop used", rec, ans, http.StatusServiceUnavailable, ReasonNotOwner, RoleNone)
	rec, ans = ask(t, w, path, http.Header{ForwardedHeader: {"1"}})
	check("hop used (earlier version's header)", rec, ans, http.StatusServiceUnavailable, ReasonNotOwner, RoleNone)
	rec, ans = ask(t, w, path, nil)
	check("owner unreachable", rec, ans, http.StatusBadGateway, ReasonNotOwner, RoleNone)

	// A reachable owner gets the query once, with the hop counted, and its
	// answer comes back with its headers.
	var hops []string
	owner := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		hops = append(hops, r.Header.Get(HopsHeader))
		rw.Header().Set(RoleHeader, RoleActive)
		rw.Header().Set(GenerationHeader, "8")
		rw.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(rw).Encode(TableAnswer{Table: "counts", Key: key, Partition: p, Found: true, Value: 5, Role: RoleActive})
	}))
	defer owner.Close()
	w.assignment.URLs[topic][p] = owner.Listener.Addr().String()
	rec, ans = ask(t, w, path, nil)
	if rec.Code != http.StatusOK || !ans.Found || rec.Header().Get(RoleHeader) != RoleActive || rec.Header().Get(GenerationHeader) != "8" ||
		rec.Header().Get(ServedByHeader) != owner.Listener.Addr().String() || len(hops) != 1 || hops[0] != "1" {
		t.Fatalf("forwarded: %d %+v %v, owner saw hops %v; want 200 from the owner, one forward with %s: 1", rec.Code, ans, rec.Header(), hops, HopsHeader)
	}
}

// Bad input is told apart from a missing key: an unknown table is a 404 with
// a reason (a missing key has none), an unparsable key or a bad consistency
// or maxLag a 400.
func TestTableQueryBadInput(t *testing.T) {
	w, _ := queryWorker(t, assignor.Assignment{Generation: 3})
	for _, c := range []struct {
		path   string
		code   int
		reason string
	}{
		{"/api/tables/no-such/k", http.StatusNotFound, ReasonUnknownTable},
		{"/api/tables/ids/not-a-number", http.StatusBadRequest, ReasonBadKey},
		{"/api/tables/counts/k?consistency=eventual", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts/k?consistency=any", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts/k?consistency=any&maxLag=-1", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts/k?consistency=any&maxLag=ten", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts/k?maxLag=10", http.StatusBadRequest, ReasonBadRequest},
	} {
		rec, ans := ask(t, w, c.path, nil)
		if rec.Code != c.code || ans.Reason != c.reason || ans.Error == "" || ans.Found {
			t.Errorf("GET %s = %d %+v, want %d reason %q with an error", c.path, rec.Code, ans, c.code, c.reason)
		}
		if rec.Header().Get(GenerationHeader) != "3" {
			t.Errorf("GET %s: %s %q, want 3", c.path, GenerationHeader, rec.Header().Get(GenerationHeader))
		}
	}
	// A key the codec parses is not bad input: ids is int64-keyed.
	if rec, ans := ask(t, w, "/api/tables/ids/42", nil); rec.Code != http.StatusServiceUnavailable || ans.Reason != ReasonRebalancing {
		t.Errorf("GET ids/42 = %d %+v, want 503 rebalancing (no owner known)", rec.Code, ans)
	}
}

// Two workers whose assignments each name the other as the key's owner (views
// that disagree mid-rebalance) cannot bounce a query: the first forwards it
// once with Runnel-Hops: 1, the second answers 503 not-owner without
// forwarding, and each sees the query exactly once. The same holds for a
// scan page.
func TestForwardLoopImpossible(t *testing.T) {
	const key = "k-7"
	p := kafka.PartitionFor([]byte(key), 3)
	var servers [2]*httptest.Server
	var seen [2][]string
	var workers [2]*Worker
	for i := range workers {
		w, _ := queryWorker(t, assignor.Assignment{Generation: 9})
		workers[i] = w
		mux := http.NewServeMux()
		w.serveTables(mux)
		servers[i] = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			seen[i] = append(seen[i], r.URL.Path+" hops="+r.Header.Get(HopsHeader))
			mux.ServeHTTP(rw, r)
		}))
		defer servers[i].Close()
	}
	for i, w := range workers {
		other := servers[1-i].Listener.Addr().String()
		w.cfg.HTTPAddr = servers[i].Listener.Addr().String()
		w.assignment.URLs = map[string]map[int32]string{w.tables[0].state.Topic(): {0: other, 1: other, 2: other}}
	}
	resp, err := http.Get(servers[0].URL + "/api/tables/counts/" + key)
	if err != nil {
		t.Fatal(err)
	}
	var ans TableAnswer
	err = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || ans.Reason != ReasonNotOwner || ans.Partition != p ||
		resp.Header.Get(ServedByHeader) != servers[1].Listener.Addr().String() {
		t.Fatalf("point read: %d %+v %v, want 503 not-owner from the second worker", resp.StatusCode, ans, err)
	}
	if len(seen[0]) != 1 || len(seen[1]) != 1 || seen[1][0] != "/api/tables/counts/"+key+" hops=1" {
		t.Fatalf("point read: the workers saw %v and %v, want one request each, the second with hops=1", seen[0], seen[1])
	}
	seen = [2][]string{}
	resp, err = http.Get(servers[0].URL + "/api/tables/counts?prefix=k")
	if err != nil {
		t.Fatal(err)
	}
	var page ScanPage
	err = json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || page.Reason != ReasonNotOwner {
		t.Fatalf("scan: %d %+v %v, want 503 not-owner", resp.StatusCode, page, err)
	}
	if len(seen[0]) != 1 || len(seen[1]) != 1 {
		t.Fatalf("scan: the workers saw %v and %v, want one request each", seen[0], seen[1])
	}
}
