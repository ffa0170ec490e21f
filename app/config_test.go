package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The default each setting documents is the value defaultConfig gives it.
func TestSettingDefaultsMatchDefaultConfig(t *testing.T) {
	c := defaultConfig()
	for _, s := range settings {
		if s.field == nil {
			continue
		}
		want := s.def
		if strings.HasPrefix(want, "none") {
			want = ""
		} else if i := strings.Index(want, " ("); i >= 0 {
			want = want[:i]
		}
		if got := s.field.get(&c); got != want {
			t.Errorf("%s: documented default %q, defaultConfig has %q", s.name, s.def, got)
		}
	}
}

// Every setting is complete, and no two share an environment variable or a
// flag.
func TestSettingsTable(t *testing.T) {
	envs, flags := map[string]string{}, map[string]string{}
	for _, s := range settings {
		if s.name == "" || s.option == "" || s.def == "" || s.unit == "" || s.usage == "" {
			t.Errorf("setting %+v: name, option, default, unit and usage are required", s.name)
		}
		if s.env != "" {
			if !strings.HasPrefix(s.env, "RUNNEL_") {
				t.Errorf("%s: env %s does not start with RUNNEL_", s.name, s.env)
			}
			if o, dup := envs[s.env]; dup {
				t.Errorf("%s and %s share %s", o, s.name, s.env)
			}
			envs[s.env] = s.name
		}
		if s.flag != "" {
			if o, dup := flags[s.flag]; dup {
				t.Errorf("%s and %s share --%s", o, s.name, s.flag)
			}
			flags[s.flag] = s.name
		}
		if (s.env != "" || s.flag != "") && s.field == nil {
			t.Errorf("%s has an env or flag but no field", s.name)
		}
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Options, then the environment, then flags: each later source wins, and a
// source that does not name a setting leaves it alone.
func TestConfigPrecedence(t *testing.T) {
	t.Setenv("RUNNEL_ACK_TIMEOUT", "90s")
	t.Setenv("RUNNEL_COMMIT_INTERVAL", "1s")
	t.Setenv("RUNNEL_SASL_MECHANISM", "scram-sha-512")
	t.Setenv("RUNNEL_SASL_USER", "env-user")
	t.Setenv("RUNNEL_SASL_PASSWORD", "env-secret")
	t.Setenv("RUNNEL_MAX_RETRIES", "7")
	t.Setenv("RUNNEL_REBALANCE_PROTOCOL", "eager")
	a := New("precedence", WithLogger(quietLogger()), WithAckTimeout(time.Minute), WithCommitInterval(5*time.Second),
		WithCacheBytes(1<<10), WithSASL("PLAIN", "opt-user", "opt-secret"))
	if a.cfg.AckTimeout != 90*time.Second || a.cfg.CommitInterval != time.Second || a.cfg.CacheBytes != 1<<10 {
		t.Fatalf("env over options: ack timeout %v (want 1m30s), commit interval %v (want 1s), cache %d (want 1024)",
			a.cfg.AckTimeout, a.cfg.CommitInterval, a.cfg.CacheBytes)
	}
	if a.cfg.SASL != (SASL{Mechanism: "SCRAM-SHA-512", User: "env-user", Password: "env-secret"}) {
		t.Fatalf("env SASL: %v", a.cfg.SASL)
	}
	if a.cfg.redelivery.MaxRetries != 7 || !a.cfg.eager {
		t.Fatalf("env: max retries %d (want 7), eager %v (want true)", a.cfg.redelivery.MaxRetries, a.cfg.eager)
	}
	cmd := a.Command()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cmd.SetArgs([]string{"worker", "--brokers", "127.0.0.1:1", "--data-dir", t.TempDir(), "--ack-timeout", "2m",
		"--sasl-user", "flag-user", "--rebalance-protocol", "cooperative"})
	_ = cmd.ExecuteContext(ctx) // fails to connect; only the configuration is checked
	if a.cfg.AckTimeout != 2*time.Minute || a.cfg.CommitInterval != time.Second {
		t.Fatalf("flags over env: ack timeout %v (want 2m), commit interval %v (want 1s)", a.cfg.AckTimeout, a.cfg.CommitInterval)
	}
	if a.cfg.SASL.User != "flag-user" || a.cfg.SASL.Password != "env-secret" || a.cfg.eager {
		t.Fatalf("flags: SASL %v, eager %v", a.cfg.SASL, a.cfg.eager)
	}
}

// validate names the setting (option, variable, flag) and what it allows;
// NewWorker returns the problems, it does not panic or start.
func TestConfigValidate(t *testing.T) {
	cases := []struct {
		opts []Option
		env  map[string]string
		want []string
	}{
		{opts: []Option{WithCommitInterval(-time.Second)}, want: []string{"WithCommitInterval", "--commit-interval", "must be 0 or more"}},
		{opts: []Option{WithAckTimeout(-time.Second)}, want: []string{"WithAckTimeout", "RUNNEL_ACK_TIMEOUT", "must be positive"}},
		{opts: []Option{WithSASL("GSSAPI", "u", "p")}, want: []string{"WithSASL", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"}},
		{opts: []Option{WithSASL("SCRAM-SHA-256", "u", "")}, want: []string{"SASL SCRAM-SHA-256 needs a user and a password"}},
		{opts: []Option{WithTLSFiles("", "cert.pem", "")}, want: []string{"WithTLSFiles", "both its certificate and its key"}},
		{opts: []Option{WithGroupTimeouts(time.Second, 2*time.Second, 0, 0)}, want: []string{"--session-timeout", "must exceed the heartbeat interval"}},
		{opts: []Option{WithBrokers("localhost")}, want: []string{"WithBrokers", "want host:port"}},
		{opts: []Option{WithHTTPAddr("8080")}, want: []string{"WithHTTPAddr", "want host:port or :port"}},
		{env: map[string]string{"RUNNEL_COMMIT_INTERVAL": "soon"}, want: []string{"RUNNEL_COMMIT_INTERVAL=\"soon\"", "want a duration"}},
		{env: map[string]string{"RUNNEL_GUARANTEE": "twice"}, want: []string{"RUNNEL_GUARANTEE", "at_least_once or exactly_once"}},
		{env: map[string]string{"RUNNEL_REBALANCE_PROTOCOL": "sticky"}, want: []string{"RUNNEL_REBALANCE_PROTOCOL", "cooperative or eager"}},
		{opts: []Option{WithCacheBytes(1 << 20), WithWriteCacheLimit(1 << 19)}, want: []string{"WithWriteCacheLimit", "--write-cache-limit", "must be at least the write cache size (1048576 bytes"}},
		{env: map[string]string{"RUNNEL_WRITE_CACHE_LIMIT": "1000"}, want: []string{"RUNNEL_WRITE_CACHE_LIMIT", "must be at least the write cache size (4194304 bytes"}},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			a := New("validate", append([]Option{WithLogger(quietLogger()), WithDataDir(t.TempDir())}, c.opts...)...)
			_, err := a.NewWorker(WorkerOptions{})
			if err == nil {
				t.Fatal("NewWorker accepted an invalid configuration")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// The defaults are valid.
	if err := New("validate", WithLogger(quietLogger())).validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// The SASL password shows in no string form of the configuration, in no log
// line and in no error about a bad environment value.
func TestSASLPasswordNeverShown(t *testing.T) {
	const secret = "hunter2-do-not-print"
	t.Setenv("RUNNEL_SASL_PASSWORD", secret)
	a := New("secret", WithLogger(quietLogger()), WithSASL("SCRAM-SHA-256", "app", "x"))
	if a.cfg.SASL.Password != secret {
		t.Fatalf("env password not applied")
	}
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "sasl", a.cfg.SASL, "cfg", a.cfg.SASL.kafka())
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "sasl", a.cfg.SASL)
	for _, s := range []string{fmt.Sprint(a.cfg), fmt.Sprintf("%+v", a.cfg), fmt.Sprintf("%#v", a.cfg.SASL), fmt.Sprintf("%v", a.cfg.SASL), logged.String()} {
		if strings.Contains(s, secret) {
			t.Fatalf("password shown in %q", s)
		}
	}
	if !strings.Contains(logged.String(), "SCRAM-SHA-256") || !strings.Contains(logged.String(), "app") {
		t.Fatalf("log does not name mechanism and user: %s", logged.String())
	}
	// A flag's --help default never shows it either.
	cmd := a.Command()
	if f := cmd.PersistentFlags().Lookup("sasl-password"); f == nil || f.DefValue != "" {
		t.Fatalf("--sasl-password default shown: %+v", f)
	}
}

// The commit interval left unset (0) is the guarantee's default
// (DefaultExactlyOnceCommitInterval under exactly-once, 2.8 s under
// at-least-once; one set by an option, the environment or a flag is kept
// under either guarantee.
func TestCommitIntervalDefaultByGuarantee(t *testing.T) {
	cases := []struct {
		name string
		opts []Option
		env  map[string]string
		args []string
		want time.Duration
	}{
		{name: "at-least-once", want: 2800 * time.Millisecond},
		{name: "exactly-once option", opts: []Option{WithGuarantee(ExactlyOnce)}, want: DefaultExactlyOnceCommitInterval},
		{name: "exactly-once env", env: map[string]string{"RUNNEL_GUARANTEE": "exactly_once"}, want: DefaultExactlyOnceCommitInterval},
		{name: "exactly-once flag", args: []string{"--guarantee", "exactly_once"}, want: DefaultExactlyOnceCommitInterval},
		{name: "exactly-once, interval set", opts: []Option{WithGuarantee(ExactlyOnce), WithCommitInterval(time.Second)}, want: time.Second},
		{name: "exactly-once, interval by env", opts: []Option{WithGuarantee(ExactlyOnce)}, env: map[string]string{"RUNNEL_COMMIT_INTERVAL": "100ms"}, want: 100 * time.Millisecond},
		{name: "exactly-once, interval by flag", args: []string{"--guarantee", "exactly_once", "--commit-interval", "3s"}, want: 3 * time.Second},
		{name: "at-least-once, interval set", opts: []Option{WithCommitInterval(500 * time.Millisecond)}, want: 500 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			a := New("interval", append([]Option{WithLogger(quietLogger()), WithDataDir(t.TempDir())}, c.opts...)...)
			if len(c.args) > 0 {
				fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
				a.addSettingFlags(fs, fs)
				if err := fs.Parse(c.args); err != nil {
					t.Fatal(err)
				}
			}
			w, err := a.NewWorker(WorkerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if w.cfg.CommitInterval != c.want {
				t.Fatalf("commit interval %v, want %v (guarantee %s)", w.cfg.CommitInterval, c.want, w.cfg.Guarantee)
			}
		})
	}
}

// The write cache's hard limit is twice the cache size unless set; negative
// turns it off (0 for task.Task.CacheLimit).
func TestWriteCacheLimitDefault(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		want int
	}{
		{want: 8 << 20},
		{opts: []Option{WithCacheBytes(1 << 10)}, want: 2 << 10},
		{opts: []Option{WithCacheBytes(1 << 10), WithWriteCacheLimit(5000)}, want: 5000},
		{opts: []Option{WithWriteCacheLimit(-1)}, want: 0},
	} {
		a := New("limit", append([]Option{WithLogger(quietLogger())}, c.opts...)...)
		if err := a.validate(); err != nil {
			t.Fatalf("%+v: %v", a.cfg, err)
		}
		if got := a.cfg.writeCacheLimit(); got != c.want {
			t.Errorf("CacheBytes %d, WriteCacheLimit %d: limit %d, want %d", a.cfg.CacheBytes, a.cfg.WriteCacheLimit, got, c.want)
		}
	}
}
