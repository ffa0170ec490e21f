package tablestate

// The interfaces below describe a table to the runtime (describe, plan,
// interactive queries, topic creation); the table types of package table
// implement them with methods that only report the declaration.

// Queryable is a table whose keys can be named in a URL
// (GET /api/tables/{table}/{key} on a worker). Table and GlobalTable
// implement it.
type Queryable interface {
	Def
	// QueryKey encodes the key named by s: s itself for a string key, else s
	// parsed as JSON into the key type (42, "a b", {"x":1}) and encoded with the
	// key codec. The error wraps the parse or encode failure.
	QueryKey(s string) ([]byte, error)
}

// ChangelogConfigurer is implemented by table definitions whose changelog
// topic needs configs beyond changelog.Spec's (windowed tables: compact,delete
// with a retention); the worker passes them when it creates the topic.
type ChangelogConfigurer interface {
	ChangelogConfig() map[string]string
}

// JoinDef is implemented by joined tables (Join): the App checks that the
// three tables are co-partitioned.
type JoinDef interface {
	Def
	JoinOf() (kind string, left, right string)
}
