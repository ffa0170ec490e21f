package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/topicdecl"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/table"
	"github.com/runnel-dev/runnel/topology"
)

// DevOptions configures a dev run: an embedded broker, N workers in this
// process, an optional input file loaded first, and a report of the tables once
// every record is processed.
type DevOptions struct {
	// Workers is the number of workers to run; default 1.
	Workers int
	// Input is a JSONL file (.gz allowed) produced to InputTopic before the
	// workers start; empty loads nothing.
	Input string
	// InputTopic and KeyField say where Input goes (a topic as declared,
	// or in full with the WithTopicPrefix prefix; required with Input) and
	// which string field of each line is the record key (empty: no key).
	InputTopic, KeyField string
	// TimestampField, if set, is the field of Input's lines holding each
	// record's timestamp (RFC 3339 or epoch milliseconds; see
	// SendOptions.TimestampField).
	TimestampField string
	// Inputs are more inputs (dev --input TOPIC=FILE), produced after Input
	// in their order; every input is validated before any is produced.
	Inputs []Input
	// Dump prints only this table (as JSON with JSONOut) instead of the top of
	// each; "all" prints every table whole (with JSONOut one object:
	// table name -> key -> value).
	Dump    string
	JSONOut bool
	// Top is how many entries of each table the report shows; default 10.
	Top int
	// DataDir holds the workers' stores; default: a temporary directory removed at the end.
	DataDir string
	// Timeout bounds the wait for lag 0; default 10 min.
	Timeout time.Duration
	// Out receives the report (stdout); logs go to the app's logger.
	Out io.Writer
	// Progress, if set, is told, for each input in turn, its path, the
	// bytes of it loaded so far and their total (uncompressed; the inputs
	// are validated before loading starts).
	Progress func(path string, loaded, total int64)
	// Inspect, if set, is called with the running workers once the group's lag
	// is 0, before they stop (tests look at assignments and stores here).
	Inspect func(ws []*Worker)
}

// Result is what Process returns.
type Result struct {
	// Tables maps a table name to its content: key -> decoded value.
	Tables map[string]map[string]any
	// Restored[i] is the changelog offset span worker i replayed in active
	// restores (end offset minus start offset, summed over partitions);
	// compaction may have removed some records inside it.
	Restored []int64
	// Processed, Retried and DeadLettered sum the workers' counts
	// (Worker.Processed, Retried, DeadLettered).
	Processed, Retried, DeadLettered int64
}

