package app

import (
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
)

// Hooks for tables with per-partition runtime state or changelog configs
// (table.Windowed): the worker calls them from the table-partition lifecycle
// (worker.go) and when it creates the changelog topics.

// changelogConfig returns the extra changelog topic configs of the named
// table (nil for plain tables).
func (w *Worker) changelogConfig(name string) map[string]string {
	for _, d := range w.app.tables {
		if c, ok := d.(tablestate.ChangelogConfigurer); ok && d.Name() == name {
			return c.ChangelogConfig()
		}
	}
	return nil
}

// activatePartition lets the table rebuild its runtime of partition p from
// the restored store, before the partition becomes writable.
func (w *Worker) activatePartition(t *tableRuntime, p int32) error {
	a, ok := tablestate.RuntimeOf(t.def).(tablestate.PartitionActivator)
	if !ok {
		return nil
	}
	if err := a.ActivatePartition(t.state, p); err != nil {
		return fmt.Errorf("activate %s[%d]: %w", t.def.Name(), p, err)
	}
	return nil
}

// deactivatePartition drops the table's runtime of partition p once it is no
// longer active on this worker.
func (w *Worker) deactivatePartition(t *tableRuntime, p int32) {
	if a, ok := tablestate.RuntimeOf(t.def).(tablestate.PartitionActivator); ok {
		a.DeactivatePartition(t.state, p)
	}
}
