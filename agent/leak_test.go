package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started is still
// running at the end (a cycle, follower, flush or timer that never stopped).
// Sarama's metrics registry keeps one goroutine for the process (go-metrics'
// meter arbiter), by design: the write tests run workers (runneltest).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}
