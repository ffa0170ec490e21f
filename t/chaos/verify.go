package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// Row is the verdict on one table or topic: how many of its keys are exact,
// below exact (lost), above exact (duplicated) or wrong (a key or value that
// no input record explains).
type Row struct {
	Name    string
	FedFrom string // what it is compared with
	// MustBeExact: a duplicate fails the run under its guarantee (a loss or
	// a wrong key always does).
	MustBeExact                   bool
	Keys, Exact, Lost, Dup, Wrong int
	Got, Want                     int64 // sum of the values (tables) or records (topics)
	Example                       string
	Note                          string
	bad                           []string // up to 5 keys that are not exact, lost ones first
}

// Overcount is how far the row is above what it is compared with, in
// percent of it ((got - want) / want); 0 when nothing is expected.
func (r Row) Overcount() float64 {
	if r.Want == 0 {
		return 0
	}
	return float64(r.Got-r.Want) / float64(r.Want) * 100
}

// Failed reports whether the row fails the run.
func (r Row) Failed() bool { return r.Lost > 0 || r.Wrong > 0 || (r.MustBeExact && r.Dup > 0) }

// Report is the outcome of a chaos run.
type Report struct {
	Seed      uint64
	Guarantee string
	Broker    string
	Steps     []Step
	Produced  int64 // records the producer had acknowledged
	Failed    int64 // records of batches that failed after every retry
	Rows      []Row
	// Problems are failures that are not a row: workers that did not stop
	// cleanly on SIGTERM, a harness step that failed.
	Problems []string
	// Crashes are unexpected worker exits (restarted by the harness).
	Crashes []string
	// Rebuilds are the workers' "claim's start offset differs" errors: a
	// table partition found out of step with where its claim starts, which
	// the worker rebuilds (app.checkStart). Not a failure of the run, but
	// the trace of an anomaly upstream.
	Rebuilds []string
	// Unowned are the workers' table writes refused because no running task
	// cuts the partition (tablestate.ErrNotOwned): the worker stops before the
	// record commits, so not a failure of the run by itself, but the trace
	// of a claim that ran without its task's tables, the state that lost
	// updates in CI once.
	Unowned []string
	// BrokerSchedule and BrokerSteps: the broker schedule of the
	// three-broker tier and what it did, with timings; Topics what the
	// check of the app's topics found (replication, min.insync.replicas).
	BrokerSchedule string
	BrokerSteps    []string
	Topics         string
	Elapsed        time.Duration
}

// OK reports whether the run met its guarantee.
func (r *Report) OK() bool {
	for _, row := range r.Rows {
		if row.Failed() {
			return false
		}
	}
	return len(r.Problems) == 0 && len(r.Rows) > 0
}

// Write prints the report.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintf(w, "chaos: seed %d, guarantee %s, broker %s, %d steps, %d records produced (%d failed), %s\n",
		r.Seed, r.Guarantee, r.Broker, len(r.Steps), r.Produced, r.Failed, r.Elapsed.Round(time.Second))
	if r.BrokerSchedule != "" {
		fmt.Fprintf(w, "chaos: broker schedule %s, %d worker exits; %s\n", r.BrokerSchedule, len(r.Crashes), r.Topics)
		for _, s := range r.BrokerSteps {
			fmt.Fprintf(w, "  broker: %s\n", s)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "table/topic\tcompared with\tkeys\texact\tlost\tdup\twrong\tgot\twant\tover\tverdict")
	for _, row := range r.Rows {
		verdict := "exact"
		switch {
		case row.Failed():
			verdict = "FAIL"
		case row.Dup > 0:
			verdict = "duplicates (allowed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%+.2f%%\t%s\n", row.Name, row.FedFrom, row.Keys, row.Exact, row.Lost, row.Dup, row.Wrong, row.Got, row.Want, row.Overcount(), verdict)
	}
	tw.Flush()
	for _, row := range r.Rows {
		if row.Example != "" || row.Note != "" {
			fmt.Fprintf(w, "  %s: %s %s\n", row.Name, row.Example, row.Note)
		}
	}
	for _, c := range r.Crashes {
		fmt.Fprintf(w, "  unexpected exit: %s\n", c)
	}
	for _, c := range r.Rebuilds {
		fmt.Fprintf(w, "  start mismatch (partition rebuilt): %s\n", c)
	}
	for _, c := range r.Unowned {
		fmt.Fprintf(w, "  write refused (no task cuts the partition): %s\n", c)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  PROBLEM: %s\n", p)
	}
	if r.OK() {
		fmt.Fprintf(w, "chaos: PASS (%s)\n", r.Guarantee)
	} else {
		fmt.Fprintf(w, "chaos: FAIL (%s); seed %d\n", r.Guarantee, r.Seed)
	}
}

