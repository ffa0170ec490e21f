package app_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/kafkaversion"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// These tests run a real worker against brokers that require SASL, TLS
// (with client certificates) or both, and check that it counts every record
// exactly; the brokers refuse any request of a connection that did not
// authenticate, so a client Runnel opened without the settings would fail
// the test. The brokers are kfake clusters started per test, or on the real
// tier (testbroker.Real) with `scripts/kafka start --secure` running, its
// SASL_PLAINTEXT, SSL and SASL_SSL listeners (the variables of
// `scripts/kafka secure-env`, which scripts/ci-kafka.sh exports with
// RUNNEL_KAFKA_SECURE=1).

const (
	kfakeUser     = "runnel-app"
	kfakePassword = "s3cret-not-in-logs"
	secKeys       = 16
	secPerKey     = 25
	secParts      = 4
)

// testPKI is a CA, a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files.
type testPKI struct {
	dir                       string
	caFile, certFile, keyFile string
	server                    tls.Certificate
	pool                      *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "runnel test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p.pool = x509.NewCertPool()
	p.pool.AddCert(ca)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	writePEM := func(name, typ string, der []byte) string {
		path := filepath.Join(p.dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p.caFile = writePEM("ca.pem", "CERTIFICATE", caDER)
	srvDER, srvKey := issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.server = tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
	cliDER, cliKey := issue(3, "client", x509.ExtKeyUsageClientAuth, nil)
	p.certFile = writePEM("client.pem", "CERTIFICATE", cliDER)
	keyDER, err := x509.MarshalPKCS8PrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	p.keyFile = writePEM("client-key.pem", "PRIVATE KEY", keyDER)
	return p
}

// serverTLS is the brokers' TLS: the server certificate, and client
// certificates signed by the CA required.
func (p *testPKI) serverTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}

// secureBrokers gives a test brokers that require SASL, TLS or both, and
// the credentials and files to reach them.
type secureBrokers struct {
	user, password            string
	caFile, certFile, keyFile string
	real                      bool
	pki                       *testPKI // kfake
}

// newSecureBrokers returns the real tier's secure listeners when
// scripts/kafka runs them, else kfake clusters (started per call).
func newSecureBrokers(t *testing.T) *secureBrokers {
	if testbroker.Real() && os.Getenv("RUNNEL_KAFKA_SASL_BROKERS") != "" {
		dir := os.Getenv("RUNNEL_KAFKA_TLS_DIR")
		return &secureBrokers{real: true, user: os.Getenv("RUNNEL_KAFKA_SASL_USER"), password: os.Getenv("RUNNEL_KAFKA_SASL_PASSWORD"),
			caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "client.pem"), keyFile: filepath.Join(dir, "client.key")}
	}
	pki := newTestPKI(t)
	return &secureBrokers{user: kfakeUser, password: kfakePassword, caFile: pki.caFile, certFile: pki.certFile, keyFile: pki.keyFile, pki: pki}
}

func (b *secureBrokers) realAddrs(env string) []string { return strings.Split(os.Getenv(env), ",") }

// sasl: SASL_PLAINTEXT with mechanism mech.
func (b *secureBrokers) sasl(t *testing.T, mech string) []string {
	if b.real {
		return b.realAddrs("RUNNEL_KAFKA_SASL_BROKERS")
	}
	return startSecuredKfake(t, kfake.EnableSASL(), kfake.Superuser(mech, b.user, b.password))
}

// ssl: TLS with a client certificate required.
func (b *secureBrokers) ssl(t *testing.T) []string {
	if b.real {
		return b.realAddrs("RUNNEL_KAFKA_SSL_BROKERS")
	}
	return startSecuredKfake(t, kfake.TLS(b.pki.serverTLS()))
}

// saslSSL: SASL_SSL with mechanism mech (no client certificate needed).
func (b *secureBrokers) saslSSL(t *testing.T, mech string) []string {
	if b.real {
		return b.realAddrs("RUNNEL_KAFKA_SASL_SSL_BROKERS")
	}
	return startSecuredKfake(t, kfake.TLS(b.pki.serverTLS()), kfake.EnableSASL(), kfake.Superuser(mech, b.user, b.password))
}

