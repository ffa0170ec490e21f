package group

import "testing"

// TestAttemptsCountPerPartitionAndOffset: failed deliveries are counted per
// partition key and offset, a forgotten offset starts again from zero, and
// forgetting an offset never counted changes nothing.
func TestAttemptsCountPerPartitionAndOffset(t *testing.T) {
	var a Attempts
	if got := a.Get("t/0", 5); got != 0 {
		t.Fatalf("nothing counted: got %d, want 0", got)
	}
	for want := 1; want <= 3; want++ {
		if got := a.Add("t/0", 5); got != want {
			t.Fatalf("failure %d of t/0@5: count %d", want, got)
		}
	}
	if got := a.Add("t/1", 5); got != 1 {
		t.Fatalf("t/1@5 counted with t/0@5: %d, want 1", got)
	}
	if got := a.Add("t/0", 6); got != 1 {
		t.Fatalf("t/0@6 counted with t/0@5: %d, want 1", got)
	}
	a.Forget("t/0", 7)
	a.Forget("t/0", 5)
	if got := a.Get("t/0", 5); got != 0 {
		t.Fatalf("t/0@5 after Forget: %d, want 0", got)
	}
	if got, want := a.n.Load(), int64(2); got != want {
		t.Fatalf("tracked offsets %d, want %d (t/1@5, t/0@6)", got, want)
	}
	if got := a.Add("t/0", 5); got != 1 {
		t.Fatalf("t/0@5 failed again after Forget: %d, want 1", got)
	}
}
