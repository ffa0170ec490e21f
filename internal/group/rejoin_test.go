package group

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestRejoinedOnlyForTheNextGeneration: a transaction's offset commit
// refused for generation 4 is sent again under generation 5 once the
// rejoining member's assignment of generation 5 arrived (reported to
// resent); it is not sent again when generation 6 is already known, when the
// member is not rejoining, or when the deadline passed.
func TestRejoinedOnlyForTheNextGeneration(t *testing.T) {
	meta := sarama.NewConsumerGroupMetadata("g")
	meta.GenerationID = 4
	meta.MemberID = "m-1"
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)

	var r Rejoins
	r.Assigned(4)
	r.joining.Store(true) // its JoinGroup went out (RejoinStrategy.SubscriptionUserData)
	var got [3]int32
	resent := func(refused, g int32, _ time.Duration) { got = [3]int32{refused, g, 1} }
	res := make(chan *sarama.ConsumerGroupMetadata, 1)
	go func() {
		next, ok := r.Rejoined(meta, deadline, resent)(ctx, 4)
		if !ok {
			next = nil
		}
		res <- next
	}()
	r.Assigned(5) // the assignment of generation 5 arrives while the commit waits
	next := <-res
	if next == nil || next.GenerationID != 5 || next.MemberID != "m-1" {
		t.Fatalf("commit sent again as %+v, want generation 5 of member m-1", next)
	}
	if got != [3]int32{4, 5, 1} || meta.GenerationID != 4 {
		t.Fatalf("resent reported %v (meta generation %d), want refused 4, generation 5; meta unchanged", got, meta.GenerationID)
	}
	if r.Joining() || r.Generation() != 5 {
		t.Fatalf("after the assignment: joining %v, generation %d; want false, 5", r.Joining(), r.Generation())
	}

	r.joining.Store(true)
	r.Assigned(6)
	r.joining.Store(true)
	if _, ok := r.Rejoined(meta, deadline, resent)(ctx, 4); ok {
		t.Fatal("refused generation 4 sent again while generation 6 is known")
	}
	r.joining.Store(false)
	if _, ok := r.Rejoined(meta, deadline, resent)(ctx, 6); ok {
		t.Fatal("sent again while the member is not rejoining (it left the group)")
	}
	r.joining.Store(true)
	if _, ok := r.Rejoined(meta, time.Now(), resent)(ctx, 6); ok {
		t.Fatal("sent again past the deadline")
	}
}
