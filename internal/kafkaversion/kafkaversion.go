// Package kafkaversion detects which sarama.KafkaVersion to configure for a broker.
//
// sarama picks request versions from Config.Version, not from the broker: too low a
// Version silently gives up features (KIP-394 member ids, KIP-447 transactional offset
// commits with generation, flexible versions), too high a Version against an old broker
// sends requests it cannot parse. Detect asks the broker with an ApiVersions request
// (KIP-35) and maps the advertised maximum versions to the highest release whose client
// APIs the broker fully supports.
//
// The per-release tables of API versions come from franz-go's kversion package, which
// transcribes them from each Apache Kafka release's clients/src/main/resources/common/message
// definitions.
package kafkaversion

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/hashicorp/go-multierror"
	"github.com/twmb/franz-go/pkg/kversion"
)

// DefaultTimeout bounds Detect when ctx has no deadline: 10 s for all addresses together.
const DefaultTimeout = 10 * time.Second

// clientAPIs are the API keys whose versions sarama derives from Config.Version and that
// Runnel uses (produce, fetch, groups, offsets, transactions, admin). Broker-internal and
// controller-only APIs are left out, so a KRaft broker, which does not advertise
// controller APIs, is not judged by them.
var clientAPIs = []int16{
	0,  // Produce
	1,  // Fetch
	2,  // ListOffsets
	3,  // Metadata
	8,  // OffsetCommit
	9,  // OffsetFetch
	10, // FindCoordinator
	11, // JoinGroup
	12, // Heartbeat
	13, // LeaveGroup
	14, // SyncGroup
	15, // DescribeGroups
	16, // ListGroups
	18, // ApiVersions
	19, // CreateTopics
	20, // DeleteTopics
	21, // DeleteRecords
	22, // InitProducerId
	24, // AddPartitionsToTxn
	25, // AddOffsetsToTxn
	26, // EndTxn
	28, // TxnOffsetCommit
	32, // DescribeConfigs
	33, // AlterConfigs
	37, // CreatePartitions
	42, // DeleteGroups
	44, // IncrementalAlterConfigs
	47, // OffsetDelete
}

// adminAPIs are further APIs sarama implements (mostly in ClusterAdmin). They are judged
// only when the broker advertises them: kfake, for one, leaves some out, and that must
// not pull the version of its produce/fetch/group APIs down. They also tell releases
// apart whose client APIs are equal (4.2 and 4.3 differ only in DescribeLogDirs).
var adminAPIs = []int16{
	29, // DescribeAcls
	30, // CreateAcls
	31, // DeleteAcls
	35, // DescribeLogDirs
	36, // SaslAuthenticate
	43, // ElectLeaders
	45, // AlterPartitionReassignments
	46, // ListPartitionReassignments
	48, // DescribeClientQuotas
	49, // AlterClientQuotas
	50, // DescribeUserScramCredentials
	51, // AlterUserScramCredentials
	60, // DescribeCluster
	61, // DescribeProducers
	65, // DescribeTransactions
	66, // ListTransactions
}

// release pairs a Kafka release's API table with the sarama version naming it.
type release struct {
	sarama sarama.KafkaVersion
	apis   *kversion.Versions
}

// releases is ordered oldest first. 0.11 is the floor: Kafka 4.x and kfake reject
// Produce < v3 and Fetch < v4, which is what sarama sends below 0.11.
var releases = []release{
	{sarama.V0_11_0_0, kversion.V0_11_0()},
	{sarama.V1_0_0_0, kversion.V1_0_0()},
	{sarama.V1_1_0_0, kversion.V1_1_0()},
	{sarama.V2_0_0_0, kversion.V2_0_0()},
	{sarama.V2_1_0_0, kversion.V2_1_0()},
	{sarama.V2_2_0_0, kversion.V2_2_0()},
	{sarama.V2_3_0_0, kversion.V2_3_0()},
	{sarama.V2_4_0_0, kversion.V2_4_0()},
	{sarama.V2_5_0_0, kversion.V2_5_0()},
	{sarama.V2_6_0_0, kversion.V2_6_0()},
	{sarama.V2_7_0_0, kversion.V2_7_0()},
	{sarama.V2_8_0_0, kversion.V2_8_0()},
	{sarama.V3_0_0_0, kversion.V3_0_0()},
	{sarama.V3_1_0_0, kversion.V3_1_0()},
	{sarama.V3_2_0_0, kversion.V3_2_0()},
	{sarama.V3_3_0_0, kversion.V3_3_0()},
	{sarama.V3_4_0_0, kversion.V3_4_0()},
	{sarama.V3_5_0_0, kversion.V3_5_0()},
	{sarama.V3_6_0_0, kversion.V3_6_0()},
	{sarama.V3_7_0_0, kversion.V3_7_0()},
	{sarama.V3_8_0_0, kversion.V3_8_0()},
	{sarama.V3_9_0_0, kversion.V3_9_0()},
	{sarama.V4_0_0_0, kversion.V4_0_0()},
	{sarama.V4_1_0_0, kversion.V4_1_0()},
	{sarama.V4_2_0_0, kversion.V4_2_0()},
	{sarama.V4_3_0_0, kversion.V4_3_0()},
	// Newer than sarama.MaxVersion (4.3.1 in sarama v1.61.1): a broker that speaks 4.4's
	// APIs is configured as sarama.MaxVersion, the newest sarama knows.
	{sarama.MaxVersion, kversion.V4_4_0()},
}

