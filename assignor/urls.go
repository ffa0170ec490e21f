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
