package app

import (
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/runnel-dev/runnel/internal/dedup"
	"github.com/runnel-dev/runnel/internal/tablestate"
)

// Repartition records sent again, recognised (package dedup; issue #24):
// under at-least-once a source partition processed again from its last
// commit (a kill -9, an abandoned task, a refused commit) sends its records
// to the repartition topics again, and the aggregates behind them counted
// each such record twice. A Deterministic agent's repartition records carry
// where they come from (the epoch's run stamps them: sendFrom), and the
// claim of a repartition topic skips those an earlier run already delivered
// (srcFilter), its state committed with the claim's offsets.

// epoch is one incarnation of a claim's reading: a new one at each start of
// a claimProducer and each seek back. It is the broker payload of every
// record fanned out in it (the record's offset is in its source.Record);
// Advance ignores records of older epochs (they are fetched again). One
// pointer per epoch, not a value per record: boxing a pointer into the
// payload interface allocates nothing. Under at-least-once it is also the
// run that stamps the records the partition's Deterministic agents send to
// repartition topics.
type epoch struct {
	n uint64
	// run is the run's random ID (never 0) and base the offset the run
	// starts reading at.
	run  uint64
	base int64
	// mu orders each stamped send with its sequence number (dedup: a run's
	// records reach a partition in the order of their numbers).
	mu   sync.Mutex
	seqs map[seqKey]uint32 // the next sequence number per agent and destination; guarded by mu
	// fails counts the partition's unfinished events
	// (tablestate.InFlight.Fail: a derived record the broker refused, so
	// that the event's later sends are refused too; an agent that failed
	// and runs again on the same subscription, going on past the record);
	// failsAt is the count when the run started and seen, per destination,
	// the count at the run's last send there. A send that finds the count
	// moved skips a sequence number: the gap keeps the reader's mark from
	// passing the unfinished record (package dedup). nil: no gaps (tests).
	// seen is guarded by mu.
	fails   *tablestate.InFlight
	failsAt uint64
	seen    map[seqKey]uint64
}

// seqKey names a run's sends of one agent to one repartition partition.
type seqKey struct {
	agent, topic string
	p            int32
}

// newEpoch returns incarnation n of a claim's reading, starting at base;
// fails counts the partition's unfinished events (nil: none).
func newEpoch(n uint64, base int64, fails *tablestate.InFlight) *epoch {
	ep := &epoch{n: n, run: rand.Uint64() | 1, base: base, fails: fails}
	if fails != nil {
		ep.failsAt = fails.Failures()
	}
	return ep
}

