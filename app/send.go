package app

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// ErrTruncatedInput is returned (wrapped) when a gzip input ends before its
// end-of-stream marker: an interrupted download or copy. The message names
// the file and the last complete line.
var ErrTruncatedInput = errors.New("input is truncated")

// ErrCorruptInput is returned (wrapped) when a gzip input fails its checksum
// or has an invalid header.
var ErrCorruptInput = errors.New("input is corrupt")

// maxLineErrors is how many bad lines an InputError lists; the rest are counted.
const maxLineErrors = 10

// LineError is one line of a JSONL input that cannot be sent.
type LineError struct {
	Line int // 1-based
	Err  error
}

func (e LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// InputError reports every problem ValidateLines found in an input: the
// first bad lines, how many there are in all, and a read error (truncated or
// corrupt file) if the input could not be read to its end. Nothing of an input
// that gives an InputError is produced by SendInput.
type InputError struct {
	Lines []LineError // the first maxLineErrors (10) bad lines, in order
	Bad   int         // bad lines in all
	Read  error       // why the input could not be read to its end, if it could not
}

func (e *InputError) Error() string {
	var b strings.Builder
	b.WriteString("nothing was sent: ")
	if e.Bad > 0 {
		fmt.Fprintf(&b, "%d bad line", e.Bad)
		if e.Bad > 1 {
			b.WriteString("s")
		}
		for _, l := range e.Lines {
			fmt.Fprintf(&b, "\n  %v", l)
		}
		if e.Bad > len(e.Lines) {
			fmt.Fprintf(&b, "\n  ... and %d more", e.Bad-len(e.Lines))
		}
		if e.Read != nil {
			b.WriteString("\n  ")
		}
	}
	if e.Read != nil {
		b.WriteString(e.Read.Error())
	}
	return b.String()
}

// Unwrap returns the read error, so that errors.Is finds ErrTruncatedInput.
func (e *InputError) Unwrap() error { return e.Read }

// SendError reports a send that failed after it started producing. Every
// line before ResumeLine was acknowledged by the broker (or was blank), so
// sending the input again from ResumeLine (send --from-line) produces what is
// missing; the records of the lines in AckedAfter were acknowledged as well
// (they were produced to other partitions while the failing record was in
// flight) and would be sent twice.
type SendError struct {
	Sent       int64 // records acknowledged by the broker
	ResumeLine int   // first line whose record was not acknowledged
	AckedAfter []int // lines after ResumeLine whose records were acknowledged, ascending
	Err        error // the first produce error, or the context's
}

func (e *SendError) Error() string {
	were := "were"
	if e.Sent == 1 {
		were = "was"
	}
	msg := fmt.Sprintf("send stopped: %v; %s %s sent, every line before %d included: resume with --from-line %d",
		e.Err, plural(e.Sent, "record"), were, e.ResumeLine, e.ResumeLine)
	if n := len(e.AckedAfter); n > 0 {
		shown := e.AckedAfter[:min(n, 10)]
		list := strings.Trim(fmt.Sprint(shown), "[]")
		if n > len(shown) {
			list += fmt.Sprintf(" and %d more", n-len(shown))
		}
		if n == 1 {
			msg += fmt.Sprintf(" (1 later line was sent as well and would be sent again: %s)", list)
		} else {
			msg += fmt.Sprintf(" (%d later lines were sent as well and would be sent again: %s)", n, list)
		}
	}
	return msg
}

// Unwrap returns the produce error.
func (e *SendError) Unwrap() error { return e.Err }

// SendStats counts what SendLines produced.
type SendStats struct {
	Records int64 // records acknowledged by the broker
	Bytes   int64 // bytes of input read, newlines included
	Lines   int   // lines read, blank lines included
}

// OpenInput opens a JSONL file, decompressing it when its name ends in .gz;
// "-" is standard input. Reading a truncated gzip file fails with
// ErrTruncatedInput and a corrupt one with ErrCorruptInput.
func OpenInput(path string) (io.ReadCloser, error) {
	if path == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, gzipError(path, 0, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{&gzipInput{z: z}, multiCloser{z, f}}, nil
}

// gzipInput turns the errors of a gzip stream into ErrTruncatedInput and
// ErrCorruptInput naming the file and how much of it decompressed.
type gzipInput struct {
	z *gzip.Reader
	n int64 // decompressed bytes returned so far
}

func (g *gzipInput) Read(p []byte) (int, error) {
	n, err := g.z.Read(p)
	g.n += int64(n)
	if err != nil && err != io.EOF {
		err = gzipError("", g.n, err)
	}
	return n, err
}

// gzipError explains err, returned after n bytes of data were decompressed;
// it names path unless path is empty (the caller names the file).
func gzipError(path string, n int64, err error) error {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		err = fmt.Errorf("%w: the gzip stream ends after %d bytes of data without its end marker (an interrupted download or copy?)", ErrTruncatedInput, n)
	case errors.Is(err, gzip.ErrChecksum), errors.Is(err, gzip.ErrHeader):
		err = fmt.Errorf("%w after %d bytes of data: %v", ErrCorruptInput, n, err)
	}
	if path == "" {
		return err
	}
	return fmt.Errorf("%s: %w", path, err)
}

type multiCloser []io.Closer

func (m multiCloser) Close() error {
	var errs []error
	for _, c := range m {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// lineScanner reads one JSONL line at a time (up to 16 MiB). A read error
// (a truncated gzip stream) ends the scan with that error; the partial line
// before it is never returned as a line, so it is reported as what it is, not
// as a JSON error.
type lineScanner struct {
	sc   *bufio.Scanner
	rerr error // the reader's first error other than io.EOF
	line int   // number of the line last returned
}

func newLineScanner(r io.Reader) *lineScanner {
	ls := &lineScanner{}
	ls.sc = bufio.NewScanner(readerFunc(func(p []byte) (int, error) {
		n, err := r.Read(p)
		if err != nil && err != io.EOF && ls.rerr == nil {
			ls.rerr = err
		}
		return n, err
	}))
	ls.sc.Buffer(make([]byte, 64<<10), 16<<20)
	ls.sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if atEOF && ls.rerr != nil && bytes.IndexByte(data, '\n') < 0 {
			return 0, nil, ls.rerr
		}
		return bufio.ScanLines(data, atEOF)
	})
	return ls
}

type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// scan advances to the next line.
func (ls *lineScanner) scan() bool {
	if !ls.sc.Scan() {
		return false
	}
	ls.line++
	return true
}

// err returns why scanning stopped early (nil at the end of the input), with
// the last complete line.
func (ls *lineScanner) err() error {
	err := ls.sc.Err()
	if err == nil {
		return nil
	}
	if errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("line %d: longer than 16 MiB: %w", ls.line+1, err)
	}
	return fmt.Errorf("read input after line %d: %w", ls.line, err)
}

