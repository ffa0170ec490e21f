package app

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// Scan pages (GET /api/tables/{table}?prefix=|from=&to=&limit=&continuation=).
const (
	// DefaultScanLimit is a scan page's size when ?limit= is not given.
	DefaultScanLimit = 100
	// MaxScanLimit is the largest page size a scan accepts (400 above).
	MaxScanLimit = 1000
)

// ScanItem is one key of a scan page.
type ScanItem struct {
	// Key is the key as the key codec renders it (the text for a string
	// key); KeyBytes its encoded bytes (base64 in JSON), the order of the
	// page.
	Key      string `json:"key"`
	KeyBytes []byte `json:"key_bytes"`
	// Value is the decoded value rendered as JSON.
	Value json.RawMessage `json:"value"`
	// Partition is the key's partition.
	Partition int32 `json:"partition"`
}

// ScanPartition is how one partition of a scan page was read.
type ScanPartition struct {
	Partition int32 `json:"partition"`
	// Role is the role of the copy that was read (Role*); Lag its distance
	// to the changelog's end in records (0 for the active) when measured.
	Role string `json:"role"`
	Lag  *int64 `json:"lag,omitempty"`
	// ServedBy is the URL of the worker that read it, when not the worker
	// asked.
	ServedBy string `json:"served_by,omitempty"`
	// Applied is, for a global table's replica, the offset after the last
	// changelog record its followers applied to the partition.
	Applied *int64 `json:"applied,omitempty"`
	// Exhausted is set when the page holds every remaining key of the
	// partition in the scan's bounds.
	Exhausted bool `json:"exhausted"`
}

// ScanPage is the body of GET /api/tables/{table} (a range or prefix scan).
// Items are in ascending byte order of the encoded keys (KeyBytes), merged
// across partitions; Continuation, when set, fetches the next page (pass it
// with the same prefix, from and to). A refusal (any partition that cannot
// be read) has no items: Reason and Error say why, Partition which
// partition, RetryAfter when to retry (also the Retry-After header).
type ScanPage struct {
	Table        string          `json:"table"`
	Generation   int32           `json:"generation"`
	Items        []ScanItem      `json:"items"`
	Continuation string          `json:"continuation,omitempty"`
	Partitions   []ScanPartition `json:"partitions"`
	Reason       string          `json:"reason,omitempty"`
	Error        string          `json:"error,omitempty"`
	RetryAfter   int             `json:"retry_after_s,omitempty"`
	Partition    *int32          `json:"partition,omitempty"`
	Owner        string          `json:"owner,omitempty"`
}

// scanToken is a continuation token: per partition, the last key returned
// (the next page starts after it), and the partitions every key of which was
// returned. It travels as base64url of its JSON; clients treat it as opaque.
type scanToken struct {
	After map[int32][]byte `json:"after,omitempty"`
	Done  []int32          `json:"done,omitempty"`
}

