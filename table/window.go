package table

import (
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
)

// Windows defines the windows of a windowed table: each window is the half-open
// interval [start, start+size) of event time, and window starts are the
// instants offset + n·advance (n any integer) since the Unix epoch. Tumbling
// windows have advance = size (every instant is in exactly one window);
// hopping windows have advance < size (every instant is in size/advance
// windows, rounded up). Kafka Streams' TimeWindows and Faust's
// HoppingWindow/TumblingWindow define the same windows; Runnel counts in
// milliseconds (Kafka record timestamps), so size, advance and offset must be
// whole milliseconds.
type Windows struct {
	size, advance, offset time.Duration
}

// Tumbling returns windows of the given size, back to back.
func Tumbling(size time.Duration) Windows { return Windows{size: size, advance: size} }

// Hopping returns windows of the given size starting every advance
// (0 < advance <= size).
func Hopping(size, advance time.Duration) Windows { return Windows{size: size, advance: advance} }

// WithOffset shifts the window starts by d from the epoch alignment: windows
// of a week start on Thursdays (1970-01-01 was one) unless offset by 4 days
// (ISO weeks start on Monday 00:00 UTC: Tumbling(7*24*time.Hour).WithOffset(4*24*time.Hour)).
func (ws Windows) WithOffset(d time.Duration) Windows { ws.offset = d; return ws }

// Size returns the window size.
func (ws Windows) Size() time.Duration { return ws.size }

// Advance returns the distance between window starts.
func (ws Windows) Advance() time.Duration { return ws.advance }

// String describes the windows: "tumbling 24h0m0s", "hopping 1h0m0s every
// 15m0s", with " offset 96h0m0s" when they are shifted.
func (ws Windows) String() string {
	out := "tumbling " + ws.size.String()
	if ws.advance != ws.size {
		out = "hopping " + ws.size.String() + " every " + ws.advance.String()
	}
	if ws.offset != 0 {
		out += " offset " + ws.offset.String()
	}
	return out
}

func (ws Windows) validate() error {
	switch {
	case ws.size < time.Millisecond || ws.size%time.Millisecond != 0:
		return fmt.Errorf("window size %v: want a positive whole number of milliseconds", ws.size)
	case ws.advance < time.Millisecond || ws.advance%time.Millisecond != 0:
		return fmt.Errorf("window advance %v: want a positive whole number of milliseconds", ws.advance)
	case ws.advance > ws.size:
		return fmt.Errorf("window advance %v is larger than the size %v: records between windows would be lost", ws.advance, ws.size)
	case ws.offset%time.Millisecond != 0:
		return fmt.Errorf("window offset %v: want a whole number of milliseconds", ws.offset)
	}
	return nil
}

// floorDiv is a/b rounded toward negative infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// startsContaining returns the starts (Unix ms) of every window containing
// instant t (Unix ms), ascending.
func (ws Windows) startsContaining(t int64) []int64 {
	size, adv, off := ws.size.Milliseconds(), ws.advance.Milliseconds(), ws.offset.Milliseconds()
	last := floorDiv(t-off, adv)*adv + off // latest start <= t
	n := 0
	for s := last; s > t-size; s -= adv {
		n++
	}
	out := make([]int64, n)
	for i, s := n-1, last; i >= 0; i, s = i-1, s-adv {
		out[i] = s
	}
	return out
}

// startAtOrAfter returns the first window start >= t (Unix ms).
func (ws Windows) startAtOrAfter(t int64) int64 {
	adv, off := ws.advance.Milliseconds(), ws.offset.Milliseconds()
	s := floorDiv(t-off, adv)*adv + off
	if s < t {
		s += adv
	}
	return s
}

// Containing returns every window containing t, by ascending start: one for
// tumbling windows, ceil(size/advance) or floor(size/advance) for hopping ones.
func (ws Windows) Containing(t time.Time) []Window {
	var out []Window
	for _, s := range ws.startsContaining(t.UnixMilli()) {
		out = append(out, ws.window(s))
	}
	return out
}

func (ws Windows) window(start int64) Window {
	return Window{Start: time.UnixMilli(start).UTC(), End: time.UnixMilli(start + ws.size.Milliseconds()).UTC()}
}

// Window is one window of event time, [Start, End), in UTC.
type Window struct {
	Start, End time.Time
}

