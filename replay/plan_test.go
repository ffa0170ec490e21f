package replay

import (
	"errors"
	"testing"
	"time"
)

// TestPlanTimeRange: per partition [start, stop) is the first offset at or
// after From and the first at or after To, from ListOffsets by timestamp;
// no record at or after To gives the end offset; partitions with nothing in
// the range are explicit and empty.
func TestPlanTimeRange(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("plan", 4, nil)
	h := time.Hour
	// p0: 22:00 the day before, 02:00, 05:00, 23:00, next day 01:00 → [1, 4).
	for _, ts := range []time.Duration{-2 * h, 2 * h, 5 * h, 23 * h, 25 * h} {
		f.produce(topic, 0, "k", "v", day0.Add(ts))
	}
	// p1: only the day before → empty at its end, [2, 2).
	f.produce(topic, 1, "k", "v", day0.Add(-5*h))
	f.produce(topic, 1, "k", "v", day0.Add(-1*h))
	// p2: nothing at all → [0, 0).
	// p3: the day before, then two in the day, nothing after → [1, 3) = end.
	for _, ts := range []time.Duration{-1 * h, 0, 12 * h} {
		f.produce(topic, 3, "k", "v", day0.Add(ts))
	}
	plan, err := newPlan(f.client, Spec{Topic: topic, From: day0, To: day0.Add(24 * h), Group: "replay-g", LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	want := []PartitionPlan{
		{Partition: 0, Start: 1, Stop: 4, LogStart: 0, End: 5},
		{Partition: 1, Start: 2, Stop: 2, LogStart: 0, End: 2, Empty: true},
		{Partition: 2, Start: 0, Stop: 0, LogStart: 0, End: 0, Empty: true},
		{Partition: 3, Start: 1, Stop: 3, LogStart: 0, End: 3},
	}
	if len(plan.Partitions) != len(want) {
		t.Fatalf("plan has %d partitions, want %d:\n%s", len(plan.Partitions), len(want), plan)
	}
	for i, w := range want {
		if plan.Partitions[i] != w {
			t.Errorf("partition %d: got %+v, want %+v", i, plan.Partitions[i], w)
		}
	}
	if plan.Records() != 5 {
		t.Errorf("Records() = %d, want 5", plan.Records())
	}
	// End offsets are captured once: records produced after the plan do not
	// move it.
	f.produce(topic, 3, "k", "v", day0.Add(13*h))
	if plan.Partitions[3].Stop != 3 || plan.Partitions[3].End != 3 {
		t.Errorf("plan moved: %+v", plan.Partitions[3])
	}
}

// TestPlanRefusals: the live group, a stop past the captured end, a bad
// range and an unknown partition are refused before anything is read.
func TestPlanRefusals(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("refuse", 2, nil)
	for i := 0; i < 3; i++ {
		f.produce(topic, 0, "k", "v", day0)
	}
	cases := []struct {
		name string
		spec Spec
		want error
	}{
		{"same group", Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 3}}, Group: "live", LiveGroup: "live"}, ErrLiveGroup},
		{"no group", Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 3}}, LiveGroup: "live"}, ErrLiveGroup},
		{"beyond end", Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 4}}, Group: "r", LiveGroup: "live"}, ErrBeyondEnd},
		{"beyond end of empty", Spec{Topic: topic, Offsets: map[int32]Range{1: {0, 1}}, Group: "r", LiveGroup: "live"}, ErrBeyondEnd},
		{"backwards", Spec{Topic: topic, Offsets: map[int32]Range{0: {2, 1}}, Group: "r", LiveGroup: "live"}, ErrBadRange},
		{"no partition", Spec{Topic: topic, Offsets: map[int32]Range{7: {0, 1}}, Group: "r", LiveGroup: "live"}, ErrBadRange},
		{"empty time range", Spec{Topic: topic, From: day0, To: day0, Group: "r", LiveGroup: "live"}, ErrBadRange},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := newPlan(f.client, c.spec)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	// An explicit range up to the end is fine, and exact.
	plan, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {1, 3}, 1: {0, 0}}, Group: "r", LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Partitions; len(got) != 2 || got[0].Start != 1 || got[0].Stop != 3 || !got[1].Empty {
		t.Fatalf("plan: %+v", got)
	}
}