func (t scanToken) encode() string {
	b, _ := json.Marshal(t) // maps of int32 to bytes always marshal
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeScanToken(s string, n int32) (scanToken, error) {
	var t scanToken
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return t, fmt.Errorf("continuation: not base64url: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return t, fmt.Errorf("continuation: %w", err)
	}
	for p := range t.After {
		if p < 0 || p >= n {
			return t, fmt.Errorf("continuation: partition %d out of [0, %d)", p, n)
		}
	}
	for _, p := range t.Done {
		if p < 0 || p >= n {
			return t, fmt.Errorf("continuation: partition %d out of [0, %d)", p, n)
		}
	}
	return t, nil
}

// scanBounds are a scan's key bounds over encoded keys: [from, to) (nil:
// unbounded) and a prefix.
type scanBounds struct {
	from, to, prefix []byte
	hasPrefix        bool
}

// in reports whether k is in the bounds, and past whether no key after k
// (in byte order) can be.
func (b scanBounds) in(k []byte) (in, past bool) {
	if b.to != nil && bytes.Compare(k, b.to) >= 0 {
		return false, true
	}
	if b.hasPrefix && !bytes.HasPrefix(k, b.prefix) {
		return false, bytes.Compare(k, b.prefix) > 0
	}
	if b.from != nil && bytes.Compare(k, b.from) < 0 {
		return false, false
	}
	return true, false
}

// scanRequest is one scan page being answered.
type scanRequest struct {
	w *Worker
	// t is the table's runtime; nil for a global table, whose replica's
	// store every worker reads locally (global set).
	t      *tableRuntime
	def    table.Def
	store  stores.Store
	global bool
	n      int32
	r      *http.Request
	qp     queryParams
	bounds scanBounds
	limit  int
	token  scanToken
	// only are the partitions a forwarded scan asks this worker for (all
	// when nil).
	only []int32
}

// partPage is what one partition (or one owner's partitions) contributed.
type partPage struct {
	items []ScanItem
	parts []ScanPartition
}

// scanRefusal is a partition that could not be read.
type scanRefusal struct {
	code       int
	reason     string
	retryAfter int
	partition  int32
	owner      string
	err        string
}

func (w *Worker) serveScan(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/tables/{table}", func(rw http.ResponseWriter, r *http.Request) {
		page, code := w.scan(r)
		rw.Header().Set(GenerationHeader, strconv.Itoa(int(page.Generation)))
		if page.RetryAfter > 0 {
			rw.Header().Set("Retry-After", strconv.Itoa(page.RetryAfter))
		}
		writeJSONStatus(rw, code, page)
	})
}

// scan answers one page; the status code goes with the page.
func (w *Worker) scan(r *http.Request) (ScanPage, int) {
	a := w.Assignment()
	page := ScanPage{Table: r.PathValue("table"), Generation: a.Generation, Items: []ScanItem{}, Partitions: []ScanPartition{}}
	refuse := func(te *TableError) (ScanPage, int) {
		page.Reason, page.Error = te.Reason, te.Error()
		return page, te.Status
	}
	sr, te := w.parseScan(r, page.Table)
	if te != nil {
		return refuse(te)
	}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		pages    []partPage
		refusals []scanRefusal
	)
	add := func(pp partPage, rf *scanRefusal) {
		mu.Lock()
		defer mu.Unlock()
		if rf != nil {
			refusals = append(refusals, *rf)
			return
		}
		pages = append(pages, pp)
	}
	var local []int32
	remote := map[string][]int32{}
	for p := int32(0); p < sr.n; p++ {
		if slices.Contains(sr.token.Done, p) || (sr.only != nil && !slices.Contains(sr.only, p)) {
			continue
		}
		owner, rf := sr.route(a, p)
		switch {
		case rf != nil:
			add(partPage{}, rf)
		case owner == "":
			local = append(local, p)
		default:
			remote[owner] = append(remote[owner], p)
		}
	}
	for _, p := range local {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pp, rf := sr.readLocal(a, p)
			add(pp, rf)
		}()
	}
	for owner, ps := range remote {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pp, rf := sr.forward(owner, ps)
			add(pp, rf)
		}()
	}
	wg.Wait()
	if len(refusals) > 0 {
		// The whole page is refused: a page without a partition would skip
		// its keys silently. The lowest partition's refusal is told.
		slices.SortFunc(refusals, func(x, y scanRefusal) int { return int(x.partition - y.partition) })
		rf := refusals[0]
		page.Reason, page.Error, page.RetryAfter, page.Owner = rf.reason, rf.err, rf.retryAfter, rf.owner
		page.Partition = &rf.partition
		return page, rf.code
	}
	sr.merge(&page, pages)
	return page, http.StatusOK
}

