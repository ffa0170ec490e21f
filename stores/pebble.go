package stores

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Key layout of a Pebble store (one Pebble instance per table per worker):
//
//	'd' | partition (uint32, big-endian) | user key   -> value
//	'o' | partition (uint32, big-endian)              -> applied offset (int64, big-endian)
//	'm' | partition (uint32, big-endian) | mark name  -> mark offset (int64, big-endian)
//
// The fixed-width big-endian partition makes every partition's data one
// contiguous key range ['d'|p, 'd'|p+1) that sorts by partition, whatever the
// user keys are: a user key that is a prefix of another, or partitions 255 and
// 256, can never interleave. Offsets and marks live under their own prefixes
// so that iterating a partition's data never meets them.
const (
	dataPrefix   byte = 'd'
	markPrefix   byte = 'm'
	offsetPrefix byte = 'o'
	// prefixLen is the length of 'd'|partition, 'm'|partition and 'o'|partition.
	prefixLen = 5
)

// Defaults of PebbleOptions.
const (
	// DefaultPebbleCacheSize is the block cache of a store opened without a
	// shared Cache: 8 MiB (Pebble's own default).
	DefaultPebbleCacheSize int64 = 8 << 20
	// DefaultPebbleMemTableSize is the size of one memtable: 16 MiB. Pebble keeps
	// at most MemTableStopWritesThreshold (2) full memtables before stalling
	// writes, so the write buffer of a store is bounded by 32 MiB plus the one
	// being filled. Larger than Pebble's 4 MiB default because restore writes
	// batches of thousands of records and small memtables flush (and stall)
	// often; see docs/stores.md for the measured effect.
	DefaultPebbleMemTableSize uint64 = 16 << 20
)

// PebbleOptions tune a Pebble store. The zero value gives the documented
// defaults.
type PebbleOptions struct {
	// Cache is a block cache shared by all the stores of a process (create it
	// with pebble.NewCache(bytes)). Pebble takes its own reference on open and
	// releases it on Close, so the creator may call Cache.Unref once every
	// store is open. Nil gives the store a private cache of CacheSize bytes.
	Cache *pebble.Cache
	// CacheSize is the private block cache in bytes when Cache is nil; default
	// DefaultPebbleCacheSize (8 MiB).
	CacheSize int64
	// MemTableSize is the size of one memtable in bytes; default
	// DefaultPebbleMemTableSize (16 MiB). Write memory is bounded by about
	// three memtables per store.
	MemTableSize uint64
	// Logger receives Pebble's log lines; default drops informational lines
	// (flushes, compactions) and sends errors to the standard log package.
	// Its Fatalf is never called: the store turns Pebble's fatal errors into
	// ErrFailed (see Pebble).
	Logger pebble.Logger
	// FS is the filesystem Pebble uses; default the operating system's
	// (vfs.Default). Tests inject faults with pebble's vfs/errorfs.
	FS vfs.FS
	// MinFreeBytes is the free space, in bytes, the store keeps on its
	// filesystem: an Apply that finds less free (plus its batch) fails the
	// store with an error wrapping ErrFailed and syscall.ENOSPC before
	// Pebble writes anything. Pebble meeting a full disk in its commit path
	// panics (a failed write-ahead log rotation) and can leave its commit
	// pipeline locked or crash the process (seen on a full tmpfs); failing
	// first keeps the database closable and the process alive. Default:
	// twice MemTableSize (a memtable flush writes up to a memtable of
	// tables while the log still holds it); negative: no check.
	MinFreeBytes int64
}

