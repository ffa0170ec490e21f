package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/table"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
)

// Main runs the app's command line: worker, dev, describe, tables, send. An
// interrupt or SIGTERM cancels the command's context: a worker then finishes
// its work, leaves the group and Main returns (exit status 0). On error Main
// logs it through the app's logger (JSON under --log-format json) and exits
// the process with status 1. opts set defaults of the commands (DevInput),
// not of the app: a worker runs the same with or without them.
func (a *App) Main(opts ...CLIOption) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if code := a.execute(ctx, a.Command(opts...)); code != 0 {
		stop()
		os.Exit(code)
	}
}

// execute runs the root command cmd and returns the process exit status: 0,
// or 1 once the error is logged through the app's logger, the one the log
// flags chose (an error found before the flags were parsed, such as an
// unknown flag, goes through the logger of the options: slog text on stderr
// by default).
func (a *App) execute(ctx context.Context, cmd *cobra.Command) int {
	c, err := cmd.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	path := cmd.CommandPath()
	if c != nil {
		path = c.CommandPath()
	}
	a.cfg.Logger.Error("command failed", "command", path, "err", err)
	return 1
}

// CLIOption sets a default of the app's command line (Main, Command): what
// the commands do when a flag is not given. It is not part of the app's
// declaration: a worker runs the same with or without it.
type CLIOption func(*cliOptions)

type cliOptions struct {
	devTopic, devKeyField string // DevInput
}

// DevInput sets where `dev --input FILE` and `send FILE` load a JSONL file
// given without a topic: into topic (as declared, or in full with the
// WithTopicPrefix prefix), keyed by the string field keyField of each line
// unless --key-field says otherwise. Default none: a bare FILE then needs
// --topic, or --input TOPIC=FILE and --key-field. It is a convenience for
// development: `dev --input change-events=FILE --key-field actor` says the
// same on the command line.
func DevInput(topic, keyField string) CLIOption {
	return func(o *cliOptions) { o.devTopic, o.devKeyField = topic, keyField }
}