// parseScan reads a scan's table and options; the error is a *TableError.
func (w *Worker) parseScan(r *http.Request, name string) (*scanRequest, *TableError) {
	qr, err := w.queryable(name)
	if err != nil {
		var te *TableError
		errors.As(err, &te)
		return nil, te
	}
	qp, err := parseQueryParams(r)
	if err != nil {
		return nil, &TableError{Status: http.StatusBadRequest, Reason: ReasonBadRequest, Err: err}
	}
	sr := &scanRequest{w: w, def: qr, r: r, qp: qp, limit: DefaultScanLimit}
	if gs := w.globalReplica(name); gs != nil {
		// Every partition from the local replica: what its followers
		// applied.
		sr.global, sr.n, sr.store = true, gs.Partitions(), w.globalStore(name)
		if sr.store == nil {
			return nil, tableErr(http.StatusInternalServerError, ReasonInternal, "global table %s has no store on this worker", name)
		}
	} else {
		t := w.tableByName(name)
		if t == nil {
			return nil, tableErr(http.StatusInternalServerError, ReasonInternal, "table %s is not run by this worker", name)
		}
		if sr.n, err = w.changelogPartitions(t); err != nil {
			return nil, &TableError{Status: http.StatusInternalServerError, Reason: ReasonInternal, Err: err}
		}
		sr.t, sr.store = t, t.store
	}
	n := sr.n
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "prefix", "from", "to", "limit", "continuation", "consistency", "maxLag", "forward", "partitions":
		default:
			return nil, tableErr(http.StatusBadRequest, ReasonBadRequest, "unknown parameter %q (prefix, from, to, limit, continuation, consistency, maxLag, forward)", k)
		}
	}
	if _, ok := q["prefix"]; ok {
		if q.Has("from") || q.Has("to") {
			return nil, tableErr(http.StatusBadRequest, ReasonBadRequest, "prefix and from/to exclude each other")
		}
		if sr.bounds.prefix, err = qr.QueryKey(q.Get("prefix")); err != nil {
			return nil, tableErr(http.StatusBadRequest, ReasonBadKey, "prefix: %w", err)
		}
		sr.bounds.hasPrefix = true
	}
	for _, b := range []struct {
		name string
		dst  *[]byte
	}{{"from", &sr.bounds.from}, {"to", &sr.bounds.to}} {
		if !q.Has(b.name) {
			continue
		}
		if *b.dst, err = qr.QueryKey(q.Get(b.name)); err != nil {
			return nil, tableErr(http.StatusBadRequest, ReasonBadKey, "%s: %w", b.name, err)
		}
	}
	if s := q.Get("limit"); s != "" {
		l, err := strconv.Atoi(s)
		if err != nil || l < 1 || l > MaxScanLimit {
			return nil, tableErr(http.StatusBadRequest, ReasonBadRequest, "limit %q: want a page size in [1, %d]", s, MaxScanLimit)
		}
		sr.limit = l
	}
	if s := q.Get("continuation"); s != "" {
		if sr.token, err = decodeScanToken(s, n); err != nil {
			return nil, &TableError{Status: http.StatusBadRequest, Reason: ReasonBadRequest, Err: err}
		}
	}
	if s, ok := q["partitions"]; ok {
		// A forwarded scan: the partitions the asking worker routed here.
		sr.only = []int32{}
		for _, f := range strings.Split(s[0], ",") {
			p, err := strconv.ParseInt(f, 10, 32)
			if err != nil || p < 0 || int32(p) >= n {
				return nil, tableErr(http.StatusBadRequest, ReasonBadRequest, "partitions %q: want partitions in [0, %d) separated by commas", s[0], n)
			}
			sr.only = append(sr.only, int32(p))
		}
	}
	return sr, nil
}

// route decides who reads partition p: "" for this worker, else the owner's
// URL; or a refusal.
func (sr *scanRequest) route(a assignor.Assignment, p int32) (string, *scanRefusal) {
	if sr.global {
		return "", nil // every worker holds every partition
	}
	w := sr.w
	st := w.partState(sr.t, a, p)
	if st.role == RoleActive {
		return "", nil
	}
	if sr.qp.consistency == ConsistencyAny && st.role != RoleNone && st.role != RolePending {
		if cl, err := w.copyLagOf(sr.t, p); err == nil && cl.lag() <= sr.qp.maxLag {
			return "", nil
		}
	}
	if st.role == RoleRestoring {
		msg := fmt.Sprintf("partition %d of table %s is being restored on this worker", p, sr.t.def.Name())
		return "", &scanRefusal{code: http.StatusServiceUnavailable, reason: ReasonRestoring, retryAfter: retryAfterRestore(w.restoreProgress(sr.t, p, copyLag{})), partition: p, err: msg}
	}
	owner := w.ownerURL(sr.t.state.Topic(), p)
	switch {
	case owner == "" || owner == w.cfg.HTTPAddr || st.role == RolePending:
		return "", &scanRefusal{code: http.StatusServiceUnavailable, reason: ReasonRebalancing, retryAfter: 1, partition: p,
			err: fmt.Sprintf("no owner known for partition %d of table %s (rebalance under way)", p, sr.t.def.Name())}
	case !sr.qp.forward || sr.qp.hops >= MaxHops:
		return "", &scanRefusal{code: http.StatusServiceUnavailable, reason: ReasonNotOwner, retryAfter: 1, partition: p, owner: owner,
			err: fmt.Sprintf("this worker is not active for partition %d of table %s and does not forward (hops %d, forward %v)", p, sr.t.def.Name(), sr.qp.hops, sr.qp.forward)}
	}
	return owner, nil
}