// lineRules say what a line must hold to be sent: a JSON object; a string
// field keyField when keyField is not empty (the record key), accepted by
// checkKey when it is not nil (the topic's key codec); a field tsField when
// tsField is not empty (the record timestamp: an RFC 3339 string or epoch
// milliseconds); and the whole line accepted by check when it is not nil
// (the topic's value codec).
type lineRules struct {
	keyField, tsField string
	checkKey, check   func([]byte) error
}

// parsedLine is what parseLine found in a line: the record key (nil without
// a key field), its timestamp (zero without a timestamp field: the producer
// stamps the send time), and whether the line is blank (white space only,
// skipped).
type parsedLine struct {
	key   []byte
	ts    time.Time
	blank bool
}

// parseLine checks one JSONL line against r.
func parseLine(b []byte, r lineRules) (parsedLine, error) {
	var out parsedLine
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		out.blank = true
		return out, nil
	}
	if r.keyField == "" && r.tsField == "" {
		if t[0] != '{' || !json.Valid(t) {
			return out, errors.New("not a JSON object")
		}
	} else {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(t, &obj); err != nil {
			return out, fmt.Errorf("not a JSON object: %w", err)
		}
		if obj == nil {
			return out, errors.New("not a JSON object: null")
		}
		if r.keyField != "" {
			var k string
			raw, ok := obj[r.keyField]
			if !ok || json.Unmarshal(raw, &k) != nil {
				return out, fmt.Errorf("field %q is missing or not a string", r.keyField)
			}
			out.key = []byte(k)
			if r.checkKey != nil {
				if err := r.checkKey(out.key); err != nil {
					return out, fmt.Errorf("field %q: %w", r.keyField, err)
				}
			}
		}
		if r.tsField != "" {
			raw, ok := obj[r.tsField]
			if !ok {
				return out, fmt.Errorf("timestamp field %q is missing", r.tsField)
			}
			ts, err := parseTimestamp(raw)
			if err != nil {
				return out, fmt.Errorf("timestamp field %q: %w", r.tsField, err)
			}
			out.ts = ts
		}
	}
	if r.check != nil {
		if err := r.check(b); err != nil {
			return out, err
		}
	}
	return out, nil
}

