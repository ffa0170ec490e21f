package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/table"
)

// change is one event of the real input
// (examples/changeaudit/testdata/git-history.jsonl.gz, one JSON object a
// line), with the fields the test reads.
type change struct {
	EventID    string   `json:"event_id"`
	Actor      string   `json:"actor"`
	RecordedAt string   `json:"recorded_at"`
	Added      int64    `json:"added"`
	Deleted    int64    `json:"deleted"`
	Dirs       []string `json:"dirs"`
	line       []byte
	at         time.Time
}

const dataPath = "../examples/changeaudit/testdata/git-history.jsonl.gz"

var (
	changesOnce sync.Once
	changes     []change
	changesErr  error
)

// loadChanges reads the real data set with recorded_at parsed (once per
// test binary).
func loadChanges(t testing.TB) []change {
	t.Helper()
	changesOnce.Do(func() { changes, changesErr = readChanges() })
	if changesErr != nil {
		t.Fatal(changesErr)
	}
	return changes
}

func readChanges() ([]change, error) {
	fh, err := os.Open(dataPath)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	gz, err := gzip.NewReader(fh)
	if err != nil {
		return nil, err
	}
	var out []change
	sc := bufio.NewScanner(gz)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// The three fields the tests need are plain strings (hex IDs,
		// pseudonyms, RFC 3339 times): picked out without a JSON decode,
		// which takes 20 s for the whole file under -race. The agent under
		// test decodes every record it replays.
		var c change
		c.EventID, c.Actor, c.RecordedAt = field(sc.Bytes(), "event_id"), field(sc.Bytes(), "actor"), field(sc.Bytes(), "recorded_at")
		if c.EventID == "" || c.Actor == "" {
			return nil, fmt.Errorf("line %d: no event_id or actor", len(out)+1)
		}
		if c.at, err = time.Parse(time.RFC3339, c.RecordedAt); err != nil {
			return nil, err
		}
		c.line = append([]byte(nil), sc.Bytes()...)
		out = append(out, c)
	}
	return out, sc.Err()
}

// field returns the string value of "name" in the JSON object line ("" when
// absent); the value must hold no escapes.
func field(line []byte, name string) string {
	key := []byte(`"` + name + `":"`)
	i := bytes.Index(line, key)
	if i < 0 {
		return ""
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 || bytes.IndexByte(rest[:j], '\\') >= 0 {
		return ""
	}
	return string(rest[:j])
}

// busiestDay is the UTC calendar day with the most events (by recorded_at).
func busiestDay(cs []change) time.Time {
	n := map[time.Time]int{}
	var best time.Time
	for _, c := range cs {
		d := c.at.UTC().Truncate(24 * time.Hour)
		n[d]++
		if n[d] > n[best] || (n[d] == n[best] && d.Before(best)) {
			best = d
		}
	}
	return best
}

// produceChanges writes cs to topic (8 partitions, key = actor, partitioned
// by murmur2 like Runnel's sinks), record timestamp = recorded_at.
func produceChanges(t testing.TB, brokers []string, cfg *sarama.Config, topic string, cs []change) {
	t.Helper()
	c := *cfg
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	c.Producer.Flush.Bytes = 512 << 10
	p, err := sarama.NewAsyncProducer(brokers, &c)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var first error
		for i := 0; i < len(cs); i++ {
			select {
			case <-p.Successes():
			case e := <-p.Errors():
				if first == nil {
					first = e
				}
			}
		}
		done <- first
	}()
	for _, ch := range cs {
		p.Input() <- &sarama.ProducerMessage{Topic: topic, Partition: kafka.PartitionFor([]byte(ch.Actor), 8),
			Key: sarama.StringEncoder(ch.Actor), Value: sarama.ByteEncoder(ch.line), Timestamp: ch.at}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// auditApp is the change-audit agent under replay: it counts events per
// actor in a table, sends a notification for every event (a sink), calls a
// "notify" effect, and writes an audit row through SQLOnce (the "audit"
// effect). delay slows the audit effect (the crash test).
type auditApp struct {
	runner   agent.Def
	tables   []table.Def
	notified atomic.Int64
}

func newAuditApp(topic string, once *SQLOnce, delay time.Duration, db *downDB) *auditApp {
	h := &host{}
	a := &auditApp{}
	events := newTopic(h, topic, codec.String(), codec.JSON[change](), 8)
	notifications := newTopic(h, topic+"-notifications", codec.String(), codec.String(), 8)
	th := &tableHost{}
	perActor := table.New(th, "commits-per-actor", codec.String(), codec.DecimalInt64())
	a.tables = th.defs
	audit := agent.NewEffect("audit")
	notify := agent.NewEffect("notify")
	a.runner = agent.New(h, "audit-changes", events, func(ctx context.Context, s *agent.Stream[string, change]) error {
		for ev := range s.Events() {
			c := ev.Value
			perActor.Update(ev, c.Actor, func(n int64) int64 { return n + 1 })
			notifications.Send(ev, c.Actor, "change "+c.EventID)
			if _, err := notify.Apply(ev, func() (bool, error) { a.notified.Add(1); return true, nil }); err != nil {
				return err
			}
			if _, err := audit.Apply(ev, func() (bool, error) {
				if delay > 0 {
					time.Sleep(delay)
				}
				apply := func() (bool, error) {
					return once.Apply(ctx, c.EventID, func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, `INSERT INTO audit_events (event_id, actor, recorded_at, lines) VALUES ($1, $2, $3, $4)`,
							c.EventID, c.Actor, c.at.UTC().Format(time.RFC3339), c.Added+c.Deleted)
						return err
					})
				}
				if db != nil {
					return db.apply(ev.Partition(), ev.Offset(), apply)
				}
				return apply()
			}); err != nil {
				return err
			}
		}
		return s.Err()
	}, agent.OnError(agent.StopWorker), agent.WritesTo(perActor), agent.SendsTo(notifications))
	return a
}

