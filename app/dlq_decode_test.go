package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

type reading struct {
	N int64 `json:"n"`
}

// TestDeadLetterDecode dead-letters three records of an agent over a topic
// keyed by decimal numbers with JSON values: one its body rejects (it
// decodes), one whose value is not JSON and one whose key is not a number
// (the stream rejects both while decoding). `dlq tail --json` shows each
// key and value decoded by the agent's codecs, or raw with the codec's
// error; --raw shows them all raw. Before, key and value were base64.
// `dlq replay` then refuses, before sending anything, because two of them
// would be dead-lettered again; --dry-run says which; --force sends all
// three back. Before, the replay sent them and the agent dead-lettered them
// again.
func TestDeadLetterDecode(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "dlqdec")
	a := app.New(id, app.WithLogger(testLogger()), app.WithTopicPrefix(id+"-"),
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime))
	readings := app.Topic(a, "readings", codec.DecimalInt64(), codec.JSON[reading](), app.Partitions(parts))
	agent.New(a, "check", readings, func(ctx context.Context, s *agent.Stream[int64, reading]) error {
		for ev := range s.Events() {
			if ev.Value.N < 0 {
				ev.Reject(errors.New("negative reading"))
			}
		}
		return s.Err()
	}, agent.OnError(agent.DeadLetter))
	w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	stop := testbroker.Start(t, w)
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), readings.Name())
	send(t, brokers, readings.Name(), kv{"1", `{"n":1}`}, kv{"2", `{"n":-2}`}, kv{"3", `not json`}, kv{"x", `{"n":4}`})
	testbroker.WaitLag0(t, brokers, id, readings.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if w.DeadLettered() != 3 {
		t.Fatalf("dead-lettered %d, want 3", w.DeadLettered())
	}

	type shown struct {
		Reason      string          `json:"reason"`
		Key         json.RawMessage `json:"key"`
		KeyFormat   string          `json:"key_format"`
		KeyError    string          `json:"key_error"`
		Value       json.RawMessage `json:"value"`
		ValueFormat string          `json:"value_format"`
		ValueError  string          `json:"value_error"`
	}
	tail := func(args ...string) map[string]shown {
		out := runCLI(t, a, brokers, append([]string{"dlq", "tail", "check", "--json"}, args...)...)
		byKey := map[string]shown{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var s shown
			if err := json.Unmarshal([]byte(line), &s); err != nil {
				t.Fatalf("dlq tail --json line %q: %v", line, err)
			}
			byKey[string(s.Key)] = s
		}
		if len(byKey) != 3 {
			t.Fatalf("dlq tail --json printed %d dead letters, want 3:\n%s", len(byKey), out)
		}
		return byKey
	}
	decoded := tail()
	if s := decoded["2"]; s.KeyFormat != "decoded" || string(s.Value) != `{"n":-2}` || s.ValueFormat != "decoded" || s.KeyError+s.ValueError != "" {
		t.Errorf("rejected by the body: %+v, want key 2 and value {\"n\":-2} decoded", s)
	}
	if s := decoded["3"]; string(s.Value) != `"not json"` || s.ValueFormat != "text" || !strings.Contains(s.ValueError, "value codec json") {
		t.Errorf("value not JSON: %+v, want the value as text with the codec's error", s)
	}
	if s := decoded[`"x"`]; s.KeyFormat != "text" || !strings.Contains(s.KeyError, "key codec") || s.ValueFormat != "decoded" {
		t.Errorf("key not a number: %+v, want the key as text with the codec's error", s)
	}
	raw := tail("--raw")
	if s := raw[`"2"`]; s.KeyFormat != "text" || string(s.Value) != `"{\"n\":-2}"` || s.ValueFormat != "text" || s.ValueError != "" {
		t.Errorf("--raw: %+v, want key and value as text", s)
	}

	text := runCLI(t, a, brokers, "dlq", "tail", "check")
	if n := strings.Count(text, "decode: fails: "); n != 2 {
		t.Errorf("dlq tail marks %d dead letters as failing the decode, want 2:\n%s", n, text)
	}

	before := total(t, testbroker.Client(t, brokers), readings.Name())
	cmd := a.Command()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"dlq", "replay", "check", "--brokers", strings.Join(brokers, ",")})
	err = cmd.ExecuteContext(context.Background())
	var ue *app.UndecodableError
	if !errors.As(err, &ue) || ue.Undecodable != 2 || ue.Of != 3 {
		t.Fatalf("replay: %v, want an UndecodableError for 2 of 3", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "nothing was sent: 2 of the 3 dead letters") || !strings.Contains(msg, "--force") {
		t.Errorf("replay error:\n%s", msg)
	}
	if after := total(t, testbroker.Client(t, brokers), readings.Name()); after != before {
		t.Fatalf("a refused replay produced %d records", after-before)
	}
	dry := runCLI(t, a, brokers, "dlq", "replay", "check", "--dry-run")
	if strings.Count(dry, "decode=ok") != 1 || strings.Count(dry, "decode=FAILS (dead-lettered again): ") != 2 {
		t.Errorf("dry run:\n%s", dry)
	}
	runCLI(t, a, brokers, "dlq", "replay", "check", "--force")
	if after := total(t, testbroker.Client(t, brokers), readings.Name()); after != before+3 {
		t.Errorf("replay --force produced %d records, want 3", after-before)
	}
}
