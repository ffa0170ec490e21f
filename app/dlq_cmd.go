package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/dedup"
	"github.com/runnel-dev/runnel/internal/topicdecl"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/spf13/cobra"
)

// DeadLetter is one record of a dead-letter topic, decoded from its headers
// (HeaderReason and the others; dlq.go).
type DeadLetter struct {
	// DLQTopic, DLQPartition and DLQOffset locate the dead letter itself.
	DLQTopic     string `json:"dlq_topic"`
	DLQPartition int32  `json:"dlq_partition"`
	DLQOffset    int64  `json:"dlq_offset"`
	// Topic, Partition and Offset locate the source record.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Agent     string `json:"agent"`
	Reason    string `json:"reason"`
	Attempts  int    `json:"attempts"`
	// DeadLetteredAt is when the worker wrote it; Timestamp the source
	// record's timestamp.
	DeadLetteredAt string    `json:"dead_lettered_at"`
	Timestamp      time.Time `json:"timestamp"`
	Key            []byte    `json:"key"`
	Value          []byte    `json:"value"`
	// Headers are the source record's own headers (the runnel-* headers
	// removed).
	Headers []source.Header `json:"-"`
}

func decodeDeadLetter(m *sarama.ConsumerMessage) DeadLetter {
	rec := source.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	for _, h := range m.Headers {
		if h != nil {
			rec.Headers = append(rec.Headers, source.Header{Key: h.Key, Value: h.Value})
		}
	}
	return decodeDeadLetterRecord(&rec)
}

func decodeDeadLetterRecord(m *source.Record) DeadLetter {
	d := DeadLetter{DLQTopic: m.Topic, DLQPartition: m.Partition, DLQOffset: m.Offset, Key: m.Key, Value: m.Value,
		Timestamp: m.Timestamp, Partition: -1, Offset: -1}
	for _, h := range m.Headers {
		v := string(h.Value)
		switch string(h.Key) {
		case HeaderReason:
			d.Reason = v
		case HeaderTopic:
			d.Topic = v
		case HeaderPartition:
			if p, err := strconv.ParseInt(v, 10, 32); err == nil {
				d.Partition = int32(p)
			}
		case HeaderOffset:
			if o, err := strconv.ParseInt(v, 10, 64); err == nil {
				d.Offset = o
			}
		case HeaderAgent:
			d.Agent = v
		case HeaderAttempts:
			d.Attempts, _ = strconv.Atoi(v)
		case HeaderTimestamp:
			d.DeadLetteredAt = v
		case dedup.Header:
			// Where a repartition record came from: a replayed dead letter
			// is a new record, which the reader must not take for a
			// duplicate of the original (dedup.go).
		default:
			d.Headers = append(d.Headers, h)
		}
	}
	return d
}

