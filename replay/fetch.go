package replay

import (
	"errors"
	"io"
	"net"

	"github.com/IBM/sarama"
)

// retriable reports whether a fetch or commit error may go away after a
// metadata refresh and a retry (leadership or coordination moved, a broker
// connection dropped).
func retriable(err error) bool {
	for _, k := range []sarama.KError{sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable,
		sarama.ErrReplicaNotAvailable, sarama.ErrNotCoordinatorForConsumer, sarama.ErrConsumerCoordinatorNotAvailable,
		sarama.ErrOffsetsLoadInProgress, sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch,
		sarama.ErrRequestTimedOut, sarama.ErrNotEnoughReplicas} {
		if errors.Is(err, k) {
			return true
		}
	}
	var ne net.Error
	return errors.Is(err, sarama.ErrNotConnected) || errors.Is(err, io.EOF) || errors.As(err, &ne)
}
