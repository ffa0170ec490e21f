package assignor

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"testing"

	"github.com/IBM/sarama"
)

// largeGroup plans P partitions of one source topic with three co-partitioned
// tables for n members through the Strategy (the leader's path: Plan, then
// AssignmentData per member) and returns the leader, the members' JoinGroup
// metadata and each member's encoded assignment.
func largeGroup(t *testing.T, p int32, n, replicas, maxURLBytes int) (*Strategy, map[string]sarama.ConsumerGroupMemberMetadata, map[string][]byte) {
	t.Helper()
	changelogs := map[string]int32{}
	for i := range 3 {
		changelogs[fmt.Sprintf("internet-scale-app-table-%d-changelog", i)] = p
	}
	const topic = "internet-scale-app-events"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var leader *Strategy
	members := map[string]sarama.ConsumerGroupMemberMetadata{}
	for i := range n {
		id := fmt.Sprintf("runnel-worker-%03d-3f9c2a1e-7b44-4c1d-9a55-%012d", i, i)
		st := NewStrategy(Config{Changelogs: changelogs, Replicas: replicas, MaxURLMapBytes: maxURLBytes,
			ProcessID: fmt.Sprintf("host-%03d", i), URL: fmt.Sprintf("http://worker-%03d.runnel.example.com:6066", i), Logger: quiet})
		if leader == nil {
			leader = st
		}
		ud, err := st.SubscriptionUserData([]string{topic})
		if err != nil {
			t.Fatal(err)
		}
		members[id] = sarama.ConsumerGroupMemberMetadata{Version: 1, Topics: []string{topic}, UserData: ud}
	}
	all := make([]int32, p)
	for q := range all {
		all[q] = int32(q)
	}
	plan, err := leader.Plan(members, map[string][]int32{topic: all})
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	for id, topics := range plan {
		b, err := leader.AssignmentData(id, topics, 7)
		if err != nil {
			t.Fatal(err)
		}
		data[id] = b
	}
	return leader, members, data
}

// Issue #13: the group's assignments (one __consumer_offsets record) stay
// below 1 MB at P=4096, N=256, R=2 with 3 tables. Version 2 sent the
// partition -> URL map to every member at one byte per partition and topic:
// 37 KB per member, 9.5 MB in all. Now the leader leaves the map out above
// MaxURLMapBytes and members derive it (URLsFromGroup).
func TestAssignmentSizeAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("plans 4096 partitions for 256 members")
	}
	_, _, data := largeGroup(t, 4096, 256, 2, 0)
	total, most := 0, 0
	for _, b := range data {
		total += len(b)
		most = max(most, len(b))
	}
	t.Logf("P=4096 N=256 R=2, 3 tables: %d bytes in all, %d per member at most", total, most)
	if total > 1_000_000 {
		t.Errorf("assignments total %d bytes, want <= 1 MB", total)
	}
	for id, b := range data {
		a, err := decodeAssignment(b)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if !a.URLsOmitted || len(a.URLs) != 0 {
			t.Fatalf("%s: URL map sent (%d topics) above the budget", id, len(a.URLs))
		}
	}
}

// Below the budget the compact URL map is sent (co-partitioned topics share
// one map, one partition list per URL): P=1024, N=64, 3 tables.
func TestAssignmentURLMapCompact(t *testing.T) {
	leader, _, data := largeGroup(t, 1024, 64, 1, 1<<30)
	total := 0
	for _, b := range data {
		total += len(b)
	}
	t.Logf("P=1024 N=64 R=1, 3 tables, URL map included: %d bytes in all (v2: ~450 KB)", total)
	var want map[string]map[int32]string
	for _, d := range leader.planned {
		want = d.URLs
		break
	}
	for id, b := range data {
		a, err := decodeAssignment(b)
		if err != nil {
			t.Fatal(err)
		}
		if a.URLsOmitted || !reflect.DeepEqual(a.URLs, want) {
			t.Fatalf("%s: URL map differs from the plan's", id)
		}
	}
	if len(want["internet-scale-app-events"]) != 1024 {
		t.Fatalf("URL map has %d partitions of the source, want 1024", len(want["internet-scale-app-events"]))
	}
}

// consumerProtocol encodes what sarama's DescribeGroups response carries for
// a consumer group member (Kafka's ConsumerProtocolSubscription v0 and
// ConsumerProtocolAssignment v0; sarama does not export its encoders).
func consumerProtocolSubscription(topics []string, userData []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(topics)))
	for _, t := range topics {
		b = binary.BigEndian.AppendUint16(b, uint16(len(t)))
		b = append(b, t...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(userData)))
	return append(b, userData...)
}

func consumerProtocolAssignment(topics map[string][]int32, userData []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(topics)))
	for _, t := range sortedKeys(topics) {
		b = binary.BigEndian.AppendUint16(b, uint16(len(t)))
		b = append(b, t...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(topics[t])))
		for _, p := range topics[t] {
			b = binary.BigEndian.AppendUint32(b, uint32(p))
		}
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(userData)))
	return append(b, userData...)
}

