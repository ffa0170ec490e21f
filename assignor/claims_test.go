package assignor

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/IBM/sarama"
)

// The leader's Strategy logs foreign and corrupt member user data and plans
// those members without state; a member claiming a generation the group has
// not reached is bounded once the leader knows the group's generation, and
// when the plan trusted it (the leader knew no bound yet) AssignmentData asks
// for a follow-up rebalance.
func TestStrategyDistrustsClaims(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := Config{Changelogs: map[string]int32{"cl": 4}, Replicas: 1, Logger: log}
	leader := NewStrategy(cfg)
	sub := func(gen int32, actives []int32) []byte {
		return encodeSubscription(subscription{Generation: gen,
			PrevActives: map[string][]int32{"src": actives, "cl": actives}})
	}
	corrupt := sub(5, []int32{3})
	corrupt[len(corrupt)/2] ^= 0x10
	members := map[string]sarama.ConsumerGroupMemberMetadata{
		"a": {Topics: []string{"src"}, UserData: sub(5, []int32{0, 1})},
		"b": {Topics: []string{"src"}, UserData: sub(5, []int32{2, 3})},
		"c": {Topics: []string{"src"}, UserData: sub(1<<31-1, []int32{0, 1, 2})},                            // forged
		"d": {Topics: []string{"src"}, UserData: []byte{0, 1, 0, 0, 0, 1, 0, 3, 's', 'r', 'c', 0, 0, 0, 0}}, // sarama sticky's
		"e": {Topics: []string{"src"}, UserData: corrupt},
	}
	topics := map[string][]int32{"src": {0, 1, 2, 3}}
	leader.mu.Lock()
	leader.groupGen = 5 // the leader was in generation 5
	leader.mu.Unlock()
	plan, err := leader.Plan(members, topics)
	if err != nil {
		t.Fatal(err)
	}
	if got := plan["c"]["src"]; len(got) > 1 {
		t.Errorf("forged claimant got %v", got)
	}
	for _, want := range []string{"member=c", "foreign=true", "corrupt=true", "generation above the group"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	select {
	case <-leader.ProbeRequested():
		t.Fatal("probe requested although the plan bounded the claim")
	default:
	}

	// A fresh leader (no generation known): the claim is outvoted by the
	// corroborated generation 5, and AssignmentData for generation 6 notices
	// it and asks for a follow-up rebalance.
	fresh := NewStrategy(cfg)
	fresh.cfg.Logger, fresh.log = log, log
	if _, err := fresh.Plan(members, topics); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.AssignmentData("c", nil, 6); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fresh.ProbeRequested():
	default:
		t.Fatal("no follow-up rebalance requested for a claim above the group's generation")
	}
}
