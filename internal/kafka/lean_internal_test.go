package kafka

import (
	"math"
	"testing"
)

// A partition's sequence wraps past math.MaxInt32 to 0, as Kafka's does
// (DefaultRecordBatch.incrementSequence): the sequence after the last record
// of a batch at MaxInt32 is 0.
func TestNextSequenceWraps(t *testing.T) {
	for _, c := range []struct {
		seq  int32
		n    int
		want int32
	}{
		{0, 1, 1},
		{10, 5, 15},
		{math.MaxInt32 - 5, 5, math.MaxInt32},
		{math.MaxInt32 - 4, 5, 0},
		{math.MaxInt32, 1, 0},
		{math.MaxInt32 - 2, 10, 7},
	} {
		if got := nextSequence(c.seq, c.n); got != c.want {
			t.Errorf("nextSequence(%d, %d) = %d, want %d", c.seq, c.n, got, c.want)
		}
	}
}