// String renders the window as "[start, end)" in RFC 3339.
func (w Window) String() string {
	return "[" + w.Start.Format(time.RFC3339Nano) + ", " + w.End.Format(time.RFC3339Nano) + ")"
}

// WindowValue is one window of a key and its value (Windowed.Range).
type WindowValue[V any] struct {
	Window Window
	Value  V
}

// WindowOption configures a windowed table (NewWindowed): the window options
// (Grace, Retention, EventTime, OnClose, EmitOnClose) and every table Option
// (Partitions).
type WindowOption interface{ applyWindow(*windowOptions) }

// windowOption is a window-only option.
type windowOption func(*windowOptions)

func (f windowOption) applyWindow(o *windowOptions) { f(o) }

type windowOptions struct {
	grace, retention time.Duration
	eventTime        func(Event) (time.Time, error)
	onClose          any // func(K, Window, V), checked by NewWindowed
	emitOnClose      any // func(Event, K, Window, V) error, checked by NewWindowed
	partitions       int32
}

// Grace sets how long after its end a window still accepts records, in event
// time: a window closes (OnClose runs, later records for it are dropped as
// late) once the partition's stream time reaches end + grace. Default 0; there
// is no hidden default grace (Kafka Streams' old 24 h default surprised users,
// KIP-633).
func Grace(d time.Duration) WindowOption { return windowOption(func(o *windowOptions) { o.grace = d }) }

// Retention sets how long a window is kept after its start, in stream time:
// the window is deleted (a tombstone in the changelog) once stream time reaches
// start + retention. Default and minimum: size + grace (a window is deleted
// when it closes); a longer retention keeps closed windows readable (At,
// Range). The changelog topic's retention.ms is set to this plus one day
// (Kafka Streams' windowstore.changelog.additional.retention.ms), measured on
// the changelog records' own (wall-clock) timestamps.
func Retention(d time.Duration) WindowOption {
	return windowOption(func(o *windowOptions) { o.retention = d })
}

// EventTime sets how a record's event time is found; default: the source
// record's timestamp (a timer's Tick: its Time). A function returning an error fails the
// write. UpdateAt takes the event time explicitly instead.
func EventTime(fn func(ev Event) (time.Time, error)) WindowOption {
	return windowOption(func(o *windowOptions) { o.eventTime = fn })
}

// OnClose sets the function called once per window with the window's final
// value, when the partition's stream time reaches end + grace (see Windowed).
// K and V must be the table's key and value types (NewWindowed reports a
// mismatch as the table's declaration error). It runs on the agent's
// goroutine, after the write of the record that advanced stream time, and
// must not block for long.
func OnClose[K, V any](fn func(key K, w Window, final V)) WindowOption {
	return windowOption(func(o *windowOptions) { o.onClose = fn })
}

// EmitOnClose is OnClose with the event whose write closed the window, so
// that fn can send the window's final value on (Kafka Streams'
// suppress(untilWindowCloses) followed by to(topic)):
//
//	table.EmitOnClose(func(ev table.Event, actor string, w table.Window, n int64) error {
//		return weekly.Send(ev, actor, fmt.Sprintf("%s %d", w.Start.Format(time.DateOnly), n))
//	})
//
// The send is bound to that event like any send of the agent: the record's
// offset is committed only after the broker acknowledged it. An error from fn
// is returned by the write (Update, UpdateAt) and fails the event: the record
// is processed again and the window closes again, so a closed window is
// emitted at least once, as OnClose runs (see Windowed). K and V must be the
// table's key and value types; fn runs on the agent's goroutine, after
// OnClose if both are set.
func EmitOnClose[K, V any](fn func(ev Event, key K, w Window, final V) error) WindowOption {
	return windowOption(func(o *windowOptions) { o.emitOnClose = fn })
}

// ErrNoEventTime is returned by a windowed write whose event carries no
// timestamp and for which no EventTime option is set.
var ErrNoEventTime = errors.New("event has no event time")

