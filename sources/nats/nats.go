// Package nats is a shared-source producer (agent/source) over a NATS
// JetStream pull consumer: every JetStream message is fanned out to the
// subscribers of the source, and its resolution is mapped back to JetStream
// acknowledgements (docs/design.md §3, user producers):
//
//	clean    -> Ack          (every subscriber accepted it)
//	rejected -> Term         (terminal: JetStream never redelivers it; the reason is logged)
//	failed   -> NakWithDelay (redelivered after a backoff that doubles with NumDelivered)
//
// The consumer must use AckExplicit. Ordering lanes: one lane per subject
// (LanePerSubject, the default: messages of one subject are resolved back to
// JetStream in stream order) or one per message (LanePerMessage: every message
// is acked as soon as it resolves). A Nak'd message is redelivered after later
// messages of its subject, so per-subject order holds only until the first
// failure; JetStream's MaxDeliver bounds retries (then the server gives up on
// the message, reported as an advisory).
//
// Package nats must never ack a message before its record resolved clean.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/runnel-dev/runnel/agent/source"
)

// Lane says how messages are ordered for advancing.
type Lane int

const (
	// LanePerSubject advances each subject's messages in stream order.
	LanePerSubject Lane = iota
	// LanePerMessage advances every message independently (parallel acks).
	LanePerMessage
)

// Config configures a Producer.
type Config struct {
	// Consumer is the JetStream consumer to pull from (AckExplicit).
	Consumer jetstream.Consumer
	// Lane is the ordering lane; default LanePerSubject.
	Lane Lane
	// NakDelay is the redelivery delay of a message failed on its first
	// delivery; it doubles with every further delivery up to MaxNakDelay.
	// Defaults 100 ms and 30 s.
	NakDelay, MaxNakDelay time.Duration
	// Logger receives the reasons of terminated messages; default slog.Default().
	Logger *slog.Logger
}

// Producer is a source.Producer over one JetStream pull consumer.
type Producer struct {
	cfg Config
	log *slog.Logger
}

// New returns a producer over cfg.Consumer.
// Errors: a nil Consumer.
func New(cfg Config) (*Producer, error) {
	if cfg.Consumer == nil {
		return nil, errors.New("nats source: Config.Consumer is nil")
	}
	if cfg.NakDelay <= 0 {
		cfg.NakDelay = 100 * time.Millisecond
	}
	if cfg.MaxNakDelay <= 0 {
		cfg.MaxNakDelay = 30 * time.Second
	}
	cfg.MaxNakDelay = max(cfg.MaxNakDelay, cfg.NakDelay)
	p := &Producer{cfg: cfg, log: cfg.Logger}
	if p.log == nil {
		p.log = slog.Default()
	}
	return p, nil
}

// Factory returns a source.ProducerFactory building a producer over cfg
// (for source.Manager.Subscribe).
func Factory(cfg Config) source.ProducerFactory {
	return func(context.Context) (source.Producer, error) { return New(cfg) }
}

// Open implements source.Producer: it pulls messages until ctx is done. The
// record's Topic is the subject, Offset the stream sequence, Timestamp the
// time the stream stored it, Headers the NATS headers (one per value).
func (p *Producer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	it, err := p.cfg.Consumer.Messages()
	if err != nil {
		return fmt.Errorf("nats source: pull: %w", err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("nats source: next message: %w", err)
		}
		rec := &source.Record{Topic: msg.Subject(), Value: msg.Data()}
		if md, err := msg.Metadata(); err == nil {
			rec.Offset = int64(md.Sequence.Stream)
			rec.Timestamp = md.Timestamp
		}
		for k, vs := range msg.Headers() {
			for _, v := range vs {
				rec.Headers = append(rec.Headers, source.Header{Key: []byte(k), Value: []byte(v)})
			}
		}
		if err := emit(rec, msg); err != nil {
			return err
		}
	}
}

// Lane implements source.Producer: the subject, or the stream sequence under
// LanePerMessage.
func (p *Producer) Lane(payload any) (any, error) {
	msg, ok := payload.(jetstream.Msg)
	if !ok {
		return nil, fmt.Errorf("nats source: payload %T is not a jetstream.Msg", payload)
	}
	if p.cfg.Lane == LanePerMessage {
		md, err := msg.Metadata()
		if err != nil {
			return nil, fmt.Errorf("nats source: metadata: %w", err)
		}
		return md.Sequence.Stream, nil
	}
	return msg.Subject(), nil
}

// Advance implements source.Producer (see the package doc for the mapping).
// A record fanned out to no subscriber (Outcome 0,0,0) is not clean: it is
// Nak'd like a failed one. The acks are sent without waiting for the server's
// confirmation; a lost ack makes JetStream redeliver after AckWait
// (at-least-once).
func (p *Producer) Advance(_ context.Context, batch []source.AdvanceItem) error {
	var errs []error
	for _, it := range batch {
		msg := it.Payload.(jetstream.Msg)
		var err error
		switch {
		case it.Outcome.Clean():
			err = msg.Ack()
		case it.Outcome.Failed == 0 && it.Outcome.Rejected > 0:
			// Plain Term: "+TERM <reason>" needs nats-server 2.10.4+ (older
			// servers ignore it and redeliver after AckWait); the reason is
			// logged instead.
			p.log.Info("nats message terminated", "subject", it.Record.Topic, "sequence", it.Record.Offset, "reason", reason(it))
			err = msg.Term()
		default:
			n := uint64(1)
			if md, e := msg.Metadata(); e == nil {
				n = md.NumDelivered
			}
			err = msg.NakWithDelay(p.delay(n))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("nats source: resolve %s seq %d: %w", it.Record.Topic, it.Record.Offset, err))
		}
	}
	return multierror.Append(nil, errs...).ErrorOrNil()
}

func (p *Producer) delay(delivered uint64) time.Duration {
	d := p.cfg.NakDelay
	for i := uint64(1); i < delivered && d < p.cfg.MaxNakDelay; i++ {
		d *= 2
	}
	return min(d, p.cfg.MaxNakDelay)
}

// reason joins the reject reasons as "subscriber: reason; ...".
func reason(it source.AdvanceItem) string {
	parts := make([]string, 0, len(it.Causes))
	for i, c := range it.Causes {
		id := ""
		if i < len(it.CauseIDs) {
			id = it.CauseIDs[i] + ": "
		}
		parts = append(parts, id+c.Error())
	}
	return strings.Join(parts, "; ")
}

// Close implements source.Producer; the pull subscription ends with Open.
func (p *Producer) Close() error { return nil }
