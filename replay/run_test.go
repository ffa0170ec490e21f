package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
)

// TestRunDay replays a day of a 3-partition topic: the audit effect sees
// exactly the records of [start, stop) of every partition, once; the notify
// effect and the sink are suppressed; the replay group ends committed at
// every stop offset and the live group is never written.
func TestRunDay(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("day", 3, nil)
	h := time.Hour
	for p := int32(0); p < 3; p++ {
		f.produce(topic, p, "k", "before", day0.Add(-h))
		for i := 0; i < 20*int(p+1); i++ {
			f.produce(topic, p, fmt.Sprint(i), "in", day0.Add(time.Duration(i)*time.Minute))
		}
		f.produce(topic, p, "k", "after", day0.Add(25*h))
	}
	// An out-of-order timestamp inside p0's range: read, not delivered.
	f.produce(topic, 0, "late", "x", day0.Add(-3*h))
	f.produce(topic, 0, "k", "after2", day0.Add(26*h))
	plan, err := newPlan(f.client, Spec{Topic: topic, From: day0, To: day0.Add(24 * h), Group: "replay-" + topic, LiveGroup: "live-" + topic})
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 3; p++ {
		pp := plan.Partitions[p]
		if pp.Start != 1 || pp.Stop != 1+20*int64(p+1) {
			t.Fatalf("p%d planned [%d, %d)", p, pp.Start, pp.Stop)
		}
	}
	pr := newProbe(topic, 3)
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 3; p++ {
		if got, want := pr.offsets(p), span(1, 1+20*int64(p+1)); !slices.Equal(got, want) {
			t.Errorf("p%d audited %v, want %v", p, got, want)
		}
	}
	if res.Records != 120 || res.Effects != 120 || res.Duplicates != 0 || res.Delivered != 120 || res.Gaps != 0 {
		t.Errorf("result %+v", res)
	}
	if res.Skipped != 120 || res.Suppressed != 120 || pr.notify != 0 {
		t.Errorf("skipped %d, suppressed %d, notify calls %d; want 120, 120, 0", res.Skipped, res.Suppressed, pr.notify)
	}
	got := f.committed(plan.Group, topic, 3)
	for p := int32(0); p < 3; p++ {
		if got[p] != plan.Partitions[p].Stop {
			t.Errorf("replay group committed p%d at %d, want %d", p, got[p], plan.Partitions[p].Stop)
		}
	}
	if live := f.committed(plan.LiveGroup, topic, 3); len(live) != 0 {
		t.Errorf("live group committed %v", live)
	}
	// Replaying the same plan again in the same group does nothing.
	res2, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Records != 0 || res2.Effects != 0 {
		t.Errorf("second run read %d, applied %d", res2.Records, res2.Effects)
	}
}

// TestRunOutOfRangeTimestamps: inside [start, stop), a record whose timestamp
// lies outside [From, To) is read and committed but not delivered.
func TestRunOutOfRangeTimestamps(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("ooo", 1, nil)
	f.produce(topic, 0, "a", "v", day0.Add(time.Hour))    // 0
	f.produce(topic, 0, "b", "v", day0.Add(-time.Hour))   // 1: before the day
	f.produce(topic, 0, "c", "v", day0.Add(2*time.Hour))  // 2
	f.produce(topic, 0, "d", "v", day0.Add(48*time.Hour)) // 3: stop
	plan, err := newPlan(f.client, Spec{Topic: topic, From: day0, To: day0.Add(24 * time.Hour), Group: "r-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	pr := newProbe(topic, 1)
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pr.offsets(0); !slices.Equal(got, []int64{0, 2}) {
		t.Errorf("audited %v, want [0 2]", got)
	}
	if res.Records != 3 || res.OutOfRange != 1 || res.Effects != 2 || res.Partitions[0].Committed != 3 {
		t.Errorf("result %+v", res)
	}
}

// TestRunFailingEffectResumes: an effect failing at an offset ends the replay
// with an error, the replay group committed exactly below it; running the
// plan again resumes there and no effect applies twice.
func TestRunFailingEffectResumes(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("fail", 2, nil)
	for p := int32(0); p < 2; p++ {
		for i := 0; i < 50; i++ {
			f.produce(topic, p, fmt.Sprint(i), "v", day0.Add(time.Duration(i)*time.Second))
		}
	}
	plan, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {5, 50}, 1: {0, 40}}, Group: "r-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	pr := newProbe(topic, 2)
	pr.failAt = "0/17"
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
	var inc *IncompleteError
	if !errors.As(err, &inc) || inc.Reason != "failed" {
		t.Fatalf("got %v, want an IncompleteError (failed)", err)
	}
	if c := f.committed(plan.Group, topic, 2)[0]; c != 17 {
		t.Fatalf("p0 committed %d after failing at 17, want 17", c)
	}
	if res.Partitions[0].Done {
		t.Fatalf("p0 reported done")
	}
	if _, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{}); err != nil {
		t.Fatal(err)
	}
	if got := pr.offsets(0); !slices.Equal(got, span(5, 50)) {
		t.Errorf("p0 audited %v", got)
	}
	if got := pr.offsets(1); !slices.Equal(got, span(0, 40)) {
		t.Errorf("p1 audited %v", got)
	}
	c := f.committed(plan.Group, topic, 2)
	if c[0] != 50 || c[1] != 40 {
		t.Errorf("committed %v, want 50, 40", c)
	}
}

