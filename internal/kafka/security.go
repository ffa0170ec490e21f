package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms Runnel offers (Kafka's sasl.mechanism values).
const (
	// SASLPlain is PLAIN (RFC 4616, KIP-43): user and password sent as they
	// are, so only over TLS outside a test.
	SASLPlain = "PLAIN"
	// SASLSCRAMSHA256 is SCRAM-SHA-256 (RFC 7677, KIP-84): the password
	// never crosses the network.
	SASLSCRAMSHA256 = "SCRAM-SHA-256"
	// SASLSCRAMSHA512 is SCRAM-SHA-512 (RFC 5802 with SHA-512, KIP-84).
	SASLSCRAMSHA512 = "SCRAM-SHA-512"
)

// SASLMechanisms lists the mechanisms SASL.Mechanism may name.
var SASLMechanisms = []string{SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512}

// SASL holds SASL credentials. The zero value is no SASL. String and
// LogValue never show the password.
type SASL struct {
	// Mechanism is one of SASLMechanisms; empty: no SASL.
	Mechanism string
	// User is the SASL user name (Kafka's principal User:<User>).
	User string
	// Password is the user's password; never logged or put in an error.
	Password string `json:"-"`
}

// String describes s without its password.
func (s SASL) String() string {
	if s.Mechanism == "" {
		return "none"
	}
	return fmt.Sprintf("%s user %q", s.Mechanism, s.User)
}

// LogValue implements slog.LogValuer: mechanism and user, never the password.
func (s SASL) LogValue() slog.Value {
	if s.Mechanism == "" {
		return slog.StringValue("none")
	}
	return slog.GroupValue(slog.String("mechanism", s.Mechanism), slog.String("user", s.User))
}

// Validate checks the mechanism and that user and password are set with one.
// Errors name the mechanism and the user, never the password.
func (s SASL) Validate() error {
	switch s.Mechanism {
	case "":
		if s.User != "" || s.Password != "" {
			return errors.New("SASL user or password given without a mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return nil
	case SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512:
	default:
		return fmt.Errorf("SASL mechanism %q: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
	}
	if s.User == "" || s.Password == "" {
		return fmt.Errorf("SASL %s needs a user and a password", s.Mechanism)
	}
	return nil
}

// Security is what a client needs to reach a secured cluster: TLS (nil:
// plaintext) and SASL. The zero value is a plaintext, unauthenticated
// connection (Kafka's security.protocol PLAINTEXT); TLS alone is SSL, SASL
// alone SASL_PLAINTEXT, both SASL_SSL.
type Security struct {
	TLS  *tls.Config
	SASL SASL
}

// Protocol returns Kafka's name for the security protocol s gives:
// PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
func (s Security) Protocol() string {
	switch {
	case s.TLS != nil && s.SASL.Mechanism != "":
		return "SASL_SSL"
	case s.TLS != nil:
		return "SSL"
	case s.SASL.Mechanism != "":
		return "SASL_PLAINTEXT"
	}
	return "PLAINTEXT"
}

// Apply sets c's network security from s: Net.TLS, and Net.SASL with a
// SaslAuthenticate exchange (handshake v1, KIP-152) and, for SCRAM, the SCRAM
// client of franz-go's pkg/sasl/scram. The TLS config is shared, not copied.
func (s Security) Apply(c *sarama.Config) {
	if s.TLS != nil {
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = s.TLS
	}
	if s.SASL.Mechanism == "" {
		return
	}
	c.Net.SASL.Enable = true
	c.Net.SASL.Handshake = true
	c.Net.SASL.Version = sarama.SASLHandshakeV1
	c.Net.SASL.Mechanism = sarama.SASLMechanism(s.SASL.Mechanism)
	c.Net.SASL.User = s.SASL.User
	c.Net.SASL.Password = s.SASL.Password
	switch s.SASL.Mechanism {
	case SASLSCRAMSHA256:
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: false} }
	case SASLSCRAMSHA512:
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{sha512: true} }
	}
}

// Base returns the Sarama configuration every client Runnel builds starts
// from: Sarama's defaults, clientID and the network security of sec. Workers
// add the producer and consumer settings with NewSecureConfig; commands that
// only read metadata use it as it is.
func Base(clientID string, sec Security) *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = clientID
	sec.Apply(c)
	return c
}

// scramClient adapts franz-go's SCRAM session (RFC 5802) to sarama's
// SCRAMClient: Step("") gives the client-first message, the server-first
// message gives the client-final one, and the server-final message is
// verified (the server proves it knows the salted password too).
type scramClient struct {
	sha512  bool
	session sasl.Session
	first   []byte
	done    bool
}

// Begin implements sarama.SCRAMClient.
func (s *scramClient) Begin(user, password, authzID string) error {
	a := scram.Auth{User: user, Pass: password, Zid: authzID}
	m := a.AsSha256Mechanism()
	if s.sha512 {
		m = a.AsSha512Mechanism()
	}
	sess, first, err := m.Authenticate(context.Background(), "")
	if err != nil {
		return fmt.Errorf("SASL %s: %w", m.Name(), err)
	}
	s.session, s.first = sess, first
	return nil
}

// Step implements sarama.SCRAMClient.
func (s *scramClient) Step(challenge string) (string, error) {
	if s.session == nil {
		return "", errors.New("SASL SCRAM: Step before Begin")
	}
	if s.first != nil {
		first := s.first
		s.first = nil
		return string(first), nil
	}
	done, resp, err := s.session.Challenge([]byte(challenge))
	if err != nil {
		return "", fmt.Errorf("SASL SCRAM: %w", err)
	}
	s.done = done
	return string(resp), nil
}

// Done implements sarama.SCRAMClient.
func (s *scramClient) Done() bool { return s.done }
