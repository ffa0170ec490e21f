package replay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Dedup is a table of applied event IDs with a time to live, in a Pebble
// store of its own (one directory, usually under the app's data directory).
// It makes an effect that is not idempotent by itself (an e-mail, an HTTP
// call) apply once per event ID however often the event is delivered within
// the TTL: a redelivery after a crash, a replay of a range already applied,
// a restart of the replay.
//
// Why a local Pebble store and not a compacted topic: a replay runs in one
// process with the partitions assigned to it by the plan (no group
// rebalances move them), so the store is where the next run of the same
// replay looks; each write is synced, so a mark survives a crash of the
// process. A worker whose partitions move between machines needs the marks
// to move with them: declare a table keyed by event ID there (a table is a
// Pebble store backed by a compacted changelog, restored on the new owner),
// or use SQLOnce, whose receipts live in the database the effect writes.
//
// The window: Once marks an ID after its effect returned, so a crash between
// the two applies the effect again on the next delivery. Only an effect that
// commits its receipt with its own write (SQLOnce) closes it.
type Dedup struct {
	db  *pebble.DB
	ttl time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time

	locks sync.Map // event ID → *sync.Mutex: one Once at a time per ID
}

// dedupPrefix prefixes every key: "e/" + event ID → expiry (unix ns, big endian).
const dedupPrefix = "e/"

// OpenDedup opens (creating if needed) the dedup store in dir with the given
// TTL (> 0). Expired IDs are deleted when it opens and by Expire.
func OpenDedup(dir string, ttl time.Duration) (*Dedup, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("dedup %s: ttl %s must be positive", dir, ttl)
	}
	db, err := openPebble(dir)
	if err != nil {
		return nil, fmt.Errorf("dedup: open %s: %w", dir, err)
	}
	d := &Dedup{db: db, ttl: ttl, Now: time.Now}
	if _, err := d.Expire(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return d, nil
}

// Seen reports whether id was marked and has not expired.
func (d *Dedup) Seen(id string) (bool, error) {
	v, closer, err := d.db.Get([]byte(dedupPrefix + id))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dedup: get %s: %w", id, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return false, fmt.Errorf("dedup: value of %s: %d bytes, want 8", id, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)) > d.Now().UnixNano(), nil
}

// Mark records id as applied now, until now + TTL (a synced write).
func (d *Dedup) Mark(id string) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(d.Now().Add(d.ttl).UnixNano()))
	if err := d.db.Set([]byte(dedupPrefix+id), v[:], pebble.Sync); err != nil {
		return fmt.Errorf("dedup: mark %s: %w", id, err)
	}
	return nil
}

// Once runs fn unless id is marked and unexpired, and marks id after fn
// returned nil. It reports whether fn ran and succeeded (applied); a
// duplicate is (false, nil). fn's error is returned as is, and id stays
// unmarked. Concurrent calls with the same id run fn at most once.
func (d *Dedup) Once(id string, fn func() error) (applied bool, err error) {
	mu, _ := d.locks.LoadOrStore(id, &sync.Mutex{})
	m := mu.(*sync.Mutex)
	m.Lock()
	defer func() {
		m.Unlock()
		d.locks.Delete(id)
	}()
	seen, err := d.Seen(id)
	if err != nil || seen {
		return false, err
	}
	if err := fn(); err != nil {
		return false, err
	}
	return true, d.Mark(id)
}

// Expire deletes the expired IDs and returns how many it deleted.
func (d *Dedup) Expire() (int, error) {
	it, err := d.db.NewIter(&pebble.IterOptions{LowerBound: []byte(dedupPrefix), UpperBound: []byte("e0")})
	if err != nil {
		return 0, fmt.Errorf("dedup: expire: %w", err)
	}
	now := d.Now().UnixNano()
	b := d.db.NewBatch()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		v := it.Value()
		if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) <= now {
			if err := b.Delete(append([]byte(nil), it.Key()...), nil); err != nil {
				_ = it.Close()
				return 0, fmt.Errorf("dedup: expire: %w", err)
			}
			n++
		}
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("dedup: expire: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return 0, fmt.Errorf("dedup: expire: %w", err)
	}
	return n, nil
}

// Close closes the store.
func (d *Dedup) Close() error { return d.db.Close() }

// openPebble is pebble.Open with its panics (a corrupt or unwritable store)
// returned as errors.
func openPebble(dir string) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pebble panicked: %v", r)
		}
	}()
	return pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
}

// quietLogger drops Pebble's informational lines and logs its errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	slog.Error("dedup store: " + fmt.Sprintf(format, args...))
}
func (quietLogger) Fatalf(format string, args ...any) {
	// Pebble calls Fatalf on unrecoverable corruption and expects it not to
	// return; openPebble turns the panic into an error.
	panic(fmt.Sprintf("dedup store: "+format, args...))
}
