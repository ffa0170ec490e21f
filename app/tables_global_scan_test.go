package app_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// TestGlobalScanAndBound (issue #27, global tables read locally): two
// workers hold the global table "latest" (key -> last value). A prefix scan
// through either worker, 5 keys a page, returns every key once in byte
// order with its last value, every partition read from the local replica
// (role global, its applied offset, no forward). A point read on either
// worker bounded by the position of a record just written answers that
// record's value once the replica applied it (its marks).
func TestGlobalScanAndBound(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "gscan")
	w1 := startGlobalWorker(t, brokers, id, t.TempDir(), "w1")
	w2 := startGlobalWorker(t, brokers, id, t.TempDir(), "w2")
	topic := w1.g.in.Name()
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), topic)
	pr := newGProducer(t, brokers, topic)
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = fmt.Sprintf("g-%02d", i)
		pr.send(keys[i])
		pr.send(keys[i])
	}
	pr.send("other") // outside the prefix
	testbroker.WaitLag0(t, brokers, id, topic)
	deadline := time.Now().Add(30 * time.Second)
	for _, rw := range []*runningWorker{w1, w2} {
		for len(replica(t, rw.w)) < len(keys)+1 {
			if time.Now().After(deadline) {
				t.Fatalf("replica of %s holds %d keys", rw.g.addr, len(replica(t, rw.w)))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, rw := range []*runningWorker{w1, w2} {
		items, pages, remote := scanAll(t, rw.g.addr, "latest?prefix=g-", 5)
		if len(items) != len(keys) || pages != 3 || remote != 0 {
			t.Fatalf("scan via %s: %d items in %d pages, %d partitions remote; want %d in 3, none remote", rw.g.addr, len(items), pages, remote, len(keys))
		}
		for i, it := range items {
			want := pr.last[keys[i]]
			if it.Key != keys[i] || string(it.Value) != strconv.FormatInt(want, 10) || it.Partition != kafka.PartitionFor([]byte(keys[i]), gparts) {
				t.Fatalf("scan via %s item %d: %+v, want %s = %d", rw.g.addr, i, it, keys[i], want)
			}
		}
		page := mustScanPage(t, rw.g.addr, "latest?limit=100")
		if len(page.Items) != len(keys)+1 || page.Continuation != "" || len(page.Partitions) != gparts {
			t.Fatalf("full scan via %s: %+v", rw.g.addr, page)
		}
		for _, sp := range page.Partitions {
			if sp.Role != app.RoleGlobal || sp.Applied == nil || *sp.Applied <= 0 || sp.ServedBy != "" || !sp.Exhausted {
				t.Fatalf("partition %+v via %s: want global, applied, local, exhausted", sp, rw.g.addr)
			}
		}
	}

	// Read-your-writes on a replica: the value of a record just written,
	// on both workers.
	rp := newRYWProducer(t, brokers, topic)
	for i, rw := range []*runningWorker{w1, w2} {
		v := 1000000 + i
		pos := rp.send("g-03", strconv.Itoa(v), time.Now())
		a := mustQuery(t, rw.g.addr, "latest/g-03?position="+pos.String()+"&wait=3s", nil)
		if a.code != http.StatusOK || a.Value != float64(v) || a.Role != app.RoleGlobal || a.Position == "" {
			t.Fatalf("bounded read of g-03 via %s: %v, want %d", rw.g.addr, a, v)
		}
	}
}

// mustScanPage GETs one scan page and fails the test on anything but a 200.
func mustScanPage(t *testing.T, addr, path string) app.ScanPage {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/tables/" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page app.ScanPage
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %+v %v", path, resp.StatusCode, page, err)
	}
	return page
}
