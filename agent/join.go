package agent

import "github.com/runnel-dev/runnel/table"

// Lookup declares that the agent reads tables by the key of its records (a
// stream-table join, with table.Table.Lookup): the App refuses to build when
// a partitioned table among them has another partition count than the
// agent's topic, since partition p of the topic would then read partition p
// of the table, where its keys are not. Global tables are held whole by
// every worker and need no check. The declaration also shows in describe.
func Lookup(tables ...table.Def) Option {
	return func(s *settings) { s.Lookups = append(s.Lookups, tables...) }
}
