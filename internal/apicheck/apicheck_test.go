package apicheck

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite api/runnel.txt with the packages' current API")

// listing is the checked-in API, relative to this directory.
var listing = filepath.Join("..", "..", "api", "runnel.txt")

// TestAPI compares the public packages' exported API with api/runnel.txt.
// A difference fails the test: lines only in the file were removed or
// changed (a break for users), lines only in the packages were added. When
// the change is meant, run
//
//	go test ./internal/apicheck -run TestAPI -update
//
// and list it in CHANGELOG.md.
func TestAPI(t *testing.T) {
	got, err := List(".", Public)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(listing, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(listing)
	if err != nil {
		t.Fatalf("%v (create it with: go test ./internal/apicheck -run TestAPI -update)", err)
	}
	want := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	var removed, added []string
	for _, l := range want {
		if _, ok := slices.BinarySearch(got, l); !ok {
			removed = append(removed, l)
		}
	}
	for _, l := range got {
		if _, ok := slices.BinarySearch(want, l); !ok {
			added = append(added, l)
		}
	}
	if len(removed)+len(added) > 0 {
		t.Errorf("the exported API differs from api/runnel.txt:\nremoved or changed (breaks users):\n  %s\nadded:\n  %s\n"+
			"if the change is meant: go test ./internal/apicheck -run TestAPI -update, and list it in CHANGELOG.md",
			strings.Join(removed, "\n  "), strings.Join(added, "\n  "))
	}
}

// TestNoClientTypes fails when a Kafka client library's type appears in the
// API of a package an app is written with (AppFacing).
func TestNoClientTypes(t *testing.T) {
	got, err := List(".", AppFacing)
	if err != nil {
		t.Fatal(err)
	}
	if bad := ClientTypes(got); len(bad) > 0 {
		t.Errorf("Kafka client types in the app-facing API (wrap them in Runnel's own types):\n  %s", strings.Join(bad, "\n  "))
	}
}

// TestClientTypesFound checks the check: a listing line naming a Sarama or
// franz-go type is reported, one naming only Runnel's types is not.
func TestClientTypesFound(t *testing.T) {
	lines := []string{
		"pkg app, func GroupLag(github.com/IBM/sarama.Client, string, []string) (map[string]map[int32]int64, error)",
		"pkg app, func ReadTable(context.Context, *Client, table.Def) (map[string]any, error)",
		"pkg runneltest, type RecordOption func(*github.com/twmb/franz-go/pkg/kgo.Record)",
	}
	got := ClientTypes(lines)
	if len(got) != 2 || got[0] != lines[0] || got[1] != lines[2] {
		t.Errorf("ClientTypes = %q, want the first and the last line", got)
	}
}