// Pebble is a Store on one Pebble database at a directory. Each partition's
// data, applied changelog offset and marks are written by Apply in one pebble.Batch,
// so after any crash the data of a partition is exactly the data of the
// batches up to its stored offset (docs/design.md §6; this fixes Goka's
// separate offset write).
//
// Apply commits with pebble.NoSync: the write-ahead log keeps batches in
// order, so a crash loses a suffix of batches and never splits one; Sync and
// Close fsync the log. It is safe for concurrent use.
type Pebble struct {
	db  *pebble.DB
	dir string

	// mu guards closed and active; idle is signalled when active drops to 0
	// after closed is set. Every method except Close runs between enter and
	// leave, and Close waits for active == 0 before closing the database,
	// because Pebble forbids Close concurrent with any other call. This is a
	// counter rather than an RWMutex so that an Iterate callback may call the
	// store again without deadlocking against a waiting Close.
	mu     sync.Mutex
	idle   *sync.Cond
	closed bool
	active int
	// failed is the first fatal error Pebble raised (see fail); once set,
	// guarded by mu, it never changes and every method returns it.
	failed error
	// failedCh is closed when failed is set.
	failedCh chan struct{}
	// fs and minFree serve the free-space check of Apply (MinFreeBytes;
	// minFree 0: no check). Read-only after OpenPebble.
	fs      vfs.FS
	minFree uint64
}

var _ Store = (*Pebble)(nil)

// OpenPebble opens (creating if needed) the Pebble store at dir. Errors from
// Pebble are wrapped with dir; a directory locked by another open store gives
// a *LockedError (errors.Is ErrLocked) naming the process that holds it, not a
// second instance.
func OpenPebble(dir string, opts PebbleOptions) (*Pebble, error) {
	po := &pebble.Options{
		Cache:              opts.Cache,
		CacheSize:          opts.CacheSize,
		MemTableSize:       opts.MemTableSize,
		Logger:             opts.Logger,
		FormatMajorVersion: pebble.FormatNewest,
	}
	if po.Cache == nil && po.CacheSize <= 0 {
		po.CacheSize = DefaultPebbleCacheSize
	}
	if po.MemTableSize == 0 {
		po.MemTableSize = DefaultPebbleMemTableSize
	}
	if po.Logger == nil {
		po.Logger = quietLogger{}
	}
	if opts.FS != nil {
		po.FS = opts.FS
	}
	p := &Pebble{dir: dir, fs: vfs.Default}
	if opts.FS != nil {
		p.fs = opts.FS
	}
	switch {
	case opts.MinFreeBytes > 0:
		p.minFree = uint64(opts.MinFreeBytes)
	case opts.MinFreeBytes == 0:
		p.minFree = 2 * po.MemTableSize
	}
	p.idle = sync.NewCond(&p.mu)
	logger := po.Logger
	po.Logger = fatalLogger{Logger: logger, p: p}
	po.EventListener = &pebble.EventListener{
		// Pebble's default calls Fatalf, from a compaction goroutine too.
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			p.fail(fmt.Errorf("on-disk corruption in %s: %w", info.Path, info.Details))
		},
		// A flush or compaction that cannot write is retried by Pebble, but
		// with a full or failing disk every write after it fails as well.
		BackgroundError: func(err error) {
			logger.Errorf("background error: %v", err)
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO) {
				p.fail(fmt.Errorf("background write: %w", err))
			}
		},
	}
	p.failedCh = make(chan struct{})
	opened := make(chan openResult, 1)
	go func() {
		db, err := openPebble(dir, po)
		opened <- openResult{db, err}
	}()
	var r openResult
	select {
	case r = <-opened:
	case <-p.failedCh:
		// A fatal error while opening: Pebble may wait for ever (Open waits
		// for the flush of the replayed log, which a full disk fails again
		// and again). Give it failedCloseWait, then leave it behind.
		select {
		case r = <-opened:
		case <-time.After(failedCloseWait):
			abandon(dir, p.Err())
			go func() { // close it if Pebble ever finishes opening
				if r := <-opened; r.db != nil {
					p.db = r.db
					_ = p.closeFailed()
				}
			}()
			return nil, fmt.Errorf("open pebble store %s: %w", dir, p.Err())
		}
	}
	db, err := r.db, r.err
	if err != nil {
		if le := lockedError(dir, err); le != nil {
			if f := abandonedFailure(dir); le.Self && f != nil {
				return nil, fmt.Errorf("open pebble store %s: it failed earlier in this process and Pebble could not release it; restart the process to recover it: %w", dir, f)
			}
			return nil, le
		}
		return nil, fmt.Errorf("open pebble store %s: %w", dir, err)
	}
	p.db = db
	if err := p.Err(); err != nil { // raised while Pebble opened (replay, compaction)
		p.closed = true
		return nil, errors.Join(fmt.Errorf("open pebble store %s: %w", dir, err), p.closeFailed())
	}
	return p, nil
}

