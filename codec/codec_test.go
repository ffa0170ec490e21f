package codec

import (
	"math"
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
	if _, err := Int64().Decode([]byte{1, 2, 3}); err == nil {
		t.Fatal("3 bytes decoded as int64")
	}
	if _, err := DecimalInt64().Decode([]byte("x1")); err == nil {
		t.Fatal("x1 decoded as decimal")
	}
}