// consumeAll reads every record of topic (all partitions, earliest to the
// end offset taken at the start) through a consumer of client, which the
// caller configured read_committed, and calls f for each.
func consumeAll(ctx context.Context, client sarama.Client, topic string, f func(*sarama.ConsumerMessage)) error {
	return consumeAllNoting(ctx, client, topic, f, nil)
}

// firstRecordWait bounds the wait for a partition's first record in
// consumeAll.
const firstRecordWait = 60 * time.Second

// consumeAllNoting is consumeAll; readShort, if not nil, is told of each
// partition whose read ended idle before its end offset.
func consumeAllNoting(ctx context.Context, client sarama.Client, topic string, f func(*sarama.ConsumerMessage), readShort func(string)) error {
	parts, err := client.Partitions(topic)
	if err != nil {
		return fmt.Errorf("partitions of %s: %w", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	defer consumer.Close()
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("end offset of %s[%d]: %w", topic, p, err)
		}
		start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("start offset of %s[%d]: %w", topic, p, err)
		}
		if start >= end {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("consume %s[%d]: %w", topic, p, err)
		}
		// Read until the end offset; transaction markers (never delivered)
		// or aborted records at the tail end the read after 3 s idle. The
		// first record may take much longer on a loaded machine (a new
		// connection to a broker that was restarted, the first fetch): 3 s
		// there once read nothing of a whole input partition (42,035
		// records, counted lost) in a run whose tables held every one of
		// them. So the first record is waited for firstRecordWait, and a
		// read that ends idle short of the end is said.
		idle := time.NewTimer(firstRecordWait)
		read, last := 0, start-1
	read:
		for {
			select {
			case m := <-pc.Messages():
				f(m)
				read++
				last = m.Offset
				if m.Offset+1 >= end {
					break read
				}
				idle.Reset(3 * time.Second)
			case e := <-pc.Errors():
				pc.AsyncClose()
				return fmt.Errorf("consume %s[%d]: %w", topic, p, e)
			case <-idle.C:
				if readShort != nil {
					readShort(fmt.Sprintf("%s[%d]: read ended idle after %d records, at offset %d of %d..%d (markers or aborted records only, or a read cut short)", topic, p, read, last, start, end))
				}
				break read
			case <-ctx.Done():
				pc.AsyncClose()
				return ctx.Err()
			}
		}
		idle.Stop()
		if err := pc.Close(); err != nil {
			return fmt.Errorf("consume %s[%d]: %w", topic, p, err)
		}
	}
	return nil
}

// committedOffsets fetches the group's committed offsets of topics; a
// partition without a commit is 0 (the app starts from the earliest offset).
func committedOffsets(client sarama.Client, group string, topics []string) (map[string]map[int32]int64, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	req := map[string][]int32{}
	for _, t := range topics {
		ps, err := client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", t, err)
		}
		req[t] = ps
	}
	resp, err := admin.ListConsumerGroupOffsets(group, req)
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	out := map[string]map[int32]int64{}
	for t, ps := range req {
		out[t] = map[int32]int64{}
		for _, p := range ps {
			b := resp.GetBlock(t, p)
			if b == nil {
				return nil, fmt.Errorf("offsets of group %s: no answer for %s[%d]", group, t, p)
			}
			if b.Err != sarama.ErrNoError {
				return nil, fmt.Errorf("offsets of group %s, %s[%d]: %w", group, t, p, b.Err)
			}
			out[t][p] = max(b.Offset, 0)
		}
	}
	return out, nil
}

