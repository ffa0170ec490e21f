package app

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzValidateLines feeds the JSONL reader arbitrary input, with and without a
// key field. It must never panic, and its verdict must agree with parseLine
// applied to each line on its own: the records it counts are the non-blank
// lines, and a line it reports bad is one parseLine rejects. `go test` runs
// the seeds (f.Add and testdata/fuzz/FuzzValidateLines); `go test
// -fuzz=FuzzValidateLines ./app` searches further.
func FuzzValidateLines(f *testing.F) {
	for _, s := range []string{
		"{\"actor\":\"a\",\"dirs\":[\"d\"]}\n{\"actor\":\"b\"}\n",
		"null\n", "[]\n", "\"x\"\n", "{\"actor\":5}\n", "{\"actor\":null}\n", "{\"actor\":\"\"}",
		"\n\n  \n\t\n", "{\"actor\":\"a\"}\r\n{\"actor\":\"b\"}\r\n", "{\"actor\":\"a\"", "\xff\xfe{}\n",
		"{\"actor\":\"a\",\"actor\":\"b\"}\n", "{} {}\n", "{\"actor\":\"\\ud800\"}\n",
	} {
		f.Add([]byte(s), "actor")
		f.Add([]byte(s), "")
	}
	f.Fuzz(func(t *testing.T, data []byte, keyField string) {
		st, err := ValidateLines(bytes.NewReader(data), keyField, nil)
		var ie *InputError
		if err != nil && !errors.As(err, &ie) {
			t.Fatalf("error %v is not an *InputError", err)
		}
		if ie != nil && ie.Read != nil {
			t.Fatalf("read error on an in-memory input: %v", ie.Read)
		}
		// Count the way a reader of the file would: split on '\n', drop the
		// '\r' of a CRLF, and no line after a final newline.
		lines := bytes.Split(data, []byte("\n"))
		if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1]
		}
		if st.Lines != len(lines) {
			t.Fatalf("%d lines counted, want %d", st.Lines, len(lines))
		}
		var records int64
		var bad []int
		for i, l := range lines {
			pl, err := parseLine(bytes.TrimSuffix(l, []byte("\r")), lineRules{keyField: keyField})
			switch {
			case err != nil:
				bad = append(bad, i+1)
			case !pl.blank:
				records++
			}
		}
		if st.Records != records {
			t.Fatalf("%d records counted, want %d", st.Records, records)
		}
		if (ie != nil) != (len(bad) > 0) {
			t.Fatalf("error %v, but bad lines are %v", err, bad)
		}
		if ie != nil {
			if ie.Bad != len(bad) || ie.Lines[0].Line != bad[0] {
				t.Fatalf("bad lines %d %+v, want %v", ie.Bad, ie.Lines, bad)
			}
		}
	})
}

// FuzzOpenInputGzip feeds OpenInput a .gz file of arbitrary bytes: either
// it reads as JSONL or the error is an *InputError (truncated, corrupt) or an
// open error; never a panic, never a bad line for a stream that did not
// decompress to its end.
func FuzzOpenInputGzip(f *testing.F) {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	z.Write([]byte("{\"actor\":\"a\"}\n{\"actor\":\"b\"}\n"))
	z.Close()
	full := b.Bytes()
	f.Add(full)
	f.Add(full[:len(full)/2])
	f.Add(full[:10])
	f.Add(append(append([]byte{}, full...), full...)) // two members
	corrupt := append([]byte{}, full...)
	corrupt[len(corrupt)-6]++ // CRC
	f.Add(corrupt)
	f.Add([]byte("not gzip"))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "in.jsonl.gz")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		in, err := OpenInput(path)
		if err != nil {
			return
		}
		defer in.Close()
		_, err = ValidateLines(in, "actor", nil)
		var ie *InputError
		if err != nil && !errors.As(err, &ie) {
			t.Fatalf("error %v is not an *InputError", err)
		}
		if ie != nil && ie.Read != nil && !errors.Is(ie.Read, ErrTruncatedInput) && !errors.Is(ie.Read, ErrCorruptInput) {
			t.Logf("read error neither truncated nor corrupt: %v", ie.Read)
		}
	})
}