// readLocal reads partition p's local copy: the first limit keys in the
// bounds after the token's position, from the store (what the last applied
// commit cycle left, not the write cache), seeking to the first candidate
// when the store is a stores.Seeker.
func (sr *scanRequest) readLocal(a assignor.Assignment, p int32) (partPage, *scanRefusal) {
	w := sr.w
	sp := ScanPartition{Partition: p, Role: RoleGlobal}
	switch {
	case sr.global:
		// The replica's applied offset is in Applied; no lag is asked of
		// the broker.
		off, err := sr.store.Offset(p)
		if err == nil {
			applied := off + 1
			sp.Applied = &applied
		}
	default:
		sp.Role = w.partState(sr.t, a, p).role
		if sp.Role == RoleActive {
			zero := int64(0)
			sp.Lag = &zero
		} else if cl, err := w.copyLagOf(sr.t, p); err == nil {
			lag := cl.lag()
			sp.Lag = &lag
		}
	}
	after, hasAfter := sr.token.After[p]
	var items []ScanItem
	stop := errors.New("stop")
	visit := func(k, v []byte) error {
		if hasAfter && bytes.Compare(k, after) <= 0 {
			return nil
		}
		in, past := sr.bounds.in(k)
		if past {
			return stop
		}
		if !in {
			return nil
		}
		ks, val, err := sr.def.Format(k, v)
		if err != nil {
			return fmt.Errorf("decode %q: %w", k, err)
		}
		vb, err := json.Marshal(val)
		if err != nil {
			return fmt.Errorf("render the value of %q: %w", k, err)
		}
		items = append(items, ScanItem{Key: ks, KeyBytes: k, Value: vb, Partition: p})
		if len(items) > sr.limit {
			return stop
		}
		return nil
	}
	var err error
	if sk, ok := sr.store.(stores.Seeker); ok {
		// Seek to the first key that can be in the page: the largest of
		// from, prefix and the key right after the position.
		start := sr.bounds.from
		if sr.bounds.hasPrefix && bytes.Compare(sr.bounds.prefix, start) > 0 {
			start = sr.bounds.prefix
		}
		if next := append(slices.Clone(after), 0); hasAfter && bytes.Compare(next, start) > 0 {
			start = next
		}
		err = sk.IterateFrom(p, start, visit)
	} else {
		err = sr.store.Iterate(p, visit)
	}
	if err != nil && !errors.Is(err, stop) {
		return partPage{}, &scanRefusal{code: http.StatusInternalServerError, reason: ReasonInternal, partition: p,
			err: fmt.Sprintf("scan table %s[%d]: %v", sr.def.Name(), p, err)}
	}
	sp.Exhausted = len(items) <= sr.limit
	if !sp.Exhausted {
		items = items[:sr.limit]
	}
	return partPage{items: items, parts: []ScanPartition{sp}}, nil
}

