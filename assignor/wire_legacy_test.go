package assignor

import "slices"

// The encoders of the previous releases (subscription v1, v2 and v3,
// assignment v2, the first two without the envelope), kept to test that
// their payloads still decode during a rolling upgrade.

func encodeSubscriptionV1(s subscription) []byte {
	return append([]byte{legacySubscriptionVersion}, encodeSubscriptionV2Body(s).b...)
}

// encodeSubscriptionV2 is the previous release's enveloped subscription (no
// since section).
func encodeSubscriptionV2(s subscription) []byte {
	return seal(2, encodeSubscriptionV2Body(s).b)
}

// encodeSubscriptionV3 is the previous release's subscription (no earlier
// actives). Its decoder reads a v4 payload as v3: a newer version's
// appended fields are ignored (TestWireFutureVersion).
func encodeSubscriptionV3(s subscription) []byte {
	e := encodeSubscriptionV2Body(s)
	e.genMap(s.Since, s.Generation)
	return seal(3, e.b)
}

func encodeAssignmentV2(a assignmentData) []byte {
	e := &encoder{b: []byte{legacyAssignmentVersion}}
	e.varint(int64(a.Generation))
	e.str(a.MemberID)
	e.str(a.LeaderID)
	var flags uint64
	if a.Probe {
		flags |= 1
	}
	e.uvarint(flags)
	e.topicMap(a.Actives)
	e.topicMap(a.Standbys)
	e.topicMap(a.Warmups)
	e.topicMap(a.Globals)
	idx := map[string]int{}
	urls := urlTable(a.URLs)
	for i, u := range urls {
		idx[u] = i
	}
	e.uvarint(uint64(len(urls)))
	for _, u := range urls {
		e.str(u)
	}
	topics := sortedKeys(a.URLs)
	e.uvarint(uint64(len(topics)))
	for _, t := range topics {
		var n int32
		for p := range a.URLs[t] {
			n = max(n, p+1)
		}
		e.str(t)
		e.uvarint(uint64(n))
		for p := range n {
			if u, ok := a.URLs[t][p]; ok && u != "" {
				e.uvarint(uint64(idx[u] + 1))
			} else {
				e.uvarint(0)
			}
		}
	}
	e.topicMap(a.Pending)
	return slices.Clip(e.b)
}
