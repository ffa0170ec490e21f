package changelog_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
)

// TestRecreatedChangelogRebuilds (issue #12): a changelog topic deleted and
// recreated under a store, which refilled past the store's checkpoint
// before the restore, is told apart by its topic ID (KIP-516, recorded with
// the checkpoint) and the store is rebuilt from the new topic. Offsets alone
// cannot tell: the checkpoint is below the new highwater, and the restore
// would read on from it, mixing the old topic's state into the new one's.
func TestRecreatedChangelogRebuilds(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	e.produce(topic, rec{key: "a", value: "1"}, rec{key: "b", value: "2"})
	st, err := stores.OpenPebble(filepath.Join(t.TempDir(), "store"), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if res := restore(t, e, topic, st); res.Records != 2 {
		t.Fatalf("first restore %+v, want 2 records", res)
	}
	first, ok, err := changelog.TopicID(e.client, topic)
	if err != nil || !ok {
		t.Fatalf("topic ID: %v %v (the broker must give topic IDs: Metadata v10+)", ok, err)
	}
	marks, err := st.Marks(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := marks[changelog.TopicIDHighMark]; !ok {
		t.Fatalf("marks %v: no topic ID recorded with the checkpoint", marks)
	}

	// Delete and recreate the topic; the new one refills past the
	// checkpoint (offset 1) before the store is restored again.
	if err := e.admin.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		err := e.admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
			ConfigEntries: map[string]*string{"cleanup.policy": strPtr("compact")}}, false)
		if err == nil {
			break
		}
		var te *sarama.TopicError
		if i > 100 || !(errors.As(err, &te) && te.Err == sarama.ErrTopicAlreadyExists) {
			t.Fatalf("recreate %s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.waitMetadata(topic)
	e.produce(topic, rec{key: "c", value: "3"}, rec{key: "d", value: "4"}, rec{key: "e", value: "5"}, rec{key: "a", value: "9"})
	second, ok, err := changelog.TopicID(e.client, topic)
	if err != nil || !ok || second == first {
		t.Fatalf("recreated topic's ID %v (ok %v, err %v), first %v: want a new one", second, ok, err, first)
	}
	res := restore(t, e, topic, st)
	if !res.Rebuilt || res.From != 0 || res.Records != 4 {
		t.Fatalf("restore after the recreation %+v, want a rebuild of 4 records from 0", res)
	}
	wantMap(t, dump(t, st), map[string]string{"a": "9", "c": "3", "d": "4", "e": "5"})
	// The new ID is recorded: the next restore keeps the checkpoint.
	if res := restore(t, e, topic, st); res.Rebuilt || res.Records != 0 {
		t.Fatalf("restore on the same topic %+v, want nothing to do", res)
	}
}