// URLsFromGroup rebuilds, from a group description, exactly the URL map the
// leader left out.
func TestURLsFromGroup(t *testing.T) {
	leader, members, data := largeGroup(t, 256, 16, 1, -1)
	desc := &sarama.GroupDescription{GroupId: "g", Members: map[string]*sarama.GroupMemberDescription{}}
	want := map[string]map[int32]string{} // the map the plan left out
	for id, d := range leader.planned {
		sub, err := decodeSubscription(members[id].UserData)
		if err != nil {
			t.Fatal(err)
		}
		url := sub.URL
		for topic, ps := range d.Actives {
			if want[topic] == nil {
				want[topic] = map[int32]string{}
			}
			for _, p := range ps {
				want[topic][p] = url
			}
		}
		a, _ := decodeAssignment(data[id])
		desc.Members[id] = &sarama.GroupMemberDescription{MemberId: id,
			MemberMetadata:   consumerProtocolSubscription(members[id].Topics, members[id].UserData),
			MemberAssignment: consumerProtocolAssignment(a.Actives, data[id])}
	}
	got, gen, err := URLsFromGroup(desc)
	if err != nil || gen != 7 || !reflect.DeepEqual(got, want) {
		t.Fatalf("URLsFromGroup: gen %d err %v, equal %v", gen, err, reflect.DeepEqual(got, want))
	}
	// A member of another generation: mid-rebalance.
	for id, m := range desc.Members {
		a, _ := decodeAssignment(data[id])
		a.Generation = 8
		m.MemberAssignment = consumerProtocolAssignment(a.Actives, encodeAssignment(a))
		break
	}
	if _, _, err := URLsFromGroup(desc); err == nil {
		t.Fatal("mixed generations accepted")
	}
}

// MembersFromGroup gives the planner the members' current state: replanning
// them changes nothing (idempotence through the group description).
func TestMembersFromGroup(t *testing.T) {
	leader, members, data := largeGroup(t, 64, 8, 1, 0)
	desc := &sarama.GroupDescription{GroupId: "g", Members: map[string]*sarama.GroupMemberDescription{}}
	for id := range members {
		a, err := decodeAssignment(data[id])
		if err != nil {
			t.Fatal(err)
		}
		desc.Members[id] = &sarama.GroupMemberDescription{MemberId: id,
			MemberMetadata:   consumerProtocolSubscription(members[id].Topics, members[id].UserData),
			MemberAssignment: consumerProtocolAssignment(a.Actives, data[id])}
	}
	desc.Members["foreign"] = &sarama.GroupMemberDescription{MemberId: "foreign",
		MemberMetadata: consumerProtocolSubscription([]string{"internet-scale-app-events"}, []byte{0, 1, 2})}
	ms, errs, err := MembersFromGroup(desc)
	if err != nil || len(ms) != 9 || len(errs) != 1 || errs["foreign"] == nil {
		t.Fatalf("MembersFromGroup: %d members, errs %v, err %v", len(ms), errs, err)
	}
	if ms[0].ID != "foreign" || ms[0].URL != "" || ms[0].PrevActives != nil {
		t.Fatalf("foreign member %+v, want ID and topics only", ms[0])
	}
	ms = ms[1:] // sorted first
	c := Cluster{Members: ms, Topics: map[string]int32{"internet-scale-app-events": 64}, Changelogs: leader.cfg.Changelogs, Replicas: 1}
	p, err := PlanAssignment(c)
	if err != nil {
		t.Fatal(err)
	}
	for id, d := range leader.planned {
		if !reflect.DeepEqual(p.Members[id].Actives, d.Actives) || !reflect.DeepEqual(p.Members[id].Standbys, d.Standbys) {
			t.Fatalf("%s: replanned %v/%v, was %v/%v", id, p.Members[id].Actives, p.Members[id].Standbys, d.Actives, d.Standbys)
		}
	}
}

// MemberURL reads the URL every member published, whether or not it holds
// an active; a member of another assignor has none.
func TestMemberURL(t *testing.T) {
	_, members, _ := largeGroup(t, 16, 4, 1, 0)
	n := 0
	for id, m := range members {
		sub, err := decodeSubscription(m.UserData)
		if err != nil || sub.URL == "" {
			t.Fatalf("member %s: subscription %+v, %v; want a URL", id, sub, err)
		}
		d := &sarama.GroupMemberDescription{MemberId: id, MemberMetadata: consumerProtocolSubscription(m.Topics, m.UserData)}
		if got := MemberURL(d); got != sub.URL {
			t.Fatalf("MemberURL(%s) = %q, want %q", id, got, sub.URL)
		}
		n++
	}
	foreign := &sarama.GroupMemberDescription{MemberId: "foreign", MemberMetadata: consumerProtocolSubscription([]string{"t"}, []byte{0, 1, 2})}
	if got := MemberURL(foreign); got != "" || n == 0 || MemberURL(nil) != "" {
		t.Fatalf("MemberURL(foreign) = %q over %d members, want \"\"", got, n)
	}
}