// Dev runs the app on an embedded broker until every record of the input (and
// everything derived from it) is processed, then stops the workers cleanly and
// reports the tables, read back from their changelogs.
func (a *App) Dev(ctx context.Context, o DevOptions) error {
	if o.Top <= 0 {
		o.Top = 10
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Dump != "" && o.Dump != "all" && a.tableDef(o.Dump) == nil {
		return fmt.Errorf("--dump %s: no such table (tables: %s)", o.Dump, strings.Join(a.tableNames(), ", "))
	}
	if o.DataDir == "" {
		dir, err := os.MkdirTemp("", "runnel-dev-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.DataDir = dir
	}
	// kfake ignores min.compaction.lag.ms and compacts whatever its cleaner
	// finds: run the cleaner only as often as the changelogs' lag (10 min),
	// so that dev compacts no sooner than Kafka would, in practice.
	broker, err := embedded.Start(embedded.Options{CleanerBackoff: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer broker.Close()
	a.cfg.Logger.Info("embedded broker started", "addrs", broker.Addrs())
	if a.cfg.Session == 0 {
		a.cfg.Session, a.cfg.Heartbeat, a.cfg.Rebalance, a.cfg.FetchMaxWait =
			kafka.TestTimeouts.Session, kafka.TestTimeouts.Heartbeat, kafka.TestTimeouts.Rebalance, kafka.TestTimeouts.MaxWait
	}
	a.cfg.CommitInterval = min(a.cfg.commitInterval(), 300*time.Millisecond)
	a.cfg.clearSecurity() // the embedded broker speaks neither TLS nor SASL
	res, err := a.Process(ctx, broker.Addrs(), o)
	if err != nil {
		return err
	}
	tables := res.Tables
	if o.Dump == "all" {
		if o.JSONOut {
			return json.NewEncoder(o.Out).Encode(tables)
		}
		for _, d := range a.tables {
			if err := writeTable(o.Out, d.Name(), tables[d.Name()], false, 0); err != nil {
				return err
			}
		}
		return nil
	}
	if o.Dump != "" {
		return writeTable(o.Out, o.Dump, tables[o.Dump], o.JSONOut, 0)
	}
	fmt.Fprintf(o.Out, "processed %s, retried %d, dead-lettered %d", plural(res.Processed, "record"), res.Retried, res.DeadLettered)
	if res.DeadLettered > 0 {
		fmt.Fprint(o.Out, " (they stay in the embedded broker; on Kafka: dlq list, dlq tail AGENT)")
	}
	fmt.Fprintln(o.Out)
	for _, d := range a.tables {
		if err := writeTable(o.Out, d.Name(), tables[d.Name()], false, o.Top); err != nil {
			return err
		}
	}
	return nil
}

// Process runs the app on brokers the way dev mode does: it creates the topics,
// loads o.Input, runs o.Workers workers in this process (stores under
// o.DataDir/worker-N) until the group's lag is 0 on every source partition,
// stops them cleanly, and returns every table read back from its changelog
// (table name -> key -> decoded value).
func (a *App) Process(ctx context.Context, brokers []string, o DevOptions) (*Result, error) {
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	g, err := a.Topology()
	if err != nil {
		return nil, err
	}
	inputs := o.Inputs
	if o.Input != "" {
		t, ok := a.lookupTopic(g, o.InputTopic)
		if !ok {
			return nil, fmt.Errorf("dev input %s: InputTopic %q is not a declared topic (topics: %s)", o.Input, o.InputTopic, topicNames(g))
		}
		inputs = append([]Input{{Topic: t.Name, Path: o.Input, KeyField: o.KeyField, TimestampField: o.TimestampField}}, inputs...)
	}
	w0 := &Worker{app: a, graph: g}
	client, _, err := a.connect(ctx, brokers, "runnel-dev", kafka.Timeouts{}, w0.topicSpecs())
	if err != nil {
		return nil, err
	}
	defer client.Close()

	if len(inputs) > 0 {
		if err := a.loadInputs(ctx, client, g, inputs, o.Progress); err != nil {
			return nil, err
		}
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	werrs := make([]error, o.Workers)
	workers := make([]*Worker, 0, o.Workers)
	for i := range o.Workers {
		w, err := a.NewWorker(WorkerOptions{Brokers: brokers, DataDir: filepath.Join(o.DataDir, fmt.Sprintf("worker-%d", i)), Name: fmt.Sprintf("worker-%d", i)})
		if err != nil {
			stop()
			wg.Wait()
			return nil, err
		}
		workers = append(workers, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if werrs[i] = w.Run(wctx); werrs[i] != nil {
				stop()
			}
		}()
	}
	start := time.Now()
	lagErr := waitReady(wctx, workers, o.Timeout)
	if lagErr == nil {
		lagErr = waitForLag0(wctx, client, a.id, g.Subscriptions(), o.Timeout)
	}
	if lagErr == nil && o.Inspect != nil {
		o.Inspect(workers)
	}
	stop()
	wg.Wait()
	if err := errors.Join(werrs...); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	if lagErr != nil {
		return nil, lagErr
	}
	out := &Result{Tables: map[string]map[string]any{}}
	for _, w := range workers {
		out.Restored = append(out.Restored, w.RestoredSpan())
		out.Processed += w.Processed()
		out.Retried += w.Retried()
		out.DeadLettered += w.DeadLettered()
	}
	a.cfg.Logger.Info("all input processed", "workers", o.Workers, "elapsed", time.Since(start).Round(time.Millisecond),
		"processed", out.Processed, "retried", out.Retried, "dead_lettered", out.DeadLettered)
	for _, d := range a.tables {
		if o.Dump != "" && o.Dump != "all" && d.Name() != o.Dump {
			continue
		}
		m, err := readTable(ctx, client, d)
		if err != nil {
			return nil, err
		}
		out.Tables[d.Name()] = m
	}
	return out, nil
}

// waitReady waits until every worker joined the group and restored its active
// partitions.
func waitReady(ctx context.Context, ws []*Worker, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ready := 0
		for _, w := range ws {
			if w.Ready() {
				ready++
			}
		}
		if ready == len(ws) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d workers not ready after %s", len(ws)-ready, len(ws), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (a *App) tableDef(name string) table.Def {
	for _, d := range a.tables {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

func (a *App) tableNames() []string {
	var out []string
	for _, d := range a.tables {
		out = append(out, d.Name())
	}
	return out
}

// loadInputs produces the inputs (every one validated first), logging each
// once it is loaded.
func (a *App) loadInputs(ctx context.Context, client sarama.Client, g *topology.Graph, ins []Input, progress func(string, int64, int64)) error {
	start := time.Now()
	before := func(i int, o *SendOptions) {
		if progress != nil {
			path := ins[i].Path
			o.Progress = func(done, total int64) { progress(path, done, total) }
		}
	}
	after := func(i int, st SendStats) {
		if progress != nil {
			progress(ins[i].Path, st.Bytes, st.Bytes)
		}
		a.cfg.Logger.Info("input loaded", "topic", ins[i].Topic, "file", ins[i].Path, "records", st.Records,
			"elapsed", time.Since(start).Round(time.Millisecond))
		start = time.Now()
	}
	if err := a.sendInputs(ctx, client, g, ins, before, after); err != nil {
		return fmt.Errorf("--input: %w", err)
	}
	return nil
}

// keyCheck returns the key check of a declared topic for SendOptions, or nil
// when the topic has none.
func (a *App) keyCheck(topic string) func([]byte) error {
	if r, ok := topicdecl.Of(a.topics[topic]); ok {
		return r.CheckKey
	}
	return nil
}

// valueCheck returns the value check of a declared topic for SendOptions, or
// nil when the topic has none.
func (a *App) valueCheck(topic string) func([]byte) error {
	if r, ok := topicdecl.Of(a.topics[topic]); ok {
		return r.CheckValue
	}
	return nil
}

// GroupLag returns, per topic and partition, the highwater minus the group's
// committed offset (the whole highwater when nothing is committed). It asks
// the group's coordinator for the committed offsets and each partition's
// leader for its highwater; it returns ctx's error (wrapped) as soon as ctx
// ends, leaving the requests in flight to end within the client's timeouts.
func GroupLag(ctx context.Context, client *Client, group string, topics []string) (map[string]map[int32]int64, error) {
	type result struct {
		lag map[string]map[int32]int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		lag, err := groupLag(client.sc, group, topics)
		done <- result{lag, err}
	}()
	select {
	case r := <-done:
		return r.lag, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("lag of group %s: %w", group, ctx.Err())
	}
}

func groupLag(client sarama.Client, group string, topics []string) (map[string]map[int32]int64, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	parts := map[string][]int32{}
	for _, t := range topics {
		ps, err := client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", t, err)
		}
		parts[t] = ps
	}
	resp, err := admin.ListConsumerGroupOffsets(group, parts)
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	if resp.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("offsets of group %s: %w", group, resp.Err)
	}
	out := map[string]map[int32]int64{}
	for t, ps := range parts {
		out[t] = map[int32]int64{}
		for _, p := range ps {
			hw, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("highwater %s[%d]: %w", t, p, err)
			}
			committed := int64(0)
			if b := resp.GetBlock(t, p); b != nil && b.Offset >= 0 {
				committed = b.Offset
			}
			out[t][p] = hw - committed
		}
	}
	return out, nil
}

// WaitForLag0 waits until the group's lag is 0 on every partition of topics, in
// two checks in a row, or timeout passes (an error).
func WaitForLag0(ctx context.Context, client *Client, group string, topics []string, timeout time.Duration) error {
	return waitForLag0(ctx, client.sc, group, topics, timeout)
}

func waitForLag0(ctx context.Context, client sarama.Client, group string, topics []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	zeros := 0
	var last map[string]map[int32]int64
	for {
		lag, err := groupLag(client, group, topics)
		total := int64(0)
		if err == nil {
			last = lag
			for _, m := range lag {
				for _, l := range m {
					total += l
				}
			}
		}
		if err == nil && total == 0 {
			zeros++
			if zeros >= 2 {
				return nil
			}
		} else {
			zeros = 0
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %s still lags after %s: %v (last error: %v)", group, timeout, last, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func writeTable(w io.Writer, name string, m map[string]any, asJSON bool, top int) error {
	if asJSON {
		return json.NewEncoder(w).Encode(m)
	}
	type kv struct {
		k string
		v any
	}
	rows := make([]kv, 0, len(m))
	for k, v := range m {
		rows = append(rows, kv{k, v})
	}
	sort.Slice(rows, func(i, j int) bool {
		a, aok := rows[i].v.(int64)
		b, bok := rows[j].v.(int64)
		if aok && bok && a != b {
			return a > b
		}
		return rows[i].k < rows[j].k
	})
	if top > 0 && len(rows) > top {
		rows = rows[:top]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s)\n", name, plural(int64(len(m)), "key"))
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-40s %v\n", r.k, r.v)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}