// forward asks owner for partitions ps (one hop) and returns its page.
func (sr *scanRequest) forward(owner string, ps []int32) (partPage, *scanRefusal) {
	q := sr.r.URL.Query()
	strs := make([]string, len(ps))
	for i, p := range ps {
		strs[i] = strconv.Itoa(int(p))
	}
	q.Set("partitions", strings.Join(strs, ","))
	q.Set("limit", strconv.Itoa(sr.limit))
	tok := scanToken{After: map[int32][]byte{}}
	for _, p := range ps {
		if k, ok := sr.token.After[p]; ok {
			tok.After[p] = k
		}
	}
	q.Del("continuation")
	if len(tok.After) > 0 {
		q.Set("continuation", tok.encode())
	}
	base := owner
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	fail := func(err error) (partPage, *scanRefusal) {
		return partPage{}, &scanRefusal{code: http.StatusBadGateway, reason: ReasonNotOwner, retryAfter: 1, partition: ps[0], owner: owner,
			err: fmt.Sprintf("scan of table %s partitions %v forwarded to %s: %v", sr.t.def.Name(), ps, owner, err)}
	}
	u, err := url.Parse(base)
	if err != nil {
		return fail(err)
	}
	u.Path, u.RawQuery = "/api/tables/"+url.PathEscape(sr.t.def.Name()), q.Encode()
	req, err := http.NewRequestWithContext(sr.r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return fail(err)
	}
	req.Header.Set(HopsHeader, strconv.Itoa(sr.qp.hops+1))
	req.Header.Set(ForwardedHeader, "1")
	resp, err := forwardClient.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	var sub ScanPage
	if err := json.NewDecoder(resp.Body).Decode(&sub); err != nil {
		return fail(fmt.Errorf("status %d: %w", resp.StatusCode, err))
	}
	if resp.StatusCode != http.StatusOK {
		rf := &scanRefusal{code: resp.StatusCode, reason: sub.Reason, retryAfter: sub.RetryAfter, partition: ps[0], owner: sub.Owner, err: sub.Error}
		if sub.Partition != nil {
			rf.partition = *sub.Partition
		}
		if rf.reason == "" {
			rf.reason, rf.err = ReasonInternal, fmt.Sprintf("forwarded to %s: status %d", owner, resp.StatusCode)
		}
		return partPage{}, rf
	}
	for i := range sub.Partitions {
		if sub.Partitions[i].ServedBy == "" {
			sub.Partitions[i].ServedBy = owner
		}
	}
	return partPage{items: sub.Items, parts: sub.Partitions}, nil
}

// merge takes the first limit items of pages in key byte order into page
// and sets the continuation: per partition, the last key taken; a partition
// is done when it was exhausted and all of its items were taken. Each
// contribution holds the first limit keys of its partitions after their
// positions, so the first limit of the union are the first limit overall,
// and every key up to the page's last is in the page.
func (sr *scanRequest) merge(page *ScanPage, pages []partPage) {
	var all []ScanItem
	for _, pp := range pages {
		all = append(all, pp.items...)
		page.Partitions = append(page.Partitions, pp.parts...)
	}
	slices.SortFunc(all, func(x, y ScanItem) int { return bytes.Compare(x.KeyBytes, y.KeyBytes) })
	left := map[int32]int{} // items of a partition not taken
	if len(all) > sr.limit {
		for _, it := range all[sr.limit:] {
			left[it.Partition]++
		}
		all = all[:sr.limit]
	}
	page.Items = append(page.Items, all...)
	slices.SortFunc(page.Partitions, func(x, y ScanPartition) int { return int(x.Partition - y.Partition) })
	tok := scanToken{After: map[int32][]byte{}, Done: slices.Clone(sr.token.Done)}
	for p, k := range sr.token.After {
		tok.After[p] = k
	}
	for _, it := range all {
		tok.After[it.Partition] = it.KeyBytes
	}
	for i := range page.Partitions {
		sp := &page.Partitions[i]
		if left[sp.Partition] > 0 {
			sp.Exhausted = false
		}
		if sp.Exhausted {
			tok.Done = append(tok.Done, sp.Partition)
			delete(tok.After, sp.Partition)
		}
	}
	if sr.only == nil && int32(len(tok.Done)) < sr.n {
		// A forwarded scan (only set) answers per partition (Exhausted);
		// the asking worker keeps the positions.
		slices.Sort(tok.Done)
		page.Continuation = tok.encode()
	}
}

// writeJSONStatus writes v as JSON with status code.
func writeJSONStatus(rw http.ResponseWriter, code int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(v)
}
