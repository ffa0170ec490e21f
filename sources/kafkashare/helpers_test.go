package kafkashare

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// EnvNoShareBrokers names a real Kafka cluster formatted with
// share.version=0 (scripts/kafka with RUNNEL_KAFKA_SHARE_VERSION=0; .ci/run
// starts one for TestShareGroupsDisabled).
const EnvNoShareBrokers = "RUNNEL_KAFKA_NOSHARE_BROKERS"

// noShareBrokers returns a cluster without share groups: the real one named
// by EnvNoShareBrokers, or a kfake broker answering like Kafka 4.4 with
// share.version=0 (ApiVersions lists the share APIs but no share.version
// feature; ShareGroupHeartbeat answers UNSUPPORTED_VERSION).
func noShareBrokers(t *testing.T) []string {
	t.Helper()
	if s := os.Getenv(EnvNoShareBrokers); s != "" {
		return strings.Split(s, ",")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrUpdateFeaturesRequest()
	fu := kmsg.NewUpdateFeaturesRequestFeatureUpdate()
	fu.Feature = "share.version"
	fu.MaxVersionLevel = 0
	fu.UpgradeType = 3 // unsafe downgrade
	req.FeatureUpdates = append(req.FeatureUpdates, fu)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Results {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("share.version=0: %v", err)
		}
	}
	c.ControlKey(kmsg.ShareGroupHeartbeat.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := r.(*kmsg.ShareGroupHeartbeatRequest).ResponseKind().(*kmsg.ShareGroupHeartbeatResponse)
		resp.ErrorCode = kerr.UnsupportedVersion.Code
		return resp, nil, true
	})
	return c.ListenAddrs()
}
