package table

import (
	"encoding/json"
	"fmt"

	"github.com/runnel-dev/runnel/codec"
)

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

func queryKey[K any](name string, kc codec.Codec[K], s string) ([]byte, error) {
	var k K
	if p, ok := any(&k).(*string); ok {
		*p = s
	} else if err := json.Unmarshal([]byte(s), &k); err != nil {
		return nil, fmt.Errorf("table %s: key %q: %w", name, s, err)
	}
	b, err := kc.Encode(k)
	if err != nil {
		return nil, fmt.Errorf("table %s: encode key %q: %w", name, s, err)
	}
	return b, nil
}

// QueryKey implements Queryable.
func (t *Table[K, V]) QueryKey(s string) ([]byte, error) { return queryKey(t.name, t.kc, s) }

// QueryKey implements Queryable.
func (t *GlobalTable[K, V]) QueryKey(s string) ([]byte, error) { return queryKey(t.name, t.kc, s) }

// Lookup returns the value of an encoded key in partition p as this worker
// sees it (its own unacknowledged writes included); the caller checks that
// the worker is active for p. For interactive queries.
func (s *State) Lookup(p int32, key []byte) ([]byte, bool, error) {
	v, ok, err := s.get(p, key)
	if err != nil {
		return nil, false, fmt.Errorf("table %s[%d]: %w", s.name, p, err)
	}
	return v, ok, nil
}