// parseTimestamp reads a record timestamp from a JSON value: an RFC 3339
// string ("2024-05-01T12:00:00Z", fractional seconds and any offset allowed)
// or a whole number of milliseconds since the Unix epoch, the unit of a
// Kafka record timestamp. Kafka reserves negative timestamps (-1 is "no
// timestamp"), so a time before 1970 is refused.
func parseTimestamp(raw json.RawMessage) (time.Time, error) {
	const want = "want an RFC 3339 string or epoch milliseconds (a whole number >= 0)"
	v := bytes.TrimSpace(raw)
	var ts time.Time
	switch {
	case len(v) > 0 && v[0] == '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", v, err)
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, fmt.Errorf("%q is not an RFC 3339 time (%s)", s, want)
		}
		ts = t
	case len(v) > 0 && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9')):
		ms, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("%s is not a whole number of milliseconds (%s)", v, want)
		}
		ts = time.UnixMilli(ms)
	default:
		return time.Time{}, fmt.Errorf("%s: %s", v, want)
	}
	if ts.UnixMilli() < 0 {
		return time.Time{}, fmt.Errorf("%s is before 1970: Kafka timestamps are milliseconds >= 0", v)
	}
	return ts, nil
}

// ValidateLines reads r to its end and checks every line as SendLines would
// produce it: a JSON object, with a string field keyField when keyField is not
// empty, accepted by check when check is not nil (SendInput passes the topic's
// value codec). It returns the counts of the input and an *InputError listing
// the bad lines and any read error; it produces nothing.
func ValidateLines(r io.Reader, keyField string, check func([]byte) error) (SendStats, error) {
	return validateLines(r, lineRules{keyField: keyField, check: check})
}

// validateLines is ValidateLines with every rule of rules (the key codec's
// check and the timestamp field as well).
func validateLines(r io.Reader, rules lineRules) (SendStats, error) {
	var st SendStats
	ie := &InputError{}
	ls := newLineScanner(r)
	for ls.scan() {
		b := ls.sc.Bytes()
		st.Lines++
		st.Bytes += int64(len(b)) + 1
		pl, err := parseLine(b, rules)
		if err != nil {
			ie.Bad++
			if len(ie.Lines) < maxLineErrors {
				ie.Lines = append(ie.Lines, LineError{Line: ls.line, Err: err})
			}
			continue
		}
		if !pl.blank {
			st.Records++
		}
	}
	ie.Read = ls.err()
	if ie.Bad > 0 || ie.Read != nil {
		return st, ie
	}
	return st, nil
}

// ackTracker finds the first line whose record the broker has not
// acknowledged. Invariant (under mu): every line below next is done (its
// record acknowledged, or blank, or skipped); done holds the lines at or above
// next that are done, true for those with an acknowledged record.
type ackTracker struct {
	mu    sync.Mutex
	next  int
	done  map[int]bool
	acked int64
	err   error // the first delivery error
}

func (t *ackTracker) finish(line int, record bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if record {
		t.acked++
	}
	if line != t.next {
		t.done[line] = record
		return
	}
	for t.next++; ; t.next++ {
		if _, ok := t.done[t.next]; !ok {
			return
		}
		delete(t.done, t.next)
	}
}