// ErrTooOld reports a broker that does not support even Kafka 0.11's client APIs.
var ErrTooOld = errors.New("broker older than Kafka 0.11 (sarama and Runnel need Produce v3, Fetch v4)")

// FromAPIVersions maps a broker's advertised API versions to the highest sarama version
// whose APIs the broker supports: for every client API (produce, fetch, groups, offsets,
// transactions, topic admin) that the release has, the broker advertises it with a max
// version at least the release's; for the other APIs sarama implements, the same holds
// wherever the broker advertises them. Of releases that tie, the newer wins. Releases are mapped
// to the highest patch sarama knows within that minor (patches do not change the
// protocol), capped at sarama.MaxVersion. It returns ErrTooOld if no release from 0.11 on
// fits.
func FromAPIVersions(keys []sarama.ApiVersionsResponseKey) (sarama.KafkaVersion, error) {
	maxOf := make(map[int16]int16, len(keys))
	for _, k := range keys {
		maxOf[k.ApiKey] = k.MaxVersion
	}
	best := -1
	for i, r := range releases {
		if supports(maxOf, r.apis) {
			best = i
		}
	}
	if best < 0 {
		return sarama.KafkaVersion{}, ErrTooOld
	}
	return highestPatch(releases[best].sarama), nil
}

func supports(maxOf map[int16]int16, rel *kversion.Versions) bool {
	for _, k := range clientAPIs {
		want, ok := rel.LookupMaxKeyVersion(k)
		if !ok {
			continue // the release does not have this API yet
		}
		if got, ok := maxOf[k]; !ok || got < want {
			return false
		}
	}
	for _, k := range adminAPIs {
		want, ok := rel.LookupMaxKeyVersion(k)
		if got, adv := maxOf[k]; ok && adv && got < want {
			return false
		}
	}
	return true
}

// highestPatch returns the newest sarama version with v's major and minor, never above
// sarama.MaxVersion.
func highestPatch(v sarama.KafkaVersion) sarama.KafkaVersion {
	prefix := minorPrefix(v)
	out := v
	for _, s := range sarama.SupportedVersions {
		if minorPrefix(s) == prefix && !out.IsAtLeast(s) && sarama.MaxVersion.IsAtLeast(s) {
			out = s
		}
	}
	return out
}

// minorPrefix is "major.minor." for 1.x and later and "0.minor.patch." before 1.0, where
// the third component was the minor release.
func minorPrefix(v sarama.KafkaVersion) string {
	parts := strings.Split(v.String(), ".")
	if parts[0] == "0" && len(parts) >= 3 {
		return strings.Join(parts[:3], ".") + "."
	}
	return strings.Join(parts[:2], ".") + "."
}

