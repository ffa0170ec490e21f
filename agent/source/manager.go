package source

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Manager owns the shared-source groups of one worker, one group per key.
//
// Lock order: Manager.mu, then group.mu, then subscriber.mu. Code holding a
// group.mu never acquires Manager.mu; Token, Delivery and the
// poll/pump/scanner goroutines take only group.mu and subscriber.mu unless
// they terminate the group, which they do without holding group.mu. Bind and
// a Confirm inside the open window take subscriber.mu alone.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	cadence time.Duration // ack-timeout scanner period: max(10ms, AckTimeout/10)

	mu sync.Mutex
	// groups holds a key only while its group is live (starting or running).
	// Stop, StopAll and termination evict the key under mu in the same
	// critical section that changes the group's state, so a Subscribe that
	// arrives during teardown always builds a fresh group.
	groups map[string]*group
	// all holds every group whose runner has not finished (live or tearing
	// down). The runner removes its group just before closing group.done.
	all map[*group]struct{}
}

// NewManager returns a Manager. It returns an error when QueueSize or
// AckTimeout is negative (zero takes the default); deviation 5 from the
// reference, which accepted any value.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.QueueSize < 0 {
		return nil, fmt.Errorf("source: QueueSize must be > 0, got %d", cfg.QueueSize)
	}
	if cfg.AckTimeout < 0 {
		return nil, fmt.Errorf("source: AckTimeout must be > 0, got %s", cfg.AckTimeout)
	}
	if cfg.CohortGrace < 0 {
		return nil, fmt.Errorf("source: CohortGrace must be >= 0, got %s", cfg.CohortGrace)
	}
	if cfg.MaxInFlightBytes < 0 {
		return nil, fmt.Errorf("source: MaxInFlightBytes must be >= 0, got %d", cfg.MaxInFlightBytes)
	}
	if cfg.Overflow != FailSubscriber && cfg.Overflow != Backpressure {
		return nil, fmt.Errorf("source: unknown Overflow policy %d", cfg.Overflow)
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.MaxInFlightBytes == 0 {
		cfg.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	m := &Manager{
		cfg:     cfg,
		log:     cfg.Logger,
		now:     cfg.Now,
		cadence: max(minScanCadence, cfg.AckTimeout/10),
		groups:  make(map[string]*group),
		all:     make(map[*group]struct{}),
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.now == nil {
		m.now = time.Now
	}
	return m, nil
}

// Subscribe registers subscriber id on the ack-mode shared source key. The
// first subscriber of a key builds the group: after CohortGrace the factory
// is called once and its producer's poll loop starts. Later subscribers join
// the live group (their factory is ignored and may be nil) and count only for
// records fanned out after they joined.
//
// Errors: an empty key, a nil factory for a new group, or an id already
// subscribed to key.
func (m *Manager) Subscribe(key, id string, factory ProducerFactory) (*Subscription, error) {
	return m.subscribe(key, id, factory, nil)
}

// SubscribeFast registers subscriber id on the fast-path shared source key:
// records are fanned out with no resolution bookkeeping and no Advance;
// Delivery.Bind returns false and Delivery.Reject warns and does nothing. The
// first subscriber's open builds the group; later subscribers may pass nil.
func (m *Manager) SubscribeFast(key, id string, open OpenFunc) (*Subscription, error) {
	return m.subscribe(key, id, nil, open)
}

func (m *Manager) subscribe(key, id string, factory ProducerFactory, open OpenFunc) (*Subscription, error) {
	if key == "" {
		return nil, errors.New("source: key must not be empty")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[key]
	fresh := g == nil
	if fresh {
		if factory == nil && open == nil {
			return nil, fmt.Errorf("source: subscribe %s to %q: the first subscriber must supply a producer factory or an open function", id, key)
		}
		g = newGroup(m, key, factory, open)
	}
	g.mu.Lock()
	for _, s := range g.subs {
		if s.id == id {
			g.mu.Unlock()
			return nil, fmt.Errorf("source: subscriber %s already subscribed to source %q", id, key)
		}
	}
	s := &subscriber{g: g, id: id, notify: make(chan struct{}, 1)}
	g.subs = append(g.subs, s)
	g.mu.Unlock()
	if fresh {
		m.groups[key] = g
		m.all[g] = struct{}{}
		go g.run()
	}
	return &Subscription{s: s}, nil
}

// Stop stops the group of key, if any: it delivers ErrGroupStopped to every
// subscriber, cancels the poll, drains the lane prefixes resolved at the time
// of the call through Advance, abandons the rest (the broker redelivers them),
// closes the producer, and waits for all of that, including a group of key
// that was already tearing down. Used on partition revoke.
func (m *Manager) Stop(key string) {
	m.mu.Lock()
	if g := m.groups[key]; g != nil {
		delete(m.groups, key)
		g.mu.Lock()
		g.beginStopLocked(nil)
		g.mu.Unlock()
	}
	var wait []*group
	for g := range m.all {
		if g.key == key {
			wait = append(wait, g)
		}
	}
	m.mu.Unlock()
	for _, g := range wait {
		<-g.done
	}
}

// StopAll stops every group like Stop and waits for all of them.
func (m *Manager) StopAll() {
	m.mu.Lock()
	live := m.groups
	m.groups = make(map[string]*group)
	for _, g := range live {
		g.mu.Lock()
		g.beginStopLocked(nil)
		g.mu.Unlock()
	}
	wait := make([]*group, 0, len(m.all))
	for g := range m.all {
		wait = append(wait, g)
	}
	m.mu.Unlock()
	for _, g := range wait {
		<-g.done
	}
}
