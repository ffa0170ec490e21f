package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

// Broker schedules of the three-broker tier (-brokers3 -broker-schedule):
// what operators do to a Kafka cluster while Runnel's workers run on it.
const (
	// BrokerRolling restarts the three brokers one after the other (SIGTERM,
	// a controlled shutdown; start; wait until no partition is
	// under-replicated; next), twice.
	BrokerRolling = "rolling"
	// BrokerLeaderKill kills (SIGKILL) the broker leading the most
	// partitions and starts it again 20 s later.
	BrokerLeaderKill = "leaderkill"
	// BrokerSigstop stops (SIGSTOP) the broker leading the most partitions
	// for 8 s, then continues it (SIGCONT): a broker that hangs (a long GC
	// pause, a frozen VM) without closing its connections.
	BrokerSigstop = "sigstop"
	// BrokerQuota puts a produce quota (producer_byte_rate) on the app's
	// client ID for 30 s, then removes it.
	BrokerQuota = "quota"
	// BrokerAll is the four above, in that order.
	BrokerAll = "all"
)

// brokerSchedules lists the schedules -broker-schedule accepts.
var brokerSchedules = []string{BrokerRolling, BrokerLeaderKill, BrokerSigstop, BrokerQuota, BrokerAll}

// BrokerPlan tunes a broker schedule; the zero value is the plan.
type BrokerPlan struct {
	Schedule       string
	RollingRounds  int           // rolling restarts of all three brokers; 0: 2
	KillDown       time.Duration // how long the killed leader stays down; 0: 20 s
	StopFor        time.Duration // how long SIGSTOP lasts; 0: 8 s
	QuotaRate      float64       // producer_byte_rate per broker in bytes/s; 0: 16 KiB/s
	QuotaFor       time.Duration // how long the quota stays; 0: 30 s
	Warmup, Settle time.Duration // live input before the first and after the last fault
}

func (p BrokerPlan) withDefaults() BrokerPlan {
	if p.RollingRounds == 0 {
		p.RollingRounds = 2
	}
	if p.KillDown == 0 {
		p.KillDown = 20 * time.Second
	}
	if p.StopFor == 0 {
		p.StopFor = 8 * time.Second
	}
	if p.QuotaRate == 0 {
		p.QuotaRate = 16 << 10
	}
	if p.QuotaFor == 0 {
		p.QuotaFor = 30 * time.Second
	}
	return p
}

// kinds returns the schedule's faults in order.
func (p BrokerPlan) kinds() ([]string, error) {
	switch p.Schedule {
	case BrokerRolling, BrokerLeaderKill, BrokerSigstop, BrokerQuota:
		return []string{p.Schedule}, nil
	case BrokerAll:
		return []string{BrokerRolling, BrokerLeaderKill, BrokerSigstop, BrokerQuota}, nil
	}
	return nil, fmt.Errorf("broker schedule %q: one of %s", p.Schedule, strings.Join(brokerSchedules, ", "))
}

// brokerOps acts on the nodes of a scripts/kafka cluster (node N of the
// script is broker ID N) and reads the cluster's state through client.
type brokerOps struct {
	script, home string // scripts/kafka and its RUNNEL_KAFKA_HOME (RUNNEL_KAFKA_RUN passes through the environment)
	client       sarama.Client
	admin        sarama.ClusterAdmin
	logf         func(string, ...any)
	steps        []string // what was done, with timings, for the report
	lag          func() (int64, error)
}

func (b *brokerOps) record(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	b.steps = append(b.steps, s)
	b.logf("chaos: broker: %s", s)
}

