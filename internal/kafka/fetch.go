package kafka

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// Fetched is one data record of a fetch response (FetchAt).
type Fetched struct {
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []*sarama.RecordHeader
	Timestamp time.Time
}

// FetchResult is one fetch response of one partition: its data records in
// offset order (control batches and, under read_committed, aborted records
// left out), the offset after the last batch returned (control batches and
// compacted batches included), whether the response held any batch, and the
// partition's highwater.
type FetchResult struct {
	Records   []Fetched
	Next      int64
	Batches   int
	Highwater int64
}

// FetchAt fetches partition p of topic from offset directly from its leader
// (Fetch v4, the oldest version Kafka 4 and kfake accept and the first with
// record batches and aborted transactions, KIP-98), with isolation level
// iso. Reading batches directly, rather than through a PartitionConsumer,
// gives the exact offset after each batch: a reader (a replay, runneltest)
// knows it reached its stop offset even when the last offsets of the range are transaction
// markers or were removed by compaction.
func FetchAt(ctx context.Context, client sarama.Client, topic string, p int32, offset int64, maxWait time.Duration, iso sarama.IsolationLevel) (FetchResult, error) {
	res := FetchResult{Next: offset}
	b, err := client.Leader(topic, p)
	if err != nil {
		return res, fmt.Errorf("leader of %s[%d]: %w", topic, p, err)
	}
	req := &sarama.FetchRequest{Version: 4, MaxWaitTime: int32(maxWait.Milliseconds()), MinBytes: 1, MaxBytes: 16 << 20, Isolation: iso}
	req.AddBlock(topic, p, offset, 4<<20, -1)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	resp, err := b.Fetch(req)
	if err != nil {
		return res, fmt.Errorf("fetch %s[%d]@%d: %w", topic, p, offset, err)
	}
	blk := resp.GetBlock(topic, p)
	if blk == nil {
		return res, fmt.Errorf("fetch %s[%d]@%d: response without the partition", topic, p, offset)
	}
	if blk.Err != sarama.ErrNoError {
		return res, fmt.Errorf("fetch %s[%d]@%d: %w", topic, p, offset, blk.Err)
	}
	res.Highwater = blk.HighWaterMarkOffset
	// Under read_committed (KIP-98) the response lists the aborted
	// transactions in it: per producer, the first offset of each. A
	// transactional batch of that producer at or after such an offset starts
	// aborted data, which runs to the producer's next control batch (the
	// abort marker); each listed transaction is consumed once, so a later
	// committed transaction of the same producer is read.
	abortedFrom := map[int64][]int64{}
	for _, at := range blk.AbortedTransactions {
		abortedFrom[at.ProducerID] = append(abortedFrom[at.ProducerID], at.FirstOffset)
	}
	for _, l := range abortedFrom {
		slices.Sort(l)
	}
	aborting := map[int64]bool{}
	for _, rs := range blk.RecordsSet {
		if rs == nil || rs.RecordBatch == nil {
			continue
		}
		rb := rs.RecordBatch
		if rb.PartialTrailingRecord && len(rb.Records) == 0 {
			continue
		}
		res.Batches++
		if !rb.PartialTrailingRecord {
			res.Next = max(res.Next, rb.FirstOffset+int64(rb.LastOffsetDelta)+1)
		}
		if l := abortedFrom[rb.ProducerID]; iso == sarama.ReadCommitted && rb.IsTransactional && len(rb.Records) > 0 && !rb.Control &&
			len(l) > 0 && l[0] <= rb.FirstOffset+int64(rb.LastOffsetDelta) {
			aborting[rb.ProducerID] = true
			abortedFrom[rb.ProducerID] = l[1:]
		}
		if rb.Control {
			delete(aborting, rb.ProducerID)
			continue
		}
		if aborting[rb.ProducerID] {
			continue
		}
		for _, r := range rb.Records {
			ts := rb.FirstTimestamp.Add(r.TimestampDelta)
			if rb.LogAppendTime {
				ts = rb.MaxTimestamp
			}
			f := Fetched{Offset: rb.FirstOffset + r.OffsetDelta, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: ts}
			res.Records = append(res.Records, f)
			if rb.PartialTrailingRecord {
				res.Next = max(res.Next, f.Offset+1)
			}
		}
	}
	return res, nil
}
