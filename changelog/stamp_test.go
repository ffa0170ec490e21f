package changelog_test

import (
	"context"
	"reflect"
	"sync"
	"testing"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
)

func TestStampRoundTrip(t *testing.T) {
	for _, s := range []changelog.Stamp{
		{},
		{Epoch: 7, HasBefore: true}, // before: absent
		{Epoch: 1 << 40, HasBefore: true, Before: []byte{}},
		{Epoch: 3, HasBefore: true, Before: []byte("41"), Sources: []changelog.Source{{Topic: "events", Partition: 5, Offset: 1234}, {Topic: "b", Partition: 0, Offset: -1}}},
	} {
		got, err := changelog.ParseStamp(s.Append(nil))
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if !reflect.DeepEqual(got, s) && !(len(got.Sources) == 0 && len(s.Sources) == 0 && got.Epoch == s.Epoch && got.HasBefore == s.HasBefore) {
			t.Fatalf("round trip %+v -> %+v", s, got)
		}
		if (got.Before == nil) != (s.Before == nil) {
			t.Fatalf("before nil-ness lost: %+v -> %+v", s, got)
		}
	}
	full := (&changelog.Stamp{Epoch: 3, HasBefore: true, Before: []byte("x"), Sources: []changelog.Source{{Topic: "t", Partition: 1, Offset: 9}}}).Append(nil)
	for i := range full {
		if _, err := changelog.ParseStamp(full[:i]); err == nil {
			t.Fatalf("truncated stamp (%d of %d bytes) parsed", i, len(full))
		}
	}
	if _, err := changelog.ParseStamp(append(full, 0)); err == nil {
		t.Fatal("stamp with a trailing byte parsed")
	}
}

func cycle(epoch, srcOffset int64, before string, absent bool) *changelog.Stamp {
	s := &changelog.Stamp{Epoch: epoch, HasBefore: true, Sources: []changelog.Source{*src(srcOffset)}}
	if !absent {
		s.Before = []byte(before)
	}
	return s
}

// The changelog of a hand-over whose old owner's last write was delayed: the
// old owner (epoch 1) counted a to 3 and then to 4, but the write of 4 was
// still in flight when the new owner (epoch 2) restored 3; the new owner
// counted the same source records to 4 and 5, and then the old owner's
// delayed 4 landed ("1 2 3 4 5 4"). Restore and standbys must end at 5.
func TestStaleOwnersLateWriteIsFenced(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	e.produce(topic,
		rec{key: "a", value: "1", stamp: cycle(1, 0, "", true)},
		rec{key: "a", value: "2", stamp: cycle(1, 1, "1", false)},
		rec{key: "a", value: "3", stamp: cycle(1, 2, "2", false)},
		rec{key: "a", value: "4", stamp: cycle(2, 3, "3", false)},
		rec{key: "a", value: "5", stamp: cycle(2, 4, "4", false)},
		rec{key: "a", value: "4", stamp: cycle(1, 3, "3", false)}, // the late write
		rec{key: "b", value: "1", stamp: cycle(1, 3, "", true)},   // the late write's sibling
	)
	all := committed(map[int32]int64{0: 5})
	st := stores.NewMemory()
	res := restore(t, e, topic, st, changelog.SkipUncommitted(all))
	wantMap(t, dump(t, st), map[string]string{"a": "5"})
	if res.Fenced != 2 {
		t.Fatalf("result %+v, want 2 fenced", res)
	}
	wantMarks(t, st, map[string]int64{"src/0": 4, changelog.EpochMark: 2})

	// Without stamps' epochs (the three source headers), the stale 4 wins:
	// the test above would fail.
	legacy := e.topic("cl", nil)
	e.produce(legacy, rec{key: "a", value: "5", src: src(4)}, rec{key: "a", value: "4", src: src(3)})
	lst := stores.NewMemory()
	restore(t, e, legacy, lst, changelog.SkipUncommitted(all))
	wantMap(t, dump(t, lst), map[string]string{"a": "4"})

	// A standby following the same changelog ends at 5 too.
	fst := stores.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = e.restorer.Follow(ctx, topic, 0, fst, changelog.SkipUncommitted(all))
	}()
	waitFor(t, func() bool { off, _ := fst.Offset(0); return off == 6 })
	cancel()
	wg.Wait()
	wantMap(t, dump(t, fst), map[string]string{"a": "5"})
}

// A cycle's record whose source offsets were not committed (the worker
// crashed after the changelog ack, before the commit) is replaced by its
// before-image on restore, also when compaction already removed the record
// that wrote the committed value.
func TestRestoreUsesBeforeImageOfUncommittedCycle(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	// Committed cycle (commit point 10): a=5, gone to compaction (not
	// produced). Uncommitted cycle (commit point 20): a=6 (before 5), n=1
	// (before: absent), z deleted (before 9); a later uncommitted cycle a=7
	// (before 6: not committed, must not be used).
	e.produce(topic,
		rec{key: "keep", value: "k", stamp: cycle(1, 9, "", true)},
		rec{key: "a", value: "6", stamp: cycle(1, 19, "5", false)},
		rec{key: "n", value: "1", stamp: cycle(1, 19, "", true)},
		rec{key: "z", tombstone: true, stamp: cycle(1, 19, "9", false)},
		rec{key: "a", value: "7", stamp: cycle(1, 29, "6", false)},
	)
	st := stores.NewMemory()
	if err := st.Apply(0, &stores.Batch{Ops: []stores.Op{{Key: []byte("z"), Value: []byte("stale")}}, Offset: stores.NoOffset}); err != nil {
		t.Fatal(err)
	}
	res := restore(t, e, topic, st, changelog.SkipUncommitted(committed(map[int32]int64{0: 10})))
	wantMap(t, dump(t, st), map[string]string{"keep": "k", "a": "5", "z": "9"})
	if res.Skipped != 4 || res.Records != 4 {
		t.Fatalf("result %+v, want 4 applied (1 record, 3 before-images) and 4 skipped", res)
	}
	// Committed later: the same changelog restores the cycles' values.
	fresh := stores.NewMemory()
	restore(t, e, topic, fresh, changelog.SkipUncommitted(committed(map[int32]int64{0: 30})))
	wantMap(t, dump(t, fresh), map[string]string{"keep": "k", "a": "7", "n": "1"})
}
