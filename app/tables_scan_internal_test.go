package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
)

// activeWorker is queryWorker active for every partition of counts, each
// restored, with keys k-00…k-(n-1) valued by their index.
func activeWorker(t *testing.T, n int) (*Worker, *tableRuntime) {
	t.Helper()
	w, ct := queryWorker(t, assignor.Assignment{Generation: 4})
	topic := ct.state.Topic()
	w.assignment.Actives = map[string][]int32{topic: {0, 1, 2}}
	w.parts = &tableParts{w: w, parts: map[restoreKey]*tablePart{}}
	for p := int32(0); p < 3; p++ {
		g := &restoreGate{done: make(chan struct{})}
		close(g.done)
		w.parts.parts[restoreKey{"counts", p}] = &tablePart{gate: g}
	}
	batches := map[int32]*stores.Batch{}
	for i := range n {
		k := fmt.Sprintf("k-%02d", i)
		p := kafka.PartitionFor([]byte(k), 3)
		if batches[p] == nil {
			batches[p] = &stores.Batch{Offset: 1}
		}
		batches[p].Put([]byte(k), []byte(strconv.Itoa(i)))
	}
	for p, b := range batches {
		if err := ct.store.Apply(p, b); err != nil {
			t.Fatal(err)
		}
	}
	return w, ct
}

func scanPage(t *testing.T, w *Worker, path string) (*httptest.ResponseRecorder, ScanPage) {
	t.Helper()
	mux := http.NewServeMux()
	w.serveTables(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var page ScanPage
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, rec.Code, rec.Body.String(), err)
	}
	return rec, page
}

// A scan pages through every key once in byte order, each with its
// partition; prefix and from/to bound it.
func TestScanPagesLocal(t *testing.T) {
	w, _ := activeWorker(t, 20)
	var got []string
	tok := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("more than 10 pages of 3 for 20 keys: %v", got)
		}
		path := "/api/tables/counts?limit=3"
		if tok != "" {
			path += "&continuation=" + url.QueryEscape(tok)
		}
		rec, page := scanPage(t, w, path)
		if rec.Code != http.StatusOK || len(page.Items) > 3 || rec.Header().Get(GenerationHeader) != "4" {
			t.Fatalf("GET %s = %d %+v", path, rec.Code, page)
		}
		for _, it := range page.Items {
			if it.Partition != kafka.PartitionFor([]byte(it.Key), 3) || string(it.Value) != strconv.Itoa(len(got)) {
				t.Fatalf("item %+v (value %s): want partition %d, value %d", it, it.Value, kafka.PartitionFor([]byte(it.Key), 3), len(got))
			}
			got = append(got, it.Key)
		}
		if tok = page.Continuation; tok == "" {
			break
		}
	}
	want := make([]string, 20)
	for i := range want {
		want[i] = fmt.Sprintf("k-%02d", i)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("scan = %v, want %v", got, want)
	}
	_, page := scanPage(t, w, "/api/tables/counts?prefix=k-1")
	if len(page.Items) != 10 || page.Items[0].Key != "k-10" || page.Items[9].Key != "k-19" || page.Continuation != "" {
		t.Fatalf("prefix k-1 = %+v, want k-10…k-19 in one page", page)
	}
	_, page = scanPage(t, w, "/api/tables/counts?from=k-05&to=k-08")
	if len(page.Items) != 3 || page.Items[0].Key != "k-05" || page.Items[2].Key != "k-07" {
		t.Fatalf("from k-05 to k-08 = %+v, want k-05, k-06, k-07", page)
	}
}

// Bad input is a 400 (404 for an unknown table) with a reason, never a page.
func TestScanAndLocateBadInput(t *testing.T) {
	w, _ := activeWorker(t, 3)
	for _, c := range []struct {
		path   string
		code   int
		reason string
	}{
		{"/api/tables/no-such", http.StatusNotFound, ReasonUnknownTable},
		{"/api/tables/counts?limit=0", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts?limit=1001", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts?limit=x", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts?continuation=%25%25", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts?continuation=bm90IGpzb24", http.StatusBadRequest, ReasonBadRequest},                    // "not json"
		{"/api/tables/counts?continuation=eyJhZnRlciI6eyI5Ijoid0E9PSJ9fQ", http.StatusBadRequest, ReasonBadRequest}, // partition 9 of 3
		{"/api/tables/counts?prefix=a&from=b", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts?consistency=any", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/counts?colour=red", http.StatusBadRequest, ReasonBadRequest},
		{"/api/tables/ids?from=seven", http.StatusBadRequest, ReasonBadKey},
		{"/api/tables/ids?prefix=seven", http.StatusBadRequest, ReasonBadKey},
	} {
		rec, page := scanPage(t, w, c.path)
		if rec.Code != c.code || page.Reason != c.reason || page.Error == "" || len(page.Items) != 0 {
			t.Errorf("GET %s = %d %+v, want %d reason %q", c.path, rec.Code, page, c.code, c.reason)
		}
	}
	if _, err := w.Locate("no-such", "k"); err == nil {
		t.Error("Locate(no-such) succeeded")
	} else if te, ok := err.(*TableError); !ok || te.Status != http.StatusNotFound || te.Reason != ReasonUnknownTable {
		t.Errorf("Locate(no-such) = %v, want a 404 %s TableError", err, ReasonUnknownTable)
	}
	if _, err := w.Locate("ids", "seven"); err == nil {
		t.Error("Locate(ids, seven) succeeded")
	} else if te, ok := err.(*TableError); !ok || te.Status != http.StatusBadRequest || te.Reason != ReasonBadKey {
		t.Errorf("Locate(ids, seven) = %v, want a 400 %s TableError", err, ReasonBadKey)
	}
	loc, err := w.Locate("ids", "42")
	if err != nil || loc.Partitions != 3 || loc.Role != RoleNone || loc.Generation != 4 {
		t.Errorf("Locate(ids, 42) = %+v, %v; want 3 partitions, role none, generation 4", loc, err)
	}
}

// A partition that cannot be read refuses the whole page with its reason
// and Retry-After: a page never skips a partition's keys.
func TestScanRefusedPartition(t *testing.T) {
	w, ct := activeWorker(t, 5)
	w.parts.parts[restoreKey{"counts", 1}].gate = &restoreGate{done: make(chan struct{})}
	rec, page := scanPage(t, w, "/api/tables/counts")
	if rec.Code != http.StatusServiceUnavailable || page.Reason != ReasonRestoring || page.Partition == nil || *page.Partition != 1 ||
		rec.Header().Get("Retry-After") == "" || len(page.Items) != 0 {
		t.Fatalf("scan with partition 1 restoring = %d %+v, want 503 restoring for partition 1 with Retry-After", rec.Code, page)
	}
	w.parts.parts[restoreKey{"counts", 1}].gate = nil
	w.assignment.Actives[ct.state.Topic()] = []int32{0, 2}
	rec, page = scanPage(t, w, "/api/tables/counts")
	if rec.Code != http.StatusServiceUnavailable || page.Reason != ReasonRebalancing || page.Partition == nil || *page.Partition != 1 {
		t.Fatalf("scan with no owner of partition 1 = %d %+v, want 503 rebalancing", rec.Code, page)
	}
}
