package task

import (
	"context"
	"fmt"
)

// Punctuate runs fn between two cycles of the task (holding the cycle token,
// as Cycle does): everything fn writes to the table caches belongs to one
// cycle, the next one, and is committed all-or-nothing with the records of
// that cycle. Timers (agent.Every) run through it. A cycle that comes due
// meanwhile waits for fn. It returns ErrStopped (wrapping the cause) without
// calling fn when the task was abandoned, ctx's error when ctx ended before
// the token was free, and otherwise fn's error; the caller decides whether
// fn's error abandons the task (it must when fn may have written a cache).
func (t *Task) Punctuate(ctx context.Context, fn func() error) error {
	if err := t.lock(ctx); err != nil {
		return fmt.Errorf("waiting for the cycle in progress: %w", err)
	}
	defer t.unlock()
	if err := t.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrStopped, err)
	}
	return fn()
}
