package app

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
)

// The status page's answers from the brokers (the group's members, the
// changelog end offsets of the table copies) are cached: Status asks for a
// refresh when they are older than brokerFresh, or when they lack a table
// copy the worker holds now, and waits for it at most brokerWait after the
// refresh started. A broker that answers slowly (a coordinator moving, a
// loaded cluster: seconds per request) then costs the page at most
// brokerWait, and the page says how old its answers are, instead of the
// page taking as long as the broker does.
const (
	// brokerFresh is how long answers are served without asking again: the
	// page refreshes every 2 s, so a page open in a browser asks the broker
	// about once per refresh, as before the cache.
	brokerFresh = time.Second
	// brokerWait is how long a Status waits for a refresh, counted from the
	// refresh's start: a healthy broker answers a DescribeGroups and a
	// ListOffsets per copy within it (a few ms each on kfake, tens of ms on
	// a loaded real cluster), so a Status usually shows fresh answers.
	brokerWait = 300 * time.Millisecond
	// brokerStale is the age beyond which the page marks the answers stale.
	brokerStale = 5 * time.Second
)

// brokerAnswers is the cache of the status page's broker answers. A refresh
// runs in a goroutine of its own, one at a time; the worker's Run joins it on
// shutdown (stop, after the metadata client closed, which ends a request
// still waiting for a broker).
//
// Lock order: mu is a leaf (held for no call out of this type).
type brokerAnswers struct {
	// ask asks the brokers (Worker.askBrokers; a test's stand-in); set
	// before the worker runs.
	ask     func(started time.Time, want []restoreKey) *brokerSnapshot
	mu      sync.Mutex
	last    *brokerSnapshot // the latest completed refresh, nil before the first; guarded by mu
	running *brokerRefresh  // the refresh under way, nil when none; guarded by mu
	open    bool            // refreshes may start: set by Run, cleared by stop; guarded by mu
	wg      sync.WaitGroup  // refresh goroutines; Add only under mu while open
}

// brokerRefresh is a refresh under way.
type brokerRefresh struct {
	started time.Time
	done    chan struct{} // closed when its snapshot is in brokerAnswers.last
}

// brokerSnapshot is what one refresh got from the brokers. It is never
// modified once published.
type brokerSnapshot struct {
	started time.Time
	took    time.Duration
	// members are the group's members as DescribeGroups answered, sorted by
	// member ID, without Self and URL (which come from the assignment at
	// Status time); membersErr is why there are none.
	members    []Member
	membersErr error
	// asked are the changelog partitions the refresh asked the end offset
	// of; ends the answers (a partition that failed is missing, endsErr
	// holds the first failure).
	asked   map[restoreKey]bool
	ends    map[restoreKey]int64
	endsErr error
}

// errNoAnswerYet is the highwater error of a copy the cached answers do not
// cover (not asked yet, or the broker did not answer).
var errNoAnswerYet = errors.New("no answer from the broker yet")

// highwater returns the cached end offset of partition p of changelog topic.
func (s *brokerSnapshot) highwater(topic string, p int32) (int64, error) {
	if s != nil {
		if off, ok := s.ends[restoreKey{topic, p}]; ok {
			return off, nil
		}
	}
	return 0, fmt.Errorf("end offset of %s[%d]: %w", topic, p, errNoAnswerYet)
}

// covers reports whether the snapshot asked for every partition of want.
func (s *brokerSnapshot) covers(want []restoreKey) bool {
	for _, k := range want {
		if !s.asked[k] {
			return false
		}
	}
	return true
}

// brokerView is the cache as one Status sees it: the latest snapshot (nil
// when none) and the start of a refresh still under way (zero when none).
type brokerView struct {
	snap       *brokerSnapshot
	refreshing time.Time
	closed     bool // the worker is not running: no refresh starts
}

// setOpen allows (Run starting) or stops (Run ending) refreshes; stop waits
// for the one under way.
func (b *brokerAnswers) setOpen(on bool) {
	b.mu.Lock()
	b.open = on
	b.mu.Unlock()
	if !on {
		b.wg.Wait()
	}
}

// get returns the cached answers, refreshed first when they are older than
// brokerFresh or lack a copy of want: it starts a refresh unless one is under
// way, and waits for the refresh until brokerWait after its start.
func (b *brokerAnswers) get(want []restoreKey) brokerView {
	now := time.Now()
	b.mu.Lock()
	if b.running == nil && b.open && (b.last == nil || now.Sub(b.last.started) >= brokerFresh || !b.last.covers(want)) {
		b.start(now, want)
	}
	r, closed := b.running, !b.open
	b.mu.Unlock()
	if r != nil {
		if wait := brokerWait - time.Since(r.started); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-r.done:
			case <-t.C:
			}
			t.Stop()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	v := brokerView{snap: b.last, closed: closed}
	if b.running != nil {
		v.refreshing = b.running.started
	}
	return v
}

// prefetch starts a refresh for want unless one is under way, without
// waiting for it (a new assignment: the next Status finds its copies).
func (b *brokerAnswers) prefetch(want []restoreKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running == nil && b.open {
		b.start(time.Now(), want)
	}
}

// start starts a refresh asking for want; mu must be held, running nil and
// open set.
func (b *brokerAnswers) start(now time.Time, want []restoreKey) {
	r := &brokerRefresh{started: now, done: make(chan struct{})}
	b.running = r
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		s := b.ask(now, want)
		b.mu.Lock()
		b.last, b.running = s, nil
		b.mu.Unlock()
		close(r.done)
	}()
}