// Windowed is a windowed table: a value per key and window of event time
// (Faust's WindowWrapper, Kafka Streams' windowed aggregations). It is stored
// like a Table — one store and one changelog topic (cleanup.policy
// compact,delete) — under the stored key tag 0x00 + encoded key + window start
// (8 bytes big-endian, sign bit flipped, Unix ms), so a key's windows sort by
// time; the value is the stream time of the write (8 bytes) followed by the
// encoded value.
//
// Stream time is per partition: the largest event time a write to this table
// has seen on the partition, never the wall clock (docs/design.md §6, "Windows";
// Faust's wall-clock expiry is the failure mode avoided). A write advances
// stream time first; then, for every window containing the record's event
// time, a window with end + grace <= stream time is closed and the record is
// not applied to it (late; counted by LateRecords). After the writes, windows
// whose end + grace <= stream time are closed: OnClose runs once per window
// with its final value. Windows whose start + retention <= stream time are
// deleted (changelog tombstones). Together with closes and deletes a
// per-partition "closed up to" watermark (tag 0x01) is written; all these
// writes are bound to the event like Table writes, so the source offset is not
// committed before the broker acknowledged them.
//
// When a partition becomes active on a worker (after its restore), the
// expiry index is rebuilt by scanning the store: windows at or below the
// persisted watermark count as closed and never close again; the others close
// when stream time (restored from the watermark and the writes' stamps)
// passes them, at the partition's next write. So a window closes once across
// clean restarts and rebalances; a crash between an OnClose and the
// acknowledgement of its watermark closes the window again on redelivery
// (at-least-once, like every effect in Runnel; see docs/tables.md).
type Windowed[K any, V any] struct {
	link        // the runtime side (windowedRuntime), no part of the API
	name, topic string
	kc          codec.Codec[K]
	vc          codec.Codec[V]
	ws          Windows
	grace       int64 // ms
	retention   int64 // ms, >= size + grace
	eventTime   func(Event) (time.Time, error)
	onClose     func(K, Window, V)
	emitOnClose func(Event, K, Window, V) error
	partitions  int32
	err         error // declaration error, returned by every operation

	mu    sync.Mutex
	parts map[partKey]*windowPart // active partitions per worker state; guarded by mu

	late, closed, expired atomic.Int64
}

type partKey struct {
	st *tablestate.State
	p  int32
}

// NewWindowed declares a windowed table on h. An invalid declaration (bad
// windows, an OnClose of other types) is reported by every operation and by
// the partition's activation in the worker.
func NewWindowed[K any, V any](h Host, name string, kc codec.Codec[K], vc codec.Codec[V], ws Windows, opts ...WindowOption) *Windowed[K, V] {
	var o windowOptions
	for _, f := range opts {
		f.applyWindow(&o)
	}
	t := &Windowed[K, V]{name: name, topic: changelog.Topic(h.AppID(), name), kc: kc, vc: vc, ws: ws,
		partitions: o.partitions, parts: map[partKey]*windowPart{}, eventTime: o.eventTime}
	t.link = tablestate.NewLink(windowedRuntime[K, V]{t})
	var errs []error
	if err := ws.validate(); err != nil {
		errs = append(errs, err)
	}
	if o.grace < 0 || o.grace%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("grace %v: want a whole number of milliseconds >= 0", o.grace))
	}
	if o.retention%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("retention %v: want a whole number of milliseconds", o.retention))
	}
	t.grace = o.grace.Milliseconds()
	t.retention = max(o.retention.Milliseconds(), ws.size.Milliseconds()+t.grace)
	if o.onClose != nil {
		fn, ok := o.onClose.(func(K, Window, V))
		if !ok {
			errs = append(errs, fmt.Errorf("OnClose takes %T, want func(%T, table.Window, %T)", o.onClose, *new(K), *new(V)))
		}
		t.onClose = fn
	}
	if o.emitOnClose != nil {
		fn, ok := o.emitOnClose.(func(Event, K, Window, V) error)
		if !ok {
			errs = append(errs, fmt.Errorf("EmitOnClose takes %T, want func(table.Event, %T, table.Window, %T) error", o.emitOnClose, *new(K), *new(V)))
		}
		t.emitOnClose = fn
	}
	if t.eventTime == nil {
		t.eventTime = recordTime
	}
	if len(errs) > 0 {
		t.err = fmt.Errorf("windowed table %s: %w", name, errors.Join(errs...))
	}
	h.RegisterTable(t)
	return t
}

func recordTime(ev Event) (time.Time, error) {
	if ts := tablestate.EventTime(ev); !ts.IsZero() {
		return ts, nil
	}
	return time.Time{}, ErrNoEventTime
}

// Name returns the table name.
func (t *Windowed[K, V]) Name() string { return t.name }

// Changelog returns the changelog topic name.
func (t *Windowed[K, V]) Changelog() string { return t.topic }

