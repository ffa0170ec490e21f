package replay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/replay"
	"github.com/runnel-dev/runnel/runneltest"
	"github.com/runnel-dev/runnel/table"
)

func TestVersionedCodec(t *testing.T) {
	c := replay.VersionedCodec(codec.String())
	for _, v := range []replay.Versioned[string]{
		{Version: 7, Value: "seven"}, {Version: -3, Value: ""}, {Version: 1 << 62, Deleted: true}, {Version: 0, Value: "zero"},
	} {
		b, err := c.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != v.Version || got.Value != v.Value || got.Deleted != v.Deleted {
			t.Errorf("round trip of %v: %v", v, got)
		}
	}
	for _, b := range [][]byte{nil, {0, 0, 0}, {2, 0, 0, 0, 0, 0, 0, 0, 1}, {1, 0, 0, 0, 0, 0, 0, 0, 1, 'x'}} {
		if v, err := c.Decode(b); err == nil {
			t.Errorf("Decode(%v) = %v, want an error", b, v)
		}
	}
	if got := (replay.Versioned[string]{Version: 4, Value: "x"}).String(); got != "x@v4" {
		t.Errorf("String = %q", got)
	}
}

// update is one event of an entity: its business version and new value, or
// a deletion.
type update struct {
	Version int64  `json:"version"`
	Value   string `json:"value"`
	Delete  bool   `json:"delete,omitempty"`
}

type versionApp struct {
	app     *app.App
	updates *agent.Topic[string, update]
	state   *table.Table[string, replay.Versioned[string]]
}

// buildVersionApp: one agent applies every update through the guard. failOn
// names one value whose first delivery writes and then fails the record, so
// that the worker reverts the cycle and redelivers it (agent.Restart). id is
// the app ID and prefixes its input topic: unique per run, for the real tier.
func buildVersionApp(id, failOn string) *versionApp {
	a := app.New(id)
	v := &versionApp{app: a}
	v.updates = app.Topic(a, id+"-entity-updates", codec.String(), codec.JSON[update](), app.Partitions(4))
	v.state = replay.NewVersionedTable(a, "entity-state", codec.String(), codec.String())
	var failed atomic.Bool
	agent.New(a, "apply", v.updates, func(ctx context.Context, s *agent.Stream[string, update]) error {
		for ev := range s.Events() {
			u := ev.Value
			if u.Delete {
				replay.DeleteVersion(ev, v.state, ev.Key, u.Version)
			} else {
				replay.SetVersion(ev, v.state, ev.Key, u.Version, u.Value)
			}
			if u.Value == failOn && failed.CompareAndSwap(false, true) {
				return errors.New("injected failure after the write")
			}
		}
		return s.Err()
	}, agent.WritesTo(v.state))
	return v
}

// model applies updates in order as the guard is specified: a write wins
// only over an older version (or none); a deletion is a versioned tombstone.
func model(us []update, state map[string]replay.Versioned[string], key string) {
	for _, u := range us {
		old, ok := state[key]
		if ok && old.Version >= u.Version {
			continue
		}
		state[key] = replay.Versioned[string]{Version: u.Version, Value: u.Value, Deleted: u.Delete}
	}
}

func checkState(t *testing.T, d *runneltest.Driver, v *versionApp, want map[string]replay.Versioned[string]) {
	t.Helper()
	got, err := d.Table(v.state)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("%d entities, want %d", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k].(replay.Versioned[string])
		if !ok || g.Version != w.Version || g.Value != w.Value || g.Deleted != w.Deleted {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
}

// TestVersionGuard sends 30 entities' versions 1..8 in a shuffled order, each
// event twice (the second time with another value: a redelivered event, or a
// second writer claiming the same version), deletions at version 9 for a third
// of them followed by older updates, and one injected failure that makes the
// worker revert its cycle and redeliver. Every entity must end at its newest
// version with the value of the first event of that version. Then the stores
// are deleted and the table restored from its changelog: older versions sent
// after the restore are refused, a newer one applies.
func TestVersionGuard(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	v := buildVersionApp(testbroker.Topic(t, "version-guard"), "e7-v5")
	// On the real tier (RUNNEL_KAFKA_BROKERS) the workers run on Kafka.
	d, err := runneltest.Start(v.app, runneltest.Options{Workers: 2, Brokers: testbroker.Brokers(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	}()

	want := map[string]replay.Versioned[string]{}
	var in []runneltest.Record[string, update]
	for e := range 30 {
		key := fmt.Sprintf("e%d", e)
		var us []update
		for ver := int64(1); ver <= 8; ver++ {
			us = append(us, update{Version: ver, Value: fmt.Sprintf("%s-v%d", key, ver)})
		}
		rng.Shuffle(len(us), func(i, j int) { us[i], us[j] = us[j], us[i] })
		for i := range len(us) { // the duplicates, each somewhere after its first
			at := i + 1 + rng.IntN(len(us)-i)
			dup := us[i]
			dup.Value += "-dup"
			us = append(us[:at], append([]update{dup}, us[at:]...)...)
		}
		if e%3 == 0 {
			us = append(us, update{Version: 9, Delete: true}, update{Version: 8, Value: key + "-resurrected"}, update{Version: 2, Value: key + "-old"})
		}
		model(us, want, key)
		for _, u := range us {
			in = append(in, runneltest.Record[string, update]{Key: key, Value: u})
		}
	}
	if err := runneltest.SendAll(d, v.updates, in); err != nil {
		t.Fatal(err)
	}
	checkState(t, d, v, want)
	var retried int64
	for _, w := range d.Workers() {
		retried += w.Retried()
	}
	if retried == 0 {
		t.Error("the injected failure did not make the worker redeliver")
	}
	if want["e0"] != (replay.Versioned[string]{Version: 9, Deleted: true}) || want["e1"].Value != "e1-v8" {
		t.Fatalf("the model is wrong: e0 %v, e1 %v", want["e0"], want["e1"])
	}

	if err := d.Restart(); err != nil {
		t.Fatal(err)
	}
	after := []runneltest.Record[string, update]{
		{Key: "e1", Value: update{Version: 7, Value: "e1-after-restore-old"}},
		{Key: "e1", Value: update{Version: 8, Value: "e1-after-restore-same"}},
		{Key: "e0", Value: update{Version: 3, Value: "e0-after-restore-old"}},
		{Key: "e2", Value: update{Version: 10, Value: "e2-after-restore-new"}},
	}
	if err := runneltest.SendAll(d, v.updates, after); err != nil {
		t.Fatal(err)
	}
	for _, r := range after {
		model([]update{r.Value}, want, r.Key)
	}
	if want["e2"].Value != "e2-after-restore-new" || want["e1"].Value != "e1-v8" {
		t.Fatalf("the model is wrong: e1 %v, e2 %v", want["e1"], want["e2"])
	}
	checkState(t, d, v, want)
}
