package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

type customer struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

type order struct {
	Customer string          `json:"customer"`
	Amount   int64           `json:"amount"`
	At       json.RawMessage `json:"at"`
}

// orderSum is a customer's order total and the timestamp of the latest
// order record (its Kafka timestamp, which --timestamp-field sets).
type orderSum struct {
	Total int64  `json:"total"`
	Last  string `json:"last"`
}

// newJoinApp declares a table-table join fed by two topics: customers
// (keyed by id) fill the names table, orders (keyed by customer) the totals
// table and a daily windowed count by the record timestamp; profiles is the
// inner join of names and totals.
func newJoinApp(t *testing.T, id string, opts ...app.Option) *app.App {
	t.Helper()
	opts = append([]app.Option{app.WithLogger(testLogger())}, opts...)
	a := app.New(id, opts...)
	customers := app.Topic(a, "customers", codec.String(), codec.JSON[customer](), app.Partitions(4))
	orders := app.Topic(a, "orders", codec.String(), codec.JSON[order](), app.Partitions(4))
	names := table.New(a, "names", codec.String(), codec.String())
	totals := table.New(a, "totals", codec.String(), codec.JSON[orderSum]())
	daily := table.NewWindowed(a, "daily-orders", codec.String(), codec.DecimalInt64(), table.Tumbling(24*time.Hour),
		table.Grace(72*time.Hour), table.Retention(30*24*time.Hour))
	table.Join(a, "profiles", table.InnerJoin, names, totals, codec.String(),
		func(n table.Side[string], s table.Side[orderSum]) string {
			return fmt.Sprintf("%s: %d, last order %s", n.Value, s.Value.Total, s.Value.Last)
		})
	agent.New(a, "customers", customers, func(ctx context.Context, s *agent.Stream[string, customer]) error {
		for ev := range s.Events() {
			names.Put(ev, ev.Key, ev.Value.Name)
		}
		return s.Err()
	}, agent.WritesTo(names))
	agent.New(a, "orders", orders, func(ctx context.Context, s *agent.Stream[string, order]) error {
		for ev := range s.Events() {
			at := ev.Timestamp().UTC().Format(time.RFC3339Nano)
			if _, err := totals.TryUpdate(ev, ev.Key, func(o orderSum) orderSum {
				o.Total += ev.Value.Amount
				if at > o.Last {
					o.Last = at
				}
				return o
			}); err != nil {
				return err
			}
			daily.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(totals, daily))
	return a
}

var (
	customerLines = []string{
		`{"id":"c1","name":"Ada"}`,
		`{"id":"c2","name":"Bob"}`,
		`{"id":"c3","name":"Cy"}`, // no orders: not in the inner join
	}
	orderLines = []string{
		`{"customer":"c1","amount":5,"at":"2024-05-01T10:00:00Z"}`,
		`{"customer":"c1","amount":7,"at":1714640400000}`,                 // 2024-05-02T09:00:00Z
		`{"customer":"c2","amount":3,"at":"2024-05-01T23:59:59.5+02:00"}`, // 21:59:59.5 UTC
		`{"customer":"c4","amount":1,"at":"2024-05-03T00:00:00Z"}`,        // no customer
	}
)

// TestDevJoinFromTwoInputs drives a join app from the command line: two
// --input TOPIC=FILE, a key field and a timestamp field per topic. The
// joined table holds each customer's name, order total and the time of the
// latest order as its record timestamp (taken from the "at" field, RFC 3339
// or epoch milliseconds), and the windowed table counts orders per day of
// that time. Before, dev took one input topic and stamped every record with
// the time it was loaded.
func TestDevJoinFromTwoInputs(t *testing.T) {
	a := newJoinApp(t, "dev-join")
	cust := writeInput(t, "customers.jsonl", customerLines)
	ords := writeInput(t, "orders.jsonl.gz", orderLines)
	cmd := a.Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"dev", "--input", "customers=" + cust, "--input", "orders=" + ords,
		"--key-field", "customers=id", "--key-field", "orders=customer", "--timestamp-field", "orders=at",
		"--dump", "all", "--json"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("dev: %v\n%s", err, errOut.String())
	}
	var tables map[string]map[string]any
	if err := json.Unmarshal(out.Bytes(), &tables); err != nil {
		t.Fatalf("dev --dump all --json: %v\n%s", err, out.String())
	}
	wantProfiles := map[string]any{
		"c1": "Ada: 12, last order 2024-05-02T09:00:00Z",
		"c2": "Bob: 3, last order 2024-05-01T21:59:59.5Z",
	}
	if got := tables["profiles"]; fmt.Sprint(got) != fmt.Sprint(wantProfiles) {
		t.Errorf("profiles = %v, want %v", got, wantProfiles)
	}
	for _, k := range []string{"c1@2024-05-01T00:00:00Z", "c1@2024-05-02T00:00:00Z", "c2@2024-05-01T00:00:00Z", "c4@2024-05-03T00:00:00Z"} {
		if v := tables["daily-orders"][k]; v != float64(1) {
			t.Errorf("daily-orders[%s] = %v, want 1 (table: %v)", k, v, tables["daily-orders"])
		}
	}
	if n := len(tables["names"]); n != 3 {
		t.Errorf("names holds %d keys, want 3: %v", n, tables["names"])
	}
}

// A timestamp field that is missing or holds neither an RFC 3339 string nor
// epoch milliseconds makes its line bad: the error names every such line of
// every input, and dev loads nothing.
func TestDevTimestampFieldErrors(t *testing.T) {
	a := newJoinApp(t, "dev-join-bad")
	cust := writeInput(t, "customers.jsonl", customerLines)
	lines := append([]string(nil), orderLines...)
	lines[1] = `{"customer":"c1","amount":7}`
	lines[2] = `{"customer":"c2","amount":3,"at":"yesterday"}`
	lines = append(lines, `{"customer":"c2","amount":3,"at":1.5}`, `{"customer":"c2","amount":3,"at":-5}`)
	ords := writeInput(t, "orders.jsonl", lines)
	cmd := a.Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"dev", "--input", "customers=" + cust, "--input", "orders=" + ords,
		"--key-field", "customers=id", "--key-field", "orders=customer", "--timestamp-field", "orders=at"})
	err := cmd.ExecuteContext(context.Background())
	if err == nil {
		t.Fatalf("dev accepted bad timestamps:\n%s", out.String())
	}
	msg := err.Error()
	for _, want := range []string{
		"nothing was sent: 4 bad lines",
		`line 2: timestamp field "at" is missing`,
		`line 3: timestamp field "at": "yesterday" is not an RFC 3339 time`,
		`line 5: timestamp field "at": 1.5 is not a whole number of milliseconds`,
		`line 6: timestamp field "at": -5 is before 1970`,
		"none of the 2 inputs was sent",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not say %q:\n%s", want, msg)
		}
	}
	if strings.Contains(errOut.String(), "input loaded") {
		t.Errorf("an input was loaded:\n%s", errOut.String())
	}
}