// TestRunRefusals: a plan whose stop lies past its captured end, the live
// group, and a replay group committed outside the plan are refused before
// anything is read; a misspelt effect is an error after the run.
func TestRunRefusals(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("runrefuse", 1, nil)
	for i := 0; i < 5; i++ {
		f.produce(topic, 0, "k", "v", day0)
	}
	pr := newProbe(topic, 1)
	bad := &Plan{Topic: topic, Group: "r1-" + topic, LiveGroup: "live", Partitions: []PartitionPlan{{Partition: 0, Start: 0, Stop: 6, End: 5}}}
	if _, err := run(context.Background(), f.client, bad, Target{Agent: pr.runner, Effect: "audit"}, Options{}); !errors.Is(err, ErrBeyondEnd) {
		t.Errorf("stop past end: %v", err)
	}
	live := &Plan{Topic: topic, Group: "live", LiveGroup: "live", Partitions: []PartitionPlan{{Partition: 0, Start: 0, Stop: 5, End: 5}}}
	if _, err := run(context.Background(), f.client, live, Target{Agent: pr.runner, Effect: "audit"}, Options{}); !errors.Is(err, ErrLiveGroup) {
		t.Errorf("live group: %v", err)
	}
	plan, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 3}}, Group: "r2-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{}); err != nil {
		t.Fatal(err)
	}
	other, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {3, 5}}, Group: plan.Group, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), f.client, other, Target{Agent: pr.runner, Effect: "audit"}, Options{}); err != nil {
		// committed 3 == other's start: allowed (continues where it ended)
		t.Fatalf("adjacent plan: %v", err)
	}
	third, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 2}}, Group: plan.Group, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), f.client, third, Target{Agent: pr.runner, Effect: "audit"}, Options{}); !errors.Is(err, ErrGroupOutside) {
		t.Errorf("group outside the plan: %v", err)
	}
	typo, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 5}}, Group: "r3-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), f.client, typo, Target{Agent: newProbe(topic, 1).runner, Effect: "audti"}, Options{}); !errors.Is(err, ErrEffectUnused) {
		t.Errorf("misspelt effect: %v", err)
	}
}

// TestRunIdleAndDeadline: a partition whose broker holds less than the plan
// expects (here a plan claiming an end of 100 over 3 records) expires the
// idle timeout; an effect that never returns expires the deadline. Both are
// IncompleteErrors saying how far each partition got, never success.
func TestRunIdleAndDeadline(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("idle", 1, nil)
	for i := 0; i < 3; i++ {
		f.produce(topic, 0, "k", "v", day0)
	}
	pr := newProbe(topic, 1)
	plan := &Plan{Topic: topic, Group: "r-idle-" + topic, LiveGroup: "live", Partitions: []PartitionPlan{{Partition: 0, Start: 0, Stop: 100, End: 100}}}
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{IdleTimeout: 300 * time.Millisecond})
	var inc *IncompleteError
	if !errors.As(err, &inc) || inc.Reason != "idle" || !errors.Is(err, errIdle) {
		t.Fatalf("got %v, want an idle IncompleteError", err)
	}
	if p := res.Partitions[0]; p.Position != 3 || p.Committed != 3 || p.Done {
		t.Errorf("partition result %+v, want position 3, committed 3", p)
	}

	blocked := newProbe(topic, 1)
	blocked.block = true
	plan2, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 3}}, Group: "r-deadline-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = run(context.Background(), f.client, plan2, Target{Agent: blocked.runner, Effect: "audit"}, Options{Deadline: 300 * time.Millisecond})
	if !errors.As(err, &inc) || inc.Reason != "deadline" {
		t.Fatalf("got %v, want a deadline IncompleteError", err)
	}
	if p := res.Partitions[0]; p.Done || p.Committed > 0 {
		t.Errorf("partition result %+v: nothing may be committed", p)
	}
	if c := f.committed(plan2.Group, topic, 1); len(c) != 0 {
		t.Errorf("replay group committed %v", c)
	}
}

// TestRunDeadLetterPolicyEffectFails: an agent whose error policy
// dead-letters records still fails the replay when its effect fails (a
// replay writes no dead letters: passing the record would lose the effect),
// and the offset stays at the failing record.
func TestRunDeadLetterPolicyEffectFails(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("dlq", 1, nil)
	for i := 0; i < 10; i++ {
		f.produce(topic, 0, "k", "v", day0)
	}
	plan, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 10}}, Group: "r-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	pr := newProbe(topic, 1, agent.OnError(agent.DeadLetter))
	pr.failAt = "0/6"
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
	var fe *agent.EffectError
	if !errors.As(err, &fe) || fe.Effect != "audit" {
		t.Fatalf("got %v, want the effect's error", err)
	}
	if c := f.committed(plan.Group, topic, 1)[0]; c != 6 || res.Partitions[0].Done {
		t.Fatalf("committed %d (done %v), want 6", c, res.Partitions[0].Done)
	}
}
