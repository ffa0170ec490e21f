package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/client"
	"github.com/runnel-dev/runnel/partition"
)

// fakeWorker answers /api/tables, /api/assignment and reads of table t (2
// partitions, text keys) by the key's name: "absent" 404, "restoring" 503
// with Retry-After 2, "bad" 400, anything else 200 with its length; gen is
// the generation its answers carry, refreshes counts /api/assignment.
type fakeWorker struct {
	srv       *httptest.Server
	gen       atomic.Int32
	refreshes atomic.Int32
	reads     atomic.Int32
}

func newFakeWorker(t *testing.T) *fakeWorker {
	fw := &fakeWorker{}
	fw.gen.Store(1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/tables", func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(rw, `[{"name":"t","changelog":"app-t-changelog","partitions":2,"text_keys":true}]`)
	})
	mux.HandleFunc("GET /api/assignment", func(rw http.ResponseWriter, _ *http.Request) {
		fw.refreshes.Add(1)
		a := fw.srv.Listener.Addr().String()
		fmt.Fprintf(rw, `{"assignment":{"generation":%d,"urls":{"app-t-changelog":{"0":%q,"1":%q}}}}`, fw.gen.Load(), a, a)
	})
	mux.HandleFunc("GET /api/tables/t/{key}", func(rw http.ResponseWriter, r *http.Request) {
		fw.reads.Add(1)
		k := r.PathValue("key")
		rw.Header().Set(client.GenerationHeader, fmt.Sprint(fw.gen.Load()))
		rw.Header().Set(client.PartitionHeader, fmt.Sprint(partition.For([]byte(k), 2)))
		switch k {
		case "absent":
			rw.WriteHeader(http.StatusNotFound)
			fmt.Fprint(rw, `{"found":false}`)
		case "restoring":
			rw.Header().Set("Retry-After", "2")
			rw.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(rw, `{"found":false,"reason":"restoring","error":"being restored"}`)
		case "bad":
			rw.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(rw, `{"found":false,"reason":"bad-key","error":"no"}`)
		default:
			fmt.Fprintf(rw, `{"found":true,"value":%d}`, len(k))
		}
	})
	fw.srv = httptest.NewServer(mux)
	t.Cleanup(fw.srv.Close)
	return fw
}

// Answers map to values, found=false, *RetryableError and *Error; a newer
// generation refreshes the owner map once.
func TestQueryAnswers(t *testing.T) {
	fw := newFakeWorker(t)
	c := client.New(fw.srv.URL)
	ctx := context.Background()
	if v, found, err := c.Query(ctx, "t", "abcd"); err != nil || !found || string(v) != "4" {
		t.Fatalf("Query(abcd) = %s, %v, %v; want 4", v, found, err)
	}
	if v, found, err := c.Query(ctx, "t", "absent"); err != nil || found || v != nil {
		t.Fatalf("Query(absent) = %s, %v, %v; want not found, no error", v, found, err)
	}
	_, found, err := c.Query(ctx, "t", "restoring")
	var re *client.RetryableError
	if found || !errors.As(err, &re) || re.Reason != "restoring" || re.RetryAfter != 2*time.Second || re.Status != http.StatusServiceUnavailable ||
		re.Partition != partition.For([]byte("restoring"), 2) {
		t.Fatalf("Query(restoring) = %v, %v; want a RetryableError restoring, retry after 2s, its partition", found, err)
	}
	var ce *client.Error
	if _, _, err := c.Query(ctx, "t", "bad"); !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || ce.Reason != "bad-key" {
		t.Fatalf("Query(bad) = %v; want a 400 bad-key *Error", err)
	}
	if n := fw.refreshes.Load(); n != 1 {
		t.Fatalf("%d refreshes of the owner map, want 1 (the first query)", n)
	}
	fw.gen.Store(2)
	if _, _, err := c.Query(ctx, "t", "abc"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Query(ctx, "t", "abc"); err != nil {
		t.Fatal(err)
	}
	if n := fw.refreshes.Load(); n != 2 {
		t.Fatalf("%d refreshes of the owner map after a new generation, want 2", n)
	}
	if o, err := c.Owner(ctx, "t", "abc"); err != nil || o != strings.TrimRight(fw.srv.URL, "/") {
		t.Fatalf("Owner(t, abc) = %q, %v; want %s", o, err, fw.srv.URL)
	}
}

// A worker that does not answer is passed over for one that does.
func TestQueryOwnerGone(t *testing.T) {
	fw := newFakeWorker(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	c := client.New(deadURL, fw.srv.URL)
	if v, found, err := c.Query(context.Background(), "t", "xy"); err != nil || !found || string(v) != "2" {
		t.Fatalf("Query(xy) with one worker down = %s, %v, %v; want 2", v, found, err)
	}
}
