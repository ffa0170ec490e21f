// Package client reads the tables of a Runnel app over the workers' HTTP API
// (docs/tables.md, "Querying tables over HTTP") from another Go service.
//
// A Client caches the owner map: the table list (GET /api/tables: changelog
// topic, partition count, whether a key's bytes are its text) and the URL of
// the active of every partition (GET /api/assignment), with the assignment
// generation. For a table whose keys are their text it computes the key's
// partition itself (partition.For, the workers' own murmur2) and asks the
// owner directly, so a read takes no hop. An answer whose Runnel-Generation
// is newer than the cache's, an answer that was forwarded, or a not-owner
// refusal refreshes the cache. It depends on the standard library only.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/partition"
)

// Header names of the workers' table answers (as app.GenerationHeader and
// friends; package app is not imported to keep this package light).
const (
	GenerationHeader = "Runnel-Generation"
	PartitionHeader  = "Runnel-Partition"
	HopsHeader       = "Runnel-Hops"
	ServedByHeader   = "X-Runnel-Served-By"
)

// DefaultPageSize is the page size of Scan when Client.PageSize is 0.
const DefaultPageSize = 100

// Error is a request the workers refused for what it says (an unknown table,
// a key the codec cannot parse, a bad option: Status 400 or 404) or a
// failure that retrying does not help (500). Reason is the worker's typed
// reason (app.Reason*).
type Error struct {
	Status  int
	Reason  string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("runnel: %d %s: %s", e.Status, e.Reason, e.Message)
}

// RetryableError is a refusal that a later attempt may not get: the
// partition is being restored, a rebalance is under way, the worker asked is
// not the owner, or the only copy is staler than the bound (503), or the
// owner could not be reached (502). The key may exist: it is never a "not
// found". RetryAfter is the worker's Retry-After (0 when it sent none).
type RetryableError struct {
	Status     int
	Reason     string
	Message    string
	RetryAfter time.Duration
	// Partition is the refused partition, -1 when not told.
	Partition int32
}

func (e *RetryableError) Error() string {
	return fmt.Sprintf("runnel: %d %s (retry after %s): %s", e.Status, e.Reason, e.RetryAfter, e.Message)
}

// Item is one key of a scan, in ascending byte order of the encoded keys.
type Item struct {
	// Key is the key as the key codec renders it; Value the value as
	// JSON.
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value"`
	Partition int32           `json:"partition"`
}

// Client reads tables from a Runnel app's workers. Its methods are safe for
// concurrent use.
type Client struct {
	// HTTP is the client requests go through (http.DefaultClient when nil).
	HTTP *http.Client
	// PageSize is the page size Scan asks for, at most the workers'
	// maximum (1000); DefaultPageSize when 0.
	PageSize int

	urls []string

	mu     sync.Mutex
	tables map[string]tableInfo         // by table name
	owners map[string]map[string]string // changelog topic -> partition -> URL
	gen    int32
	next   int // round robin over urls
}

// tableInfo is an entry of GET /api/tables.
type tableInfo struct {
	Name       string `json:"name"`
	Changelog  string `json:"changelog"`
	Partitions int32  `json:"partitions"`
	Global     bool   `json:"global"`
	Windowed   bool   `json:"windowed"`
	TextKeys   bool   `json:"text_keys"`
}

// New returns a client of the workers at urls (HTTP addresses such as
// "10.0.0.5:8080" or URLs such as "http://10.0.0.5:8080"); it asks them in
// turn when it does not know a key's owner. The owner map is read at the
// first request.
func New(urls ...string) *Client {
	c := &Client{}
	for _, u := range urls {
		c.urls = append(c.urls, baseURL(u))
	}
	return c
}

func baseURL(u string) string {
	u = strings.TrimRight(u, "/")
	if !strings.Contains(u, "://") {
		u = "http://" + u
	}
	return u
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// any returns one of the configured workers, in turn.
func (c *Client) any() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.urls) == 0 {
		return ""
	}
	c.next++
	return c.urls[c.next%len(c.urls)]
}

// other returns a configured worker other than u (u when it is the only
// one).
func (c *Client) other(u string) string {
	for range len(c.urls) {
		if o := c.any(); o != u {
			return o
		}
	}
	return u
}

