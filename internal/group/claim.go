package group

import (
	"sync"

	"github.com/IBM/sarama"
)

// ClaimFeed hands a claim's message channel to the first producer of the
// partition and watches for the claim's end afterwards: the channel closes when
// the partition is revoked (cooperative rebalancing) or the session ends.
// Sarama claims cannot seek, so once a producer seeks back it reads the
// partition with its own PartitionConsumer and the feed discards what the
// claim still delivers, only to notice its end.
type ClaimFeed struct {
	claim   sarama.ConsumerGroupClaim
	revoked chan struct{} // closed when the claim's channel closed

	mu       sync.Mutex
	taken    bool
	released bool
	once     sync.Once
}

// NewClaimFeed returns the feed of claim.
func NewClaimFeed(claim sarama.ConsumerGroupClaim) *ClaimFeed {
	return &ClaimFeed{claim: claim, revoked: make(chan struct{})}
}

// Take returns the claim's channel the first time, nil afterwards.
func (f *ClaimFeed) Take() <-chan *sarama.ConsumerMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.taken {
		return nil
	}
	f.taken = true
	return f.claim.Messages()
}

// Ended records that the claim's channel closed.
func (f *ClaimFeed) Ended() { f.once.Do(func() { close(f.revoked) }) }

// Release says the producer that took the channel stopped reading it: the
// rest is discarded until the claim closes (the goroutine ends when Sarama
// closes the claim, at the latest right after ConsumeClaim returns).
func (f *ClaimFeed) Release() {
	f.mu.Lock()
	if !f.taken {
		f.taken = true
	}
	if f.released {
		f.mu.Unlock()
		return
	}
	f.released = true
	f.mu.Unlock()
	go func() {
		for range f.claim.Messages() {
		}
		f.Ended()
	}()
}

// IsRevoked reports whether the claim's channel closed.
func (f *ClaimFeed) IsRevoked() bool {
	select {
	case <-f.revoked:
		return true
	default:
		return false
	}
}

// Revoked returns a channel closed when the claim's channel closed (the
// partition was revoked or the session ended).
func (f *ClaimFeed) Revoked() <-chan struct{} { return f.revoked }

// Claim returns the Sarama claim the feed reads (its initial offset and
// highwater mark).
func (f *ClaimFeed) Claim() sarama.ConsumerGroupClaim { return f.claim }