// Partitions returns the declared partition count (0 = follows the sources).
func (t *Windowed[K, V]) Partitions() int32 { return t.partitions }

// KeyCodec names the key codec.
func (t *Windowed[K, V]) KeyCodec() string { return t.kc.Name() }

// ValueCodec names the value codec.
func (t *Windowed[K, V]) ValueCodec() string { return t.vc.Name() }

// Windows returns the table's window definition.
func (t *Windowed[K, V]) Windows() Windows { return t.ws }

// WindowSpec describes the windows, grace and retention, for describe:
// "tumbling 24h0m0s, grace 0s, retention 24h0m0s".
func (t *Windowed[K, V]) WindowSpec() string {
	return fmt.Sprintf("%s, grace %s, retention %s", t.ws, time.Duration(t.grace)*time.Millisecond, time.Duration(t.retention)*time.Millisecond)
}

// ChangelogConfig is the windowed table's changelog topic configuration: compact,delete with
// retention.ms = retention + 1 day.
func (t *Windowed[K, V]) ChangelogConfig() map[string]string {
	return map[string]string{
		"cleanup.policy": "compact,delete",
		"retention.ms":   strconv.FormatInt(t.retention+24*time.Hour.Milliseconds(), 10),
	}
}

// LateRecords returns how many (record, window) updates were dropped because
// the window had closed, summed over every worker of the process. It counts
// at least once: a record processed again (after an abandoned cycle or a
// rebalance) is counted again.
func (t *Windowed[K, V]) LateRecords() int64 { return t.late.Load() }

// ClosedWindows returns how many windows closed (OnClose calls, or closes
// without an OnClose set) in this process.
func (t *Windowed[K, V]) ClosedWindows() int64 { return t.closed.Load() }

// ExpiredWindows returns how many windows were deleted by retention in this process.
func (t *Windowed[K, V]) ExpiredWindows() int64 { return t.expired.Load() }

// Format decodes a stored key and value for dumps: "key@start" (RFC 3339, UTC)
// and the value; the per-partition watermark renders as "~closed-up-to[p]"
// with the watermark time.
func (t *Windowed[K, V]) Format(key, value []byte) (string, any, error) {
	if p, ok := decodeMetaKey(key); ok {
		st, err := decodeMeta(value)
		if err != nil {
			return "", nil, fmt.Errorf("table %s: watermark of partition %d: %w", t.name, p, err)
		}
		return fmt.Sprintf("~closed-up-to[%d]", p), time.UnixMilli(st).UTC().Format(time.RFC3339Nano), nil
	}
	kb, start, ok := decodeWindowKey(key)
	if !ok {
		return "", nil, fmt.Errorf("table %s: stored key %q is not a windowed key", t.name, key)
	}
	k, err := t.kc.Decode(kb)
	if err != nil {
		return "", nil, fmt.Errorf("table %s: key: %w", t.name, err)
	}
	_, vb, err := decodeRow(value)
	if err != nil {
		return "", nil, fmt.Errorf("table %s: value of %v: %w", t.name, k, err)
	}
	v, err := t.vc.Decode(vb)
	if err != nil {
		return "", nil, fmt.Errorf("table %s: value of %v: %w", t.name, k, err)
	}
	return fmt.Sprintf("%v@%s", k, time.UnixMilli(start).UTC().Format(time.RFC3339Nano)), v, nil
}

// windowedRuntime is a Windowed's runtime side (tablestate.RuntimeOf): the
// worker activates its partitions (tablestate.PartitionActivator: stream
// time and the expiry index live beside the store) and lists a key's
// windows for interactive queries (tablestate.WindowQuerier).
type windowedRuntime[K any, V any] struct{ t *Windowed[K, V] }

// ActivatePartition implements tablestate.PartitionActivator: called after
// partition p's restore and before any write to it.
func (r windowedRuntime[K, V]) ActivatePartition(st *tablestate.State, p int32) error {
	return r.t.activatePartition(st, p)
}

// DeactivatePartition implements tablestate.PartitionActivator: called when
// p stops being active on the worker.
func (r windowedRuntime[K, V]) DeactivatePartition(st *tablestate.State, p int32) {
	r.t.deactivatePartition(st, p)
}

// WindowKey implements tablestate.WindowQuerier.
func (r windowedRuntime[K, V]) WindowKey(s string) ([]byte, error) {
	return queryKey(r.t.name, r.t.kc, s)
}

