package assignor

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
)

func sampleSubscription() subscription {
	return subscription{
		Instance: 1 << 60, ProcessID: "proc-1", URL: "http://h:8080", Generation: 7,
		PrevActives:  map[string][]int32{"src": {0, 3, 9}, "tbl-changelog": {0, 3, 9}},
		PrevStandbys: map[string][]int32{"tbl-changelog": {1, 2}},
		Offsets:      map[string]map[int32]int64{"tbl-changelog": {0: 41, 3: -1, 9: 1 << 40}},
		Since:        map[string]map[int32]int32{"src": {0: 3, 9: 5}, "tbl-changelog": {0: 3, 9: 5}},
		Earlier:      map[string]map[int32]int32{"src": {1: 2, 4: 6}, "tbl-changelog": {1: 2, 4: 6}},
	}
}

func sampleAssignment() assignmentData {
	return assignmentData{
		Generation: 12, MemberID: "m-1", LeaderID: "m-0", Probe: true,
		Actives:  map[string][]int32{"src": {0, 5}},
		Standbys: map[string][]int32{"cl": {1}},
		Warmups:  map[string][]int32{"cl": {2}},
		Globals:  map[string][]int32{"g": {0, 1, 2}},
		URLs:     map[string]map[int32]string{"src": {0: "http://a", 1: "http://b", 5: "http://a"}},
		Pending:  map[string][]int32{"src": {3}, "cl": {3}},
	}
}

func TestWireRoundTrip(t *testing.T) {
	s := sampleSubscription()
	b := encodeSubscription(s)
	got, err := decodeSubscription(b)
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("subscription: %+v %v, want %+v", got, err, s)
	}
	a := sampleAssignment()
	got2, err := decodeAssignment(encodeAssignment(a))
	if err != nil || !reflect.DeepEqual(got2, a) {
		t.Fatalf("assignment: %+v %v, want %+v", got2, err, a)
	}
	t.Logf("subscription %d bytes, assignment %d bytes", len(b), len(encodeAssignment(a)))
}

// reseal sets an enveloped payload's version and appends extra body bytes,
// with a valid checksum.
func reseal(b []byte, version byte, extra ...byte) []byte {
	body := append(slices.Clone(b[len(magic)+1:len(b)-4]), extra...)
	return seal(version, body)
}

