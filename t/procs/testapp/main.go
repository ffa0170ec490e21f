// Command testapp is the worker process of the multi-process assignment test
// (t/procs): one topic, one table, one counting agent. It runs one worker and
// prints a JSON line on stdout whenever its assignment or what it runs
// changes (including its restore counts). Environment: RUNNEL_BROKERS, PROCS_APP (app ID), PROCS_TOPIC
// (topic name), PROCS_DIR (data dir), PROCS_EAGER=1 for the eager protocol,
// PROCS_INSTANCE for static membership (app.WithInstanceID), PROCS_FILL=1 for
// a second table holding each key's last value, PROCS_HTTP for the worker's
// HTTP address (table queries; none by default).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
)

// Line is one report of the worker's state.
type Line struct {
	Generation int32              `json:"generation"`
	Member     string             `json:"member"`
	Actives    map[string][]int32 `json:"actives"`
	Standbys   map[string][]int32 `json:"standbys"`
	Pending    map[string][]int32 `json:"pending"`
	Claims     map[string][]int32 `json:"claims"`
	Followed   map[string][]int32 `json:"followed"`
	Ready      bool               `json:"ready"`
	// Restored is how many changelog records the worker's active restores
	// applied; RestoredSpan the changelog offsets they advanced over.
	Restored     int64 `json:"restored"`
	RestoredSpan int64 `json:"restored_span"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := []app.Option{
		app.WithBrokers(strings.Split(os.Getenv("RUNNEL_BROKERS"), ",")...),
		app.WithDataDir(os.Getenv("PROCS_DIR")),
		app.WithReplicas(1),
		app.WithGroupTimeouts(3*time.Second, 100*time.Millisecond, 5*time.Second, 100*time.Millisecond),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))),
	}
	if addr := os.Getenv("PROCS_HTTP"); addr != "" {
		opts = append(opts, app.WithHTTPAddr(addr))
	}
	if id := os.Getenv("PROCS_INSTANCE"); id != "" {
		opts = append(opts, app.WithInstanceID(id))
	}
	if os.Getenv("PROCS_EAGER") == "1" {
		opts = append(opts, app.WithRebalanceProtocol(app.RebalanceEager))
	}
	a := app.New(os.Getenv("PROCS_APP"), opts...)
	in := app.Topic(a, os.Getenv("PROCS_TOPIC"), codec.String(), codec.String(), app.Partitions(6))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(6))
	// PROCS_FILL=1: a second table keeps each key's last value, so that
	// large values fill the data dir (the disk-full test).
	var last *table.Table[string, string]
	writes := []table.Def{counts}
	if os.Getenv("PROCS_FILL") == "1" {
		last = table.New(a, "last", codec.String(), codec.String(), table.Partitions(6))
		writes = append(writes, last)
	}
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			if last != nil {
				last.Put(ev, ev.Key, ev.Value)
			}
		}
		return s.Err()
	}, agent.WritesTo(writes...))
	w, err := a.NewWorker(app.WorkerOptions{})
	if err != nil {
		return err
	}
	go func() {
		enc := json.NewEncoder(os.Stdout)
		var last Line
		for ctx.Err() == nil {
			as := w.Assignment()
			claims, followed := w.Running()
			l := Line{Generation: as.Generation, Member: as.MemberID, Actives: as.Actives, Standbys: as.Standbys,
				Pending: as.Pending, Claims: claims, Followed: followed, Ready: w.Ready(),
				Restored: w.Restored(), RestoredSpan: w.RestoredSpan()}
			if !reflect.DeepEqual(l, last) {
				_ = enc.Encode(l)
				last = l
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w.Run(ctx)
}

// logLevel is PROCS_LOG_LEVEL (debug, info, warn, error), warn by default.
func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("PROCS_LOG_LEVEL"))); err != nil {
		return slog.LevelWarn
	}
	return l
}