// QueryWindows implements tablestate.WindowQuerier.
func (r windowedRuntime[K, V]) QueryWindows(st *tablestate.State, p int32, key []byte, from, to time.Time, limit int) ([]tablestate.WindowRow, bool, error) {
	return r.t.queryWindows(st, p, key, from, to, limit)
}

func (t *Windowed[K, V]) state(ev Event) (*tablestate.State, error) {
	if t.err != nil {
		return nil, t.err
	}
	env := envOf(ev)
	if env == nil || env.States[t.name] == nil {
		return nil, fmt.Errorf("table %s: %w", t.name, ErrNotRunning)
	}
	return env.States[t.name], nil
}

// Update applies fn to the value of key in every window containing the
// event's time (EventTime option; default the record timestamp), bound to ev.
// old is the zero value for a window without a value yet. It returns how
// many windows it updated: 0 when the record is late for all of them
// (dropped, see Windowed). A failure (the event time's, the codecs', the
// write's, EmitOnClose's) fails the event, as Table.Put's does; use TryUpdate
// to handle the error instead.
func (t *Windowed[K, V]) Update(ev Event, key K, fn func(old V) V) int {
	n, err := t.TryUpdate(ev, key, fn)
	failOn(ev, err)
	return n
}

// TryUpdate is Update returning the error instead of failing the event.
func (t *Windowed[K, V]) TryUpdate(ev Event, key K, fn func(old V) V) (int, error) {
	et, err := t.eventTime(ev)
	if err != nil {
		return 0, fmt.Errorf("table %s: event time: %w", t.name, err)
	}
	return t.TryUpdateAt(ev, key, et, fn)
}

// UpdateAt is Update with the event time given explicitly.
func (t *Windowed[K, V]) UpdateAt(ev Event, key K, at time.Time, fn func(old V) V) int {
	n, err := t.TryUpdateAt(ev, key, at, fn)
	failOn(ev, err)
	return n
}

// TryUpdateAt is UpdateAt returning the error instead of failing the event.
func (t *Windowed[K, V]) TryUpdateAt(ev Event, key K, at time.Time, fn func(old V) V) (int, error) {
	if err := checkFailed(t.name, ev); err != nil {
		return 0, err
	}
	s, err := t.state(ev)
	if err != nil {
		return 0, err
	}
	if err := checkWrite(envOf(ev), t.name); err != nil {
		return 0, err
	}
	kb, err := t.kc.Encode(key)
	if err != nil {
		return 0, fmt.Errorf("table %s: encode key: %w", t.name, err)
	}
	wp, err := t.part(s, ev.Partition())
	if err != nil {
		return 0, err
	}
	n, closes, err := wp.update(t.spec(), s, ev, kb, at.UnixMilli(), func(old []byte, found bool) ([]byte, error) {
		var ov V
		if found {
			if ov, err = t.vc.Decode(old); err != nil {
				return nil, fmt.Errorf("table %s: decode value of %v: %w", t.name, key, err)
			}
		}
		b, err := t.vc.Encode(fn(ov))
		if err != nil {
			return nil, fmt.Errorf("table %s: encode value (key %v): %w", t.name, key, err)
		}
		return b, nil
	})
	// On an error the event fails and is redelivered; the windows it closed
	// close then (the watermark was not written), so OnClose runs once.
	if ferr := t.fire(ev, closes); err == nil {
		err = ferr
	}
	return n, err
}

// fire calls OnClose and EmitOnClose for each closed window, outside the
// partition's lock. It returns the first error of EmitOnClose's function
// (wrapped with the table and the window); the other windows are still
// handed to it.
func (t *Windowed[K, V]) fire(ev Event, closes []closedWindow) error {
	var first error
	for _, c := range closes {
		t.closed.Add(1)
		if t.onClose == nil && t.emitOnClose == nil {
			continue
		}
		k, err := t.kc.Decode(c.key)
		if err != nil {
			continue // the key was encoded by this codec; undecodable only with a changed codec
		}
		v, err := t.vc.Decode(c.value)
		if err != nil {
			continue
		}
		w := t.ws.window(c.start)
		if t.onClose != nil {
			t.onClose(k, w, v)
		}
		if t.emitOnClose != nil {
			if err := t.emitOnClose(ev, k, w, v); err != nil && first == nil {
				first = fmt.Errorf("table %s: emit window %s of %v: %w", t.name, w.Start.UTC().Format(time.RFC3339), k, err)
			}
		}
	}
	return first
}