func (t *ackTracker) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
}

func (t *ackTracker) failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err != nil
}

// SendLines produces every line of r (one JSON object a line) to topic, keyed
// by the string field keyField of each object (no key when keyField is empty)
// and partitioned like Runnel's own sends (murmur2 of the key; a keyless
// record goes to partition line mod partitions). Lines before fromLine
// (1-based; 0 or 1 sends everything) are read but not produced.
//
// SendLines reads its input once, so a bad line found halfway stops it after
// the lines before were produced: callers that can read the input twice use
// SendInput, which validates everything first. A bad line gives an error
// naming it; a produce failure (or the end of ctx) stops producing and gives
// a *SendError saying how many records were sent and from which line to
// resume. progress, if not nil, is called with the bytes read so far.
func SendLines(ctx context.Context, client *Client, topic string, partitions int32, keyField string, r io.Reader, progress func(n int64)) (SendStats, error) {
	return sendLines(ctx, client.sc, topic, partitions, lineRules{keyField: keyField}, 0, r, progress)
}

func sendLines(ctx context.Context, client sarama.Client, topic string, partitions int32, rules lineRules, fromLine int, r io.Reader, progress func(n int64)) (SendStats, error) {
	var st SendStats
	if partitions < 1 {
		return st, fmt.Errorf("send to %s: %d partitions", topic, partitions)
	}
	p, err := kafka.NewProducer(kafka.ProducerConfigOf(client))
	if err != nil {
		return st, fmt.Errorf("send to %s: %w", topic, err)
	}
	tr := &ackTracker{next: 1, done: map[int]bool{}}
	ls := newLineScanner(r)
	var stop error // why producing stopped before the end of the input
	for ls.scan() {
		line, b := ls.line, ls.sc.Bytes()
		st.Lines++
		st.Bytes += int64(len(b)) + 1
		if progress != nil {
			progress(st.Bytes)
		}
		if err := ctx.Err(); err != nil {
			stop = err
			break
		}
		if tr.failed() {
			break
		}
		pl, err := parseLine(b, rules)
		if err != nil {
			stop = LineError{Line: line, Err: err}
			break
		}
		if pl.blank || line < fromLine {
			tr.finish(line, false)
			continue
		}
		part := int32(line % int(partitions))
		if pl.key != nil {
			part = kafka.PartitionFor(pl.key, partitions)
		}
		msg := &sarama.ProducerMessage{Topic: topic, Partition: part, Key: bytesOrNil(pl.key), Value: sarama.ByteEncoder(slices.Clone(b)),
			Timestamp: pl.ts}
		if err := p.Send(msg, func(_ int32, _ int64, err error) {
			if err != nil {
				tr.fail(fmt.Errorf("line %d: %w", line, err))
				return
			}
			tr.finish(line, true)
		}); err != nil {
			tr.fail(fmt.Errorf("line %d: %w", line, err))
			break
		}
	}
	if stop == nil && !tr.failed() {
		stop = ls.err()
	}
	cerr := p.Close() // waits for every delivery report
	tr.mu.Lock()
	defer tr.mu.Unlock()
	st.Records = tr.acked
	if tr.err == nil && cerr == nil {
		if stop == nil {
			return st, nil
		}
		var le LineError
		if errors.As(stop, &le) || errors.Is(stop, ErrTruncatedInput) || errors.Is(stop, ErrCorruptInput) {
			// A bad line or a bad file: what was read before it was sent.
			return st, fmt.Errorf("%w (%s sent before it; resume with --from-line %d once fixed)", stop, plural(st.Records, "record"), tr.next)
		}
	}
	se := &SendError{Sent: tr.acked, ResumeLine: tr.next, Err: errors.Join(tr.err, stop, cerr)}
	for l, rec := range tr.done {
		if rec {
			se.AckedAfter = append(se.AckedAfter, l)
		}
	}
	slices.Sort(se.AckedAfter)
	return st, se
}

