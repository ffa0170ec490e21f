package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/client"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// hopCounter is an http.RoundTripper that counts the answers of table reads
// (point reads, scans) and those a worker forwarded (ServedByHeader set).
type hopCounter struct {
	mu                sync.Mutex
	reads, forwarded  int
	forwardedExamples []string
}

func (hc *hopCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && len(req.URL.Path) > len("/api/tables/") && req.URL.Path[:len("/api/tables/")] == "/api/tables/" {
		hc.mu.Lock()
		hc.reads++
		if s := resp.Header.Get(app.ServedByHeader); s != "" {
			hc.forwarded++
			hc.forwardedExamples = append(hc.forwardedExamples, req.URL.String()+" served by "+s)
		}
		hc.mu.Unlock()
	}
	return resp, err
}

// scanAll pages through GET /api/tables/{path} on addr (path has its
// query) with page size limit and returns the items and how many pages it
// took and how many partitions were read on another worker.
func scanAll(t *testing.T, addr, path string, limit int) (items []app.ScanItem, pages, remote int) {
	t.Helper()
	tok := ""
	for ; ; pages++ {
		if pages > 100 {
			t.Fatalf("scan %s: more than 100 pages", path)
		}
		u := "http://" + addr + "/api/tables/" + path + "&limit=" + strconv.Itoa(limit)
		if tok != "" {
			u += "&continuation=" + url.QueryEscape(tok)
		}
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		var page app.ScanPage
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %+v %v", u, resp.StatusCode, page, err)
		}
		if len(page.Items) > limit {
			t.Fatalf("GET %s: %d items, more than the limit", u, len(page.Items))
		}
		items = append(items, page.Items...)
		for _, sp := range page.Partitions {
			if sp.ServedBy != "" {
				remote++
			}
		}
		if tok = page.Continuation; tok == "" {
			return items, pages + 1, remote
		}
	}
}

