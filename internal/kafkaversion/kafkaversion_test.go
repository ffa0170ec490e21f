package kafkaversion_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafkaversion"
)

// keysOf turns a kversion release table into what a broker of that release advertises.
func keysOf(v *kversion.Versions) []sarama.ApiVersionsResponseKey {
	var keys []sarama.ApiVersionsResponseKey
	v.EachMaxKeyVersion(func(k, max int16) {
		keys = append(keys, sarama.ApiVersionsResponseKey{ApiKey: k, MinVersion: 0, MaxVersion: max})
	})
	return keys
}

func TestFromAPIVersionsPerRelease(t *testing.T) {
	cases := []struct {
		rel  *kversion.Versions
		want sarama.KafkaVersion
	}{
		{kversion.V0_11_0(), sarama.V0_11_0_2},
		{kversion.V1_0_0(), sarama.V1_0_2_0},
		{kversion.V2_0_0(), sarama.V2_0_1_0},
		{kversion.V2_4_0(), sarama.V2_4_1_0},
		{kversion.V2_8_0(), sarama.V2_8_2_0},
		{kversion.V3_6_0(), sarama.V3_6_2_0},
		{kversion.V3_9_0(), sarama.V3_9_2_0},
		{kversion.V4_0_0(), sarama.V4_0_1_0},
		{kversion.V4_2_0(), sarama.V4_2_1_0},
		{kversion.V4_3_0(), sarama.V4_3_1_0},
		// Newer than sarama knows: capped at sarama's newest.
		{kversion.V4_4_0(), sarama.MaxVersion},
	}
	for _, c := range cases {
		got, err := kafkaversion.FromAPIVersions(keysOf(c.rel))
		if err != nil {
			t.Fatalf("%s: %v", c.want, err)
		}
		if got != c.want {
			t.Errorf("release table for %s: got %s, want %s", c.want, got, c.want)
		}
	}
}

func TestFromAPIVersionsOneLaggingAPI(t *testing.T) {
	// A 3.6 broker whose JoinGroup stops at v5 (Kafka 2.3's max; 2.4 added flexible v6,
	// KIP-482) must be configured as 2.3: the one lagging API decides.
	rel := kversion.V3_6_0()
	rel.SetMaxKeyVersion(11, 5)
	got, err := kafkaversion.FromAPIVersions(keysOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	if got.IsAtLeast(sarama.V2_4_0_0) {
		t.Fatalf("JoinGroup v5 broker detected as %s; 2.4 needs JoinGroup v6", got)
	}
	if !got.IsAtLeast(sarama.V2_3_0_0) {
		t.Fatalf("JoinGroup v5 broker detected as %s; want 2.3", got)
	}
}

func TestFromAPIVersionsTooOld(t *testing.T) {
	_, err := kafkaversion.FromAPIVersions(keysOf(kversion.V0_10_2()))
	if !errors.Is(err, kafkaversion.ErrTooOld) {
		t.Fatalf("0.10.2 table: got %v, want ErrTooOld", err)
	}
}

func TestDetectEmbedded(t *testing.T) {
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := kafkaversion.Detect(ctx, b.Addrs(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kfake detected as %s", v)
	// kfake advertises Kafka 4.x's client APIs (Produce v13, Fetch v18, JoinGroup v9).
	if !v.IsAtLeast(sarama.V4_0_0_0) {
		t.Fatalf("kfake detected as %s, want ≥ 4.0", v)
	}
}

func TestDetectEmulatedOldBroker(t *testing.T) {
	// kfake can advertise an older release's versions; Detect must follow them.
	for _, c := range []struct {
		rel  *kversion.Versions
		want sarama.KafkaVersion
	}{
		{kversion.V2_8_0(), sarama.V2_8_2_0},
		{kversion.V3_6_0(), sarama.V3_6_2_0},
	} {
		cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.MaxVersions(c.rel))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := kafkaversion.Detect(ctx, cl.ListenAddrs(), nil)
		cancel()
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		if v != c.want {
			t.Errorf("kfake limited to %s's versions detected as %s", c.want, v)
		}
	}
}

func TestDetectUnreachable(t *testing.T) {
	// Port 1 refuses at once; the listener below accepts and never answers, which is the
	// case that would hang without a deadline.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, addrs := range [][]string{{"127.0.0.1:1"}, {silent.Addr().String()}, {"127.0.0.1:1", silent.Addr().String()}} {
		const timeout = 1500 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		_, err := kafkaversion.Detect(ctx, addrs, nil)
		took := time.Since(start)
		cancel()
		if err == nil {
			t.Fatalf("%v: Detect succeeded against a broken address", addrs)
		}
		if took > timeout+500*time.Millisecond {
			t.Fatalf("%v: Detect took %s, timeout %s", addrs, took, timeout)
		}
		if !strings.Contains(err.Error(), addrs[len(addrs)-1]) {
			t.Errorf("%v: error does not name the address: %v", addrs, err)
		}
		// A silent address runs out the deadline: the error says so first.
		silentToo := addrs[len(addrs)-1] == silent.Addr().String()
		if want := "no Kafka answered at " + strings.Join(addrs, ", ") + " within 1.5 s ("; silentToo != strings.HasPrefix(err.Error(), want) {
			t.Errorf("%v: error %q; want it to start with %q: %v", addrs, err, want, silentToo)
		}
		if silentToo != errors.Is(err, kafkaversion.ErrNoAnswer) {
			t.Errorf("%v: errors.Is(err, ErrNoAnswer) = %v", addrs, !silentToo)
		}
		t.Logf("%v: %s: %v", addrs, took.Round(time.Millisecond), err)
	}
}

// TestDetectReal runs against the real broker when RUNNEL_KAFKA_BROKERS is set (the
// second test tier, scripts/kafka start); it is a no-op otherwise because the same
// assertions ran against kfake above.
func TestDetectReal(t *testing.T) {
	env := os.Getenv("RUNNEL_KAFKA_BROKERS")
	if env == "" {
		t.Log("RUNNEL_KAFKA_BROKERS not set; real-Kafka detection covered by the real tier")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := kafkaversion.Detect(ctx, strings.Split(env, ","), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("real Kafka at %s detected as %s", env, v)
	if !v.IsAtLeast(sarama.V4_0_0_0) {
		t.Fatalf("real Kafka detected as %s, want ≥ 4.0 (scripts/kafka fetches 4.4)", v)
	}
}
