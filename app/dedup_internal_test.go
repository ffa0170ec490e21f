package app

import (
	"testing"

	"github.com/runnel-dev/runnel/internal/dedup"
)

// The commit metadata carries the dead letters' part and the duplicate
// filter's side by side; each reader finds its own, whichever is present.
func TestCommitMetadataParts(t *testing.T) {
	f := dedup.NewFilter(0)
	f.Offer(dedup.Stamp{Topic: "in", Agent: "a", Run: 3, Base: 0, Offset: 4})
	f.Seal(10)
	src := f.Encode(10, maxSrcMetadata)
	dlq := dlqMetaPrefix + "app-a-dlq=12"
	for _, tc := range []struct{ meta, dlq, src string }{
		{joinMeta(dlq, src), dlq, src},
		{joinMeta("", src), "", src},
		{joinMeta(dlq, ""), dlq, ""},
		{"", "", ""},
		{"written by another tool", "", ""},
	} {
		if got := dlqPart(tc.meta); got != tc.dlq {
			t.Errorf("dlqPart(%q) = %q, want %q", tc.meta, got, tc.dlq)
		}
		if got := srcPart(tc.meta); got != tc.src {
			t.Errorf("srcPart(%q) = %q, want %q", tc.meta, got, tc.src)
		}
	}
	if m := parseDLQMetadata(dlqPart(joinMeta(dlq, src))); m["app-a-dlq"] != 12 || len(m) != 1 {
		t.Errorf("dead letters' part parsed as %v", m)
	}
	if e := newSrcFilter(joinMeta(dlq, src), 10, nil).f.Entries(); len(e) != 1 {
		t.Errorf("filter decoded from joined metadata has %d entries, want 1", len(e))
	}
}