// readDeadLetters calls fn for each record of every partition of topic from
// the offset from(p) returns (sarama.OffsetOldest allowed) up to the
// highwater captured at the start, in offset order per partition, as a
// read_committed consumer gets them: neither transaction markers nor records
// of aborted transactions are records. A partition is read once nothing is
// given for 200 ms and a direct fetch finds only markers and aborted records
// left below the highwater (changelog.Restorer.SkipControl); one that
// delivers nothing for 2 s while below its highwater ends early.
func readDeadLetters(ctx context.Context, client sarama.Client, topic string, from func(p int32) (int64, error), fn func(*sarama.ConsumerMessage) error) error {
	ps, err := client.Partitions(topic)
	if err != nil {
		return fmt.Errorf("partitions of %s: %w", topic, err)
	}
	// Under ExactlyOnce a dead letter is written in the cycle's transaction:
	// one of an aborted transaction was never dead-lettered (its record is
	// processed again), so only committed ones are read. The client is this
	// command's own.
	if client.Config().Version.IsAtLeast(sarama.V0_11_0_0) {
		client.Config().Consumer.IsolationLevel = sarama.ReadCommitted
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer consumer.Close()
	probe := &changelog.Restorer{Client: client} // fetches with the client's isolation level
	for _, p := range ps {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("highwater %s[%d]: %w", topic, p, err)
		}
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("log start %s[%d]: %w", topic, p, err)
		}
		start, err := from(p)
		if err != nil {
			return err
		}
		if start < oldest {
			start = oldest
		}
		if start >= hw {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, start)
		if err != nil {
			return fmt.Errorf("read %s[%d] from %d: %w", topic, p, start, err)
		}
		err = func() error {
			defer pc.Close()
			next := start // the offset after the last record given
			idle := time.Duration(0)
			const idleProbe = 200 * time.Millisecond
			for {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(idleProbe):
					// Under ExactlyOnce the log ends with a commit marker,
					// which the consumer never gives.
					if to, err := probe.SkipControl(topic, p, next); err == nil && to >= hw {
						return nil
					}
					if idle += idleProbe; idle >= 2*time.Second {
						return nil
					}
				case m := <-pc.Messages():
					idle = 0
					if err := fn(m); err != nil {
						return err
					}
					next = m.Offset + 1
					if m.Offset >= hw-1 {
						return nil
					}
				case e := <-pc.Errors():
					return fmt.Errorf("read %s[%d]: %w", topic, p, e)
				}
			}
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// replayGroup is the consumer group whose committed offsets on an agent's
// dead-letter topic say how far `dlq replay` got: a replay resumes there,
// so each dead letter is sent back once.
func (a *App) replayGroup(agent string) string { return a.id + "-dlq-replay-" + agent }

func (a *App) agentNames() []string {
	var out []string
	for _, r := range a.agents {
		out = append(out, r.Name())
	}
	return out
}

func (a *App) checkAgent(name string) (string, error) {
	t := a.DeadLetterTopic(name)
	if t == "" {
		return "", fmt.Errorf("no agent %q (agents: %s)", name, strings.Join(a.agentNames(), ", "))
	}
	return t, nil
}

// dlqCommand is `dlq list|tail|replay`.
func (a *App) dlqCommand() *cobra.Command {
	dlq := &cobra.Command{Use: "dlq", Short: "Inspect and replay the agents' dead-letter topics"}
	dlq.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List each agent's dead-letter topic, how many dead letters it holds and how many a replay has not sent back yet",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer client.Close()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AGENT\tDEAD-LETTER TOPIC\tRECORDS\tNOT REPLAYED")
			for _, name := range a.agentNames() {
				topic := a.DeadLetterTopic(name)
				n, pending, err := a.dlqCounts(cmd.Context(), client, topic, name)
				if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
					fmt.Fprintf(tw, "%s\t%s\t-\t-\n", name, topic)
					continue
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", name, topic, n, pending)
			}
			return tw.Flush()
		},
	})

	var tailN int
	var tailJSON, tailRaw bool
	tail := &cobra.Command{
		Use:   "tail AGENT",
		Short: "Print the agent's latest dead letters: source record, attempts, reason, key and value",
		Long: `Print the agent's latest dead letters: where each came from, the reason, the
delivery attempts, its key and value. Under --json, key and value are decoded with
the agent's codecs (those of its source topic) and shown as JSON ("key_format":
"decoded"); one the codec refuses is shown raw ("text" when it is UTF-8, else
"base64") with the codec's error in "key_error" or "value_error", which is also
what a replay into the agent would do to it. --raw shows both raw, undecoded.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			topic, err := a.checkAgent(args[0])
			if err != nil {
				return err
			}
			client, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer client.Close()
			from := func(p int32) (int64, error) {
				hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err != nil {
					return 0, fmt.Errorf("highwater %s[%d]: %w", topic, p, err)
				}
				return max(hw-int64(tailN), 0), nil
			}
			var ds []DeadLetter
			err = readDeadLetters(cmd.Context(), client, topic, from, func(m *sarama.ConsumerMessage) error {
				if d := decodeDeadLetter(m); d.Agent == "" || d.Agent == args[0] {
					ds = append(ds, d)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if len(ds) > tailN {
				ds = ds[len(ds)-tailN:]
			}
			var dec recordDecoder
			if !tailRaw {
				dec = a.agentDecoder(args[0])
			}
			return writeDeadLetters(cmd.OutOrStdout(), ds, tailJSON, dec)
		},
	}
	tail.Flags().IntVarP(&tailN, "lines", "n", 10, "dead letters to print (the latest of each partition of the topic)")
	tail.Flags().BoolVar(&tailJSON, "json", false, "one JSON object a line, key and value decoded with the agent's codecs")
	tail.Flags().BoolVar(&tailRaw, "raw", false, "do not decode key and value: show the bytes (under --json: a string when UTF-8, else base64)")

	var dryRun, fromStart, force bool
	replay := &cobra.Command{
		Use:   "replay AGENT",
		Short: "Send the agent's dead letters back to their source topic and partition (after a fix)",
		Long: `Send the agent's dead letters back to their source topic, to the partition they
came from, with their key, value, timestamp and own headers (the runnel-* headers
removed). Progress is committed in the consumer group <app>-dlq-replay-<agent>:
a second replay sends only what was dead-lettered since (--from-start sends
everything again). --dry-run prints what would be sent, and whether the agent's
codecs decode it, and commits nothing.
Before sending, the replay decodes every dead letter with the agent's codecs: if
some still fail (the agent would dead-letter them again), it sends nothing and
says which; --force sends them anyway.
Records dead-lettered while the replay runs wait for the next one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.ReplayDeadLetters(cmd.Context(), args[0], ReplayOptions{DryRun: dryRun, FromStart: fromStart, Force: force, Out: cmd.OutOrStdout()})
			if err != nil {
				return err
			}
			verb := "sent back"
			if dryRun {
				verb = "would send back"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s %s of agent %s (%s of other agents skipped, %s of a record already sent skipped)",
				verb, plural(st.Sent, "dead letter"), args[0], plural(st.Skipped, "dead letter"), plural(st.Duplicates, "duplicate"))
			if st.Undecodable > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "; %d of them fail the agent's decode and are dead-lettered again", st.Undecodable)
			}
			fmt.Fprintln(cmd.ErrOrStderr())
			return nil
		},
	}
	replay.Flags().BoolVar(&dryRun, "dry-run", false, "print the dead letters that would be sent back and whether the agent decodes them; send and commit nothing")
	replay.Flags().BoolVar(&fromStart, "from-start", false, "ignore the progress of earlier replays: send back every dead letter the topic holds")
	replay.Flags().BoolVar(&force, "force", false, "send back dead letters the agent's codecs still refuse (it dead-letters them again)")
	dlq.AddCommand(tail, replay)
	return dlq
}

