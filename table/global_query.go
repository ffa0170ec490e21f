package table

import (
	"encoding/json"
	"fmt"

	"github.com/runnel-dev/runnel/codec"
)

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

// QueryKey encodes the key named by s: s itself for a string key, else s
// parsed as JSON into the key type, encoded with the key codec (for
// GET /api/tables/{table}/{key} on a worker).
func (t *Table[K, V]) QueryKey(s string) ([]byte, error) { return queryKey(t.name, t.kc, s) }

// QueryKey encodes the key named by s: s itself for a string key, else s
// parsed as JSON into the key type, encoded with the key codec (for
// GET /api/tables/{table}/{key} on a worker).
func (t *GlobalTable[K, V]) QueryKey(s string) ([]byte, error) { return queryKey(t.name, t.kc, s) }
