package main

import (
	"testing"

	"github.com/runnel-dev/runnel/runneltest"
)

// TestWordcount sends the guide's four lines and checks every count and the
// dead letter of the empty line.
func TestWordcount(t *testing.T) {
	w := Build("wordcount-test")
	d, err := runneltest.Start(w.App, runneltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, l := range []Line{
		{ID: "1", Text: "the quick brown fox"},
		{ID: "2", Text: "jumps over the lazy dog"},
		{ID: "3", Text: ""},
		{ID: "4", Text: "the dog sleeps"},
	} {
		if _, _, err := runneltest.Send(d, w.Lines, l.ID, l); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int64{"the": 3, "dog": 2, "quick": 1, "brown": 1, "fox": 1, "jumps": 1, "over": 1, "lazy": 1, "sleeps": 1}
	for word, n := range want {
		got, ok, err := runneltest.Get(d, w.Counts, word) // waits until every line is processed
		if err != nil || !ok || got != n {
			t.Fatalf("count of %q = %d, %v, %v; want %d", word, got, ok, err, n)
		}
	}
	all, err := d.Table(w.Counts)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want) {
		t.Fatalf("word-counts holds %d words (%v), want %d", len(all), all, len(want))
	}
	dead, err := d.DeadLetters("split")
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Offset < 0 || dead[0].Reason != "empty line" {
		t.Fatalf("dead letters %+v, want the empty line once", dead)
	}
}