// Command returns the app's root cobra command, for embedding in a larger
// CLI; opts as for Main.
func (a *App) Command(opts ...CLIOption) *cobra.Command {
	var co cliOptions
	for _, o := range opts {
		o(&co)
	}
	var logLevel, logFormat string
	root := &cobra.Command{
		// The usage lines name the binary the user ran ("changeaudit
		// dev [flags]"), not the app ID, which is a consumer group's
		// name (change-audit).
		Use:           binaryName(a.id),
		Short:         fmt.Sprintf("Runnel app %s", a.id),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			// A logger set with WithLogger is kept unless a flag asks for
			// another level or format.
			if a.cfg.userLogger && !cmd.Flags().Changed("log-level") && !cmd.Flags().Changed("log-format") {
				return nil
			}
			// The command's stderr: os.Stderr unless the embedding CLI (or
			// a test) set another with SetErr.
			opts, out := &slog.HandlerOptions{Level: lvl}, cmd.ErrOrStderr()
			switch logFormat {
			case "text":
				a.cfg.Logger = slog.New(slog.NewTextHandler(out, opts))
			case "json":
				a.cfg.Logger = slog.New(slog.NewJSONHandler(out, opts))
			default:
				return fmt.Errorf("--log-format %q: text or json", logFormat)
			}
			return nil
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text", "text or json (slog)")

	worker := &cobra.Command{
		Use:   "worker",
		Short: "Join the consumer group and process records until SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w, err := a.NewWorker(WorkerOptions{})
			if err != nil {
				return err
			}
			return w.Run(cmd.Context())
		},
	}
	// The settings' flags (config.go) write a.cfg as they are parsed, over
	// the options and the environment.
	a.addSettingFlags(root.PersistentFlags(), worker.Flags())

	var do DevOptions
	var devIn inputFlags
	var noProgress bool
	dev := &cobra.Command{
		Use:   "dev",
		Short: "Run on an in-process broker: load the --input files, process them with --workers workers, print the tables",
		Long: `Run on an in-process broker: load the --input files, process them with --workers
workers until every record is processed, then print the tables.

--input FILE goes to --topic (default: the main function's app.DevInput topic);
--input TOPIC=FILE, repeated, loads one file into each topic (a join of two
topics). --key-field and --timestamp-field take FIELD (every input) or
TOPIC=FIELD (that topic's inputs). A timestamp field holds an RFC 3339 string
or epoch milliseconds: it becomes the record's timestamp (the event time of
windowed tables). Every input is validated whole before any is loaded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			do.Out = cmd.OutOrStdout()
			if do.Workers < 1 {
				return fmt.Errorf("--workers %d: run at least 1 worker", do.Workers)
			}
			if do.JSONOut && do.Dump == "" {
				return fmt.Errorf("--json prints one table: name it with --dump TABLE (tables: %s)", strings.Join(a.tableNames(), ", "))
			}
			if len(devIn.inputs) == 0 && (devIn.topic != "" || len(devIn.keyFields) > 0 || len(devIn.tsFields) > 0) {
				return errors.New("--topic, --key-field and --timestamp-field apply to --input files: name at least one --input")
			}
			if len(devIn.inputs) > 0 {
				g, err := a.Topology()
				if err != nil {
					return err
				}
				if do.Inputs, err = a.resolveInputs(g, devIn, co); err != nil {
					return err
				}
			}
			if fi, err := os.Stderr.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
				noProgress = true // not a terminal: a progress bar would run into the log lines
			}
			if !noProgress {
				var bar *progressbar.ProgressBar
				var barOf string
				do.Progress = func(path string, loaded, total int64) {
					if bar == nil || barOf != path {
						bar, barOf = progressbar.DefaultBytes(total, "loading "+path), path
					}
					_ = bar.Set64(loaded)
				}
			}
			return a.Dev(cmd.Context(), do)
		},
	}
	dev.Flags().IntVar(&do.Workers, "workers", 1, "workers to run in this process")
	dev.Flags().StringArrayVar(&devIn.inputs, "input", nil, "JSONL file (.gz allowed) to produce before the workers start: FILE (to --topic) or TOPIC=FILE; repeat for several topics")
	dev.Flags().StringVar(&devIn.topic, "topic", "", "topic a bare --input FILE goes to (default: the app's dev input topic)")
	dev.Flags().StringArrayVar(&devIn.keyFields, "key-field", nil, "JSON string field of each line used as the record key: FIELD, or TOPIC=FIELD for one topic's inputs (default: the app's dev key field, for its dev input topic)")
	dev.Flags().StringArrayVar(&devIn.tsFields, "timestamp-field", nil, "JSON field of each line used as the record timestamp (RFC 3339 string or epoch milliseconds): FIELD, or TOPIC=FIELD (default: the time it is loaded)")
	dev.Flags().StringVar(&do.Dump, "dump", "", "print only this table (all: every table, whole)")
	dev.Flags().BoolVar(&do.JSONOut, "json", false, "with --dump: print the table as one JSON object")
	dev.Flags().IntVar(&do.Top, "top", 10, "entries of each table to print")
	dev.Flags().BoolVar(&noProgress, "no-progress", false, "do not draw the loading progress bar (it is drawn only on a terminal)")
	dev.Flags().DurationVar(&do.Timeout, "timeout", 10*time.Minute, "give up when the input is not processed within this time")

	var describeJSON, describeDOT bool
	describe := &cobra.Command{
		Use:   "describe",
		Short: "Print the topics, agents (sinks, tables written, dead-letter topics), tables and co-partitioned groups",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := a.Topology()
			if err != nil {
				return err
			}
			if describeJSON {
				return g.WriteJSON(cmd.OutOrStdout())
			}
			if describeDOT {
				return g.WriteDOT(cmd.OutOrStdout())
			}
			return g.WriteText(cmd.OutOrStdout())
		},
	}
	describe.Flags().BoolVar(&describeJSON, "json", false, "print JSON")
	describe.Flags().BoolVar(&describeDOT, "dot", false, "print a Graphviz DOT graph (render with: dot -Tsvg)")

	tables := &cobra.Command{Use: "tables", Short: "List and dump tables"}
	tables.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the declared tables and their changelog topics",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, d := range a.tables {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", d.Name(), d.Changelog())
			}
			return nil
		},
	})
	var dumpJSON bool
	dump := &cobra.Command{
		Use:   "dump TABLE",
		Short: "Print a table, read from its changelog topic",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var def table.Def
			for _, d := range a.tables {
				if d.Name() == args[0] {
					def = d
				}
			}
			if def == nil {
				return fmt.Errorf("no table %q (tables: %s)", args[0], strings.Join(a.tableNames(), ", "))
			}
			client, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer client.Close()
			m, err := readTable(cmd.Context(), client, def)
			if err != nil {
				return err
			}
			return writeTable(cmd.OutOrStdout(), def.Name(), m, dumpJSON, 0)
		},
	}
	dump.Flags().BoolVar(&dumpJSON, "json", false, "print one JSON object {key: value}")
	tables.AddCommand(dump)

	var sendIn inputFlags
	var sendFrom int
	send := &cobra.Command{
		Use:   "send [FILE]",
		Short: "Produce JSONL files (.gz allowed, - for stdin) to topics, one record a line",
		Long: `Produce JSONL files (.gz allowed, - for stdin) to topics, one record a line.
FILE (or --input FILE) goes to --topic, by default the app.DevInput topic;
--input TOPIC=FILE, repeated, sends one file to each topic. --key-field and
--timestamp-field take FIELD (every input) or TOPIC=FIELD (that topic's inputs);
a timestamp field holds an RFC 3339 string or epoch milliseconds and becomes the
record's timestamp.
Every input is validated first (JSON objects, the key and timestamp fields, the
topic's key and value codecs, a complete gzip stream): a bad input sends nothing.
If producing fails halfway, the error says how many records were sent and the
line to resume from with --from-line.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := a.Topology()
			if err != nil {
				return err
			}
			in := sendIn
			in.inputs = append(slices.Clone(args), in.inputs...)
			if len(in.inputs) == 0 {
				return errors.New("nothing to send: name a FILE or --input TOPIC=FILE")
			}
			ins, err := a.resolveInputs(g, in, co)
			if err != nil {
				return err
			}
			if sendFrom > 0 && len(ins) > 1 {
				return fmt.Errorf("--from-line resumes one input; %d are named", len(ins))
			}
			brokers, err := resolveBrokers(a.cfg.Brokers)
			if err != nil {
				return err
			}
			w0 := &Worker{app: a, graph: g}
			client, _, err := a.connect(cmd.Context(), brokers, "runnel-send", kafka.Timeouts{}, w0.topicSpecs())
			if err != nil {
				return err
			}
			defer client.Close()
			before := func(_ int, o *SendOptions) { o.FromLine = sendFrom }
			after := func(i int, st SendStats) {
				fmt.Fprintf(cmd.ErrOrStderr(), "sent %s to %s\n", plural(st.Records, "record"), ins[i].Topic)
			}
			return a.sendInputs(cmd.Context(), client, g, ins, before, after)
		},
	}
	send.Flags().StringArrayVar(&sendIn.inputs, "input", nil, "a file to send: FILE (to --topic) or TOPIC=FILE; repeat for several topics")
	send.Flags().StringVar(&sendIn.topic, "topic", "", "topic a bare FILE goes to (default: the app's dev input topic)")
	send.Flags().StringArrayVar(&sendIn.keyFields, "key-field", nil, "JSON string field used as the record key: FIELD, or TOPIC=FIELD for one topic's inputs (default: the app's dev key field, for its dev input topic)")
	send.Flags().StringArrayVar(&sendIn.tsFields, "timestamp-field", nil, "JSON field used as the record timestamp (RFC 3339 string or epoch milliseconds): FIELD, or TOPIC=FIELD (default: the time of the send)")
	send.Flags().IntVar(&sendFrom, "from-line", 0, "produce only from this line on (1-based; the resume line of a failed send); earlier lines are still validated")

	root.AddCommand(worker, dev, describe, tables, send, a.assignmentCommand(), a.replayCommand())
	root.AddCommand(a.dlqCommand()) // dlq_cmd.go
	return root
}

// binaryName is the name the process was started as (its base name, without
// .exe), or fallback when there is none.
func binaryName(fallback string) string {
	if len(os.Args) == 0 {
		return fallback
	}
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	if name == "" || name == "." || name == string(filepath.Separator) {
		return fallback
	}
	return name
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func (a *App) client(ctx context.Context) (sarama.Client, error) {
	brokers, err := resolveBrokers(a.cfg.Brokers)
	if err != nil {
		return nil, err
	}
	client, _, err := a.connect(ctx, brokers, "runnel-cli", kafka.Timeouts{}, nil)
	return client, err
}

// plural renders n and noun, with an s unless n is 1: "1 record", "2 records".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.FormatInt(n, 10) + " " + noun + "s"
}
