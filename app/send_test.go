package app_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/twmb/franz-go/pkg/kerr"
)

const sendParts = 4

type sendEvent struct {
	Actor string   `json:"actor"`
	Dirs  []string `json:"dirs"`
}

// sendSetup creates a topic of sendParts partitions and returns it with a
// client configured like `send`'s own (kafka.NewConfig); tune, if not nil,
// changes that configuration first.
func sendSetup(t *testing.T, tune func(*sarama.Config)) ([]string, string, sarama.Client) {
	t.Helper()
	brokers := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "send")
	cfg := kafka.NewConfig("send-test", testbroker.Version(t), kafka.TestTimeouts)
	if tune != nil {
		tune(cfg)
	}
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: sendParts, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	testbroker.WaitTopic(t, client, topic)
	// On Kafka a new topic's partitions answer only once their leaders are
	// elected: until then a produce or an offset lookup gets
	// NOT_LEADER_OR_FOLLOWER.
	for p := int32(0); p < sendParts; p++ {
		for i := 0; ; i++ {
			_ = client.RefreshMetadata(topic)
			if _, err := client.GetOffset(topic, p, sarama.OffsetNewest); err == nil {
				break
			} else if i > 100 {
				t.Fatalf("partition %d of %s never got a leader: %v", p, topic, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return brokers, topic, client
}

// topicValues reads every record of topic (to the highwaters) and returns the
// values, sorted.
func topicValues(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	client := testbroker.Client(t, brokers)
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	var out []string
	for p := int32(0); p < sendParts; p++ {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if hw == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		for m := range pc.Messages() {
			out = append(out, string(m.Value))
			if m.Offset+1 >= hw {
				break
			}
		}
		pc.Close()
	}
	slices.Sort(out)
	return out
}

// eventLines returns n JSONL lines {"actor":"a<i>","dirs":["d"]}, i from 1.
func eventLines(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf(`{"actor":"a%d","dirs":["d"]}`, i))
	}
	return out
}

func writeInput(t *testing.T, name string, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	data := []byte(strings.Join(lines, "\n") + "\n")
	if strings.HasSuffix(name, ".gz") {
		var b bytes.Buffer
		z := gzip.NewWriter(&b)
		z.Write(data)
		z.Close()
		data = b.Bytes()
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A file with bad lines 21 and 35 (one not JSON, one whose dirs the value
// codec rejects) sends nothing, and the error lists both lines. Before,
// lines 1-20 were produced and the error named line 21 only.
func TestSendValidatesWholeInputBeforeProducing(t *testing.T) {
	brokers, topic, client := sendSetup(t, nil)
	lines := eventLines(40)
	lines[20] = `{"actor":"a21","dirs":["d"]` // truncated object
	lines[34] = `{"actor":"a35","dirs":"d"}`  // dirs is not a list
	path := writeInput(t, "in.jsonl", lines)
	check := func(b []byte) error { _, err := codec.JSON[sendEvent]().Decode(b); return err }

	_, err := app.SendInput(context.Background(), app.WrapClient(client), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor", CheckValue: check})
	var ie *app.InputError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %v, want an *InputError", err)
	}
	if ie.Bad != 2 || len(ie.Lines) != 2 || ie.Lines[0].Line != 21 || ie.Lines[1].Line != 35 {
		t.Fatalf("bad lines = %d %+v, want lines 21 and 35", ie.Bad, ie.Lines)
	}
	if !strings.Contains(err.Error(), "nothing was sent") {
		t.Errorf("message %q does not say that nothing was sent", err)
	}
	if got := topicValues(t, brokers, topic); len(got) != 0 {
		t.Fatalf("topic holds %d records after a rejected input, want 0", len(got))
	}

	// The fixed file is sent whole, once.
	lines[20], lines[34] = `{"actor":"a21","dirs":["d"]}`, `{"actor":"a35","dirs":["d"]}`
	path = writeInput(t, "fixed.jsonl", lines)
	st, err := app.SendInput(context.Background(), app.WrapClient(client), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor", CheckValue: check})
	if err != nil || st.Records != 40 {
		t.Fatalf("send fixed file = %+v, %v; want 40 records", st, err)
	}
	want := slices.Sorted(slices.Values(lines))
	if got := topicValues(t, brokers, topic); !slices.Equal(got, want) {
		t.Fatalf("topic holds %d records, want the 40 lines once each", len(got))
	}
}

// A key the topic's key codec rejects makes its line bad before anything is
// produced: keys are decimal numbers here and line 7's is not. Before, the
// key was sent as it was and the agents dead-lettered the record.
func TestSendChecksKeyCodec(t *testing.T) {
	brokers, topic, client := sendSetup(t, nil)
	var lines []string
	for i := 1; i <= 10; i++ {
		lines = append(lines, fmt.Sprintf(`{"id":"%d","dirs":["d"]}`, i))
	}
	lines[6] = `{"id":"seven","dirs":["d"]}`
	path := writeInput(t, "keys.jsonl", lines)
	a := app.New("send-keys")
	tp := app.Topic(a, topic, codec.DecimalInt64(), codec.JSON[sendEvent]())
	_, err := app.SendInput(context.Background(), app.WrapClient(client), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "id",
		CheckKey: tp.CheckKey, CheckValue: tp.CheckValue})
	var ie *app.InputError
	if !errors.As(err, &ie) || ie.Bad != 1 || ie.Lines[0].Line != 7 {
		t.Fatalf("err = %v, want an *InputError for line 7 alone", err)
	}
	if !strings.Contains(err.Error(), "key codec") || !strings.Contains(err.Error(), `"id"`) {
		t.Errorf("message %q does not name the key field and its codec", err)
	}
	if got := topicValues(t, brokers, topic); len(got) != 0 {
		t.Fatalf("topic holds %d records after a rejected input, want 0", len(got))
	}
	lines[6] = `{"id":"7","dirs":["d"]}`
	path = writeInput(t, "keys-fixed.jsonl", lines)
	if st, err := app.SendInput(context.Background(), app.WrapClient(client), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "id",
		CheckKey: tp.CheckKey, CheckValue: tp.CheckValue}); err != nil || st.Records != 10 {
		t.Fatalf("send fixed file = %+v, %v; want 10 records", st, err)
	}
}

// A truncated .gz input is reported as truncated, naming the file, and sends
// nothing. Before, the partial last line was reported as a JSON error at some
// line, after the lines before it had been produced.
func TestSendTruncatedGzip(t *testing.T) {
	brokers, topic, client := sendSetup(t, nil)
	path := writeInput(t, "in.jsonl.gz", eventLines(2000))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}

	_, err = app.SendInput(context.Background(), app.WrapClient(client), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor"})
	if !errors.Is(err, app.ErrTruncatedInput) {
		t.Fatalf("err = %v, want ErrTruncatedInput", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, path) || strings.Contains(msg, "JSON") || !strings.Contains(msg, "nothing was sent") {
		t.Fatalf("message %q should name the file, say it is truncated and that nothing was sent, and not blame JSON", msg)
	}
	if got := topicValues(t, brokers, topic); len(got) != 0 {
		t.Fatalf("topic holds %d records after a truncated input, want 0", len(got))
	}

	// SendLines, which reads its input once, stops at the truncation too (not
	// at a JSON error) and says how much it sent.
	in, err := app.OpenInput(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	st, err := app.SendLines(context.Background(), app.WrapClient(client), topic, sendParts, "actor", in, nil)
	if !errors.Is(err, app.ErrTruncatedInput) || strings.Contains(err.Error(), "JSON") {
		t.Fatalf("SendLines err = %v, want ErrTruncatedInput", err)
	}
	if want := fmt.Sprintf("%d records sent before it", st.Records); !strings.Contains(err.Error(), want) {
		t.Fatalf("SendLines message %q does not say %q", err, want)
	}
	if got := topicValues(t, brokers, topic); int64(len(got)) != st.Records || st.Records == 0 {
		t.Fatalf("topic holds %d records, SendLines reported %d", len(got), st.Records)
	}
}

// A record the producer cannot deliver (line 21 is larger than the producer's
// MaxMessageBytes, as a broker's max.message.bytes would refuse it) stops the
// send; the error says how many records were sent and that line 21 is where
// to resume; resuming there with a producer that accepts the record leaves
// every line in the topic, and only the lines the error named as already
// sent twice.
func TestSendProduceFailureSaysWhereToResume(t *testing.T) {
	brokers, topic, small := sendSetup(t, func(c *sarama.Config) { c.Producer.MaxMessageBytes = 2000 })
	lines := eventLines(60)
	lines[20] = fmt.Sprintf(`{"actor":"a21","dirs":["%s"]}`, strings.Repeat("x", 4000))
	path := writeInput(t, "in.jsonl", lines)

	_, err := app.SendInput(context.Background(), app.WrapClient(small), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor"})
	var se *app.SendError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *SendError", err)
	}
	if se.ResumeLine != 21 {
		t.Fatalf("resume line = %d, want 21 (%v)", se.ResumeLine, err)
	}
	if !errors.Is(err, kerr.MessageTooLarge) || !strings.Contains(err.Error(), "line 21: produce") {
		t.Errorf("err = %v, want the producer's error for line 21 inside", err)
	}
	if want := fmt.Sprintf("%d records were sent", se.Sent); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--from-line 21") {
		t.Errorf("message %q should say %q and --from-line 21", err, want)
	}
	got := topicValues(t, brokers, topic)
	var twice []string // the lines after 21 already sent
	for _, l := range se.AckedAfter {
		if l <= 21 {
			t.Fatalf("acked-after line %d is not after the resume line", l)
		}
		twice = append(twice, lines[l-1])
	}
	want := slices.Sorted(slices.Values(append(slices.Clone(lines[:20]), twice...)))
	if !slices.Equal(got, want) || se.Sent != int64(len(want)) {
		t.Fatalf("topic holds %d records, error says %d sent; want lines 1-20 and %v", len(got), se.Sent, se.AckedAfter)
	}

	// Resume from line 21 with a producer that takes the large record.
	normal := newClientFor(t, brokers)
	st, err := app.SendInput(context.Background(), app.WrapClient(normal), path, app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor", FromLine: se.ResumeLine})
	if err != nil || st.Records != 40 {
		t.Fatalf("resume = %+v, %v; want 40 records (lines 21-60)", st, err)
	}
	want = slices.Sorted(slices.Values(append(slices.Clone(lines), twice...))) // every line, the named lines twice
	if got := topicValues(t, brokers, topic); !slices.Equal(got, want) {
		t.Fatalf("after resume the topic holds %d records, want %d (every line once, %d named lines twice)", len(got), len(want), len(se.AckedAfter))
	}
}

// newClientFor returns a client configured like `send`'s.
func newClientFor(t *testing.T, brokers []string) sarama.Client {
	t.Helper()
	client, err := sarama.NewClient(brokers, kafka.NewConfig("send-test", testbroker.Version(t), kafka.TestTimeouts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// Standard input is validated whole too (it is spooled while it is read),
// then sent from the spool.
func TestSendStdin(t *testing.T) {
	brokers, topic, client := sendSetup(t, nil)
	stdin := func(lines []string) {
		f, err := os.Open(writeInput(t, "stdin.jsonl", lines))
		if err != nil {
			t.Fatal(err)
		}
		old := os.Stdin
		os.Stdin = f
		t.Cleanup(func() { os.Stdin = old; f.Close() })
	}
	lines := eventLines(30)
	lines[29] = `{"dirs":["d"]}` // no key field
	stdin(lines)
	_, err := app.SendInput(context.Background(), app.WrapClient(client), "-", app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor"})
	var ie *app.InputError
	if !errors.As(err, &ie) || ie.Bad != 1 || ie.Lines[0].Line != 30 {
		t.Fatalf("err = %v, want an InputError for line 30", err)
	}
	if got := topicValues(t, brokers, topic); len(got) != 0 {
		t.Fatalf("topic holds %d records, want 0", len(got))
	}
	lines[29] = `{"actor":"a30","dirs":["d"]}`
	stdin(lines)
	if st, err := app.SendInput(context.Background(), app.WrapClient(client), "-", app.SendOptions{Topic: topic, Partitions: sendParts, KeyField: "actor"}); err != nil || st.Records != 30 {
		t.Fatalf("send stdin = %+v, %v; want 30 records", st, err)
	}
	if got := topicValues(t, brokers, topic); !slices.Equal(got, slices.Sorted(slices.Values(lines))) {
		t.Fatalf("topic holds %d records, want the 30 lines once each", len(got))
	}
}
