package app_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// runCLIErr runs the app's command line with args and returns its error
// and stderr.
func runCLIErr(t *testing.T, ctx context.Context, a *app.App, args ...string) (string, error) {
	t.Helper()
	return runCLIOptsErr(t, ctx, a, nil, args...)
}

// runCLIOptsErr is runCLIErr with the command line's options.
func runCLIOptsErr(t *testing.T, ctx context.Context, a *app.App, opts []app.CLIOption, args ...string) (string, error) {
	t.Helper()
	cmd := a.Command(opts...)
	var errOut bytes.Buffer
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return errOut.String(), err
}

// `tables dump` of an app no worker has run yet: its changelog topic does
// not exist, and the error says to start a worker instead of printing
// Kafka's UNKNOWN_TOPIC_OR_PARTITION alone.
func TestTablesDumpBeforeAnyWorker(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "nodump")
	a := app.New(id, app.WithLogger(testLogger()))
	table.New(a, "counts", codec.String(), codec.DecimalInt64())
	_, err := runCLIErr(t, context.Background(), a, "tables", "dump", "counts", "--brokers", strings.Join(brokers, ","))
	if err == nil || !strings.Contains(err.Error(), "changelog topic "+id+"-counts-changelog does not exist yet: start a worker first") {
		t.Fatalf("tables dump before any worker: %v", err)
	}
}

// A listener that accepts connections and never answers: the command fails
// with "no Kafka answered at ADDR within N s" when the connect deadline
// passes (15 s by default; 1 s here through the command's context).
func TestSilentBrokerSaysNoKafkaAnswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	a := app.New("silent", app.WithLogger(testLogger()))
	table.New(a, "counts", codec.String(), codec.DecimalInt64())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err = runCLIErr(t, ctx, a, "tables", "dump", "counts", "--brokers", ln.Addr().String())
	if want := "no Kafka answered at " + ln.Addr().String() + " within 1 s"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to say %q", err, want)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s", took)
	}
}

// An app ID with '.' or '_' warns once that its topics can collide with
// Kafka's metric names; '-' does not.
func TestAppIDDotUnderscoreWarns(t *testing.T) {
	for _, c := range []struct {
		id   string
		warn bool
	}{{"orders.v2", true}, {"orders_v2", true}, {"orders-v2", false}} {
		var logs bytes.Buffer
		a := app.New(c.id, app.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		table.New(a, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(4))
		for range 2 {
			if _, err := a.Topology(); err != nil {
				t.Fatal(err)
			}
		}
		n := strings.Count(logs.String(), "level=WARN")
		if want := map[bool]int{true: 1, false: 0}[c.warn]; n != want || (c.warn && !strings.Contains(logs.String(), "collide")) {
			t.Errorf("app ID %s: %d warnings, want %d:\n%s", c.id, n, want, logs.String())
		}
	}
}

// The usage lines name the binary, as the user typed it, not the app ID.
func TestUsageShowsBinaryName(t *testing.T) {
	a := app.New("usage-app", app.WithLogger(testLogger()))
	bin := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	cmd := a.Command()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"dev", "--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Usage:\n  "+bin+" dev [flags]") {
		t.Errorf("dev --help does not show %q:\n%s", bin+" dev [flags]", out.String())
	}
}

// One record, one key: singular nouns in dev's summary and table headings
// and in send's report.
func TestOneRecordIsSingular(t *testing.T) {
	a := newJoinApp(t, "one-record")
	var out bytes.Buffer
	if err := a.Dev(context.Background(), app.DevOptions{Input: writeInput(t, "one.jsonl", orderLines[:1]), InputTopic: "orders", KeyField: "customer",
		Out: &out, DataDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"processed 1 record, ", "totals (1 key)\n", "names (0 keys)\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dev output lacks %q:\n%s", want, out.String())
		}
	}
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "one")
	b := newJoinApp(t, id, app.WithTopicPrefix(id+"-"))
	stderr, err := runCLIOptsErr(t, context.Background(), b, []app.CLIOption{app.DevInput("orders", "customer")},
		"send", writeInput(t, "one.jsonl", orderLines[:1]), "--brokers", strings.Join(brokers, ","))
	if err != nil || stderr != "sent 1 record to "+id+"-orders\n" {
		t.Errorf("send one line: %v, %q", err, stderr)
	}
}