// Current returns key's value in the latest window containing the event's
// time, that window, and whether it has a value.
func (t *Windowed[K, V]) Current(ev Event, key K) (V, Window, bool, error) {
	et, err := t.eventTime(ev)
	if err != nil {
		var zero V
		return zero, Window{}, false, fmt.Errorf("table %s: event time: %w", t.name, err)
	}
	return t.At(ev, key, et)
}

// Delta returns key's value in the latest window containing the event's time
// minus d (Faust's WindowSet.delta): Delta(ev, k, size) is the previous
// tumbling window.
func (t *Windowed[K, V]) Delta(ev Event, key K, d time.Duration) (V, Window, bool, error) {
	et, err := t.eventTime(ev)
	if err != nil {
		var zero V
		return zero, Window{}, false, fmt.Errorf("table %s: event time: %w", t.name, err)
	}
	return t.At(ev, key, et.Add(-d))
}

// At returns key's value in the latest window containing instant at (the
// only one for tumbling windows), that window, and whether it has a value
// (a window not yet written, or deleted by retention, has none). It reads the
// event's partition, including this worker's unacknowledged writes.
func (t *Windowed[K, V]) At(ev Event, key K, at time.Time) (V, Window, bool, error) {
	var zero V
	starts := t.ws.startsContaining(at.UnixMilli())
	w := t.ws.window(starts[len(starts)-1])
	s, err := t.state(ev)
	if err != nil {
		return zero, w, false, err
	}
	kb, err := t.kc.Encode(key)
	if err != nil {
		return zero, w, false, fmt.Errorf("table %s: encode key: %w", t.name, err)
	}
	v, ok, err := t.read(s, ev.Partition(), kb, starts[len(starts)-1])
	return v, w, ok, err
}

func (t *Windowed[K, V]) read(s *tablestate.State, p int32, kb []byte, start int64) (V, bool, error) {
	var zero V
	b, ok, err := s.Get(p, windowKey(kb, start))
	if err != nil || !ok {
		return zero, false, err
	}
	_, vb, err := decodeRow(b)
	if err != nil {
		return zero, false, fmt.Errorf("table %s: %w", t.name, err)
	}
	v, err := t.vc.Decode(vb)
	if err != nil {
		return zero, false, fmt.Errorf("table %s: decode value: %w", t.name, err)
	}
	return v, true, nil
}

// MaxRangeWindows bounds how many window starts one Range call may visit.
const MaxRangeWindows = 1 << 20

// Range lists key's windows whose start is in [from, to] that have a value,
// by ascending start (Kafka Streams' WindowStore.fetch(key, from, to)). It
// visits every window start in the interval (at most MaxRangeWindows, else an
// error) with a point read each.
func (t *Windowed[K, V]) Range(ev Event, key K, from, to time.Time) ([]WindowValue[V], error) {
	s, err := t.state(ev)
	if err != nil {
		return nil, err
	}
	kb, err := t.kc.Encode(key)
	if err != nil {
		return nil, fmt.Errorf("table %s: encode key: %w", t.name, err)
	}
	lo, hi, adv := t.ws.startAtOrAfter(from.UnixMilli()), to.UnixMilli(), t.ws.advance.Milliseconds()
	if hi >= lo && (hi-lo)/adv >= MaxRangeWindows {
		return nil, fmt.Errorf("table %s: range %v..%v spans more than %d windows", t.name, from, to, MaxRangeWindows)
	}
	var out []WindowValue[V]
	for st := lo; st <= hi; st += adv {
		v, ok, err := t.read(s, ev.Partition(), kb, st)
		if err != nil {
			return out, err
		}
		if ok {
			out = append(out, WindowValue[V]{Window: t.ws.window(st), Value: v})
		}
	}
	return out, nil
}

// StreamTime returns the stream time of the event's partition on this worker
// (zero time when no write happened since the partition's activation and none
// was restored).
func (t *Windowed[K, V]) StreamTime(ev Event) (time.Time, error) {
	s, err := t.state(ev)
	if err != nil {
		return time.Time{}, err
	}
	wp, err := t.part(s, ev.Partition())
	if err != nil {
		return time.Time{}, err
	}
	st, ok := wp.streamTime()
	if !ok {
		return time.Time{}, nil
	}
	return time.UnixMilli(st).UTC(), nil
}