// tableHost collects table declarations.
type tableHost struct{ defs []table.Def }

func (h *tableHost) AppID() string             { return "change-audit" }
func (h *tableHost) RegisterTable(d table.Def) { h.defs = append(h.defs, d) }

// openAuditDB opens (creating) the SQLite audit database at path.
func openAuditDB(t testing.TB, path string) (*sql.DB, *SQLOnce) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS audit_events (event_id TEXT NOT NULL, actor TEXT NOT NULL, recorded_at TEXT NOT NULL, lines INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	once, err := NewSQLOnce(context.Background(), db, "audit_receipts")
	if err != nil {
		t.Fatal(err)
	}
	return db, once
}

// auditIDs returns the event IDs of the audit rows, sorted, and the row count.
func auditIDs(t testing.TB, db *sql.DB) ([]string, int) {
	t.Helper()
	rows, err := db.Query(`SELECT event_id FROM audit_events ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids, len(ids)
}

// expectedIDs is the sorted event IDs with recorded_at in [from, to),
// computed from the input alone.
func expectedIDs(cs []change, from, to time.Time) []string {
	var ids []string
	for _, c := range cs {
		if !c.at.Before(from) && c.at.Before(to) {
			ids = append(ids, c.EventID)
		}
	}
	sort.Strings(ids)
	return ids
}

// TestReplayRealDay replays the busiest day of the real data (record
// timestamp = recorded_at) into a SQLite audit table: the audit rows are the
// day's events exactly; the notification sink and the notify effect stay
// silent; the live group's committed offsets do not move; a database that
// fails halfway leaves the replay offset uncommitted at the failing record,
// and the resumed replay completes the table; replaying the day again adds
// no row.
func TestReplayRealDay(t *testing.T) {
	all := loadChanges(t)
	day := busiestDay(all)
	// Produce the day with a day of real data on each side.
	var cs []change
	for _, c := range all {
		if !c.at.Before(day.AddDate(0, 0, -1)) && c.at.Before(day.AddDate(0, 0, 2)) {
			cs = append(cs, c)
		}
	}
	f := newFixture(t)
	topic := f.topic("change-events", 8, nil)
	produceChanges(t, f.brokers, f.client.Config(), topic, cs)
	want := expectedIDs(all, day, day.AddDate(0, 0, 1))
	if len(want) < 100 {
		t.Fatalf("busiest day %s has %d events", day, len(want))
	}
	// The live group has committed offsets; the replay must not move them.
	live := "change-audit-" + topic
	commitLive(t, f, live, topic, map[int32]int64{0: 3, 5: 1})

	db, once := openAuditDB(t, filepath.Join(t.TempDir(), "audit.db"))
	plan, err := newPlan(f.client, Spec{Topic: topic, From: day, To: day.AddDate(0, 0, 1), Group: live + "-replay", LiveGroup: live})
	if err != nil {
		t.Fatal(err)
	}
	// The database goes down after 40 audit rows.
	down := &downDB{after: 40, firstFail: map[int32]int64{}}
	app := newAuditApp(topic, once, 0, down)
	res, err := run(context.Background(), f.client, plan, Target{Agent: app.runner, Effect: "audit", Tables: app.tables}, Options{})
	var inc *IncompleteError
	if !errors.As(err, &inc) {
		t.Fatalf("failing database: got %v, want an IncompleteError", err)
	}
	if res.Effects != 40 || res.EffectErrors == 0 {
		t.Fatalf("failing database: %d effects, %d errors; want 40 and some", res.Effects, res.EffectErrors)
	}
	_, rows := auditIDs(t, db)
	if rows != 40 {
		t.Fatalf("%d audit rows after the failure, want 40", rows)
	}
	// Every partition that met the failure is committed exactly at the
	// record that failed: never past it.
	committed := f.committed(plan.Group, topic, 8)
	for p, off := range down.firstFail {
		if res.Partitions[p].Done {
			t.Errorf("partition %d reported done", p)
		}
		if committed[p] != off {
			t.Errorf("partition %d committed %d, its first failed record is %d", p, committed[p], off)
		}
	}
	if len(down.firstFail) == 0 {
		t.Fatal("no record failed")
	}
	t.Logf("first run: %v", err)

	app = newAuditApp(topic, once, 0, nil)
	res, err = run(context.Background(), f.client, plan, Target{Agent: app.runner, Effect: "audit", Tables: app.tables}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, rows := auditIDs(t, db)
	if rows != len(want) || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("audit rows %d, want the day's %d events", rows, len(want))
	}
	if res.Effects+40 != int64(len(want)) || app.notified.Load() != 0 || res.Suppressed != res.Delivered {
		t.Fatalf("resumed run: effects %d (+40 before), notified %d, suppressed %d of %d", res.Effects, app.notified.Load(), res.Suppressed, res.Delivered)
	}
	if c := f.committed(live, topic, 8); len(c) != 2 || c[0] != 3 || c[5] != 1 {
		t.Fatalf("live group offsets moved: %v", c)
	}
	// Again, in a fresh replay group: every record is a duplicate.
	plan2 := *plan
	plan2.Group = live + "-replay-2"
	app = newAuditApp(topic, once, 0, nil)
	res, err = run(context.Background(), f.client, &plan2, Target{Agent: app.runner, Effect: "audit", Tables: app.tables}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, rows := auditIDs(t, db); rows != len(want) || res.Effects != 0 || res.Duplicates != int64(len(want)) {
		t.Fatalf("second replay: rows %d, effects %d, duplicates %d; want %d, 0, %d", rows, res.Effects, res.Duplicates, len(want), len(want))
	}
	t.Logf("day %s: %d events, %d records read, %d out of the time range", day.Format("2006-01-02"), len(want), res.Records, res.OutOfRange)
}

// downDB is a database that goes down for good after `after` applied
// effects; firstFail holds, per partition, the offset of its first failed
// record.
type downDB struct {
	mu        sync.Mutex
	after     int
	applied   int
	firstFail map[int32]int64
}

func (d *downDB) apply(p int32, off int64, fn func() (bool, error)) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.applied >= d.after {
		if _, ok := d.firstFail[p]; !ok {
			d.firstFail[p] = off
		}
		return false, errors.New("database unavailable")
	}
	ok, err := fn()
	if ok {
		d.applied++
	}
	return ok, err
}

func commitLive(t *testing.T, f *fixture, group, topic string, offs map[int32]int64) {
	t.Helper()
	req := sarama.NewOffsetCommitRequest(f.client.Config(), group)
	for p, o := range offs {
		req.AddBlock(topic, p, o, 0, "")
	}
	b, err := f.client.Coordinator(group)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CommitOffset(req); err != nil {
		t.Fatal(err)
	}
}

// TestMain runs the child replay of TestReplayCrashRestart when asked.
func TestMain(m *testing.M) {
	if os.Getenv("RUNNEL_REPLAY_CHILD") != "" {
		if err := childReplay(); err != nil {
			fmt.Fprintln(os.Stderr, "child replay:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childReplay replays the range named by the environment into the SQLite
// database named there, slowly (10 ms per audit effect), until it completes
// or is killed.
func childReplay() error {
	env := func(k string) string { return os.Getenv("RUNNEL_REPLAY_" + k) }
	from, err := time.Parse(time.RFC3339, env("FROM"))
	if err != nil {
		return err
	}
	to, err := time.Parse(time.RFC3339, env("TO"))
	if err != nil {
		return err
	}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_0_0_0
	client, err := sarama.NewClient(strings.Split(env("BROKERS"), ","), cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	db, err := sql.Open("sqlite", "file:"+env("DB")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	once, err := NewSQLOnce(context.Background(), db, "audit_receipts")
	if err != nil {
		return err
	}
	plan, err := newPlan(client, Spec{Topic: env("TOPIC"), From: from, To: to, Group: env("GROUP"), LiveGroup: env("LIVE")})
	if err != nil {
		return err
	}
	app := newAuditApp(env("TOPIC"), once, 10*time.Millisecond, nil)
	_, err = run(context.Background(), client, plan, Target{Agent: app.runner, Effect: "audit", Tables: app.tables}, Options{})
	return err
}

// TestReplayCrashRestart kills a replay process (SIGKILL) in the middle of
// the busiest day of the real data and replays again in the same group: the
// audit table ends with the day's events exactly, the restarted replay
// resumes from the group's committed offsets, and every record the killed
// process applied but had not committed comes back as a duplicate, never as
// a second row.
func TestReplayCrashRestart(t *testing.T) {
	all := loadChanges(t)
	day := busiestDay(all)
	var cs []change
	for _, c := range all {
		if !c.at.Before(day.AddDate(0, 0, -1)) && c.at.Before(day.AddDate(0, 0, 2)) {
			cs = append(cs, c)
		}
	}
	f := newFixture(t)
	topic := f.topic("change-events", 8, nil)
	produceChanges(t, f.brokers, f.client.Config(), topic, cs)
	want := expectedIDs(all, day, day.AddDate(0, 0, 1))
	path := filepath.Join(t.TempDir(), "audit.db")
	db, once := openAuditDB(t, path)
	live := "change-audit-" + topic
	group := live + "-replay"

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "RUNNEL_REPLAY_CHILD=1", "RUNNEL_REPLAY_BROKERS="+strings.Join(f.brokers, ","),
		"RUNNEL_REPLAY_TOPIC="+topic, "RUNNEL_REPLAY_GROUP="+group, "RUNNEL_REPLAY_LIVE="+live, "RUNNEL_REPLAY_DB="+path,
		"RUNNEL_REPLAY_FROM="+day.Format(time.RFC3339), "RUNNEL_REPLAY_TO="+day.AddDate(0, 0, 1).Format(time.RFC3339))
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	// Kill it once half of the day's rows are in (and it has committed
	// some offsets, or not: both must end exactly).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, rows := auditIDs(t, db)
		if rows >= len(want)/2 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("child ended before the kill: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("child made no progress: %d rows\n%s", rows, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	_, atKill := auditIDs(t, db)
	committedAtKill := f.committed(group, topic, 8)

	app := newAuditApp(topic, once, 0, nil)
	plan, err := newPlan(f.client, Spec{Topic: topic, From: day, To: day.AddDate(0, 0, 1), Group: group, LiveGroup: live})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run(context.Background(), f.client, plan, Target{Agent: app.runner, Effect: "audit", Tables: app.tables}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, rows := auditIDs(t, db)
	if rows != len(want) || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("audit rows %d after the restart, want the day's %d events exactly", rows, len(want))
	}
	if res.Effects != int64(len(want)-atKill) {
		t.Fatalf("restart applied %d effects, want %d (%d rows were in at the kill)", res.Effects, len(want)-atKill, atKill)
	}
	var resumed int64
	for _, p := range res.Partitions {
		if p.From != committedAtKill[p.Partition] && committedAtKill[p.Partition] != 0 {
			t.Errorf("partition %d resumed at %d, committed at the kill %d", p.Partition, p.From, committedAtKill[p.Partition])
		}
		resumed += p.From - p.Start
	}
	t.Logf("killed with %d of %d rows in, %d offsets committed; restart read %d records: %d effects, %d duplicates",
		atKill, len(want), resumed, res.Records, res.Effects, res.Duplicates)
}