type openResult struct {
	db  *pebble.DB
	err error
}

// openPebble is pebble.Open with its panics (a corrupt or unwritable store)
// returned as errors.
func openPebble(dir string, po *pebble.Options) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
	}()
	return pebble.Open(dir, po)
}

// Dir returns the directory the store was opened at.
func (p *Pebble) Dir() string { return p.dir }

// enter registers a running call, or returns the store's failure or
// ErrClosed.
func (p *Pebble) enter() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil {
		return p.failed
	}
	if p.closed {
		return ErrClosed
	}
	p.active++
	return nil
}

// enter2 returns what enter would, without registering a call.
func (p *Pebble) enter2() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil {
		return p.failed
	}
	if p.closed {
		return ErrClosed
	}
	return nil
}

// callUser calls an Iterate callback; a panic in it is wrapped in userPanic
// so that leave passes it on instead of failing the store.
func callUser(fn func(key, value []byte) error, k, v []byte) error {
	defer func() {
		if r := recover(); r != nil {
			panic(userPanic{r})
		}
	}()
	return fn(k, v)
}

// leave ends a call registered by enter. Deferred by every method, it also
// turns a panic raised by Pebble during the call (a failed WAL write panics
// in the committing goroutine; fatalLogger panics with a fatalPanic) into the
// store's failure: *err is set to it, and every later call returns it.
func (p *Pebble) leave(err *error) {
	r := recover()
	p.mu.Lock()
	defer p.mu.Unlock()
	if r != nil {
		if up, ok := r.(userPanic); ok {
			p.leaveLocked()
			panic(up.v) // from an Iterate callback, not from Pebble
		}
		p.failLocked(panicError(r))
		*err = p.failed
	}
	p.leaveLocked()
}

func (p *Pebble) leaveLocked() {
	p.active--
	if p.active == 0 && p.closed {
		p.idle.Broadcast()
	}
}

// ErrFailed is returned (wrapped, with Pebble's error) by every method of a
// Pebble store once Pebble raised a fatal error: a write to the write-ahead
// log or the MANIFEST failed (ENOSPC, EIO) or corruption was found. Pebble
// cannot continue after those (its commit pipeline is left broken), so the
// store stays failed; Close releases what it can. Reopening the directory,
// once the cause is fixed, recovers every batch Pebble acknowledged before
// the failure up to the last Sync (and in practice all of them).
var ErrFailed = errors.New("stores: store failed")

// fail records the store's failure; the first one wins.
func (p *Pebble) fail(err error) {
	p.mu.Lock()
	p.failLocked(err)
	p.mu.Unlock()
}

// failLocked records the store's failure; the first one wins. Requires mu.
func (p *Pebble) failLocked(err error) {
	if p.failed == nil {
		p.failed = fmt.Errorf("%w: %s: %w", ErrFailed, p.dir, err)
		close(p.failedCh)
	}
}

// Err returns the failure that closed the store for good (see ErrFailed), or
// nil.
func (p *Pebble) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// fatalPanic carries a fatal error from fatalLogger to the store method that
// recovers it.
type fatalPanic struct{ err error }

// userPanic carries a panic of an Iterate callback through leave unchanged.
type userPanic struct{ v any }

// panicError turns a recovered panic value into an error.
func panicError(r any) error {
	switch v := r.(type) {
	case fatalPanic:
		return v.err
	case error:
		return fmt.Errorf("pebble panicked: %w", v)
	}
	return fmt.Errorf("pebble panicked: %v", r)
}