// sendFrom is tablestate.Env.SendFrom: the record goes out with its stamp
// (dedup.Header), numbered in its run under the run's lock, so that the
// order of the numbers is the order of the Produce calls. A record whose
// event came from no known run goes out unstamped.
func (w *Worker) sendFrom(o tablestate.Origin, topic string, p int32, key, value []byte, ts time.Time, ack tablestate.Acker) error {
	ep, ok := o.Payload.(*epoch)
	if !ok || ep == nil || o.Sends == nil {
		return w.producer.SendRecordAt(topic, p, key, value, ts, ack)
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	k := seqKey{agent: o.Agent, topic: topic, p: p}
	if ep.seqs == nil {
		ep.seqs = map[seqKey]uint32{}
	}
	if ep.fails != nil {
		if ep.seen == nil {
			ep.seen = map[seqKey]uint64{}
		}
		at, ok := ep.seen[k]
		if !ok {
			at = ep.failsAt
		}
		if f := ep.fails.Failures(); f != at {
			ep.seqs[k]++ // a gap: the run went on past a record it did not finish
			ep.seen[k] = f
		}
	}
	st := dedup.Stamp{Topic: o.Topic, Partition: o.Partition, Agent: o.Agent, Offset: o.Offset, Index: *o.Sends,
		Run: ep.run, Base: ep.base, Seq: ep.seqs[k]}
	*o.Sends++
	// The number is used even when the producer refuses the record: the
	// gap keeps the reader's mark from passing it.
	ep.seqs[k]++
	return w.producer.SendRecordHeader(topic, p, key, value, ts, dedup.Header, st.Append(nil), ack)
}

// isRepartition reports whether topic is a repartition topic of the app.
func (w *Worker) isRepartition(topic string) bool {
	t, ok := w.graph.Topic(topic)
	return ok && t.RepartitionOf != ""
}

// maxSrcMetadata bounds the filter's part of the commit metadata (with the
// dead letters' maxDLQMetadata and the separator, below
// offset.metadata.max.bytes, 4096 by default): about 90 (source partition,
// agent) marks at offsets near 10^7. Marks past it are left out: the next
// owner keeps those keys' records sent again (counted twice, as without
// stamps).
const maxSrcMetadata = 2900

// srcFilter is the duplicate filter of one claimed repartition partition
// under at-least-once (dedup.Filter), shared by the claim's incarnations:
// the poll loop offers each fetched batch (emitFetched, under the producer's
// lock, so that a seek back and the batch it discards are ordered), the
// commits encode and fold it, a new incarnation or a seek back rewinds it.
type srcFilter struct {
	mu      sync.Mutex
	f       *dedup.Filter
	skipped prometheus.Counter
}

// newSrcFilter returns the filter of a claim starting at from, with the state
// committed in meta (the group's commit metadata of from).
func newSrcFilter(meta string, from int64, skipped prometheus.Counter) *srcFilter {
	return &srcFilter{f: dedup.Decode(srcPart(meta), from), skipped: skipped}
}

// offer reads a fetched batch and returns the records to hand out: those
// without a stamp, or whose stamp is not covered (dedup.Filter.Offer), and
// the offsets of the others, which the caller resolves at once. kept is msgs
// when nothing is skipped.
func (s *srcFilter) offer(msgs []*sarama.ConsumerMessage) (kept []*sarama.ConsumerMessage, skipped []int64) {
	if s == nil || len(msgs) == 0 {
		return msgs, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range msgs {
		skip := false
		if h := stampOf(m); h != nil {
			skip, _ = s.f.OfferHeader(h)
		}
		switch {
		case skip && skipped == nil:
			kept = append(make([]*sarama.ConsumerMessage, 0, len(msgs)), msgs[:i]...)
			skipped = append(skipped, m.Offset)
		case skip:
			skipped = append(skipped, m.Offset)
		case skipped != nil:
			kept = append(kept, m)
		}
	}
	s.f.Seal(msgs[len(msgs)-1].Offset + 1)
	if skipped == nil {
		return msgs, nil
	}
	if s.skipped != nil {
		s.skipped.Add(float64(len(skipped)))
	}
	return kept, skipped
}

// stampOf returns the value of m's last dedup.Header header, nil if none.
func stampOf(m *sarama.ConsumerMessage) []byte {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if h := m.Headers[i]; h != nil && string(h.Key) == dedup.Header {
			return h.Value
		}
	}
	return nil
}

// rewind puts the filter back to at: the claim reads again from there.
func (s *srcFilter) rewind(at int64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f.Rewind(at)
}

// metadata returns the filter's commit metadata at offset at; commit also
// forgets the state before at (at is marked for commit: no incarnation reads
// below it again).
func (s *srcFilter) metadata(at int64, commit bool) string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if commit {
		s.f.Commit(at)
	}
	return s.f.Encode(at, maxSrcMetadata)
}

// srcSep separates the dead letters' part of the commit metadata from the
// filter's (neither part holds it).
const srcSep = "|"

// joinMeta joins the dead letters' and the filter's commit metadata.
func joinMeta(dlq, src string) string {
	switch {
	case src == "":
		return dlq
	case dlq == "":
		return src
	}
	return dlq + srcSep + src
}

// srcPart returns the filter's part of commit metadata joinMeta wrote.
func srcPart(meta string) string { return metaPart(meta, dedup.Prefix) }

// dlqPart returns the dead letters' part of commit metadata joinMeta wrote.
func dlqPart(meta string) string { return metaPart(meta, dlqMetaPrefix) }

// metaPart returns the part of meta that starts with prefix, "" if none.
func metaPart(meta, prefix string) string {
	for _, part := range strings.Split(meta, srcSep) {
		if strings.HasPrefix(part, prefix) {
			return part
		}
	}
	return ""
}