// readCommittedTable restores every partition of d's changelog into a memory
// store the way a worker's restore does (changelog.Restorer), skipping
// records whose source offsets the group has not committed: the table's
// committed state.
func readCommittedTable(ctx context.Context, client sarama.Client, d table.Def, committed map[string]map[int32]int64) (map[string]any, error) {
	parts, err := client.Partitions(d.Changelog())
	if err != nil {
		return nil, fmt.Errorf("table %s: %w", d.Name(), err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	r := &changelog.Restorer{Client: client, Consumer: consumer, Logger: slog.New(slog.DiscardHandler), ProgressInterval: time.Hour}
	st := stores.NewMemory()
	defer st.Close()
	fn := func(topic string, p int32) (int64, bool) {
		m, ok := committed[topic]
		if !ok {
			return 0, false
		}
		return m[p], true
	}
	out := map[string]any{}
	for _, p := range parts {
		if _, err := r.Restore(ctx, d.Changelog(), p, st, changelog.SkipUncommitted(fn)); err != nil {
			return nil, fmt.Errorf("table %s: %w", d.Name(), err)
		}
		err := st.Iterate(p, func(k, v []byte) error {
			ks, val, err := d.Format(k, v)
			if err != nil {
				return err
			}
			out[ks] = val
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("table %s[%d]: %w", d.Name(), p, err)
		}
	}
	return out, nil
}

// compareCounts compares a table of int64 with the expected values.
func compareCounts(name, fedFrom string, exact bool, got map[string]any, want map[string]int64) Row {
	row := Row{Name: name, FedFrom: fedFrom, MustBeExact: exact}
	var examples []string
	var lost, other []string
	note := func(k, s string, isLost bool) {
		if isLost {
			lost = append(lost, k)
		} else {
			other = append(other, k)
		}
		if len(examples) < 3 {
			examples = append(examples, s)
		}
	}
	keys := map[string]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	for k := range keys {
		row.Keys++
		w, expected := want[k]
		row.Want += w
		v, isInt := got[k].(int64)
		row.Got += v
		switch {
		case got[k] != nil && !isInt:
			row.Wrong++
			note(k, fmt.Sprintf("%s=%v (not int64)", k, got[k]), false)
		case !expected:
			row.Wrong++
			note(k, fmt.Sprintf("%s=%d (no input)", k, v), false)
		case v < w:
			row.Lost++
			note(k, fmt.Sprintf("%s=%d want %d", k, v, w), true)
		case v > w:
			row.Dup++
			note(k, fmt.Sprintf("%s=%d want %d", k, v, w), false)
		default:
			row.Exact++
		}
	}
	sort.Strings(examples)
	if len(examples) > 0 {
		row.Example = "e.g. " + strings.Join(examples, ", ")
	}
	sort.Strings(lost)
	sort.Strings(other)
	row.bad = append(lost, other...)
	if len(row.bad) > 5 {
		row.bad = row.bad[:5]
	}
	return row
}

// dirChange is a record of the intermediate topic, declared independently of
// the example's DirChange.
type dirChange struct {
	Dir     string `json:"dir"`
	EventID string `json:"event_id"`
	Actor   string `json:"actor"`
}

// compareMultisets compares, per key, the multiset of IDs a topic holds with
// the expected one: a key missing an ID is lost, one holding an ID more often
// than expected is duplicated, one holding an ID no input explains is wrong.
func compareMultisets(name, fedFrom string, exact bool, got, want map[string]map[string]int) Row {
	row := Row{Name: name, FedFrom: fedFrom, MustBeExact: exact}
	var examples []string
	keys := map[string]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	for k := range keys {
		row.Keys++
		var lost, dup, wrong bool
		for id, n := range want[k] {
			row.Want += int64(n)
			if got[k][id] < n {
				lost = true
				if len(examples) < 3 {
					examples = append(examples, fmt.Sprintf("%s/%s x%d want %d", k, id, got[k][id], n))
				}
			}
		}
		for id, n := range got[k] {
			row.Got += int64(n)
			w, ok := want[k][id]
			switch {
			case !ok:
				wrong = true
				if len(examples) < 3 {
					examples = append(examples, fmt.Sprintf("%s/%s unexpected", k, id))
				}
			case n > w:
				dup = true
			}
		}
		switch {
		case lost:
			row.Lost++
		case wrong:
			row.Wrong++
		case dup:
			row.Dup++
		default:
			row.Exact++
		}
	}
	sort.Strings(examples)
	if len(examples) > 0 {
		row.Example = "e.g. " + strings.Join(examples, ", ")
	}
	return row
}

// verifyInput is what verify needs to know about one run.
type verifyInput struct {
	appID       string
	inputTopic  string // change-events, prefixed
	dirTopic    string // changes-by-dir, prefixed
	tables      map[string]table.Def
	produced    []inputRecord
	acked       []bool // per produced record
	exactlyOnce bool
	// deadLetters names each agent of the input topic's dead-letter topic
	// (agent name → topic); checked when the input holds bad values.
	deadLetters map[string]string
	// diagDir receives diag-<table>.txt (diagnose) for every failing table.
	diagDir string
}

// verify reads the input topic, the intermediate topic and the three tables
// (committed state, read_committed) and compares each with values computed
// here from the input topic's records.
func verify(ctx context.Context, client sarama.Client, vi verifyInput) ([]Row, []string, error) {
	var problems []string
	// The input as the broker holds it: the expected values are computed
	// from it, and it is compared with what the producer had acknowledged.
	inIDs := map[string]int{}
	inPos := map[string]inputPos{} // each event's input record
	perActor, linesPerActor, perDir := map[string]int64{}, map[string]int64{}, map[string]int64{}
	wantDir := map[string]map[string]int{}
	actorOffsets := map[int32]map[string][]int64{} // input offsets per partition and actor, ascending
	var bad int
	// The injected bad values as the input topic holds them: per agent, the
	// source positions ("partition/offset") it must dead-letter.
	wantDead := map[string]map[string]map[string]int{}
	for agentName := range vi.deadLetters {
		wantDead[agentName] = map[string]map[string]int{}
	}
	badKinds := map[string]int{}
	err := consumeAllNoting(ctx, client, vi.inputTopic, func(m *sarama.ConsumerMessage) {
		if kind := badKind(m); kind != "" {
			badKinds[kind]++
			pos := fmt.Sprintf("%d/%d", m.Partition, m.Offset)
			for agentName, want := range wantDead {
				if agentName == "count-by-actor" || undecodable(kind) {
					want[pos] = map[string]int{kind: 1}
				}
			}
			return
		}
		var ev event
		if err := json.Unmarshal(m.Value, &ev); err != nil || string(m.Key) != ev.Actor {
			bad++
			return
		}
		inIDs[ev.EventID]++
		inPos[ev.EventID] = inputPos{m.Partition, m.Offset}
		if actorOffsets[m.Partition] == nil {
			actorOffsets[m.Partition] = map[string][]int64{}
		}
		actorOffsets[m.Partition][ev.Actor] = append(actorOffsets[m.Partition][ev.Actor], m.Offset)
		perActor[ev.Actor]++
		linesPerActor[ev.Actor] += ev.Added + ev.Deleted
		for _, d := range ev.Dirs {
			perDir[d]++
			if wantDir[d] == nil {
				wantDir[d] = map[string]int{}
			}
			wantDir[d][ev.EventID+" "+ev.Actor]++
		}
	}, func(msg string) {
		problems = append(problems, "input read short (the input topic has no transactions): "+msg)
	})
	if err != nil {
		return nil, nil, err
	}
	wantIDs := map[string]map[string]int{}
	for i, r := range vi.produced {
		if r.bad != "" {
			continue // checked in the dead-letter rows
		}
		var ev event
		if err := json.Unmarshal(r.value, &ev); err != nil {
			return nil, nil, fmt.Errorf("produced record %d: %w", i, err)
		}
		if vi.acked[i] {
			wantIDs[ev.EventID] = map[string]int{"": 1}
		} else if inIDs[ev.EventID] > 0 {
			// Its batch failed but the broker wrote it: not an error.
			wantIDs[ev.EventID] = map[string]int{"": inIDs[ev.EventID]}
		}
	}
	gotIDs := map[string]map[string]int{}
	for id, n := range inIDs {
		gotIDs[id] = map[string]int{"": n}
	}
	inRow := compareMultisets(vi.inputTopic, "acknowledged records", true, gotIDs, wantIDs)
	inRow.Note = "(keys: event IDs)"
	if bad > 0 {
		inRow.Wrong += bad
		inRow.Note += fmt.Sprintf(" %d records do not decode or are keyed by another field", bad)
	}
	rows := []Row{inRow}
	if len(badKinds) > 0 {
		dead, err := deadLetterRows(ctx, client, vi, wantDead, vi.inputTopic)
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, dead...)
	}

	gotDir := map[string]map[string]int{}
	dirRecords := map[string]int64{}
	bad = 0
	err = consumeAll(ctx, client, vi.dirTopic, func(m *sarama.ConsumerMessage) {
		var dc dirChange
		if err := json.Unmarshal(m.Value, &dc); err != nil || string(m.Key) != dc.Dir {
			bad++
			return
		}
		if gotDir[dc.Dir] == nil {
			gotDir[dc.Dir] = map[string]int{}
		}
		gotDir[dc.Dir][dc.EventID+" "+dc.Actor]++
		dirRecords[dc.Dir]++
	})
	if err != nil {
		return nil, nil, err
	}
	if !vi.exactlyOnce && vi.diagDir != "" {
		if err := writeDuplicateRuns(filepath.Join(vi.diagDir, "dups-"+vi.dirTopic+".txt"), vi.inputTopic, gotDir, wantDir, inPos); err != nil {
			slog.Warn("chaos: the duplicate runs were not written", "err", err) // a diagnostic, not a verdict
		}
	}
	dirRow := compareMultisets(vi.dirTopic, "input (per dir: event IDs)", vi.exactlyOnce, gotDir, wantDir)
	if bad > 0 {
		dirRow.Wrong += bad
		dirRow.Note = fmt.Sprintf("%d records do not decode or are keyed by another field", bad)
	}
	rows = append(rows, dirRow)

	committed, err := committedOffsets(client, vi.appID, []string{vi.inputTopic, vi.dirTopic})
	if err != nil {
		return nil, nil, err
	}
	read := func(name string) (map[string]any, error) {
		d := vi.tables[name]
		got, err := readCommittedTable(ctx, client, d, committed)
		if err != nil {
			return nil, err
		}
		// The app's own read (`tables dump`) must agree once the group is
		// at lag 0 and stopped.
		var addrs []string
		for _, b := range client.Brokers() {
			addrs = append(addrs, b.Addr())
		}
		tools, err := app.Dial(ctx, addrs)
		if err != nil {
			return nil, err
		}
		dump, err := app.ReadTable(ctx, tools, d)
		tools.Close()
		if err != nil {
			return nil, fmt.Errorf("tables dump %s: %w", name, err)
		}
		var differ int
		for k, v := range dump {
			if got[k] != v {
				differ++
			}
		}
		for k := range got {
			if _, ok := dump[k]; !ok {
				differ++
			}
		}
		if differ > 0 {
			problems = append(problems, fmt.Sprintf("table %s: `tables dump` (latest state) differs from the committed state on %d keys", name, differ))
		}
		return got, nil
	}
	for _, tc := range []struct {
		name, from string
		want       map[string]int64
		exact      bool
	}{
		{"commits-per-actor", "input", perActor, true},
		{"lines-per-actor", "input", linesPerActor, true},
		{"events-per-dir", "input", perDir, vi.exactlyOnce},
	} {
		got, err := read(tc.name)
		if err != nil {
			return nil, nil, err
		}
		var cycleNote string
		if tc.name == "commits-per-actor" {
			if cycleNote, err = checkCycles(ctx, client, vi.tables[tc.name], vi.inputTopic, actorOffsets); err != nil {
				return nil, nil, err
			}
		}
		add := func(row Row, keyOf func(*sarama.ConsumerMessage) []string, topic string) error {
			if row.Failed() && vi.diagDir != "" && len(row.bad) > 0 {
				path := filepath.Join(vi.diagDir, fmt.Sprintf("diag-%s-%d.txt", row.Name, len(rows)))
				f, err := os.Create(path)
				if err != nil {
					return err
				}
				derr := diagnose(ctx, f, client, vi.tables[tc.name], row.bad, topic, keyOf, committed)
				if err := f.Close(); derr == nil {
					derr = err
				}
				if derr != nil {
					return fmt.Errorf("diagnose %s: %w", row.Name, derr)
				}
				row.Note += " history of " + strings.Join(row.bad, ", ") + " in " + path
			}
			rows = append(rows, row)
			return nil
		}
		keyOf, topic := actorOf, vi.inputTopic
		if tc.name == "events-per-dir" {
			keyOf = dirsOf
		}
		row := compareCounts(tc.name, tc.from, tc.exact, got, tc.want)
		row.Note = cycleNote
		if err := add(row, keyOf, topic); err != nil {
			return nil, nil, err
		}
		if tc.name == "events-per-dir" {
			// Fed straight from changes-by-dir, the table must count each
			// distinct record that topic holds at least once. The split
			// agent is agent.Deterministic: under at-least-once the records
			// a second run sent again are skipped by the reader, so the
			// table counts no more than the topic holds and no less than
			// its distinct records (under exactly-once the two are equal).
			distinct := map[string]int64{}
			for dir, ids := range gotDir {
				distinct[dir] = int64(len(ids))
			}
			row := compareCounts(tc.name, "changes-by-dir distinct records", vi.exactlyOnce, got, distinct)
			var above []string
			for dir, v := range got {
				if n, ok := v.(int64); ok && n > dirRecords[dir] {
					above = append(above, dir)
				}
			}
			if len(above) > 0 {
				row.Wrong += len(above)
				row.Note += fmt.Sprintf(" %d dirs counted more often than changes-by-dir holds records (e.g. %s)", len(above), above[0])
			}
			err := add(row,
				func(m *sarama.ConsumerMessage) []string { return []string{string(m.Key)} }, vi.dirTopic)
			if err != nil {
				return nil, nil, err
			}
		}
	}
	return rows, problems, nil
}

// checkCycles checks every changelog record of a count-per-actor table
// against the input: a cycle whose commit point on the input partition is
// X+1 must hold, for each key it wrote, the number of the key's input records
// at offsets up to X (the table is fed straight from the input, one count
// per record). A record above that count holds effects of records at or
// after its commit point (or inherited such a value); one below it lost some.
// Uncommitted and fenced records are checked too: the note says how many
// records disagree and shows the first ones; it is a diagnostic, the verdict
// is on the table's committed state.
func checkCycles(ctx context.Context, client sarama.Client, d table.Def, inputTopic string, offsets map[int32]map[string][]int64) (string, error) {
	var checked, above, below int
	var first []string
	hist := map[int32]*writerHistory{}
	bad := map[int32]bool{}
	err := consumeAll(ctx, client, d.Changelog(), func(m *sarama.ConsumerMessage) {
		k, v, err := d.Format(m.Key, m.Value)
		n, isInt := v.(int64)
		if err != nil || !isInt {
			return
		}
		st, ok := changelog.StampOf(m.Headers)
		if !ok {
			return
		}
		if hist[m.Partition] == nil {
			hist[m.Partition] = &writerHistory{}
		}
		hist[m.Partition].add(m.Offset, st)
		for _, src := range st.Sources {
			if src.Topic != inputTopic {
				continue
			}
			offs := offsets[src.Partition][k]
			want := int64(sort.Search(len(offs), func(i int) bool { return offs[i] > src.Offset }))
			checked++
			if n == want {
				continue
			}
			if n > want {
				above++
			} else {
				below++
			}
			bad[m.Partition] = true
			if len(first) < 3 {
				before := "absent"
				if st.HasBefore && st.Before != nil {
					if _, bv, err := d.Format(m.Key, st.Before); err == nil {
						before = fmt.Sprint(bv)
					}
				}
				first = append(first, fmt.Sprintf("%s[%d]@%d %s=%d before %s epoch %d, but %d input records up to %s[%d]@%d",
					d.Name(), m.Partition, m.Offset, k, n, before, st.Epoch, want, src.Topic, src.Partition, src.Offset))
			}
		}
	})
	if err != nil {
		return "", fmt.Errorf("check cycles of %s: %w", d.Name(), err)
	}
	if above+below == 0 {
		return fmt.Sprintf("(all %d changelog records agree with their commit points)", checked), nil
	}
	var hs []string
	for _, p := range slices.Sorted(maps.Keys(bad)) {
		hs = append(hs, fmt.Sprintf("%s[%d] writers: %s", d.Name(), p, hist[p]))
	}
	return fmt.Sprintf("(%d of %d changelog records disagree with their commit points: %d above, %d below; first: %s; %s)",
		above+below, checked, above, below, strings.Join(first, "; "), strings.Join(hs, "; ")), nil
}

// writerHistory is a changelog partition's committed records grouped into
// runs of one writer epoch, in offset order: a diagnostic that shows where the
// source offsets of one writer's cycles end and the next writer's begin (a
// jump between them is a range of source records whose effects no changelog
// record carries).
type writerHistory struct{ runs []writerRun }

type writerRun struct {
	epoch             int64
	from, to          int64            // changelog offsets
	srcFirst, srcLast map[string]int64 // per source partition: the run's first and last stamp offsets
	records           int
}

func (h *writerHistory) add(offset int64, st changelog.Stamp) {
	if n := len(h.runs); n == 0 || h.runs[n-1].epoch != st.Epoch {
		h.runs = append(h.runs, writerRun{epoch: st.Epoch, from: offset, srcFirst: map[string]int64{}, srcLast: map[string]int64{}})
	}
	r := &h.runs[len(h.runs)-1]
	r.to = offset
	r.records++
	for _, src := range st.Sources {
		k := fmt.Sprintf("%s[%d]", src.Topic, src.Partition)
		if _, ok := r.srcFirst[k]; !ok {
			r.srcFirst[k] = src.Offset
		}
		r.srcLast[k] = src.Offset
	}
}

// String lists the runs: "epoch E @from-to (N records; topic[p] first-last ...)".
func (h *writerHistory) String() string {
	if h == nil {
		return "none"
	}
	var b strings.Builder
	for i, r := range h.runs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "epoch %d @%d-%d (%d records;", r.epoch, r.from, r.to, r.records)
		for _, k := range slices.Sorted(maps.Keys(r.srcFirst)) {
			fmt.Fprintf(&b, " %s %d-%d", k, r.srcFirst[k], r.srcLast[k])
		}
		b.WriteString(")")
	}
	return b.String()
}