// fatalLogger is the Logger the store gives Pebble. Pebble calls Fatalf where
// it cannot go on (a failed MANIFEST or commit write, corruption) and expects
// it not to return. Fatalf marks the store failed, then, when the call comes
// from a goroutine running a store method, panics with a fatalPanic that the
// method recovers into its error. In Pebble's background goroutines (flushes,
// compactions), which run no store method, Fatalf returns: ending or blocking
// such a goroutine leaves Pebble waiting for it forever (measured: Open hangs
// in scanObsoleteFiles), while at every Fatalf site Pebble's code goes on to
// return the error it logged. The store refuses every later call either way.
type fatalLogger struct {
	pebble.Logger
	p *Pebble
}

func (l fatalLogger) Fatalf(format string, args ...any) {
	err := newFatalError(format, args)
	l.Logger.Errorf("%v (the store is closed)", err)
	l.p.fail(err)
	if inStoreMethod() {
		panic(fatalPanic{err})
	}
}

// fatalError is the message of a Fatalf call; it unwraps to the errors among
// the call's arguments (Pebble formats them with %v or %s), so that
// errors.Is(err, syscall.ENOSPC) holds.
type fatalError struct {
	msg  string
	errs []error
}

func newFatalError(format string, args []any) *fatalError {
	if !strings.HasPrefix(format, "pebble") {
		format = "pebble: " + format
	}
	e := &fatalError{msg: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if err, ok := a.(error); ok {
			e.errs = append(e.errs, err)
		}
	}
	return e
}

func (e *fatalError) Error() string   { return e.msg }
func (e *fatalError) Unwrap() []error { return e.errs }

// inStoreMethod reports whether the calling goroutine runs a method of this
// package (a store method or OpenPebble); it reads the goroutine's stack, so
// it is for the fatal path only.
func inStoreMethod() bool {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, false)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// Two frames are Fatalf's and inStoreMethod's own.
	return bytes.Count(buf, []byte("github.com/runnel-dev/runnel/stores.")) > 2
}

// Get implements Store.
func (p *Pebble) Get(partition int32, key []byte) (_ []byte, _ bool, err error) {
	if err := checkPartition(partition); err != nil {
		return nil, false, fmt.Errorf("get [%d]: %w", partition, err)
	}
	if err := p.enter(); err != nil {
		return nil, false, err
	}
	defer p.leave(&err)
	k := dataKey(make([]byte, 0, prefixLen+len(key)), partition, key)
	v, closer, err := p.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get [%d] in %s: %w", partition, p.dir, err)
	}
	out := append([]byte{}, v...)
	if err := closer.Close(); err != nil {
		return nil, false, fmt.Errorf("get [%d] in %s: %w", partition, p.dir, err)
	}
	return out, true, nil
}

