package main

import "testing"

// The distinct-key input draws as many keys as records: 1 − 1/e ≈ 63% of
// them distinct (issue #28's rerun: ~316k in 500k), the same every time.
func TestDistinctDataset(t *testing.T) {
	d := newDataset(100_000, 100_000, 8)
	if n := len(d.counts); n < 62_000 || n > 64_500 {
		t.Errorf("%d distinct keys in 100000 records, want ~63200", n)
	}
	if again := newDataset(100_000, 100_000, 8); len(again.counts) != len(d.counts) {
		t.Errorf("not deterministic: %d then %d distinct keys", len(d.counts), len(again.counts))
	}
	var sum int64
	for _, c := range d.counts {
		sum += c
	}
	if sum != 100_000 {
		t.Errorf("counts sum to %d, want 100000", sum)
	}
}
