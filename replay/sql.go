package replay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
)

// SQLOnce applies effects to a database once per event ID through a unique
// constraint: a receipts table whose primary key is the event ID. Each Apply
// is one transaction that inserts the receipt and runs the effect; a receipt
// already there (the event was applied before: a redelivery, a replay of a
// day already replayed) makes it a duplicate that changes nothing. The
// receipt commits with the effect, so there is no window in which one is
// durable without the other.
//
// Only the receipt's own conflict counts as a duplicate (INSERT … ON
// CONFLICT (event_id) DO NOTHING, which PostgreSQL ≥ 9.5 and SQLite ≥ 3.24
// accept). Any other error (a lost connection, another constraint, the
// effect's own) rolls back, and Apply returns it: the effect was not
// applied, and the agent must not let the record be committed.
type SQLOnce struct {
	db    *sql.DB
	table string
}

var sqlIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// NewSQLOnce returns the helper for db with the receipts table named table
// (a plain SQL identifier), creating the table if it does not exist:
// event_id TEXT PRIMARY KEY, applied_at TIMESTAMP.
func NewSQLOnce(ctx context.Context, db *sql.DB, table string) (*SQLOnce, error) {
	if !sqlIdent.MatchString(table) {
		return nil, fmt.Errorf("sql once: table name %q is not a plain identifier", table)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (event_id TEXT PRIMARY KEY, applied_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)`); err != nil {
		return nil, fmt.Errorf("sql once: create %s: %w", table, err)
	}
	return &SQLOnce{db: db, table: table}, nil
}

// ErrNoEventID is returned by Apply for an empty event ID.
var ErrNoEventID = errors.New("sql once: empty event ID")

// Apply runs effect in a transaction with the receipt of eventID. It returns
// (true, nil) when the effect was applied now, (false, nil) when the receipt
// already existed (effect not run), and (false, err) when anything failed
// (the transaction is rolled back: nothing of the effect or the receipt is
// stored). effect runs in the transaction and must use tx for its writes.
func (s *SQLOnce) Apply(ctx context.Context, eventID string, effect func(ctx context.Context, tx *sql.Tx) error) (applied bool, err error) {
	if eventID == "" {
		return false, ErrNoEventID
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("sql once %s: begin: %w", eventID, err)
	}
	defer func() {
		if !applied {
			_ = tx.Rollback()
		}
	}()
	res, err := tx.ExecContext(ctx, `INSERT INTO `+s.table+` (event_id) VALUES ($1) ON CONFLICT (event_id) DO NOTHING`, eventID)
	if err != nil {
		return false, fmt.Errorf("sql once %s: receipt: %w", eventID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sql once %s: receipt: %w", eventID, err)
	}
	if n == 0 {
		return false, nil // applied before
	}
	if err := effect(ctx, tx); err != nil {
		return false, fmt.Errorf("sql once %s: effect: %w", eventID, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("sql once %s: commit: %w", eventID, err)
	}
	return true, nil
}