// Apply implements Store: the ops and the offset key go into one pebble.Batch
// committed with pebble.NoSync.
func (p *Pebble) Apply(partition int32, b *Batch) (err error) {
	if err := checkBatch(partition, b); err != nil {
		return err
	}
	if b.empty() {
		// Still report ErrClosed on a closed store.
		return p.enter2()
	}
	if err := p.enter(); err != nil {
		return err
	}
	defer p.leave(&err)

	// Size the batch up front: per op the batch holds a kind byte, two varint
	// lengths (at most 5 bytes each here), the prefixed key and the value.
	size, maxKey := 12+prefixLen+8, 0
	for _, op := range b.Ops {
		size += 11 + prefixLen + len(op.Key) + len(op.Value)
		maxKey = max(maxKey, len(op.Key))
	}
	for _, mk := range b.Marks {
		size += 11 + prefixLen + len(mk.Key) + 8
		maxKey = max(maxKey, len(mk.Key))
	}
	if err := p.checkFree(size); err != nil {
		return err
	}
	pb := p.db.NewBatchWithSize(size)
	defer pb.Close()
	// Batch.Set and Batch.Delete copy key and value, so one key buffer serves.
	kbuf := make([]byte, 0, prefixLen+maxKey)
	for _, op := range b.Ops {
		kbuf = dataKey(kbuf[:0], partition, op.Key)
		var err error
		if op.Delete {
			err = pb.Delete(kbuf, nil)
		} else {
			err = pb.Set(kbuf, op.Value, nil)
		}
		if err != nil {
			return fmt.Errorf("apply [%d] in %s: %w", partition, p.dir, err)
		}
	}
	if b.Offset != NoOffset {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(b.Offset))
		if err := pb.Set(offsetKey(partition), v[:], nil); err != nil {
			return fmt.Errorf("apply [%d] offset %d in %s: %w", partition, b.Offset, p.dir, err)
		}
	}
	for _, mk := range b.Marks {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(mk.Offset))
		kbuf = markKey(kbuf[:0], partition, mk.Key)
		if err := pb.Set(kbuf, v[:], nil); err != nil {
			return fmt.Errorf("apply [%d] mark %q in %s: %w", partition, mk.Key, p.dir, err)
		}
	}
	if err := pb.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("apply [%d] in %s: %w", partition, p.dir, err)
	}
	return nil
}

// checkFree fails the store when its filesystem has less than minFree plus
// size bytes free (MinFreeBytes). A filesystem that cannot tell (an
// in-memory one) is not checked.
func (p *Pebble) checkFree(size int) error {
	if p.minFree == 0 {
		return nil
	}
	du, err := p.fs.GetDiskUsage(p.dir)
	if err != nil || du.AvailBytes >= p.minFree+uint64(size) {
		return nil
	}
	p.fail(fmt.Errorf("%d bytes free on the filesystem, below the %d the store keeps (MinFreeBytes) plus a %d-byte batch: %w",
		du.AvailBytes, p.minFree, size, syscall.ENOSPC))
	return p.Err()
}

// Offset implements Store.
func (p *Pebble) Offset(partition int32) (_ int64, err error) {
	if err := checkPartition(partition); err != nil {
		return NoOffset, fmt.Errorf("offset [%d]: %w", partition, err)
	}
	if err := p.enter(); err != nil {
		return NoOffset, err
	}
	defer p.leave(&err)
	v, closer, err := p.db.Get(offsetKey(partition))
	if errors.Is(err, pebble.ErrNotFound) {
		return NoOffset, nil
	}
	if err != nil {
		return NoOffset, fmt.Errorf("offset [%d] in %s: %w", partition, p.dir, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return NoOffset, fmt.Errorf("offset [%d] in %s: stored value has %d bytes, want 8", partition, p.dir, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// Marks implements Store with one iterator over the partition's mark range.
func (p *Pebble) Marks(partition int32) (_ map[string]int64, err error) {
	if err := checkPartition(partition); err != nil {
		return nil, fmt.Errorf("marks [%d]: %w", partition, err)
	}
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave(&err)
	lo, hi := partitionBounds(markPrefix, partition)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, fmt.Errorf("marks [%d] in %s: %w", partition, p.dir, err)
	}
	out := make(map[string]int64)
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil && len(v) != 8 {
			err = fmt.Errorf("mark %q has %d bytes, want 8", it.Key()[prefixLen:], len(v))
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("marks [%d] in %s: %w", partition, p.dir, err), it.Close())
		}
		out[string(it.Key()[prefixLen:])] = int64(binary.BigEndian.Uint64(v))
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("marks [%d] in %s: %w", partition, p.dir, err)
	}
	return out, nil
}

// Iterate implements Store over a Pebble iterator bounded to the partition's
// data range; the iterator reads the snapshot current when it is created.
func (p *Pebble) Iterate(partition int32, fn func(key, value []byte) error) (err error) {
	return p.IterateFrom(partition, nil, fn)
}

// IterateFrom implements Seeker: the iterator's lower bound is start within
// the partition, so Pebble seeks to it.
func (p *Pebble) IterateFrom(partition int32, start []byte, fn func(key, value []byte) error) (err error) {
	if err := checkPartition(partition); err != nil {
		return fmt.Errorf("iterate [%d]: %w", partition, err)
	}
	if err := p.enter(); err != nil {
		return err
	}
	defer p.leave(&err)
	lo, hi := partitionBounds(dataPrefix, partition)
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: append(lo, start...), UpperBound: hi})
	if err != nil {
		return fmt.Errorf("iterate [%d] in %s: %w", partition, p.dir, err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return errors.Join(fmt.Errorf("iterate [%d] in %s: %w", partition, p.dir, err), it.Close())
		}
		k := append([]byte{}, it.Key()[prefixLen:]...)
		if err := callUser(fn, k, append([]byte{}, v...)); err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("iterate [%d] in %s: %w", partition, p.dir, err)
	}
	return nil
}

