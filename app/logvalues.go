package app

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// topicParts is a log attribute's value for partitions by topic (an
// assignment's actives, standbys, warm-ups, pending; a session's claims).
// JSON logs get an object of arrays, as /api/assignment shows it,
// {"change-events":[0,2]}; text logs get one line, change-events[0 2]. A
// topic without partitions is left out of both.
type topicParts map[string][]int32

// MarshalJSON is the JSON handler's form: json.Marshal prefers it to
// MarshalText.
func (m topicParts) MarshalJSON() ([]byte, error) {
	out := make(map[string][]int32, len(m))
	for t, ps := range m {
		if len(ps) > 0 {
			out[t] = ps
		}
	}
	return json.Marshal(out) // keys sorted
}

// MarshalText is the text handler's form.
func (m topicParts) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m topicParts) String() string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		if len(m[k]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s%v ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}
