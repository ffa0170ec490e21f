package codec

import (
	"math"
	"strings"
	"testing"
)

func TestRoundTrips(t *testing.T) {
	type change struct {
		Actor string   `json:"actor"`
		Dirs  []string `json:"dirs"`
	}
	j := JSON[change]()
	b, err := j.Encode(change{Actor: "u1", Dirs: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"actor":"u1","dirs":["a","b"]}` {
		t.Fatalf("json encoding = %s", b)
	}
	got, err := j.Decode(b)
	if err != nil || got.Actor != "u1" || len(got.Dirs) != 2 {
		t.Fatalf("json decode = %+v, %v", got, err)
	}
	for _, v := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64} {
		for _, c := range []Codec[int64]{Int64(), DecimalInt64()} {
			b, _ := c.Encode(v)
			if got, err := c.Decode(b); err != nil || got != v {
				t.Fatalf("%s(%d) round trip = %d, %v", c.Name(), v, got, err)
			}
		}
	}
}

func TestBadInputIsAnError(t *testing.T) {
	if _, err := JSON[map[string]int]().Decode([]byte("{")); err == nil {
		t.Fatal("truncated json decoded without error")
	}
	// null decodes only where Encode can write it: a struct, string or number
	// would come out as its zero value, an event nobody sent.
	if v, err := JSON[struct{ Actor string }]().Decode([]byte(" null\n")); err == nil {
		t.Fatalf("null decoded as a struct: %+v", v)
	}
	if _, err := JSON[string]().Decode([]byte("null")); err == nil {
		t.Fatal("null decoded as a string")
	}
	if v, err := JSON[*struct{ Actor string }]().Decode([]byte("null")); err != nil || v != nil {
		t.Fatalf("null as a pointer = %v, %v; want nil, no error", v, err)
	}
	if v, err := JSON[map[string]int]().Decode([]byte("null")); err != nil || v != nil {
		t.Fatalf("null as a map = %v, %v; want nil, no error", v, err)
	}
	if _, err := Int64().Decode([]byte{1, 2, 3}); err == nil {
		t.Fatal("3 bytes decoded as int64")
	}
	if _, err := DecimalInt64().Decode([]byte("x1")); err == nil {
		t.Fatal("x1 decoded as decimal")
	}
}

// TestStringViewIsEncode: String's View returns the bytes Encode returns,
// without a copy, and the empty string's view is empty but not nil (a nil
// value is a tombstone to the producer).
func TestStringViewIsEncode(t *testing.T) {
	c := String()
	vw, ok := c.(Viewer[string])
	if !ok {
		t.Fatal("String does not implement Viewer")
	}
	for _, s := range []string{"", "k", "héllo wörld", string([]byte{0, 0xff, 1})} {
		enc, _ := c.Encode(s)
		view := vw.View(s)
		if string(view) != string(enc) || len(view) != len(s) {
			t.Fatalf("View(%q) = %q, Encode = %q", s, view, enc)
		}
		if view == nil {
			t.Fatalf("View(%q) is nil: the producer would send a tombstone", s)
		}
	}
	s := strings.Repeat("x", 64)
	if allocs := testing.AllocsPerRun(100, func() { _ = vw.View(s) }); allocs != 0 {
		t.Fatalf("View allocates %.0f times per call, want 0", allocs)
	}
}

// TestIntegersAreKafkaSerializersBytes: Int64 and Int32 write what Kafka's
// LongSerializer and IntegerSerializer write (big-endian two's complement;
// the bytes below are those serializers' output for these values), and
// refuse any other length.
func TestIntegersAreKafkaSerializersBytes(t *testing.T) {
	for _, tc := range []struct {
		v    int64
		want []byte
	}{
		{42, []byte{0, 0, 0, 0, 0, 0, 0, 42}},
		{-1, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{1 << 40, []byte{0, 0, 1, 0, 0, 0, 0, 0}},
	} {
		b, err := Int64().Encode(tc.v)
		if err != nil || string(b) != string(tc.want) {
			t.Fatalf("Int64(%d) = % x, %v; want % x", tc.v, b, err, tc.want)
		}
	}
	for _, tc := range []struct {
		v    int32
		want []byte
	}{
		{42, []byte{0, 0, 0, 42}},
		{-2, []byte{0xff, 0xff, 0xff, 0xfe}},
		{math.MinInt32, []byte{0x80, 0, 0, 0}},
	} {
		b, err := Int32().Encode(tc.v)
		if err != nil || string(b) != string(tc.want) {
			t.Fatalf("Int32(%d) = % x, %v; want % x", tc.v, b, err, tc.want)
		}
		if got, err := Int32().Decode(b); err != nil || got != tc.v {
			t.Fatalf("Int32 round trip of %d = %d, %v", tc.v, got, err)
		}
	}
	if _, err := Int32().Decode([]byte{0, 0, 0, 0, 42}); err == nil {
		t.Fatal("5 bytes decoded as int32")
	}
}