// Partitions implements Store. It seeks from one partition to the next
// ('d'|p+1, then 'm'|p+1 and 'o'|p+1), so it costs a seek per partition, not a
// scan of the data.
func (p *Pebble) Partitions() (_ []int32, err error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave(&err)
	seen := make(map[int32]bool)
	for _, prefix := range []byte{dataPrefix, markPrefix, offsetPrefix} {
		it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
		if err != nil {
			return nil, fmt.Errorf("partitions in %s: %w", p.dir, err)
		}
		for valid := it.First(); valid; {
			k := it.Key()
			if len(k) < prefixLen {
				_ = it.Close()
				return nil, fmt.Errorf("partitions in %s: malformed key %q", p.dir, k)
			}
			id := binary.BigEndian.Uint32(k[1:prefixLen])
			if id > math.MaxInt32 {
				_ = it.Close()
				return nil, fmt.Errorf("partitions in %s: malformed key %q", p.dir, k)
			}
			seen[int32(id)] = true
			var next [prefixLen]byte
			next[0] = prefix
			binary.BigEndian.PutUint32(next[1:], id+1)
			valid = it.SeekGE(next[:])
		}
		if err := it.Close(); err != nil {
			return nil, fmt.Errorf("partitions in %s: %w", p.dir, err)
		}
	}
	out := make([]int32, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// DropPartition implements Store with one batch holding range deletes of the
// partition's data and marks and a delete of its offset key, so a crash leaves
// either the whole partition or none of it.
func (p *Pebble) DropPartition(partition int32) (err error) {
	if err := checkPartition(partition); err != nil {
		return fmt.Errorf("drop [%d]: %w", partition, err)
	}
	if err := p.enter(); err != nil {
		return err
	}
	defer p.leave(&err)
	lo, hi := partitionBounds(dataPrefix, partition)
	pb := p.db.NewBatch()
	defer pb.Close()
	if err := pb.DeleteRange(lo, hi, nil); err != nil {
		return fmt.Errorf("drop [%d] in %s: %w", partition, p.dir, err)
	}
	mlo, mhi := partitionBounds(markPrefix, partition)
	if err := pb.DeleteRange(mlo, mhi, nil); err != nil {
		return fmt.Errorf("drop [%d] in %s: %w", partition, p.dir, err)
	}
	if err := pb.Delete(offsetKey(partition), nil); err != nil {
		return fmt.Errorf("drop [%d] in %s: %w", partition, p.dir, err)
	}
	if err := pb.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("drop [%d] in %s: %w", partition, p.dir, err)
	}
	return nil
}

// Sync implements Store: it fsyncs Pebble's write-ahead log, which holds every
// batch committed before the call.
func (p *Pebble) Sync() (err error) {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.leave(&err)
	return p.sync()
}

func (p *Pebble) sync() error {
	// An empty LogData record committed with Sync waits for the WAL fsync that
	// covers every earlier commit (the commit pipeline is ordered).
	if err := p.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("sync %s: %w", p.dir, err)
	}
	return nil
}

