package table

import (
	"errors"
	"fmt"
)

// Range calls fn for every key of the event's partition of the table and
// its value, as Get would read them (the partition's writes not yet
// committed included), in no particular order, until fn returns false.
// Timers use it to emit or expire a partition's state. Keys written while
// Range runs may or may not be seen. Errors: ErrNotRunning, the store's, a
// stored key or value that does not decode.
func (t *Table[K, V]) Range(ev Event, fn func(key K, value V) bool) error {
	s, err := t.current(ev)
	if err != nil {
		return err
	}
	p := ev.Partition()
	type unappliedWrite struct {
		value   []byte
		deleted bool
	}
	unapplied := map[string]unappliedWrite{}
	s.EachUnapplied(p, func(k string, v []byte, deleted bool) { unapplied[k] = unappliedWrite{value: v, deleted: deleted} })
	stop := errors.New("stop")
	visit := func(kb, vb []byte) error {
		k, err := t.kc.Decode(kb)
		if err != nil {
			return fmt.Errorf("table %s[%d]: decode key: %w", t.name, p, err)
		}
		v, err := t.vc.Decode(vb)
		if err != nil {
			return fmt.Errorf("table %s[%d]: decode value of %v: %w", t.name, p, k, err)
		}
		if !fn(k, v) {
			return stop
		}
		return nil
	}
	err = s.Store().Iterate(p, func(kb, vb []byte) error {
		if _, ok := unapplied[string(kb)]; ok {
			return nil
		}
		return visit(kb, vb)
	})
	if errors.Is(err, stop) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("table %s[%d]: %w", t.name, p, err)
	}
	for k, it := range unapplied {
		if it.deleted {
			continue
		}
		if err := visit([]byte(k), it.value); errors.Is(err, stop) {
			return nil
		} else if err != nil {
			return err
		}
	}
	return nil
}