// A newer version appends fields: this decoder reads what it knows.
func TestWireFutureVersion(t *testing.T) {
	b := reseal(encodeSubscription(sampleSubscription()), subscriptionVersion+1, 0xde, 0xad, 0xbe, 0xef)
	got, err := decodeSubscription(b)
	if err != nil || !reflect.DeepEqual(got, sampleSubscription()) {
		t.Fatalf("future subscription: %+v %v", got, err)
	}
	ab := reseal(encodeAssignment(sampleAssignment()), 200, 1, 2, 3)
	if got, err := decodeAssignment(ab); err != nil || !reflect.DeepEqual(got, sampleAssignment()) {
		t.Fatalf("future assignment: %+v %v", got, err)
	}
	// On its own version, trailing bytes are an error.
	if _, err := decodeSubscription(reseal(encodeSubscription(sampleSubscription()), subscriptionVersion, 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte: %v", err)
	}
}

// Every single-bit flip of an enveloped payload is rejected (CRC-32C detects
// all 1-bit errors), so corrupt data is never half-trusted (issue #13: 854 of
// 10 000 mutated v1 payloads decoded).
func TestWireBitFlipsRejected(t *testing.T) {
	for name, good := range map[string][]byte{
		"subscription": encodeSubscription(sampleSubscription()),
		"assignment":   encodeAssignment(sampleAssignment()),
	} {
		for i := range len(good) * 8 {
			b := slices.Clone(good)
			b[i/8] ^= 1 << (i % 8)
			_, err1 := decodeSubscription(b)
			_, err2 := decodeAssignment(b)
			if err1 == nil || err2 == nil {
				t.Fatalf("%s: bit %d flipped still decodes (%v, %v)", name, i, err1, err2)
			}
		}
	}
}

func TestWireForeign(t *testing.T) {
	// Sarama's sticky strategy user data starts with a big-endian int16
	// version; a JSON payload with '{'.
	for _, b := range [][]byte{{0, 1, 0, 0, 0, 0}, []byte(`{"a":1}`), {0xff}} {
		if _, err := decodeSubscription(b); !errors.Is(err, ErrForeign) || !errors.Is(err, ErrMalformed) {
			t.Errorf("%x: err = %v, want ErrForeign", b, err)
		}
		if _, err := decodeAssignment(b); !errors.Is(err, ErrForeign) {
			t.Errorf("%x (assignment): err = %v, want ErrForeign", b, err)
		}
	}
	b := encodeAssignment(sampleAssignment())
	b[len(b)-1] ^= 0xff
	if _, err := decodeAssignment(b); !errors.Is(err, ErrChecksum) {
		t.Errorf("bad trailer: %v, want ErrChecksum", err)
	}
}

func TestWireGarbage(t *testing.T) {
	good := encodeSubscription(sampleSubscription())
	cases := map[string][]byte{
		"empty":      nil,
		"version 0":  {0, 1, 2},
		"truncated":  good[:len(good)-1],
		"trailing":   append(append([]byte{}, good...), 0),
		"huge count": {1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"json":       []byte(`{"actives":{}}`),
	}
	for name, b := range cases {
		if _, err := decodeSubscription(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
		if _, err := decodeAssignment(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s (assignment): err = %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeSubscription(sampleSubscription()))
	f.Add(encodeAssignment(sampleAssignment()))
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0})
	f.Add(encodeSubscriptionV1(sampleSubscription()))
	f.Add(encodeAssignmentV2(sampleAssignment()))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Whatever decodes must re-encode to a fixed point (encoding normalizes:
		// sorted, deduplicated, empty topics dropped).
		if s, err := decodeSubscription(b); err == nil {
			e1 := encodeSubscription(s)
			s2, err := decodeSubscription(e1)
			if err != nil || !bytes.Equal(encodeSubscription(s2), e1) {
				t.Fatalf("subscription re-encode: %v", err)
			}
		}
		if a, err := decodeAssignment(b); err == nil {
			e1 := encodeAssignment(a)
			a2, err := decodeAssignment(e1)
			if err != nil || !bytes.Equal(encodeAssignment(a2), e1) {
				t.Fatalf("assignment re-encode: %v", err)
			}
		}
	})
}

// The previous release's payloads (subscription v1; assignment v1 and v2,
// no envelope) still decode: a rolling upgrade keeps the members' state.
func TestWireLegacyVersions(t *testing.T) {
	s := sampleSubscription()
	s.Earlier = nil // v4
	if got, err := decodeSubscription(encodeSubscriptionV3(s)); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("v3 subscription: %+v %v", got, err)
	}
	s.Since = nil // v3
	if got, err := decodeSubscription(encodeSubscriptionV1(s)); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("v1 subscription: %+v %v", got, err)
	}
	if got, err := decodeSubscription(encodeSubscriptionV2(s)); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("v2 subscription: %+v %v", got, err)
	}
	a := sampleAssignment()
	v2 := encodeAssignmentV2(a)
	if got, err := decodeAssignment(v2); err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("v2 assignment: %+v %v, want %+v", got, err, a)
	}
	a.Pending = nil
	b := encodeAssignmentV2(a)
	if b[0] != 2 || b[len(b)-1] != 0 {
		t.Fatalf("v2 assignment should end with an empty pending map: %x", b)
	}
	v1 := append([]byte{1}, b[1:len(b)-1]...)
	got, err := decodeAssignment(v1)
	if err != nil || got.Pending != nil || !reflect.DeepEqual(got.Actives, a.Actives) || !reflect.DeepEqual(got.URLs, a.URLs) {
		t.Fatalf("v1 assignment: %+v %v", got, err)
	}
	if _, err := decodeAssignment(append(b, 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte on v2: %v", err)
	}
	// A previous release's decoder reads the first byte as the version: the
	// envelope's leading zero makes it reject the payload ("version 0").
	if encodeSubscription(s)[0] != 0 || encodeAssignment(a)[0] != 0 {
		t.Fatal("enveloped payloads must start with a zero byte")
	}
}