// TestTableLocateScanClient (issue #27 items 1, 3, 4): two workers share a
// table of 20 keys (key-NN counted NN+1 times). Locate, on either worker,
// names the key's partition (murmur2 over the changelog's partition count)
// and the worker that answers the key itself, without a hop. A scan through
// either worker, 3 keys a page, returns every key once in byte order with
// its value and partition, reading the other worker's partitions through
// one forward; prefix and from/to scans return their keys; bad input is a
// 400. The Go client reads every key with no forward and scans the table.
// Then the second worker leaves with the first's restores held: every read
// of the client is the value or a RetryableError (restoring, rebalancing,
// not-owner), never found=false; released, every key reads its value again.
func TestTableLocateScanClient(t *testing.T) {
	var holding atomic.Bool
	t.Cleanup(app.HoldRestores(holding.Load))
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "qloc")
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}
	partOf := func(k string) int32 { return kafka.PartitionFor([]byte(k), gparts) }

	w1 := startQueryWorker(t, brokers, id, t.TempDir(), "w1")
	w2 := startQueryWorker(t, brokers, id, t.TempDir(), "w2")
	topic := w1.q.in.Name()
	changelog := w1.q.counts.Changelog()
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), topic)
	pr := newGProducer(t, brokers, topic)
	for i, k := range keys {
		for range i + 1 {
			pr.send(k)
		}
	}
	testbroker.WaitLag0(t, brokers, id, topic)
	ws := []*queryWorker{w1, w2}
	owner := func(k string) *queryWorker {
		for _, qw := range ws {
			if slices.Contains(qw.w.Assignment().Actives[changelog], partOf(k)) {
				return qw
			}
		}
		return nil
	}
	// Settled: both ready and active, every partition active once, every
	// key's committed value applied to its store (a scan reads the store).
	deadline := time.Now().Add(60 * time.Second)
	for {
		a1, a2 := w1.w.Assignment(), w2.w.Assignment()
		all := append(slices.Clone(a1.Actives[changelog]), a2.Actives[changelog]...)
		slices.Sort(all)
		if w1.w.Ready() && w2.w.Ready() && len(a1.Actives[changelog]) > 0 && len(a2.Actives[changelog]) > 0 && slices.Equal(all, []int32{0, 1, 2}) &&
			a1.Generation == a2.Generation {
			if items, _, err := scanAllQuiet(w1.q.addr, "counts?prefix=key-"); err == nil && allCounted(items, len(keys)) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("two workers never settled with every key stored: w1 %+v, w2 %+v", a1, a2)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Locate: the partition from murmur2, the active that answers without
	// a hop, the same generation on both workers.
	gen := w1.w.Assignment().Generation
	for _, k := range keys {
		ow := owner(k)
		for _, qw := range ws {
			loc, err := qw.w.Locate("counts", k)
			if err != nil || loc.Partition != partOf(k) || loc.Partitions != gparts || loc.Active != ow.q.addr || loc.Generation != gen ||
				loc.Changelog != changelog {
				t.Fatalf("Locate(counts, %s) on %s = %+v, %v; want partition %d of %d, active %s, generation %d", k, qw.q.addr, loc, err, partOf(k), gparts, ow.q.addr, gen)
			}
			if qw != ow && loc.Role == app.RoleStandby &&
				(len(loc.Standbys) != 1 || loc.Standbys[0].URL != qw.q.addr || loc.Standbys[0].Role != app.RoleStandby || loc.Standbys[0].Lag == nil) {
				t.Fatalf("Locate(counts, %s) on the standby %s = %+v; want itself among the standbys, with its lag", k, qw.q.addr, loc)
			}
			var over app.Location
			resp, err := http.Get("http://" + qw.q.addr + "/api/locate/counts/" + k)
			if err != nil {
				t.Fatal(err)
			}
			err = json.NewDecoder(resp.Body).Decode(&over)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || over.Partition != loc.Partition || over.Active != loc.Active || over.Role != loc.Role {
				t.Fatalf("GET /api/locate/counts/%s on %s = %d %+v %v; want %+v", k, qw.q.addr, resp.StatusCode, over, err, loc)
			}
		}
		a := mustQuery(t, ow.q.addr, "counts/"+k, nil)
		if want := float64(slices.Index(keys, k) + 1); a.code != http.StatusOK || a.Value != want || a.h.Get(app.ServedByHeader) != "" || a.h.Get(app.RoleHeader) != app.RoleActive {
			t.Fatalf("GET counts/%s on its located active = %s; want 200 value %v, not forwarded", k, a, want)
		}
	}

	// Scans through either worker: every key once, in order, paged by 3,
	// the other worker's partitions read through a forward.
	for _, qw := range ws {
		items, pages, remote := scanAll(t, qw.q.addr, "counts?prefix=", 3)
		var got []string
		for i, it := range items {
			got = append(got, it.Key)
			if it.Partition != partOf(it.Key) || string(it.Value) != strconv.Itoa(i+1) {
				t.Fatalf("scan through %s: item %+v (value %s); want partition %d, value %d", qw.q.addr, it, it.Value, partOf(it.Key), i+1)
			}
		}
		if !slices.Equal(got, keys) || pages != 7 || remote == 0 {
			t.Fatalf("scan through %s = %v in %d pages, %d forwarded partition reads; want %v in 7 pages, some forwarded", qw.q.addr, got, pages, remote, keys)
		}
	}
	items, _, _ := scanAll(t, w2.q.addr, "counts?prefix=key-1", 3)
	if len(items) != 10 || items[0].Key != "key-10" || items[9].Key != "key-19" {
		t.Fatalf("prefix scan key-1 = %+v; want key-10…key-19", items)
	}
	items, _, _ = scanAll(t, w1.q.addr, "counts?from=key-05&to=key-09", 2)
	if len(items) != 4 || items[0].Key != "key-05" || items[3].Key != "key-08" {
		t.Fatalf("range scan [key-05, key-09) = %+v; want key-05…key-08", items)
	}
	for _, path := range []string{
		"counts?limit=5000", "counts?limit=-1", "counts?continuation=!!", "counts?continuation=e30K~", "counts?prefix=a&to=b",
		"ids?from=seven", "counts?consistency=any",
	} {
		resp, err := http.Get("http://" + w1.q.addr + "/api/tables/" + path)
		if err != nil {
			t.Fatal(err)
		}
		var page app.ScanPage
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusBadRequest || page.Reason == "" || page.Error == "" {
			t.Fatalf("GET /api/tables/%s = %d %+v %v; want 400 with a reason", path, resp.StatusCode, page, err)
		}
	}
	if resp, err := http.Get("http://" + w1.q.addr + "/api/locate/counts-nope/k"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /api/locate/counts-nope/k = %v %v; want 404", resp, err)
	}

	// The Go client: every key from its owner, no forward.
	hc := &hopCounter{}
	c := client.New(w1.q.addr, w2.q.addr)
	c.HTTP = &http.Client{Transport: hc, Timeout: 10 * time.Second}
	c.PageSize = 3
	ctx := context.Background()
	for i, k := range keys {
		v, found, err := c.Query(ctx, "counts", k)
		if err != nil || !found || string(v) != strconv.Itoa(i+1) {
			t.Fatalf("client Query(counts, %s) = %s, %v, %v; want %d", k, v, found, err, i+1)
		}
	}
	if v, found, err := c.Query(ctx, "counts", "nobody"); err != nil || found || v != nil {
		t.Fatalf("client Query(counts, nobody) = %s, %v, %v; want not found, no error", v, found, err)
	}
	if _, _, err := c.Query(ctx, "nosuchtable", "k"); err == nil {
		t.Fatal("client Query(nosuchtable) succeeded")
	} else if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusNotFound || e.Reason != app.ReasonUnknownTable {
		t.Fatalf("client Query(nosuchtable) = %v; want a 404 %s *client.Error", err, app.ReasonUnknownTable)
	}
	hc.mu.Lock()
	if hc.reads != len(keys)+2 || hc.forwarded != 0 {
		t.Fatalf("client: %d reads, %d forwarded (%v); want %d, none forwarded", hc.reads, hc.forwarded, hc.forwardedExamples, len(keys)+2)
	}
	hc.mu.Unlock()
	var got []string
	for it, err := range c.Scan(ctx, "counts", "key-") {
		if err != nil {
			t.Fatalf("client Scan: %v after %v", err, got)
		}
		if it.Partition != partOf(it.Key) || string(it.Value) != strconv.Itoa(len(got)+1) {
			t.Fatalf("client Scan item %+v (value %s)", it, it.Value)
		}
		got = append(got, it.Key)
	}
	if !slices.Equal(got, keys) {
		t.Fatalf("client Scan = %v, want %v", got, keys)
	}

	// Hand-over: w2 leaves, w1's activations of w2's partitions are held
	// restoring. The client's cached owner of those keys is gone: it reads
	// the map again and gets a retryable refusal, never found=false.
	moved := map[string]bool{}
	for _, k := range keys {
		moved[k] = owner(k) == w2
	}
	holding.Store(true)
	w2.stop()
	for deadline := time.Now().Add(60 * time.Second); len(w1.w.Assignment().Actives[changelog]) != gparts; {
		if time.Now().After(deadline) {
			t.Fatalf("w1 never took every partition: %+v", w1.w.Assignment())
		}
		time.Sleep(20 * time.Millisecond)
	}
	retryable := 0
	for i, k := range keys {
		v, found, err := c.Query(ctx, "counts", k)
		var re *client.RetryableError
		switch {
		case err == nil && found && string(v) == strconv.Itoa(i+1):
			if moved[k] {
				t.Fatalf("client Query(counts, %s) = %s while its partition is held restoring; want a RetryableError", k, v)
			}
		case errors.As(err, &re) && re.RetryAfter > 0 &&
			slices.Contains([]string{app.ReasonRestoring, app.ReasonRebalancing, app.ReasonNotOwner}, re.Reason):
			retryable++
		default:
			t.Fatalf("client Query(counts, %s) during the hand-over = %s, found %v, %v; want its value %d or a RetryableError", k, v, found, err, i+1)
		}
	}
	var re *client.RetryableError
	for _, err := range c.Scan(ctx, "counts", "") {
		if err != nil && !errors.As(err, &re) {
			t.Fatalf("client Scan during the hand-over: %v; want a RetryableError", err)
		}
	}
	if retryable == 0 || re == nil || re.Reason != app.ReasonRestoring {
		t.Fatalf("during the hand-over: %d retryable point reads, scan refusal %v; want some, and a restoring scan refusal", retryable, re)
	}

	// Released: w1 answers every key, the client reads it directly.
	holding.Store(false)
	waitQueryReady(t, w1, gparts)
	hc.mu.Lock()
	hc.reads, hc.forwarded = 0, 0
	hc.mu.Unlock()
	for i, k := range keys {
		v, found, err := c.Query(ctx, "counts", k)
		if err != nil || !found || string(v) != strconv.Itoa(i+1) {
			t.Fatalf("client Query(counts, %s) after the hand-over = %s, %v, %v; want %d", k, v, found, err, i+1)
		}
	}
	if hc.forwarded != 0 {
		t.Fatalf("client after the hand-over: %d of %d reads forwarded: %v", hc.forwarded, hc.reads, hc.forwardedExamples)
	}
}

// scanAllQuiet is scanAll for polling: errors end it.
func scanAllQuiet(addr, path string) (items []app.ScanItem, pages int, err error) {
	tok := ""
	for ; pages < 100; pages++ {
		u := "http://" + addr + "/api/tables/" + path
		if tok != "" {
			u += "&continuation=" + url.QueryEscape(tok)
		}
		resp, err := http.Get(u)
		if err != nil {
			return items, pages, err
		}
		var page app.ScanPage
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return items, pages, fmt.Errorf("%d %+v %v", resp.StatusCode, page, err)
		}
		items = append(items, page.Items...)
		if tok = page.Continuation; tok == "" {
			break
		}
	}
	return items, pages, nil
}

// allCounted reports whether items are n keys valued 1…n in order.
func allCounted(items []app.ScanItem, n int) bool {
	if len(items) != n {
		return false
	}
	for i, it := range items {
		if string(it.Value) != strconv.Itoa(i+1) {
			return false
		}
	}
	return true
}
