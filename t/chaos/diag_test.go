package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/changelog"
)

// TestOurRaces reads two race reports the chaos workers printed: one inside
// Sarama's transaction manager (IBM/sarama#2913; the goroutines were created
// by Runnel's code, the racing accesses are Sarama's) and one between two of
// Runnel's goroutines.
func TestOurRaces(t *testing.T) {
	sarama, err := os.ReadFile(filepath.Join("testdata", "race-sarama.log"))
	if err != nil {
		t.Fatal(err)
	}
	runnel, err := os.ReadFile(filepath.Join("testdata", "race-runnel.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		log        string
		ours, srm  int
		firstFrame string
	}{
		{"sarama only", string(sarama), 0, 1, ""},
		{"runnel", string(runnel), 1, 0, "github.com/runnel-dev/runnel/app.(*claimProducer).OpenBatch()"},
		{"both, between log lines", "level=INFO msg=x\n" + string(sarama) + "\nlevel=INFO msg=y\n" + string(runnel) + "\n", 1, 1, "github.com/runnel-dev/runnel/app.(*claimProducer).OpenBatch()"},
		{"none", "level=INFO msg=x\n", 0, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ours, srm := ourRaces(c.log)
			if len(ours) != c.ours || srm != c.srm {
				t.Fatalf("ours %d (%q), sarama %d; want %d, %d", len(ours), ours, srm, c.ours, c.srm)
			}
			if c.ours > 0 && !strings.HasPrefix(ours[0], c.firstFrame) {
				t.Fatalf("first frame %q, want %q", ours[0], c.firstFrame)
			}
		})
	}
}

// TestWriterHistory groups changelog records into runs of one writer epoch
// with the range of source offsets each run's stamps carry.
func TestWriterHistory(t *testing.T) {
	var h writerHistory
	src := func(off int64) []changelog.Source {
		return []changelog.Source{{Topic: "in", Partition: 5, Offset: off}, {Topic: "rp", Partition: 5, Offset: off * 2}}
	}
	h.add(0, changelog.Stamp{Epoch: 1, Sources: src(10)})
	h.add(1, changelog.Stamp{Epoch: 1, Sources: src(20)})
	h.add(3, changelog.Stamp{Epoch: 2, Sources: src(900)})
	h.add(4, changelog.Stamp{Epoch: 1, Sources: src(30)})
	want := "epoch 1 @0-1 (2 records; in[5] 10-20 rp[5] 20-40), epoch 2 @3-3 (1 records; in[5] 900-900 rp[5] 1800-1800), epoch 1 @4-4 (1 records; in[5] 30-30 rp[5] 60-60)"
	if got := h.String(); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
