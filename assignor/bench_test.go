package assignor

import (
	"fmt"
	"testing"
)

// benchCluster is a steady-state cluster: P partitions in one stateful group
// (two source topics and a changelog), N members, R replicas, every member
// reporting the previous plan with one member removed (so promotions run).
func benchCluster(b *testing.B, p int32, n, r int) Cluster {
	c := Cluster{Members: members(n, "a", "b"), Topics: map[string]int32{"a": p, "b": p}, Changelogs: map[string]int32{"cl": p}, Replicas: r}
	plan, err := PlanAssignment(c)
	if err != nil {
		b.Fatal(err)
	}
	c.Members = feedBack(c.Members, plan)[1:]
	return c
}

func BenchmarkPlan(b *testing.B) {
	for _, tc := range []struct {
		p    int32
		n, r int
	}{{1024, 128, 1}, {256, 64, 8}, {1024, 128, 0}} {
		b.Run(fmt.Sprintf("P=%d/N=%d/R=%d", tc.p, tc.n, tc.r), func(b *testing.B) {
			c := benchCluster(b, tc.p, tc.n, tc.r)
			b.ResetTimer()
			for b.Loop() {
				if _, err := PlanAssignment(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