// TestSendTwoInputsWithTimestamps sends two files to two topics in one
// `send`: each record gets its key field and the timestamp of its "at"
// field. The input flags' errors name the flag and value.
func TestSendTwoInputsWithTimestamps(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "sendjoin")
	a := newJoinApp(t, id, app.WithTopicPrefix(id+"-"))
	cust := writeInput(t, "customers.jsonl", customerLines)
	ords := writeInput(t, "orders.jsonl", orderLines)
	// The orders carry timestamps of 2024: on real Kafka a topic with the
	// default time retention (checked every second in scripts/kafka)
	// deletes them before the test reads them back.
	for _, topic := range []string{id + "-customers", id + "-orders"} {
		testbroker.CreateTopic(t, brokers, topic, 4, map[string]string{"retention.ms": "-1"})
	}
	cmd := a.Command()
	var errOut bytes.Buffer
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&errOut)
	// The topics are named as declared (customers) or in full (<id>-orders).
	cmd.SetArgs([]string{"send", "--input", "customers=" + cust, "--input", id + "-orders=" + ords,
		"--key-field", "customers=id", "--key-field", "orders=customer", "--timestamp-field", "orders=at",
		"--brokers", strings.Join(brokers, ",")})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("send: %v\n%s", err, errOut.String())
	}
	if want := "sent 3 records to " + id + "-customers\nsent 4 records to " + id + "-orders\n"; errOut.String() != want {
		t.Errorf("send printed %q, want %q", errOut.String(), want)
	}
	client := testbroker.Client(t, brokers)
	var recs []*sarama.ConsumerMessage
	for _, ms := range readAll(t, client, id+"-orders") {
		recs = append(recs, ms...)
	}
	want := map[string]time.Time{
		"c1/5": time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC),
		"c1/7": time.Date(2024, 5, 2, 9, 0, 0, 0, time.UTC),
		"c2/3": time.Date(2024, 5, 1, 21, 59, 59, 5e8, time.UTC),
		"c4/1": time.Date(2024, 5, 3, 0, 0, 0, 0, time.UTC),
	}
	if len(recs) != len(want) {
		t.Fatalf("orders holds %d records, want %d", len(recs), len(want))
	}
	for _, m := range recs {
		var o order
		if err := json.Unmarshal(m.Value, &o); err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("%s/%d", m.Key, o.Amount)
		if ts, ok := want[k]; !ok || !m.Timestamp.Equal(ts) {
			t.Errorf("record %s has timestamp %s, want %s", k, m.Timestamp.UTC(), ts)
		}
	}
	var keys []string
	for _, ms := range readAll(t, client, id+"-customers") {
		for _, m := range ms {
			keys = append(keys, string(m.Key))
		}
	}
	if slices.Sort(keys); !slices.Equal(keys, []string{"c1", "c2", "c3"}) {
		t.Errorf("customers are keyed %q, want c1 c2 c3", keys)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--input", "nosuch=" + ords}, `"nosuch" is not a declared topic`},
		{[]string{"--input", ords}, "no topic to send it to"},
		{[]string{"--input", "orders=" + ords, "--key-field", "customers=id"}, "--key-field customers=id: no --input goes to topic " + id + "-customers"},
		{[]string{"--input", "orders=" + ords, "--input", "customers=" + cust, "--key-field", "id", "--key-field", "customer"}, "two fields for every input"},
		{[]string{"--input", "orders=" + ords, "--input", "customers=" + cust, "--from-line", "2"}, "--from-line resumes one input"},
		{[]string{"--input", "orders=-", "--input", "customers=" + cust}, "standard input can be the only input"},
	} {
		cmd := a.Command()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(append(append([]string{"send"}, c.args...), "--brokers", strings.Join(brokers, ",")))
		err := cmd.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("send %v: err %v, want %q", c.args, err, c.want)
		}
	}
}

// The single-input form still works: a bare --input FILE goes to the
// DevInput topic of the command line, keyed by its key field; a bare
// --timestamp-field applies to it.
func TestDevSingleInputWithDevInput(t *testing.T) {
	a := newJoinApp(t, "dev-single")
	cmd := a.Command(app.DevInput("orders", "customer"))
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"dev", "--input", writeInput(t, "orders.jsonl", orderLines), "--timestamp-field", "at", "--dump", "totals", "--json"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("dev: %v\n%s", err, errOut.String())
	}
	want := `{"c1":{"total":12,"last":"2024-05-02T09:00:00Z"},"c2":{"total":3,"last":"2024-05-01T21:59:59.5Z"},"c4":{"total":1,"last":"2024-05-03T00:00:00Z"}}`
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("totals = %s, want %s", got, want)
	}
}