// dlqCounts returns how many dead letters of agent topic holds and how many
// of them no replay of agent sent back. It counts records, read as a
// read_committed consumer gets them (readDeadLetters), not offsets: under
// ExactlyOnce a dead letter is written in the cycle's transaction, so the
// topic also holds transaction markers and, after an abort, records that
// were never dead letters. Records of other agents (a topic shared with
// WithDeadLetterTopic) are not counted.
func (a *App) dlqCounts(ctx context.Context, client sarama.Client, topic, agent string) (n, pending int64, err error) {
	ps, err := client.Partitions(topic)
	if err != nil {
		return 0, 0, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	committed, err := replayOffsets(client, a.replayGroup(agent), topic, ps)
	if err != nil {
		return 0, 0, err
	}
	oldest := func(int32) (int64, error) { return sarama.OffsetOldest, nil }
	err = readDeadLetters(ctx, client, topic, oldest, func(m *sarama.ConsumerMessage) error {
		if d := decodeDeadLetter(m); d.Agent != "" && d.Agent != agent {
			return nil
		}
		n++
		if m.Offset >= committed[m.Partition] {
			pending++
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return n, pending, nil
}

// replayOffsets returns the offsets group committed on topic's partitions
// (0 where none).
func replayOffsets(client sarama.Client, group, topic string, ps []int32) (map[int32]int64, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	out := map[int32]int64{}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ps})
	if errors.Is(err, sarama.ErrGroupIDNotFound) || (err == nil && resp.Err == sarama.ErrGroupIDNotFound) {
		return out, nil // no replay yet (kfake answers so; Kafka answers with no offsets)
	}
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	if resp.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("offsets of group %s: %w", group, resp.Err)
	}
	for _, p := range ps {
		if b := resp.GetBlock(topic, p); b != nil && b.Offset > 0 {
			out[p] = b.Offset
		}
	}
	return out, nil
}

// ReplayOptions configure ReplayDeadLetters.
type ReplayOptions struct {
	// DryRun sends and commits nothing; the dead letters are printed to Out.
	DryRun bool
	// FromStart ignores the progress of earlier replays.
	FromStart bool
	// Force sends dead letters back even when the agent's codecs still
	// refuse their key or value (the agent dead-letters them again).
	// Without it such a replay sends nothing and returns an
	// *UndecodableError.
	Force bool
	// Out, if set, receives one line per dead letter sent (or, with DryRun,
	// that would be sent).
	Out io.Writer
}

// ReplayStats counts what a replay did.
type ReplayStats struct {
	// Sent is how many dead letters of the agent were sent back (with
	// DryRun: would be); Skipped how many of other agents (a dead-letter
	// topic shared with WithDeadLetterTopic) were passed over; Duplicates
	// how many were passed over because a dead letter of the same source
	// record (topic, partition, offset) of the agent was sent in this
	// replay already (under AtLeastOnce a record processed again after a
	// crash can be dead-lettered again: docs/ack-mode.md).
	Sent, Skipped, Duplicates int64
	// Undecodable is how many of Sent the agent's codecs refuse: the agent
	// dead-letters them again (with DryRun or Force; otherwise the replay
	// refuses to send them).
	Undecodable int64
}

// UndecodableError is returned by ReplayDeadLetters, before it sends
// anything, when some dead letters it would send back still fail the agent's
// decode: the agent would dead-letter them again. ReplayOptions.Force sends
// them anyway.
type UndecodableError struct {
	Agent       string
	Undecodable int64        // dead letters that fail the decode
	Of          int64        // dead letters the replay would send
	First       []DeadLetter // the first few that fail (at most 3)
	Errs        []error      // the decode error of each of First
}

func (e *UndecodableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nothing was sent: %d of the %s to replay still fail the decode of agent %s, which would dead-letter them again:",
		e.Undecodable, plural(e.Of, "dead letter"), e.Agent)
	for i, d := range e.First {
		fmt.Fprintf(&b, "\n  %s[%d]@%d (from %s[%d]@%d): %v", d.DLQTopic, d.DLQPartition, d.DLQOffset, d.Topic, d.Partition, d.Offset, e.Errs[i])
	}
	if n := e.Undecodable - int64(len(e.First)); n > 0 {
		fmt.Fprintf(&b, "\n  ... and %d more", n)
	}
	b.WriteString("\nfix the agent's codec (and deploy it) first; --dry-run lists each dead letter's decode, --force sends them anyway")
	return b.String()
}