// Detect connects to each address in turn (a plain sarama.Broker, no metadata), sends
// ApiVersions v3 and returns FromAPIVersions of the first answer. base supplies the
// network settings (TLS, SASL, client id); it is copied, not modified, and may be nil.
//
// The whole detection is bounded by ctx, or by DefaultTimeout if ctx has no deadline; an
// unreachable or silent address returns an error wrapping context.DeadlineExceeded or the
// dial error by then. If every address fails, the error lists each failure; when the
// deadline passed first (an address accepts connections but never answers), it wraps
// ErrNoAnswer too and reads "no Kafka answered at ADDRS within 15 s (...)".
func Detect(ctx context.Context, addrs []string, base *sarama.Config) (sarama.KafkaVersion, error) {
	if len(addrs) == 0 {
		return sarama.KafkaVersion{}, errors.New("detect kafka version: no broker addresses")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	budget := time.Until(deadline)
	var errs *multierror.Error
	for _, addr := range addrs {
		keys, err := apiVersions(ctx, addr, base)
		if err != nil {
			errs = multierror.Append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		v, err := FromAPIVersions(keys)
		if err != nil {
			return sarama.KafkaVersion{}, fmt.Errorf("detect kafka version at %s: %w", addr, err)
		}
		return v, nil
	}
	errs.ErrorFormat = oneLine
	if ctx.Err() != context.Canceled && slices.ContainsFunc(errs.WrappedErrors(), isTimeout) {
		// An address that accepts connections but never answers (a wrong
		// port of another service, a stopped broker process behind a
		// proxy, a firewall that drops): say so, in the words a user
		// looks for, before the details.
		return sarama.KafkaVersion{}, fmt.Errorf("%w at %s within %s (%w)", ErrNoAnswer, strings.Join(addrs, ", "), seconds(budget), errs.ErrorOrNil())
	}
	return sarama.KafkaVersion{}, fmt.Errorf("detect kafka version: %w", errs.ErrorOrNil())
}

// ErrNoAnswer is returned (wrapped) by Detect when no address answered
// ApiVersions before the deadline: "no Kafka answered at ADDRS within 15 s".
var ErrNoAnswer = errors.New("no Kafka answered")

// isTimeout reports whether err is a deadline that passed: the context's,
// or a connection's read, write or dial timeout (set to the time left).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// seconds renders d as "15 s" or "1.5 s" (tenths of a second).
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Round(100*time.Millisecond).Seconds(), 'f', -1, 64) + " s"
}

// apiVersions sends one ApiVersions request to addr, giving up when ctx is done.
func apiVersions(ctx context.Context, addr string, base *sarama.Config) ([]sarama.ApiVersionsResponseKey, error) {
	conf := sarama.NewConfig()
	if base != nil {
		c := *base
		conf = &c
	}
	// ApiVersions v3 (KIP-511) needs Version ≥ 2.4 in sarama; Open must not send its own
	// ApiVersions, and every network wait must end by the deadline.
	conf.Version = sarama.V2_4_0_0
	conf.ApiVersionsRequest = false
	deadline, _ := ctx.Deadline()
	left := time.Until(deadline)
	if left <= 0 {
		return nil, fmt.Errorf("api versions from %s: %w", addr, context.DeadlineExceeded)
	}
	for _, d := range []*time.Duration{&conf.Net.DialTimeout, &conf.Net.ReadTimeout, &conf.Net.WriteTimeout} {
		if *d <= 0 || *d > left {
			*d = left
		}
	}
	conf.Metadata.Retry.Max = 0
	if err := conf.Validate(); err != nil {
		return nil, fmt.Errorf("api versions from %s: config: %w", addr, err)
	}

	b := sarama.NewBroker(addr)
	type result struct {
		resp *sarama.ApiVersionsResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		if err := b.Open(conf); err != nil {
			done <- result{err: err}
			return
		}
		resp, err := b.ApiVersions(&sarama.ApiVersionsRequest{
			Version:               3,
			ClientSoftwareName:    "runnel",
			ClientSoftwareVersion: "0",
		})
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		_ = b.Close()
		if r.err != nil {
			return nil, fmt.Errorf("api versions from %s: %w", addr, r.err)
		}
		if kerr := sarama.KError(r.resp.ErrorCode); kerr != sarama.ErrNoError {
			return nil, fmt.Errorf("api versions from %s: %w", addr, kerr)
		}
		return r.resp.ApiKeys, nil
	case <-ctx.Done():
		// The goroutine ends once its own timeouts (≤ the deadline) fire; closing the
		// broker lets it end sooner.
		go func() { <-done; _ = b.Close() }()
		return nil, fmt.Errorf("api versions from %s: %w", addr, ctx.Err())
	}
}

// oneLine formats several failures as "a; b" so that they fit a test log line.
func oneLine(es []error) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}
