package codec

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strconv"
	"testing"
)

// The fuzz targets feed codecs arbitrary bytes, as a topic written by any
// producer can hold. Every Decode must return an error or a value, never
// panic; a value it returns must encode back to bytes that decode to the same
// value. `go test` runs the seeds (f.Add and testdata/fuzz/<target>); `go
// test -fuzz=FuzzJSON ./codec` searches further.

// fuzzEvent has the shapes user events have: nested, optional, numeric.
type fuzzEvent struct {
	Actor string            `json:"actor"`
	Dirs  []string          `json:"dirs"`
	N     int64             `json:"n"`
	F     float64           `json:"f"`
	Meta  map[string]string `json:"meta"`
	Next  *fuzzEvent        `json:"next"`
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{"actor":"u1","dirs":["a","b"],"n":3}`, `null`, `{}`, `[]`, `{"next":{"next":{}}}`,
		`{"n":1e400}`, `{"f":1e400}`, `{"actor":"\ud800"}`, `{"meta":{"a":"b"}`, "\xff", ``} {
		f.Add([]byte(s))
	}
	c := JSON[fuzzEvent]()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := c.Decode(b)
		if err != nil {
			return
		}
		if string(bytes.TrimSpace(b)) == "null" {
			t.Fatalf("null decoded as a struct: %+v", v)
		}
		enc, err := c.Encode(v)
		if err != nil {
			t.Fatalf("decoded %q to %+v, which does not encode: %v", b, v, err)
		}
		v2, err := c.Decode(enc)
		if err != nil {
			t.Fatalf("re-decode %q: %v", enc, err)
		}
		if !reflect.DeepEqual(v, v2) {
			t.Fatalf("round trip of %q: %+v became %+v", b, v, v2)
		}
	})
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"", "actor", "\xff\xfe", "a\x00b"} {
		f.Add([]byte(s))
	}
	c := String()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := c.Decode(b)
		if err != nil {
			t.Fatalf("string decode of %q: %v", b, err)
		}
		if enc, _ := c.Encode(v); !bytes.Equal(enc, b) {
			t.Fatalf("string round trip of %q gave %q", b, enc)
		}
	})
}

func FuzzBytes(f *testing.F) {
	for _, s := range []string{"", "x", "\x00\x01\x02"} {
		f.Add([]byte(s))
	}
	c := Bytes()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := c.Decode(b)
		if err != nil {
			t.Fatalf("bytes decode of %q: %v", b, err)
		}
		if len(b) > 0 {
			b0 := b[0]
			b[0]++ // Decode must not retain b
			if v[0] != b0 {
				t.Fatalf("bytes decode retained its input")
			}
			b[0] = b0
		}
		if enc, _ := c.Encode(v); !bytes.Equal(enc, b) {
			t.Fatalf("bytes round trip of %q gave %q", b, enc)
		}
	})
}

func FuzzInt64(f *testing.F) {
	for _, s := range []string{"", "\x00\x00\x00\x00\x00\x00\x00\x2a", "\xff\xff\xff\xff\xff\xff\xff\xff", "1234567", "123456789"} {
		f.Add([]byte(s))
	}
	c := Int64()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := c.Decode(b)
		if len(b) != 8 {
			if err == nil {
				t.Fatalf("int64 decoded %d bytes to %d", len(b), v)
			}
			return
		}
		if err != nil || v != int64(binary.BigEndian.Uint64(b)) {
			t.Fatalf("int64 decode of %x = %d, %v", b, v, err)
		}
		if enc, _ := c.Encode(v); !bytes.Equal(enc, b) {
			t.Fatalf("int64 round trip of %x gave %x", b, enc)
		}
	})
}

func FuzzDecimalInt64(f *testing.F) {
	for _, s := range []string{"0", "42", "-42", "+7", "007", "9223372036854775807", "-9223372036854775808",
		"9223372036854775808", "", " 1", "1 ", "0x10", "1e3"} {
		f.Add([]byte(s))
	}
	c := DecimalInt64()
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := c.Decode(b)
		want, werr := strconv.ParseInt(string(b), 10, 64)
		if (err == nil) != (werr == nil) || (err == nil && v != want) {
			t.Fatalf("decimal decode of %q = %d, %v; want %d, %v", b, v, err, want, werr)
		}
		if err != nil {
			return
		}
		enc, _ := c.Encode(v)
		if v2, err := c.Decode(enc); err != nil || v2 != v {
			t.Fatalf("decimal round trip of %q: %d became %q -> %d, %v", b, v, enc, v2, err)
		}
	})
}
