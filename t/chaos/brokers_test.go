package main

import (
	"slices"
	"testing"
	"time"
)

func TestBrokerPlanAllRunsEveryFaultInOrder(t *testing.T) {
	kinds, err := BrokerPlan{Schedule: BrokerAll}.kinds()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{BrokerRolling, BrokerLeaderKill, BrokerSigstop, BrokerQuota}; !slices.Equal(kinds, want) {
		t.Fatalf("all = %v, want %v", kinds, want)
	}
	if _, err := (BrokerPlan{Schedule: "reboot"}).kinds(); err == nil {
		t.Fatal("an unknown schedule was accepted")
	}
}

func TestBrokerPlanDefaultsAreTheIssues(t *testing.T) {
	p := BrokerPlan{Schedule: BrokerRolling}.withDefaults()
	if p.RollingRounds != 2 || p.KillDown != 20*time.Second || p.StopFor != 8*time.Second {
		t.Fatalf("defaults %+v: want 2 rolling rounds, 20 s down after kill -9, 8 s SIGSTOP", p)
	}
}

func TestOvercountIsRelativeToWhatIsExpected(t *testing.T) {
	if got := (Row{Got: 105, Want: 100}).Overcount(); got != 5 {
		t.Fatalf("over-count of 105 for 100 = %v, want 5", got)
	}
	if got := (Row{}).Overcount(); got != 0 {
		t.Fatalf("over-count with nothing expected = %v, want 0", got)
	}
}