// askBrokers describes the group and asks for the end offset of each
// changelog partition of want (one ListOffsets each).
func (w *Worker) askBrokers(started time.Time, want []restoreKey) *brokerSnapshot {
	s := &brokerSnapshot{started: started, asked: map[restoreKey]bool{}, ends: map[restoreKey]int64{}}
	s.members, s.membersErr = w.describeMembers()
	for _, k := range want {
		s.asked[k] = true
		off, err := w.liveHighwater(k.table, k.p)
		if err != nil {
			if s.endsErr == nil {
				s.endsErr = err
			}
			continue
		}
		s.ends[k] = off
	}
	s.took = time.Since(started)
	return s
}

// liveHighwater asks the broker for the end offset of partition p of topic
// (one ListOffsets).
func (w *Worker) liveHighwater(topic string, p int32) (int64, error) {
	if w.meta == nil {
		return 0, fmt.Errorf("end offset of %s[%d]: worker not running", topic, p)
	}
	off, err := w.meta.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		return 0, fmt.Errorf("end offset of %s[%d]: %w", topic, p, err)
	}
	return off, nil
}

// heldCopies returns the changelog partitions of the table copies this
// worker holds under a (the partitions table_partitions lists).
func (w *Worker) heldCopies(a assignor.Assignment) []restoreKey {
	var out []restoreKey
	for _, t := range w.tables {
		topic := t.state.Topic()
		for p := int32(0); p < t.parts; p++ {
			if holdsCopy(a, topic, p) {
				out = append(out, restoreKey{topic, p})
			}
		}
	}
	return out
}

// describeMembers describes the consumer group (DescribeGroups): its members
// sorted by member ID, each with its assigned source partitions.
func (w *Worker) describeMembers() ([]Member, error) {
	if w.meta == nil {
		return nil, fmt.Errorf("describe group %s: worker not running", w.app.id)
	}
	w.adminOnce.Do(func() {
		// Shared with tables_committed.go: built from the metadata client,
		// never closed (closing it would close the client).
		w.admin, w.adminErr = sarama.NewClusterAdminFromClient(w.meta)
	})
	if w.adminErr != nil {
		return nil, fmt.Errorf("describe group %s: %w", w.app.id, w.adminErr)
	}
	ds, err := w.admin.DescribeConsumerGroups([]string{w.app.id})
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", w.app.id, err)
	}
	out := []Member{}
	for _, d := range ds {
		if d.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("describe group %s: %w", w.app.id, d.Err)
		}
		for id, md := range d.Members {
			m := Member{MemberID: id, ClientID: md.ClientId, ClientHost: md.ClientHost, Partitions: map[string][]int32{},
				published: assignor.MemberURL(md)}
			if as, err := md.GetMemberAssignment(); err == nil && as != nil {
				for t, ps := range as.Topics {
					ps = slices.Clone(ps)
					slices.Sort(ps)
					m.Partitions[t] = ps
				}
			}
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MemberID < out[j].MemberID })
	return out, nil
}

// membersAt returns the described members joined with assignment a: Self
// marks this worker's member, URL is a member's HTTP address: the one it
// published in its subscription, else from a's URL map (the address of the
// active of one of its partitions).
func membersAt(described []Member, a assignor.Assignment) []Member {
	out := make([]Member, 0, len(described))
	for _, m := range described {
		m.Self = m.MemberID == a.MemberID
		m.URL = m.published
		for _, t := range sortedKeys(m.Partitions) {
			if m.URL != "" {
				break
			}
			if ps := m.Partitions[t]; len(ps) > 0 && a.URLs[t] != nil && a.URLs[t][ps[0]] != "" {
				m.URL = a.URLs[t][ps[0]]
				break
			}
		}
		out = append(out, m)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// BrokerAnswers says how current the parts of a Status that come from the
// brokers are: Members, and the end offsets in TablePartitions, the tasks'
// Changelogs and StandbyLag. They are cached and refreshed when a Status
// finds them older than 1 s; a Status waits at most 300 ms for a refresh, so
// with a slow broker it shows older answers, and says so here.
type BrokerAnswers struct {
	// AskedAt is when the refresh whose answers are shown started (zero
	// when there are none yet); AgeMS is the time since then, TookMS how
	// long that refresh took.
	AskedAt time.Time `json:"asked_at"`
	AgeMS   float64   `json:"age_ms"`
	TookMS  float64   `json:"took_ms"`
	// RefreshingMS is how long a refresh still waiting for the brokers has
	// been under way (0 when none is).
	RefreshingMS float64 `json:"refreshing_ms"`
	// Stale is set when there are no answers yet or they are older than 5 s.
	Stale bool `json:"stale"`
	// Error is what went wrong in the refresh shown (the group description
	// or an end offset), or why there are no answers.
	Error string `json:"error,omitempty"`
}

// answersOf describes v at now.
func answersOf(v brokerView, now time.Time) BrokerAnswers {
	var b BrokerAnswers
	if !v.refreshing.IsZero() {
		b.RefreshingMS = ms(now.Sub(v.refreshing))
	}
	s := v.snap
	if s == nil {
		b.Stale = true
		switch {
		case v.closed:
			b.Error = "worker not running"
		default:
			b.Error = "no answer from the brokers yet"
		}
		return b
	}
	b.AskedAt, b.AgeMS, b.TookMS = s.started.UTC(), ms(now.Sub(s.started)), ms(s.took)
	b.Stale = now.Sub(s.started) > brokerStale
	if err := errors.Join(s.membersErr, s.endsErr); err != nil {
		b.Error = err.Error()
	}
	return b
}