// Refresh reads the table list and the owner map again, from the first of
// the workers (in turn) that answers; the error names every worker's
// failure.
func (c *Client) Refresh(ctx context.Context) error {
	c.mu.Lock()
	n := len(c.urls)
	c.mu.Unlock()
	if n == 0 {
		return errors.New("runnel: client has no worker URLs")
	}
	var errs []error
	for range n {
		err := c.refreshFrom(ctx, c.any())
		if err == nil {
			return nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("runnel: refresh the owner map: %w", errors.Join(errs...))
}

func (c *Client) refreshFrom(ctx context.Context, base string) error {
	var tables []tableInfo
	if _, err := c.getJSON(ctx, base+"/api/tables", &tables); err != nil {
		return err
	}
	var asg struct {
		Assignment struct {
			Generation int32                        `json:"generation"`
			URLs       map[string]map[string]string `json:"urls"`
		} `json:"assignment"`
	}
	if _, err := c.getJSON(ctx, base+"/api/assignment", &asg); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tables = map[string]tableInfo{}
	for _, t := range tables {
		c.tables[t.Name] = t
	}
	c.owners, c.gen = asg.Assignment.URLs, asg.Assignment.Generation
	return nil
}

func (c *Client) getJSON(ctx context.Context, u string, v any) (http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.Header, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return resp.Header, fmt.Errorf("GET %s: %w", u, err)
	}
	return resp.Header, nil
}

// Owner returns the URL of the worker the client sends a read of key in
// table to: the partition's active per the cached owner map when the table's
// keys are their text, else "" (any worker; it forwards). It reads the owner
// map first when it has none.
func (c *Client) Owner(ctx context.Context, table, key string) (string, error) {
	c.mu.Lock()
	loaded := c.tables != nil
	c.mu.Unlock()
	if !loaded {
		if err := c.Refresh(ctx); err != nil {
			return "", err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ti, ok := c.tables[table]
	if !ok || !ti.TextKeys || ti.Global || ti.Partitions <= 0 {
		return "", nil
	}
	p := partition.For([]byte(key), ti.Partitions)
	if o := c.owners[ti.Changelog][strconv.Itoa(int(p))]; o != "" {
		return baseURL(o), nil
	}
	return "", nil
}

// stale reports an answer that says the cache is out of date: a newer
// generation, or a forward (the worker asked was not the owner).
func (c *Client) stale(h http.Header) bool {
	if h.Get(ServedByHeader) != "" {
		return true
	}
	g, err := strconv.Atoi(h.Get(GenerationHeader))
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return int32(g) > c.gen
}

// answer is the part of a worker's table answer (app.TableAnswer,
// app.ScanPage) the client reads.
type answer struct {
	Found        bool            `json:"found"`
	Value        json.RawMessage `json:"value"`
	Reason       string          `json:"reason"`
	Error        string          `json:"error"`
	Partition    *int32          `json:"partition"`
	Items        []Item          `json:"items"`
	Continuation string          `json:"continuation"`
	Windows      []Window        `json:"windows"`
	More         bool            `json:"more"`
}

// Window is one window of a key in a windowed table: [Start, End) and the
// value as JSON.
type Window struct {
	Start time.Time       `json:"start"`
	End   time.Time       `json:"end"`
	Value json.RawMessage `json:"value"`
}

// Windows lists key's windows in the windowed table whose start is in
// [from, to], ascending by start, following the workers' pages (up to 1000
// windows each) until the range is done. It reads the owner of the key's
// partition directly, as Query does, with the same options (AtLeast,
// WaitFor, MaxLag). Errors: as Query's; a table that is not windowed, or
// to before from, is a 400 *Error.
func (c *Client) Windows(ctx context.Context, table, key string, from, to time.Time, opts ...QueryOption) ([]Window, error) {
	var out []Window
	for {
		q := url.Values{"from": {strconv.FormatInt(from.UnixMilli(), 10)}, "to": {strconv.FormatInt(to.UnixMilli(), 10)}, "limit": {"1000"}}
		for _, o := range opts {
			o(q)
		}
		a, err := c.read(ctx, table, key, "/windows?"+q.Encode())
		if err != nil {
			return out, err
		}
		out = append(out, a.Windows...)
		if !a.More || len(a.Windows) == 0 {
			return out, nil
		}
		from = a.Windows[len(a.Windows)-1].Start.Add(time.Millisecond)
	}
}

// Position is one entry of a read-your-writes bound: the topic, partition and
// offset of a source record the caller wrote (the producer's result). A read
// bound by it shows the record's effect on the table.
type Position struct {
	Topic     string
	Partition int32
	Offset    int64
}

// String renders p as the workers read it: "topic:partition:offset".
func (p Position) String() string {
	return p.Topic + ":" + strconv.FormatInt(int64(p.Partition), 10) + ":" + strconv.FormatInt(p.Offset, 10)
}

// QueryOption changes how Query reads a key.
type QueryOption func(url.Values)

// AtLeast bounds the read by the caller's own writes (read-your-writes,
// ?position=): the answer shows the effect of every source record named,
// whose partition is the key's (a record of another partition cannot have
// written the key). The worker waits for its copy to reach the bound for up
// to WaitFor (500 ms by default, at most 3 s), else the read fails with a
// *RetryableError of reason "position-not-reached". A topic that is not one
// of the app's source topics with the table's partition count is a 400
// (*Error).
func AtLeast(ps ...Position) QueryOption {
	return func(v url.Values) {
		for _, p := range ps {
			v.Add("position", p.String())
		}
	}
}

// WaitFor sets how long a read bound by AtLeast may wait for the bound
// (?wait=; 0 to 3 s, the workers' default 500 ms).
func WaitFor(d time.Duration) QueryOption {
	return func(v url.Values) { v.Set("wait", d.String()) }
}

// MaxLag lets a copy other than the active answer when it is at most n
// changelog records behind (?consistency=any&maxLag=n): a standby of the
// worker asked, which then answers without a hop to the active.
func MaxLag(n int64) QueryOption {
	return func(v url.Values) {
		v.Set("consistency", "any")
		v.Set("maxLag", strconv.FormatInt(n, 10))
	}
}

// Query reads key in table. found is false, with a nil error, only when the
// active (or the copy entitled to say so) answered that the key is absent.
// Options bound the read (AtLeast, WaitFor, MaxLag). Errors: *RetryableError
// (the key may exist: restoring, rebalancing, not-owner, owner unreachable,
// position-not-reached), *Error (bad request, unknown table), or a transport
// error wrapped with the URL.
func (c *Client) Query(ctx context.Context, table, key string, opts ...QueryOption) (value json.RawMessage, found bool, err error) {
	suffix := ""
	if len(opts) > 0 {
		q := url.Values{}
		for _, o := range opts {
			o(q)
		}
		suffix = "?" + q.Encode()
	}
	a, err := c.read(ctx, table, key, suffix)
	switch {
	case err != nil:
		return nil, false, err
	case a.Found:
		return a.Value, true, nil
	}
	return nil, false, nil
}

// read sends GET /api/tables/{table}/{key}{suffix} to the key's owner (any
// worker when unknown), once more to the owner of a refreshed map when the
// owner does not answer, and returns a 200 answer or a 404 without a reason
// (Found false); every other answer is an error (refusal).
func (c *Client) read(ctx context.Context, table, key, suffix string) (answer, error) {
	owner, err := c.Owner(ctx, table, key)
	if err != nil {
		return answer{}, err
	}
	if owner == "" {
		owner = c.any()
	}
	path := "/api/tables/" + url.PathEscape(table) + "/" + url.PathEscape(key) + suffix
	a, resp, err := c.get(ctx, owner+path)
	if err != nil && ctx.Err() == nil {
		// The owner in the cache is gone (stopped, crashed): read the map
		// again and ask the owner it names, or another worker, once.
		_ = c.Refresh(ctx)
		next, oerr := c.Owner(ctx, table, key)
		if oerr != nil || next == "" || next == owner {
			next = c.other(owner)
		}
		a, resp, err = c.get(ctx, next+path)
	}
	if err != nil {
		return a, err
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return a, nil
	case resp.StatusCode == http.StatusNotFound && a.Reason == "":
		a.Found = false
		return a, nil
	}
	return a, c.refusal(resp, a)
}

// get sends GET u and decodes the answer; an answer that shows the cache
// stale refreshes it before get returns (a failed refresh is not the
// caller's error: the next request tries again).
func (c *Client) get(ctx context.Context, u string) (answer, *http.Response, error) {
	var a answer
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return a, nil, fmt.Errorf("runnel: %w", err)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return a, nil, fmt.Errorf("runnel: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return a, resp, fmt.Errorf("runnel: GET %s: status %d: %w", u, resp.StatusCode, err)
	}
	if c.stale(resp.Header) || a.Reason == "not-owner" {
		_ = c.Refresh(ctx)
	}
	return a, resp, nil
}

// refusal turns a refused answer into *RetryableError or *Error.
func (c *Client) refusal(resp *http.Response, a answer) error {
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		e := &RetryableError{Status: resp.StatusCode, Reason: a.Reason, Message: a.Error, Partition: -1}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		if a.Partition != nil {
			e.Partition = *a.Partition
		} else if p, err := strconv.Atoi(resp.Header.Get(PartitionHeader)); err == nil {
			e.Partition = int32(p)
		}
		return e
	}
	return &Error{Status: resp.StatusCode, Reason: a.Reason, Message: a.Error}
}

// Scan iterates over the keys of table that start with prefix (every key
// when prefix is ""), in ascending byte order of the encoded keys, one page
// of PageSize at a time, following the continuation tokens. A refused page
// ends the iteration with its error (*RetryableError or *Error) after the
// items of the pages before it.
func (c *Client) Scan(ctx context.Context, table, prefix string) iter.Seq2[Item, error] {
	return func(yield func(Item, error) bool) {
		size := c.PageSize
		if size <= 0 {
			size = DefaultPageSize
		}
		tok := ""
		for {
			q := url.Values{"limit": {strconv.Itoa(size)}}
			if prefix != "" {
				q.Set("prefix", prefix)
			}
			if tok != "" {
				q.Set("continuation", tok)
			}
			if len(c.urls) == 0 {
				yield(Item{}, errors.New("runnel: client has no worker URLs"))
				return
			}
			// Any worker answers a page (it fans out); one that does
			// not answer at all is passed over.
			var (
				a    answer
				resp *http.Response
				err  error
			)
			for range len(c.urls) {
				a, resp, err = c.get(ctx, c.any()+"/api/tables/"+url.PathEscape(table)+"?"+q.Encode())
				if err == nil || ctx.Err() != nil || resp != nil {
					break
				}
			}
			if err != nil {
				yield(Item{}, err)
				return
			}
			if resp.StatusCode != http.StatusOK {
				yield(Item{}, c.refusal(resp, a))
				return
			}
			for _, it := range a.Items {
				if !yield(it, nil) {
					return
				}
			}
			if tok = a.Continuation; tok == "" {
				return
			}
		}
	}
}
