package app

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// Text logs keep partitions by topic on one readable line; JSON logs get an
// object of arrays. A topic without partitions is left out of both.
func TestTopicPartsLogForms(t *testing.T) {
	m := topicParts{"b": {1, 3}, "a": {0}, "empty": nil}
	for _, c := range []struct {
		handler func(*bytes.Buffer) slog.Handler
		want    string
	}{
		{func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) }, `actives="a[0] b[1 3]" standbys=""`},
		{func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) }, `"actives":{"a":[0],"b":[1,3]},"standbys":{}`},
	} {
		var b bytes.Buffer
		slog.New(c.handler(&b)).Info("assignment", "actives", m, "standbys", topicParts(nil))
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("got %s\nwant it to contain %s", b.String(), c.want)
		}
	}
}
