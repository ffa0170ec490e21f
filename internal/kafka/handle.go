package kafka

import "github.com/IBM/sarama"

// ClientHandle carries a Sarama client inside a public type (app.Client)
// without making it part of that type's API: the public type embeds it
// through an unexported alias, which gives the type the unexported method
// ClientCarrier asks for and no exported field or method. Packages of the
// module that take the public type (replay) reach the client with
// SaramaClient; users cannot, and the client library can change without a
// change of Runnel's API.
type ClientHandle struct{ c sarama.Client }

// NewClientHandle wraps c.
func NewClientHandle(c sarama.Client) ClientHandle { return ClientHandle{c: c} }

func (h ClientHandle) saramaClient() sarama.Client { return h.c }

// ClientCarrier is implemented by the types that embed a ClientHandle, and
// by no type outside this module (its method is unexported).
type ClientCarrier interface{ saramaClient() sarama.Client }

// SaramaClient returns the client c carries (nil for a zero handle).
func SaramaClient(c ClientCarrier) sarama.Client { return c.saramaClient() }