func (b *brokerOps) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.script, args...)
	cmd.Env = append(os.Environ(), "RUNNEL_KAFKA_HOME="+b.home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", b.script, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// signal sends sig to node n's JVM.
func (b *brokerOps) signal(ctx context.Context, n int32, sig syscall.Signal) error {
	out, err := b.run(ctx, "pid", strconv.Itoa(int(n)))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(out)
	if err != nil {
		return fmt.Errorf("pid of node %d: %q", n, out)
	}
	return syscall.Kill(pid, sig)
}

// partitionState is the cluster's view of every partition of every topic
// (internal ones included): leaders per broker, and the partitions whose
// in-sync replicas are fewer than their replicas, or that have no leader.
type partitionState struct {
	leaders  map[int32]int // partitions led, per broker ID
	under    []string      // "topic[p] isr [..] of [..]"
	total    int
	brokers  int
	problems int
}

// state reads the metadata of every topic from the cluster.
func (b *brokerOps) state() (partitionState, error) {
	st := partitionState{leaders: map[int32]int{}}
	if err := b.client.RefreshMetadata(); err != nil {
		return st, err
	}
	st.brokers = len(b.client.Brokers())
	topics, err := b.admin.ListTopics()
	if err != nil {
		return st, err
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Strings(names)
	md, err := b.admin.DescribeTopics(names)
	if err != nil {
		return st, err
	}
	for _, t := range md {
		if t.Err != sarama.ErrNoError {
			st.problems++
			continue
		}
		for _, p := range t.Partitions {
			st.total++
			if p.Leader >= 0 && p.Err != sarama.ErrLeaderNotAvailable {
				st.leaders[p.Leader]++
			}
			if p.Leader < 0 || len(p.Isr) < len(p.Replicas) {
				st.under = append(st.under, fmt.Sprintf("%s[%d] leader %d isr %v of %v", t.Name, p.ID, p.Leader, p.Isr, p.Replicas))
			}
		}
	}
	return st, nil
}

// waitReplicated waits until every partition has a leader and all its
// replicas in sync, seen twice in a row 1 s apart (a broker's metadata
// cache trails the controller), and all three brokers are registered.
func (b *brokerOps) waitReplicated(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	ok := 0
	var last partitionState
	var lastErr error
	for {
		st, err := b.state()
		switch {
		case err != nil:
			lastErr, ok = err, 0
		case len(st.under) == 0 && st.problems == 0 && st.brokers >= 3 && st.total > 0:
			ok++
		default:
			last, lastErr, ok = st, nil, 0
		}
		if ok >= 2 {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			if lastErr != nil {
				return 0, fmt.Errorf("under-replicated partitions did not clear within %s: %w", timeout, lastErr)
			}
			ex := last.under
			if len(ex) > 3 {
				ex = ex[:3]
			}
			return 0, fmt.Errorf("under-replicated partitions did not clear within %s: %d of %d still under, e.g. %s",
				timeout, len(last.under), last.total, strings.Join(ex, "; "))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// busiestLeader returns the broker leading the most partitions.
func (b *brokerOps) busiestLeader() (int32, int, int, error) {
	st, err := b.state()
	if err != nil {
		return 0, 0, 0, err
	}
	var best int32 = -1
	for id, n := range st.leaders {
		if best < 0 || n > st.leaders[best] || (n == st.leaders[best] && id < best) {
			best = id
		}
	}
	if best < 0 {
		return 0, 0, 0, errors.New("no partition has a leader")
	}
	return best, st.leaders[best], st.total, nil
}

func (b *brokerOps) lagNote() string {
	if b.lag == nil {
		return ""
	}
	n, err := b.lag()
	if err != nil {
		return fmt.Sprintf(" (lag: %v)", err)
	}
	return fmt.Sprintf(" (group lag %d)", n)
}

const replicatedTimeout = 3 * time.Minute

// rolling restarts nodes 1..3 one at a time, rounds times.
func (b *brokerOps) rolling(ctx context.Context, rounds int) error {
	for r := 1; r <= rounds; r++ {
		for n := 1; n <= 3; n++ {
			t0 := time.Now()
			if _, err := b.run(ctx, "stop", "--node", strconv.Itoa(n)); err != nil {
				return err
			}
			stopped := time.Since(t0)
			if _, err := b.run(ctx, "restart-node", strconv.Itoa(n)); err != nil {
				return err
			}
			back := time.Since(t0) - stopped
			repl, err := b.waitReplicated(ctx, replicatedTimeout)
			if err != nil {
				return fmt.Errorf("rolling restart %d, node %d: %w", r, n, err)
			}
			b.record("rolling %d/%d node %d: SIGTERM stop %.1fs, start %.1fs, replicated %.1fs%s",
				r, rounds, n, stopped.Seconds(), back.Seconds(), repl.Seconds(), b.lagNote())
		}
	}
	return nil
}

// leaderKill SIGKILLs the busiest leader, restarts it after down.
func (b *brokerOps) leaderKill(ctx context.Context, down time.Duration) error {
	n, led, total, err := b.busiestLeader()
	if err != nil {
		return err
	}
	if err := b.signal(ctx, n, syscall.SIGKILL); err != nil {
		return err
	}
	b.record("kill -9 node %d (leader of %d of %d partitions)%s", n, led, total, b.lagNote())
	if err := sleepCtx(ctx, down); err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := b.run(ctx, "restart-node", strconv.Itoa(int(n))); err != nil {
		return err
	}
	back := time.Since(t0)
	repl, err := b.waitReplicated(ctx, replicatedTimeout)
	if err != nil {
		return fmt.Errorf("after kill -9 of node %d: %w", n, err)
	}
	b.record("node %d restarted after %s: start %.1fs, replicated %.1fs%s", n, down, back.Seconds(), repl.Seconds(), b.lagNote())
	return nil
}

// sigstop freezes the busiest leader for d.
func (b *brokerOps) sigstop(ctx context.Context, d time.Duration) error {
	n, led, total, err := b.busiestLeader()
	if err != nil {
		return err
	}
	if err := b.signal(ctx, n, syscall.SIGSTOP); err != nil {
		return err
	}
	b.record("SIGSTOP node %d (leader of %d of %d partitions)%s", n, led, total, b.lagNote())
	serr := sleepCtx(ctx, d)
	// Continue it even when the run is interrupted: a stopped JVM would
	// outlive the run.
	if err := b.signal(context.Background(), n, syscall.SIGCONT); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	repl, err := b.waitReplicated(ctx, replicatedTimeout)
	if err != nil {
		return fmt.Errorf("after SIGSTOP of node %d: %w", n, err)
	}
	b.record("SIGCONT node %d after %s: replicated %.1fs%s", n, d, repl.Seconds(), b.lagNote())
	return nil
}

// quota throttles the produce requests of clientID (all of the app's
// workers: they share one client.id) to rate bytes/s per broker for d.
func (b *brokerOps) quota(ctx context.Context, clientID string, rate float64, d time.Duration) error {
	entity := []sarama.QuotaEntityComponent{{EntityType: sarama.QuotaEntityClientID, MatchType: sarama.QuotaMatchExact, Name: clientID}}
	if err := b.admin.AlterClientQuotas(entity, sarama.ClientQuotasOp{Key: "producer_byte_rate", Value: rate}, false); err != nil {
		return fmt.Errorf("set the produce quota of %s: %w", clientID, err)
	}
	b.record("produce quota on client.id %s: producer_byte_rate %.0f B/s per broker for %s%s", clientID, rate, d, b.lagNote())
	serr := sleepCtx(ctx, d)
	if err := b.admin.AlterClientQuotas(entity, sarama.ClientQuotasOp{Key: "producer_byte_rate", Remove: true}, false); err != nil {
		return fmt.Errorf("remove the produce quota of %s: %w", clientID, err)
	}
	if serr != nil {
		return serr
	}
	b.record("produce quota removed%s", b.lagNote())
	return nil
}

// checkTopics reports whether every topic whose name starts with prefix has
// replication factor rf and min.insync.replicas isr, and how many there are.
func checkTopics(admin sarama.ClusterAdmin, prefix string, rf int, isr string) (int, []string, error) {
	topics, err := admin.ListTopics()
	if err != nil {
		return 0, nil, err
	}
	var names []string
	for t, d := range topics {
		if strings.HasPrefix(t, prefix) {
			names = append(names, t)
			if int(d.ReplicationFactor) != rf {
				return len(names), nil, fmt.Errorf("topic %s has replication factor %d, want %d", t, d.ReplicationFactor, rf)
			}
		}
	}
	sort.Strings(names)
	var bad []string
	res := make([]*sarama.ConfigResource, 0, len(names))
	for _, t := range names {
		res = append(res, &sarama.ConfigResource{Type: sarama.TopicResource, Name: t, ConfigNames: []string{"min.insync.replicas"}})
	}
	results, err := admin.DescribeConfigs(res, sarama.DescribeConfigsOptions{})
	if err != nil {
		return len(names), nil, fmt.Errorf("describe the app's topics: %w", err)
	}
	for _, r := range results {
		if r.ErrorCode != sarama.ErrNoError {
			return len(names), nil, fmt.Errorf("describe %s: %w", r.Name, r.ErrorCode)
		}
		for _, e := range r.Configs {
			if e.Name == "min.insync.replicas" && e.Value != isr {
				bad = append(bad, fmt.Sprintf("%s min.insync.replicas=%s", r.Name, e.Value))
			}
		}
	}
	return len(names), bad, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// groupLag is the group's lag on topics: the sum over their partitions of
// the end offset minus the committed offset (transaction markers included,
// so a few per partition under exactly-once even when caught up).
func groupLag(client sarama.Client, group string, topics []string) (int64, error) {
	committed, err := committedOffsets(client, group, topics)
	if err != nil {
		return 0, err
	}
	var lag int64
	for t, ps := range committed {
		for p, c := range ps {
			end, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return 0, fmt.Errorf("end offset of %s[%d]: %w", t, p, err)
			}
			lag += max(end-c, 0)
		}
	}
	return lag, nil
}