// Close implements Store: it waits for running calls, fsyncs the log and
// closes the database. Errors of both steps are returned together. A failed
// store (ErrFailed) returns its failure; it closes the database only as far as
// Pebble lets it within failedCloseWait, since Pebble's state after a fatal
// error is undefined (a lock may be held forever).
func (p *Pebble) Close() (err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	for p.active > 0 {
		p.idle.Wait()
	}
	failed := p.failed
	p.mu.Unlock()
	if failed != nil {
		return errors.Join(failed, p.closeFailed())
	}
	defer func() {
		if r := recover(); r != nil {
			p.mu.Lock()
			p.failLocked(panicError(r))
			err = p.failed
			p.mu.Unlock()
		}
	}()
	err = errors.Join(p.sync(), wrapErr("close "+p.dir, p.db.Close()))
	if f := p.Err(); f != nil { // a fatal error raised during the close
		return f
	}
	return err
}

// failedCloseWait bounds how long Close waits for Pebble to close a failed
// store.
const failedCloseWait = 5 * time.Second

// closeFailed closes the database of a failed store, recovering Pebble's
// panics, and gives up after failedCloseWait (the goroutine is left behind).
func (p *Pebble) closeFailed() error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- nil // the failure is already reported
			}
		}()
		_ = p.db.Close()
		done <- nil
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(failedCloseWait):
		abandon(p.dir, p.Err())
		return fmt.Errorf("close %s: pebble did not close within %v after its failure (a panic left its commit pipeline locked); its files and lock stay held until the process exits", p.dir, failedCloseWait)
	}
}

// abandoned maps the directories of failed stores whose Pebble could not be
// closed to their failure: reopening one in this process is impossible (the
// lock is held by the abandoned instance), and OpenPebble says why.
var abandoned struct {
	sync.Mutex
	dirs map[string]error
}

func abandon(dir string, failure error) {
	abandoned.Lock()
	defer abandoned.Unlock()
	if abandoned.dirs == nil {
		abandoned.dirs = map[string]error{}
	}
	abandoned.dirs[absDir(dir)] = failure
}

// abandonedFailure returns the failure of an abandoned store at dir, or nil.
func abandonedFailure(dir string) error {
	abandoned.Lock()
	defer abandoned.Unlock()
	return abandoned.dirs[absDir(dir)]
}

func absDir(dir string) string {
	if a, err := filepath.Abs(dir); err == nil {
		return a
	}
	return filepath.Clean(dir)
}

func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}

// dataKey appends 'd'|partition|key to dst.
func dataKey(dst []byte, partition int32, key []byte) []byte {
	dst = append(dst, dataPrefix)
	dst = binary.BigEndian.AppendUint32(dst, uint32(partition))
	return append(dst, key...)
}

// markKey appends 'm'|partition|name to dst.
func markKey(dst []byte, partition int32, name string) []byte {
	dst = append(dst, markPrefix)
	dst = binary.BigEndian.AppendUint32(dst, uint32(partition))
	return append(dst, name...)
}

// offsetKey returns 'o'|partition.
func offsetKey(partition int32) []byte {
	k := make([]byte, prefixLen)
	k[0] = offsetPrefix
	binary.BigEndian.PutUint32(k[1:], uint32(partition))
	return k
}

// partitionBounds returns [prefix|partition, prefix|partition+1), the key
// range of one partition under prefix. partition >= 0, so partition+1 fits in
// a uint32.
func partitionBounds(prefix byte, partition int32) (lo, hi []byte) {
	lo = make([]byte, prefixLen)
	hi = make([]byte, prefixLen)
	lo[0], hi[0] = prefix, prefix
	binary.BigEndian.PutUint32(lo[1:], uint32(partition))
	binary.BigEndian.PutUint32(hi[1:], uint32(partition)+1)
	return lo, hi
}

// quietLogger drops Pebble's informational lines and forwards errors to the
// standard logger. Its Fatalf is never reached: fatalLogger wraps it.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	log.Printf("pebble: "+format, args...)
}
func (quietLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}
