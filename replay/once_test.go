package replay

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// TestDedupSurvivesRestartAndExpires: a mark survives closing and reopening
// the store; it expires after the TTL (and is deleted on open); a failed
// effect leaves no mark; concurrent Once calls with one ID run it once.
func TestDedupSurvivesRestartAndExpires(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dedup")
	now := time.Now()
	clock := func() time.Time { return now }
	d, err := OpenDedup(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	d.Now = clock
	runs := 0
	fn := func() error { runs++; return nil }
	if ok, err := d.Once("e1", fn); !ok || err != nil {
		t.Fatalf("first Once: %v, %v", ok, err)
	}
	if ok, err := d.Once("e1", fn); ok || err != nil {
		t.Fatalf("second Once: %v, %v", ok, err)
	}
	boom := errors.New("smtp down")
	if ok, err := d.Once("e2", func() error { return boom }); ok || !errors.Is(err, boom) {
		t.Fatalf("failing Once: %v, %v", ok, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d, err = OpenDedup(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.Now = clock
	if seen, _ := d.Seen("e1"); !seen {
		t.Fatal("e1 not seen after reopening")
	}
	if seen, _ := d.Seen("e2"); seen {
		t.Fatal("e2 marked although its effect failed")
	}
	if ok, _ := d.Once("e1", fn); ok || runs != 1 {
		t.Fatalf("e1 applied again after a restart (runs %d)", runs)
	}
	now = now.Add(time.Hour)
	if seen, _ := d.Seen("e1"); seen {
		t.Fatal("e1 seen at its expiry")
	}
	if n, err := d.Expire(); n != 1 || err != nil {
		t.Fatalf("Expire: %d, %v; want 1", n, err)
	}
	var wg sync.WaitGroup
	var conc atomic.Int64
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := d.Once("e3", func() error { conc.Add(1); return nil }); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if conc.Load() != 1 {
		t.Fatalf("concurrent Once ran the effect %d times", conc.Load())
	}
}

func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSQLOnce (SQLite): the same event twice stores one row and reports
// (true) then (false); a failing effect stores neither the row nor the
// receipt, and is applied when retried; a violation of another constraint is
// an error, not a duplicate; a database that is gone is an error.
func TestSQLOnce(t *testing.T) { testSQLOnce(t, openSQLite(t)) }

// testSQLOnce is TestSQLOnce on any database; it closes db at the end.
func testSQLOnce(t *testing.T, db *sql.DB) {
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE audit (event_id TEXT NOT NULL, actor TEXT NOT NULL CHECK (actor <> ''))`); err != nil {
		t.Fatal(err)
	}
	once, err := NewSQLOnce(ctx, db, "audit_receipts")
	if err != nil {
		t.Fatal(err)
	}
	insert := func(id, actor string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO audit (event_id, actor) VALUES ($1, $2)`, id, actor)
			return err
		}
	}
	if ok, err := once.Apply(ctx, "evt-30", insert("evt-30", "a")); !ok || err != nil {
		t.Fatalf("first: %v, %v", ok, err)
	}
	if ok, err := once.Apply(ctx, "evt-30", insert("evt-30", "a")); ok || err != nil {
		t.Fatalf("second: %v, %v", ok, err)
	}
	if n := count(t, db, "audit"); n != 1 {
		t.Fatalf("%d audit rows, want 1", n)
	}
	boom := errors.New("validation failed")
	if ok, err := once.Apply(ctx, "evt-31", func(context.Context, *sql.Tx) error { return boom }); ok || !errors.Is(err, boom) {
		t.Fatalf("failing effect: %v, %v", ok, err)
	}
	if ok, err := once.Apply(ctx, "evt-32", insert("evt-32", "")); ok || err == nil {
		t.Fatalf("check constraint: %v, %v; want an error", ok, err)
	}
	if n := count(t, db, "audit_receipts"); n != 1 {
		t.Fatalf("%d receipts after two failures, want 1", n)
	}
	if ok, err := once.Apply(ctx, "evt-31", insert("evt-31", "b")); !ok || err != nil {
		t.Fatalf("retry: %v, %v", ok, err)
	}
	if n := count(t, db, "audit"); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
	if _, err := once.Apply(ctx, "", insert("", "a")); !errors.Is(err, ErrNoEventID) {
		t.Fatalf("empty id: %v", err)
	}
	_ = db.Close()
	if ok, err := once.Apply(ctx, "evt-33", insert("evt-33", "a")); ok || err == nil {
		t.Fatalf("closed database: %v, %v; want an error", ok, err)
	}
}
