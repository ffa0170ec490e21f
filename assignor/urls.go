package assignor

import (
	"errors"
	"fmt"
	"slices"

	"github.com/IBM/sarama"
)

// ErrURLsStale is returned by URLsFromGroup when the group description holds
// assignments of different generations, or none: a rebalance is under way;
// describe the group again after the next OnAssignment.
var ErrURLsStale = errors.New("runnel assignor: group description is mid-rebalance")

// MemberURL returns the HTTP URL a member of the group published in its
// subscription (the JoinGroup metadata this assignor writes,
// Config.URL), from a DescribeGroups response's member; "" when it published
// none or its metadata is not this assignor's. Unlike the partition -> URL
// map it names members that hold no active (only standbys, or nothing).
func MemberURL(m *sarama.GroupMemberDescription) string {
	if m == nil {
		return ""
	}
	meta, err := m.GetMemberMetadata()
	if err != nil || meta == nil {
		return ""
	}
	sub, err := decodeSubscription(meta.UserData)
	if err != nil {
		return ""
	}
	return sub.URL
}

// URLsFromGroup derives the partition -> URL map for interactive queries from
// a DescribeGroups response (sarama ClusterAdmin.DescribeConsumerGroups) of
// the group: every member's JoinGroup metadata carries its URL (subscription
// user data) and its SyncGroup assignment carries its actives and pending
// actives. It is the same map the leader would have sent (Assignment.URLs),
// for groups whose assignments leave it out (Assignment.URLsOmitted, see
// Config.MaxURLMapBytes). It returns the map (topic -> partition -> URL) and
// the generation of the assignments; compare it with Assignment.Generation.
//
// A member whose user data does not decode (another assignor's, corrupt) is
// skipped: its partitions have no URL. Errors: ErrURLsStale when the
// members' assignments are of different generations or there are none; a
// description error from the broker (desc.Err) is returned wrapped.
func URLsFromGroup(desc *sarama.GroupDescription) (map[string]map[int32]string, int32, error) {
	if desc == nil {
		return nil, -1, fmt.Errorf("urls from group: no description: %w", ErrURLsStale)
	}
	if desc.Err != sarama.ErrNoError {
		return nil, -1, fmt.Errorf("urls from group %s: %w", desc.GroupId, desc.Err)
	}
	ids := make([]string, 0, len(desc.Members))
	for id := range desc.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	urls := map[string]map[int32]string{}
	gen := int32(-1)
	for _, id := range ids {
		m := desc.Members[id]
		meta, err := m.GetMemberMetadata()
		if err != nil || meta == nil {
			continue
		}
		asg, err := m.GetMemberAssignment()
		if err != nil || asg == nil || len(asg.UserData) == 0 {
			continue
		}
		sub, err := decodeSubscription(meta.UserData)
		if err != nil {
			continue
		}
		a, err := decodeAssignment(asg.UserData)
		if err != nil {
			continue
		}
		if gen >= 0 && a.Generation != gen {
			return nil, -1, fmt.Errorf("urls from group %s: generations %d and %d: %w", desc.GroupId, gen, a.Generation, ErrURLsStale)
		}
		gen = a.Generation
		if sub.URL == "" {
			continue
		}
		for _, tp := range []map[string][]int32{a.Actives, a.Pending} {
			for t, ps := range tp {
				if urls[t] == nil {
					urls[t] = map[int32]string{}
				}
				for _, p := range ps {
					urls[t][p] = sub.URL
				}
			}
		}
	}
	if gen < 0 {
		return nil, -1, fmt.Errorf("urls from group %s: no decodable assignment: %w", desc.GroupId, ErrURLsStale)
	}
	return urls, gen, nil
}

// MembersFromGroup rebuilds the planner's input members from a DescribeGroups
// response of a live group (for `assignment plan --brokers`): each member's
// ID, subscribed topics, process, URL and local changelog offsets from its
// JoinGroup metadata, and what it would report at its next join from its
// current assignment: generation, previous actives (pending included) and
// previous standbys (warm-ups included). Members are sorted by ID. A member
// whose user data does not decode is returned without state (ID and topics
// only); its decoding error is in errs, keyed by member ID. A description
// error from the broker is returned wrapped.
func MembersFromGroup(desc *sarama.GroupDescription) (members []Member, errs map[string]error, err error) {
	if desc == nil {
		return nil, nil, errors.New("members from group: no description")
	}
	if desc.Err != sarama.ErrNoError {
		return nil, nil, fmt.Errorf("members from group %s: %w", desc.GroupId, desc.Err)
	}
	ids := make([]string, 0, len(desc.Members))
	for id := range desc.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	errs = map[string]error{}
	for _, id := range ids {
		d := desc.Members[id]
		m := Member{ID: id, Generation: -1}
		meta, err := d.GetMemberMetadata()
		if err != nil || meta == nil {
			errs[id] = fmt.Errorf("member %s metadata: %w", id, errors.Join(err, ErrMalformed))
			members = append(members, m)
			continue
		}
		m.Topics = slices.Clone(meta.Topics)
		sub, err := decodeSubscription(meta.UserData)
		if err != nil {
			errs[id] = fmt.Errorf("member %s: %w", id, err)
			members = append(members, m)
			continue
		}
		m.ProcessID, m.URL, m.Offsets = sub.ProcessID, sub.URL, sub.Offsets
		m.Generation, m.PrevActives, m.PrevStandbys = sub.Generation, sub.PrevActives, sub.PrevStandbys
		if asg, err := d.GetMemberAssignment(); err == nil && asg != nil && len(asg.UserData) > 0 {
			if a, err := decodeAssignment(asg.UserData); err == nil {
				m.Generation = a.Generation
				m.PrevActives = mergeTP(a.Actives, a.Pending)
				m.PrevStandbys = mergeTP(a.Standbys, a.Warmups)
			} else {
				errs[id] = fmt.Errorf("member %s assignment: %w", id, err)
			}
		}
		members = append(members, m)
	}
	return members, errs, nil
}

// mergeTP returns a ∪ b as topic -> sorted, deduplicated partitions.
func mergeTP(a, b map[string][]int32) map[string][]int32 {
	out := map[string][]int32{}
	for _, m := range []map[string][]int32{a, b} {
		for t, ps := range m {
			out[t] = append(out[t], ps...)
		}
	}
	for t := range out {
		slices.Sort(out[t])
		out[t] = slices.Compact(out[t])
	}
	return out
}