// waitCaughtUp waits until the group has processed every record of topics:
// on every partition the committed offset is at the end offset, or only
// records a read_committed reader never sees (transaction markers, aborted
// records) lie between them; and the committed offsets did not move between
// two such checks. app.WaitForLag0 compares with the end offset only, which
// under exactly-once never matches: the commit marker after a partition's
// last transaction sits above the group's committed offset.
func waitCaughtUp(ctx context.Context, client sarama.Client, group string, topics []string, timeout time.Duration) error {
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return err
	}
	defer consumer.Close()
	// invisible reports whether a read_committed reader at from sees no
	// record below end.
	invisible := func(topic string, p int32, from, end int64) (bool, error) {
		pc, err := consumer.ConsumePartition(topic, p, from)
		if err != nil {
			return false, err
		}
		defer pc.AsyncClose()
		select {
		case m := <-pc.Messages():
			return m.Offset >= end, nil
		case e := <-pc.Errors():
			return false, e
		case <-time.After(1500 * time.Millisecond):
			return true, nil
		}
	}
	deadline := time.Now().Add(timeout)
	var last map[string]map[int32]int64
	var why string
	for {
		committed, err := committedOffsets(client, group, topics)
		caught := err == nil
		if err != nil {
			why = err.Error()
		}
		for t, ps := range committed {
			for p, c := range ps {
				if !caught {
					break
				}
				end, err := client.GetOffset(t, p, sarama.OffsetNewest)
				switch {
				case err != nil:
					caught, why = false, err.Error()
				case c >= end:
				case last == nil || last[t][p] != c:
					caught, why = false, fmt.Sprintf("%s[%d] committed %d, end %d", t, p, c, end)
				default:
					ok, err := invisible(t, p, c, end)
					if err != nil || !ok {
						caught, why = false, fmt.Sprintf("%s[%d] committed %d, end %d (%v)", t, p, c, end, err)
					}
				}
			}
		}
		if caught && last != nil && reflect.DeepEqual(committed, last) {
			return nil
		}
		last = committed
		if time.Now().After(deadline) {
			return fmt.Errorf("group %s not caught up after %s: %s", group, timeout, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// undecodable says whether the bad value of kind does not decode as a
// change (every agent of the input dead-letters it).
func undecodable(kind string) bool {
	for _, b := range badValues {
		if b.kind == kind {
			return b.undecodable
		}
	}
	return false
}

// deadLetterRows reads each agent's dead-letter topic and compares the
// source positions of its dead letters (headers runnel-topic,
// runnel-partition, runnel-offset) with want (agent → position → kind → 1):
// every bad value the agent cannot process must be there, and nothing else
// (a good record dead-lettered is a count lost). Under at-least-once a
// dead letter may be written again when its record is processed again.
func deadLetterRows(ctx context.Context, client sarama.Client, vi verifyInput, want map[string]map[string]map[string]int, source string) ([]Row, error) {
	var rows []Row
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, agentName := range names {
		topic := vi.deadLetters[agentName]
		got := map[string]map[string]int{}
		foreign := 0
		if err := client.RefreshMetadata(topic); err == nil {
			err := consumeAll(ctx, client, topic, func(m *sarama.ConsumerMessage) {
				hs := map[string]string{}
				for _, h := range m.Headers {
					if h != nil {
						hs[string(h.Key)] = string(h.Value)
					}
				}
				if hs[app.HeaderTopic] != source {
					foreign++
					return
				}
				pos := hs[app.HeaderPartition] + "/" + hs[app.HeaderOffset]
				kind := "good record"
				if w, ok := want[agentName][pos]; ok {
					for k := range w {
						kind = k
					}
				}
				if got[pos] == nil {
					got[pos] = map[string]int{}
				}
				got[pos][kind]++
			})
			if err != nil {
				return nil, err
			}
		} else if !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			return nil, fmt.Errorf("dead-letter topic %s: %w", topic, err)
		}
		row := compareMultisets(topic, "bad values "+agentName+" cannot process", vi.exactlyOnce, got, want[agentName])
		row.Note = "(keys: input partition/offset)"
		if foreign > 0 {
			row.Wrong += foreign
			row.Note += fmt.Sprintf(" %d dead letters from another topic", foreign)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// inputPos is an input record's partition and offset.
type inputPos struct {
	p   int32
	off int64
}

// writeDuplicateRuns writes to path, per input partition, the runs of input
// offsets whose events the repartition topic holds more often than the
// input asks (at-least-once: processed again by hop 1), one line per run:
// partition, first and last offset, events in it. Two duplicated offsets
// belong to one run when fewer than 50 offsets lie between them (events
// without a directory leave no trace in the repartition topic). A run
// starts where some member resumed from a committed offset; the workers'
// debug logs ("offsets committed") tell which commit that was.
func writeDuplicateRuns(path, inputTopic string, got, want map[string]map[string]int, pos map[string]inputPos) error {
	dup := map[int32][]int64{}
	seen := map[string]bool{}
	for dir, ids := range got {
		for idActor, n := range ids {
			if n <= want[dir][idActor] {
				continue
			}
			id, _, _ := strings.Cut(idActor, " ")
			if seen[id] {
				continue
			}
			seen[id] = true
			if ip, ok := pos[id]; ok {
				dup[ip.p] = append(dup[ip.p], ip.off)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: runs of input offsets processed again (partition first last events)\n", inputTopic)
	parts := make([]int32, 0, len(dup))
	for p := range dup {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	for _, p := range parts {
		offs := dup[p]
		slices.Sort(offs)
		first, last, n := offs[0], offs[0], 0
		for _, o := range offs {
			if o-last >= 50 {
				fmt.Fprintf(&b, "%d %d %d %d\n", p, first, last, n)
				first, n = o, 0
			}
			last = o
			n++
		}
		fmt.Fprintf(&b, "%d %d %d %d\n", p, first, last, n)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("duplicate runs: %w", err)
	}
	return nil
}
