package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started is still
// running at the end (a cycle, follower, flush or timer that never stopped).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
