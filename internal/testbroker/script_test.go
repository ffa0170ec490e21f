package testbroker_test

import (
	"encoding/base64"
	"os/exec"
	"strings"
	"testing"
)

// TestClusterIDNeverStartsWithDash draws 512 cluster ids from scripts/kafka.
// An id starting with '-' makes `kafka-storage format --cluster-id ID` fail
// ("expected one argument"); a plain draw starts with '-' once in 64, so 512
// plain draws contain one with probability 1-(63/64)^512 > 0.9996.
func TestClusterIDNeverStartsWithDash(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns 512 subshells (about 2 s)")
	}
	out, err := exec.Command("bash", "../../scripts/kafka", "cluster-id", "512").Output()
	if err != nil {
		t.Fatalf("scripts/kafka cluster-id: %v", err)
	}
	ids := strings.Fields(string(out))
	if len(ids) != 512 {
		t.Fatalf("got %d ids, want 512", len(ids))
	}
	for _, id := range ids {
		if strings.HasPrefix(id, "-") {
			t.Fatalf("cluster id %q starts with '-'", id)
		}
		b, err := base64.RawURLEncoding.DecodeString(id)
		if err != nil || len(b) != 16 {
			t.Fatalf("cluster id %q is not 16 bytes of unpadded URL-safe base64 (%d bytes, %v)", id, len(b), err)
		}
	}
}
