// Package bench holds side-by-side benchmarks of Runnel's moving parts.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/agent/source"
)

// benchProducer emits n records as fast as emit accepts them, once start is
// closed, then idles until its context is done. Advance counts the advanced
// records.
type benchProducer struct {
	n        int
	start    chan struct{} // closed once every subscriber subscribed
	advanced atomic.Int64
	calls    atomic.Int64
	all      chan struct{} // closed once n records were advanced
}

func (p *benchProducer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	select {
	case <-p.start:
	case <-ctx.Done():
		return ctx.Err()
	}
	for i := range p.n {
		rec := &source.Record{Topic: "t", Offset: int64(i)}
		if err := emit(rec, rec); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

func (p *benchProducer) Lane(any) (any, error) { return int32(0), nil }

func (p *benchProducer) Advance(_ context.Context, batch []source.AdvanceItem) error {
	p.calls.Add(1)
	if p.advanced.Add(int64(len(batch))) == int64(p.n) {
		close(p.all)
	}
	return nil
}

func (p *benchProducer) Close() error { return nil }

// BenchmarkSource measures records/s through the shared-source manager: one
// producer emitting as fast as possible (Backpressure, queue 1024), k
// subscribers pulling every record. In ack mode each subscriber binds and
// confirms one persist token per record and the run ends when the last record
// was advanced; on the fast path it ends when every subscriber pulled the last
// record.
func BenchmarkSource(b *testing.B) {
	for _, subs := range []int{1, 2, 4} {
		for _, mode := range []string{"fast", "ack"} {
			b.Run(fmt.Sprintf("subs=%d/%s", subs, mode), func(b *testing.B) {
				m, err := source.NewManager(source.Config{
					Overflow: source.Backpressure,
					Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
				})
				if err != nil {
					b.Fatal(err)
				}
				// The group starts with the first subscriber: the
				// producer waits until every subscriber joined, so each
				// is in the snapshot of every record.
				start := make(chan struct{})
				p := &benchProducer{n: b.N, start: start, all: make(chan struct{})}
				open := func(ctx context.Context, emit func(*source.Record) error) error {
					select {
					case <-start:
					case <-ctx.Done():
						return ctx.Err()
					}
					for i := range b.N {
						if err := emit(&source.Record{Topic: "t", Offset: int64(i)}); err != nil {
							return err
						}
					}
					<-ctx.Done()
					return ctx.Err()
				}
				b.ResetTimer()
				var wg sync.WaitGroup
				for k := range subs {
					var s *source.Subscription
					if mode == "ack" {
						s, err = m.Subscribe("k", fmt.Sprint(k), func(context.Context) (source.Producer, error) { return p, nil })
					} else {
						s, err = m.SubscribeFast("k", fmt.Sprint(k), open)
					}
					if err != nil {
						b.Fatal(err)
					}
					wg.Go(func() {
						for range b.N {
							d, err := s.Next(context.Background())
							if err != nil {
								b.Error(err)
								return
							}
							if tok, ok := d.Bind(); ok {
								tok.Confirm()
							}
						}
						// Close the last window so the last record resolves.
						ctx, cancel := context.WithCancel(context.Background())
						cancel()
						_, _ = s.Next(ctx)
					})
				}
				close(start)
				wg.Wait()
				if mode == "ack" {
					<-p.all
				}
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
				if mode == "ack" {
					b.ReportMetric(float64(b.N)/float64(p.calls.Load()), "records/advance")
				}
				m.StopAll()
			})
		}
	}
}
