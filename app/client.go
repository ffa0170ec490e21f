package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// Client is a connection to a Kafka cluster for the tools that work beside
// an app's workers: ReadTable, GroupLag, WaitForLag0, SendInput, SendLines
// and package replay take one. It hides the Kafka client library Runnel
// uses, so that a change of that library is not a change of Runnel's API.
// A Client is safe for concurrent use; Close it when done.
type Client struct {
	clientHandle // replay reaches the connection through it
	sc           sarama.Client
}

// clientHandle is unexported so that the handle is no field of Client's API.
type clientHandle = kafka.ClientHandle

func wrapClient(sc sarama.Client) *Client {
	return &Client{clientHandle: kafka.NewClientHandle(sc), sc: sc}
}

// Dial connects to brokers ("host:port" each) and returns once one of them
// answered (the Kafka version is detected from its ApiVersions answer).
// Of opts only the connection options apply (WithTLS, WithTLSFiles,
// WithSASL); the RUNNEL_* environment does not (App.Client reads it, with the
// app's options). Errors name the brokers; a refused SASL login says so.
func Dial(ctx context.Context, brokers []string, opts ...Option) (*Client, error) {
	if len(brokers) == 0 {
		return nil, errors.New("dial: no brokers")
	}
	var c Config
	for _, o := range opts {
		o(&c)
	}
	sec, err := c.security()
	if err != nil {
		return nil, fmt.Errorf("dial %v: %w", brokers, err)
	}
	sc, _, err := connect(ctx, sec, brokers, "runnel-client", kafka.Timeouts{}, nil)
	if err != nil {
		return nil, err
	}
	return wrapClient(sc), nil
}

// Client connects to the app's brokers with its security settings (options
// given to New, then the RUNNEL_* environment), as the CLI's commands do.
// The app's configuration is validated first.
func (a *App) Client(ctx context.Context) (*Client, error) {
	sc, err := a.client(ctx)
	if err != nil {
		return nil, err
	}
	return wrapClient(sc), nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.sc.Close() }

// Brokers returns the addresses of the cluster's brokers the client knows
// of (from the latest metadata).
func (c *Client) Brokers() []string {
	var out []string
	for _, b := range c.sc.Brokers() {
		out = append(out, b.Addr())
	}
	return out
}
