package group

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started is still
// running at the end (a clock's wait or a commit sender that never stopped).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