// clientTLS is what a test client presents: the CA and the client certificate.
func (b *secureBrokers) clientTLS(t *testing.T) *tls.Config {
	t.Helper()
	ca, err := os.ReadFile(b.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("%s: no certificate", b.caFile)
	}
	cert, err := tls.LoadX509KeyPair(b.certFile, b.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// startSecuredKfake starts a one-node kfake cluster with the given extra
// options (EnableSASL, Superuser, TLS), the embedded broker's group timeouts.
func startSecuredKfake(t *testing.T, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100 * time.Millisecond),
		kfake.DefaultNumPartitions(secParts)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// secureCount declares a word-count app: an agent counts the records of
// "words" per key into the table "counts".
func secureCount(id string, opts ...app.Option) (*app.App, *agent.Topic[string, string], *table.Table[string, int64]) {
	a := app.New(id, opts...)
	words := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(secParts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	agent.New(a, "count", words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	return a, words, counts
}

// secureClient opens a client of the test itself with sec.
func secureClient(t *testing.T, brokers []string, sec kafka.Security) sarama.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := kafkaversion.Detect(ctx, brokers, kafka.Base("runnel-test", sec))
	if err != nil {
		t.Fatal(err)
	}
	cfg := kafka.NewSecureConfig("runnel-test", v, kafka.TestTimeouts, sec)
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// runSecuredCount runs one worker of a word-count app configured with opts
// against brokers, produces secKeys×secPerKey records through client once the
// worker created the topic, waits for lag 0, stops the worker and checks the
// table read back from its changelog: every key counted exactly secPerKey
// times. It returns the worker's log and the app.
func runSecuredCount(t *testing.T, brokers []string, client sarama.Client, opts ...app.Option) (string, *app.App) {
	t.Helper()
	logs := &testbroker.LockedBuffer{}
	id := testbroker.Topic(t, "sec")
	a, words, counts := secureCount(id, append([]app.Option{
		app.WithBrokers(brokers...),
		app.WithDataDir(t.TempDir()),
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		app.WithTopicPrefix(id + "-"),
	}, opts...)...)
	w, err := a.NewWorker(app.WorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	defer func() { _ = stop() }()

	for deadline := time.Now().Add(30 * time.Second); ; {
		_ = client.RefreshMetadata(words.Name())
		if ps, err := client.Partitions(words.Name()); err == nil && len(ps) == secParts {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("worker stopped before creating %s: %v", words.Name(), err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s never created", words.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
	prod, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*sarama.ProducerMessage
	for i := range secPerKey {
		for k := range secKeys {
			key := fmt.Sprintf("key-%02d", k)
			msgs = append(msgs, &sarama.ProducerMessage{Topic: words.Name(), Partition: kafka.PartitionFor([]byte(key), secParts),
				Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(fmt.Sprint(i))})
		}
	}
	if err := prod.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	if err := app.WaitForLag0(ctx, app.WrapClient(client), id, []string{words.Name()}, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("worker: %v", err)
	}
	got, err := app.ReadTable(context.Background(), app.WrapClient(client), counts)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != secKeys {
		t.Errorf("table has %d keys, want %d: %v", len(got), secKeys, got)
	}
	for k := range secKeys {
		key := fmt.Sprintf("key-%02d", k)
		if got[key] != int64(secPerKey) {
			t.Errorf("count of %s = %v, want %d", key, got[key], secPerKey)
		}
	}
	return logs.String(), a
}

// A worker counts exactly over SASL/SCRAM (SHA-256 at-least-once, SHA-512
// exactly-once: the transactional producer authenticates too) and over PLAIN;
// it logs the security protocol and the user, never the password.
func TestWorkerSASL(t *testing.T) {
	for _, c := range []struct {
		mech string
		g    app.Guarantee
	}{
		{kafka.SASLSCRAMSHA256, app.AtLeastOnce},
		{kafka.SASLSCRAMSHA512, app.ExactlyOnce},
		{kafka.SASLPlain, app.AtLeastOnce},
	} {
		t.Run(c.mech, func(t *testing.T) {
			sb := newSecureBrokers(t)
			brokers := sb.sasl(t, c.mech)
			sec := kafka.Security{SASL: kafka.SASL{Mechanism: c.mech, User: sb.user, Password: sb.password}}
			client := secureClient(t, brokers, sec)
			logs, a := runSecuredCount(t, brokers, client, app.WithSASL(c.mech, sb.user, sb.password), app.WithGuarantee(c.g))
			if strings.Contains(logs, sb.password) {
				t.Fatalf("the worker logged the SASL password")
			}
			if !strings.Contains(logs, "security=SASL_PLAINTEXT") || !strings.Contains(logs, "sasl.user="+sb.user) {
				t.Fatalf("the worker's join line does not name the security protocol and user:\n%s", logs)
			}
			// The commands connect with the same settings: tables dump
			// reads the changelog over SASL.
			var out bytes.Buffer
			cmd := a.Command()
			cmd.SetOut(&out)
			cmd.SetArgs([]string{"tables", "dump", "counts", "--json"})
			if err := cmd.ExecuteContext(context.Background()); err != nil {
				t.Fatalf("tables dump: %v", err)
			}
			var dumped map[string]int64
			if err := json.Unmarshal(out.Bytes(), &dumped); err != nil {
				t.Fatalf("tables dump: %v: %s", err, out.String())
			}
			if len(dumped) != secKeys || dumped["key-00"] != secPerKey || dumped[fmt.Sprintf("key-%02d", secKeys-1)] != secPerKey {
				t.Fatalf("tables dump: %v", dumped)
			}
		})
	}
}

// A worker counts exactly over TLS with a client certificate (the broker
// requires one), configured with PEM files, and over SASL_SSL with the
// credentials from the environment (RUNNEL_SASL_*) and a *tls.Config.
func TestWorkerTLS(t *testing.T) {
	sb := newSecureBrokers(t)
	t.Run("files", func(t *testing.T) {
		brokers := sb.ssl(t)
		client := secureClient(t, brokers, kafka.Security{TLS: sb.clientTLS(t)})
		logs, _ := runSecuredCount(t, brokers, client, app.WithTLSFiles(sb.caFile, sb.certFile, sb.keyFile))
		if !strings.Contains(logs, "security=SSL") {
			t.Fatalf("the worker's join line does not say SSL:\n%s", logs)
		}
	})
	t.Run("sasl_ssl_env", func(t *testing.T) {
		brokers := sb.saslSSL(t, kafka.SASLSCRAMSHA512)
		t.Setenv("RUNNEL_SASL_MECHANISM", "scram-sha-512")
		t.Setenv("RUNNEL_SASL_USER", sb.user)
		t.Setenv("RUNNEL_SASL_PASSWORD", sb.password)
		sec := kafka.Security{TLS: sb.clientTLS(t), SASL: kafka.SASL{Mechanism: kafka.SASLSCRAMSHA512, User: sb.user, Password: sb.password}}
		client := secureClient(t, brokers, sec)
		logs, _ := runSecuredCount(t, brokers, client, app.WithTLS(sb.clientTLS(t)))
		if strings.Contains(logs, sb.password) {
			t.Fatalf("the worker logged the SASL password")
		}
		if !strings.Contains(logs, "security=SASL_SSL") {
			t.Fatalf("the worker's join line does not say SASL_SSL:\n%s", logs)
		}
	})
}

// A wrong password, a missing client certificate and a plaintext client on
// a TLS listener end the worker with an error that says what failed (SASL
// authentication, TLS), names the user but not the password, and do not
// hang.
func TestWorkerSecurityRefused(t *testing.T) {
	sb := newSecureBrokers(t)
	saslBrokers := sb.sasl(t, kafka.SASLSCRAMSHA256)
	tlsBrokers := sb.ssl(t)
	const wrong = "wrong-password-xyz"
	for _, c := range []struct {
		name    string
		brokers []string
		opts    []app.Option
		want    []string
	}{
		{"wrong password", saslBrokers, []app.Option{app.WithSASL(kafka.SASLSCRAMSHA256, sb.user, wrong)},
			[]string{"SASL SCRAM-SHA-256 user \"" + sb.user + "\"", "SASL authentication failed"}},
		{"unknown user", saslBrokers, []app.Option{app.WithSASL(kafka.SASLSCRAMSHA512, "nobody-here", sb.password)},
			[]string{"SASL SCRAM-SHA-512 user \"nobody-here\"", "SASL authentication failed"}},
		{"no SASL", saslBrokers, nil, []string{"connect to"}},
		{"no client certificate", tlsBrokers, []app.Option{app.WithTLSFiles(sb.caFile, "", "")},
			[]string{"SSL"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := testbroker.Topic(t, "refused")
			a, _, _ := secureCount(id, append([]app.Option{app.WithBrokers(c.brokers...), app.WithDataDir(t.TempDir()),
				app.WithLogger(slog.New(slog.DiscardHandler))}, c.opts...)...)
			w, err := a.NewWorker(app.WorkerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// A hang guard, not a timing assertion: ConnectTimeout is 15 s.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			err = w.Run(ctx)
			t.Logf("error: %v", err)
			if err == nil {
				t.Fatal("worker ran with refused credentials")
			}
			if ctx.Err() != nil {
				t.Fatalf("worker hung until the test's deadline: %v", err)
			}
			for _, s := range c.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), sb.password) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}