// SendOptions configure SendInput.
type SendOptions struct {
	// Topic and Partitions are the destination; Partitions must be the
	// topic's partition count (records are partitioned by the key's murmur2).
	Topic      string
	Partitions int32
	// KeyField is the JSON string field used as the record key; empty sends
	// records without a key.
	KeyField string
	// TimestampField is the JSON field holding each record's timestamp (the
	// event time of windowed tables and stream-time timers): an RFC 3339
	// string or epoch milliseconds. A line without it, or with another
	// value, is bad. Empty: the producer stamps each record with the time
	// it is sent.
	TimestampField string
	// FromLine skips the lines before it (1-based; 0 sends everything): the
	// resume line of a SendError. The skipped lines are still validated.
	FromLine int
	// CheckValue, if not nil, is called with every line before anything is
	// produced; an error makes the line bad (the topic's value codec).
	CheckValue func([]byte) error
	// CheckKey, if not nil, is called with every line's key (the KeyField
	// string) before anything is produced; an error makes the line bad (the
	// topic's key codec).
	CheckKey func([]byte) error
	// Progress, if not nil, is called while producing with the bytes of input
	// read so far and their total (uncompressed, newlines included).
	Progress func(done, total int64)
}

// SendInput validates the whole JSONL input at path (see OpenInput) with
// ValidateLines, then produces it with the rules of SendLines. A bad line, a
// truncated or corrupt file gives an *InputError and produces nothing; a
// failure while producing gives a *SendError with the line to resume from.
// Standard input ("-") is spooled to a temporary file while it is validated.
func SendInput(ctx context.Context, client *Client, path string, o SendOptions) (SendStats, error) {
	in, err := prepareInput(path, o)
	if err != nil {
		return SendStats{}, err
	}
	defer in.close()
	return in.send(ctx, client.sc)
}

// preparedInput is an input validated whole, ready to be produced: several
// inputs (dev and send with more than one --input) are all validated before
// any is produced.
type preparedInput struct {
	path  string
	o     SendOptions
	st    SendStats // of the whole input
	spool *os.File  // standard input, spooled while it was validated; nil for a file
}

// prepareInput validates the input at path with o's rules. Errors name path:
// an *InputError (bad lines, a truncated or corrupt file), a --from-line past
// the end, an open error.
func prepareInput(path string, o SendOptions) (*preparedInput, error) {
	in, err := OpenInput(path)
	if err != nil {
		return nil, err
	}
	p := &preparedInput{path: path, o: o}
	var r io.Reader = in
	if path == "-" {
		if p.spool, err = os.CreateTemp("", "runnel-send-*.jsonl"); err != nil {
			in.Close()
			return nil, fmt.Errorf("spool stdin: %w", err)
		}
		r = io.TeeReader(in, p.spool)
	}
	p.st, err = validateLines(r, o.rules())
	in.Close()
	if err == nil && o.FromLine > p.st.Lines+1 {
		err = fmt.Errorf("--from-line %d is past the end of the input (%s)", o.FromLine, plural(int64(p.st.Lines), "line"))
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

func (o SendOptions) rules() lineRules {
	return lineRules{keyField: o.KeyField, tsField: o.TimestampField, checkKey: o.CheckKey, check: o.CheckValue}
}

// send produces the prepared input (read again from its file or spool).
func (p *preparedInput) send(ctx context.Context, client sarama.Client) (SendStats, error) {
	var r io.Reader
	if p.spool != nil {
		if _, err := p.spool.Seek(0, io.SeekStart); err != nil {
			return SendStats{}, fmt.Errorf("spool stdin: %w", err)
		}
		r = p.spool
	} else {
		in, err := OpenInput(p.path)
		if err != nil {
			return SendStats{}, err
		}
		defer in.Close()
		r = in
	}
	var progress func(int64)
	if p.o.Progress != nil {
		progress = func(n int64) { p.o.Progress(n, p.st.Bytes) }
	}
	return sendLines(ctx, client, p.o.Topic, p.o.Partitions, p.o.rules(), p.o.FromLine, r, progress)
}

// close removes the spool of standard input, if any.
func (p *preparedInput) close() {
	if p.spool != nil {
		p.spool.Close()
		os.Remove(p.spool.Name())
		p.spool = nil
	}
}