// ReplayDeadLetters sends the dead letters of agent back to the source topic
// and partition they came from, from where the last replay stopped (the
// consumer group "<app>-dlq-replay-<agent>") up to the dead-letter topic's
// highwater at the start. Each partition's progress is committed once every
// record sent up to there was acknowledged. Before sending, it decodes every
// dead letter it would send with the agent's codecs: when some fail (the
// agent would dead-letter them again) it sends nothing and returns an
// *UndecodableError, unless o.Force. Errors: an unknown agent, the brokers',
// a dead letter without its source topic header.
func (a *App) ReplayDeadLetters(ctx context.Context, agent string, o ReplayOptions) (ReplayStats, error) {
	var st ReplayStats
	topic, err := a.checkAgent(agent)
	if err != nil {
		return st, err
	}
	brokers, err := resolveBrokers(a.cfg.Brokers)
	if err != nil {
		return st, err
	}
	client, _, err := a.connect(ctx, brokers, "runnel-dlq-replay", kafka.Timeouts{}, nil)
	if err != nil {
		return st, err
	}
	defer client.Close()
	ps, err := client.Partitions(topic)
	if err != nil {
		return st, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	committed := map[int32]int64{}
	if !o.FromStart {
		if committed, err = replayOffsets(client, a.replayGroup(agent), topic, ps); err != nil {
			return st, err
		}
	}
	dec := a.agentDecoder(agent)
	if !o.DryRun && !o.Force && dec != nil {
		// Warn first: a pass that only decodes, over what the replay
		// would send. A dead letter the agent still cannot decode goes
		// straight back to the dead-letter topic.
		ue := &UndecodableError{Agent: agent}
		var cst ReplayStats
		err := a.scanReplay(ctx, client, topic, agent, committed, &cst, nil, func(_ *sarama.ConsumerMessage, d DeadLetter) error {
			ue.Of++
			if derr := decodeError(dec, d.Key, d.Value); derr != nil {
				ue.Undecodable++
				if len(ue.First) < 3 {
					ue.First, ue.Errs = append(ue.First, d), append(ue.Errs, derr)
				}
			}
			return nil
		})
		if err != nil {
			return st, err
		}
		if ue.Undecodable > 0 {
			return st, ue
		}
	}
	var prod *kafka.Producer
	if !o.DryRun {
		if prod, err = kafka.NewProducer(kafka.ProducerConfigOf(client)); err != nil {
			return st, err
		}
		defer prod.Close()
	}
	type sent struct {
		dlqPart int32
		next    int64
		done    chan error
	}
	var all []sent
	next := map[int32]int64{} // DLQ partition -> offset after the last record read
	partsOf := map[string]int32{}
	err = a.scanReplay(ctx, client, topic, agent, committed, &st, next, func(m *sarama.ConsumerMessage, d DeadLetter) error {
		n, ok := partsOf[d.Topic]
		if !ok {
			ps, err := client.Partitions(d.Topic)
			if err != nil {
				return fmt.Errorf("partitions of %s: %w", d.Topic, err)
			}
			n = int32(len(ps))
			partsOf[d.Topic] = n
		}
		p := d.Partition
		if p < 0 || p >= n {
			p = kafka.PartitionFor(d.Key, n) // the source topic shrank or the header is missing
		}
		st.Sent++
		decoded := "ok"
		if derr := decodeError(dec, d.Key, d.Value); derr != nil {
			st.Undecodable++
			decoded = "FAILS (dead-lettered again): " + derr.Error()
		}
		if o.Out != nil {
			fmt.Fprintf(o.Out, "%s[%d]@%d -> %s[%d]  key=%s  reason=%s", m.Topic, m.Partition, m.Offset, d.Topic, p,
				strconv.Quote(string(d.Key)), d.Reason)
			if dec != nil {
				fmt.Fprintf(o.Out, "  decode=%s", decoded)
			}
			fmt.Fprintln(o.Out)
		}
		if o.DryRun {
			return nil
		}
		msg := &sarama.ProducerMessage{Topic: d.Topic, Partition: p, Key: bytesOrNil(d.Key), Value: bytesOrNil(d.Value),
			Timestamp: d.Timestamp}
		for _, h := range d.Headers {
			msg.Headers = append(msg.Headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		s := sent{dlqPart: m.Partition, next: m.Offset + 1, done: make(chan error, 1)}
		if err := prod.Send(msg, func(_ int32, _ int64, err error) { s.done <- err }); err != nil {
			return fmt.Errorf("replay %s[%d]@%d to %s[%d]: %w", m.Topic, m.Partition, m.Offset, d.Topic, p, err)
		}
		all = append(all, s)
		return nil
	})
	if o.DryRun {
		return st, err
	}
	// Commit, per dead-letter partition, up to the first record whose send
	// failed (everything before it is acknowledged).
	commit := map[int32]int64{}
	failed := map[int32]bool{}
	var sendErr error
	for _, s := range all {
		e := <-s.done
		if e != nil && sendErr == nil {
			sendErr = fmt.Errorf("replay to the source topic: %w", e)
		}
		if e != nil {
			failed[s.dlqPart] = true
		}
		if !failed[s.dlqPart] {
			commit[s.dlqPart] = s.next
		}
	}
	if err == nil && sendErr == nil {
		// Records of other agents after the last one sent are passed over
		// for good.
		for p, n := range next {
			commit[p] = max(commit[p], n)
		}
	}
	if cerr := commitReplay(client, a.replayGroup(agent), topic, commit); cerr != nil {
		return st, errors.Join(err, sendErr, cerr)
	}
	return st, errors.Join(err, sendErr)
}

// scanReplay reads the dead letters of agent's dead-letter topic that a
// replay sends back, from committed (partition -> offset; the log start
// where none), and calls fn with each: the agent's own, the first of each
// source record (topic, partition, offset). It counts the others in
// st.Skipped and st.Duplicates and, if next is not nil, records there the
// offset after the last record read of each partition.
func (a *App) scanReplay(ctx context.Context, client sarama.Client, topic, agent string, committed map[int32]int64,
	st *ReplayStats, next map[int32]int64, fn func(*sarama.ConsumerMessage, DeadLetter) error) error {
	// The source records sent back in this replay: a source offset names
	// one record, so a second dead letter of it would be a copy.
	type origin struct {
		topic     string
		partition int32
		offset    int64
	}
	sentFrom := map[origin]bool{}
	return readDeadLetters(ctx, client, topic, func(p int32) (int64, error) {
		if c, ok := committed[p]; ok {
			return c, nil
		}
		return sarama.OffsetOldest, nil
	}, func(m *sarama.ConsumerMessage) error {
		if next != nil {
			next[m.Partition] = m.Offset + 1
		}
		d := decodeDeadLetter(m)
		if d.Agent != "" && d.Agent != agent {
			st.Skipped++
			return nil
		}
		if d.Topic == "" {
			return fmt.Errorf("dead letter %s[%d]@%d has no %s header", m.Topic, m.Partition, m.Offset, HeaderTopic)
		}
		if d.Partition >= 0 && d.Offset >= 0 {
			src := origin{d.Topic, d.Partition, d.Offset}
			if sentFrom[src] {
				st.Duplicates++
				return nil
			}
			sentFrom[src] = true
		}
		return fn(m, d)
	})
}

// commitReplay commits offs (partition -> next offset) of topic for group
// (a simple consumer group: generation -1, no member).
func commitReplay(client sarama.Client, group, topic string, offs map[int32]int64) error {
	if len(offs) == 0 {
		return nil
	}
	coord, err := client.Coordinator(group)
	if err != nil {
		return fmt.Errorf("commit replay progress: coordinator of %s: %w", group, err)
	}
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: group, ConsumerGroupGeneration: -1}
	if client.Config().Version.IsAtLeast(sarama.V2_1_0_0) {
		req.Version = 6
	}
	ps := make([]int32, 0, len(offs))
	for p := range offs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for _, p := range ps {
		req.AddBlock(topic, p, offs[p], 0, "")
	}
	resp, err := coord.CommitOffset(req)
	if err != nil {
		return fmt.Errorf("commit replay progress of %s: %w", group, err)
	}
	for _, p := range ps {
		if kerr := resp.Errors[topic][p]; kerr != sarama.ErrNoError {
			return fmt.Errorf("commit replay progress of %s on %s[%d]: %w", group, topic, p, kerr)
		}
	}
	return nil
}

// recordDecoder decodes a record's key and value with the codecs of an
// agent's source topic (an agent.Topic's topicdecl.Runtime).
type recordDecoder interface {
	DecodeKey([]byte) (any, error)
	DecodeValue([]byte) (any, error)
}

// agentDecoder returns the decoder of agent's source topic, nil when it has
// none (an agent over a topic that is not an agent.Topic).
func (a *App) agentDecoder(agent string) recordDecoder {
	for _, r := range a.agents {
		if r.Name() == agent {
			if d, ok := topicdecl.Of(a.topics[r.Topic()]); ok {
				return d
			}
		}
	}
	return nil
}

// decodeError is the error the agent's stream meets decoding the record
// (agent.Stream.Events: a key only when there is one, then the value), nil
// when it decodes or dec is nil.
func decodeError(dec recordDecoder, key, value []byte) error {
	if dec == nil {
		return nil
	}
	if key != nil {
		if _, err := dec.DecodeKey(key); err != nil {
			return err
		}
	}
	_, err := dec.DecodeValue(value)
	return err
}

// deadLetterJSON is a dead letter as `dlq tail --json` prints it: key and
// value decoded by the agent's codecs, or raw.
type deadLetterJSON struct {
	DeadLetter
	// Key and Value shadow DeadLetter's bytes. Their format is "decoded"
	// (the agent's codec decoded it; its JSON), "text" (the bytes, valid
	// UTF-8, as a string) or "base64"; a null key has no format.
	Key         json.RawMessage `json:"key"`
	KeyFormat   string          `json:"key_format,omitempty"`
	KeyError    string          `json:"key_error,omitempty"`
	Value       json.RawMessage `json:"value"`
	ValueFormat string          `json:"value_format,omitempty"`
	ValueError  string          `json:"value_error,omitempty"`
}

// showBytes renders b for deadLetterJSON: decoded by decode when it is not
// nil and succeeds, else raw. It returns the JSON, its format and the
// decode error.
func showBytes(b []byte, decode func([]byte) (any, error)) (json.RawMessage, string, string) {
	if b == nil {
		return json.RawMessage("null"), "", ""
	}
	var derr string
	if decode != nil {
		v, err := decode(b)
		_, isBytes := v.([]byte) // a bytes codec: shown raw, not as JSON base64 of the same bytes
		switch {
		case err != nil:
			derr = err.Error()
		case !isBytes:
			j, err := json.Marshal(v)
			if err == nil {
				return j, "decoded", ""
			}
			derr = "decoded, but not representable as JSON: " + err.Error()
		}
	}
	if utf8.Valid(b) {
		j, _ := json.Marshal(string(b)) // a valid string always marshals
		return j, "text", derr
	}
	j, _ := json.Marshal(b) // base64
	return j, "base64", derr
}

func writeDeadLetters(out io.Writer, ds []DeadLetter, asJSON bool, dec recordDecoder) error {
	if asJSON {
		var decodeKey, decodeValue func([]byte) (any, error)
		if dec != nil {
			decodeKey, decodeValue = dec.DecodeKey, dec.DecodeValue
		}
		enc := json.NewEncoder(out)
		for _, d := range ds {
			j := deadLetterJSON{DeadLetter: d}
			j.Key, j.KeyFormat, j.KeyError = showBytes(d.Key, decodeKey)
			j.Value, j.ValueFormat, j.ValueError = showBytes(d.Value, decodeValue)
			if err := enc.Encode(j); err != nil {
				return err
			}
		}
		return nil
	}
	if len(ds) == 0 {
		_, err := fmt.Fprintln(out, "no dead letters")
		return err
	}
	for _, d := range ds {
		fmt.Fprintf(out, "%s[%d]@%d  from %s[%d]@%d  agent=%s  attempts=%d  at=%s\n  reason: %s\n  key: %s\n  value: %s\n",
			d.DLQTopic, d.DLQPartition, d.DLQOffset, d.Topic, d.Partition, d.Offset, d.Agent, d.Attempts, d.DeadLetteredAt,
			d.Reason, strconv.Quote(string(d.Key)), strconv.Quote(string(d.Value)))
		if err := decodeError(dec, d.Key, d.Value); err != nil {
			fmt.Fprintf(out, "  decode: fails: %v (a replay dead-letters it again)\n", err)
		}
	}
	return nil
}
