package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/spf13/cobra"
)

// PlanInput is the JSON cluster description read by `assignment plan`
// (docs/assignment.md "assignment plan"). Maps of partitions are topic ->
// partition numbers; offsets are topic -> partition (as a JSON string key) ->
// offset.
type PlanInput struct {
	// Topics maps each subscribed source topic to its partition count.
	Topics map[string]int32 `json:"topics"`
	// Changelogs and Globals map table changelog topics to partition counts.
	Changelogs map[string]int32 `json:"changelogs,omitempty"`
	Globals    map[string]int32 `json:"globals,omitempty"`
	// Replicas is the number of standbys per changelog partition.
	Replicas int `json:"replicas"`
	// Cooperative plans for the incremental protocol (moves withheld while
	// their owner still runs them).
	Cooperative bool `json:"cooperative,omitempty"`
	// EndOffsets (highwaters) enable the KIP-441 lag rule.
	EndOffsets            map[string]map[int32]int64 `json:"end_offsets,omitempty"`
	AcceptableRecoveryLag int64                      `json:"acceptable_recovery_lag,omitempty"`
	MaxWarmupReplicas     int                        `json:"max_warmup_replicas,omitempty"`
	Members               []PlanInputMember          `json:"members"`
}

// PlanInputMember is one member of PlanInput: its previous assignment.
type PlanInputMember struct {
	ID         string `json:"id"`
	Process    string `json:"process,omitempty"`
	URL        string `json:"url,omitempty"`
	Generation int32  `json:"generation"`
	// Topics defaults to every key of PlanInput.Topics.
	Topics   []string                   `json:"topics,omitempty"`
	Actives  map[string][]int32         `json:"actives,omitempty"`
	Standbys map[string][]int32         `json:"standbys,omitempty"`
	Owned    map[string][]int32         `json:"owned,omitempty"`
	Offsets  map[string]map[int32]int64 `json:"offsets,omitempty"`
}

// PlanOutput is the JSON printed by `assignment plan`.
type PlanOutput struct {
	Members    map[string]PlanOutputMember `json:"members"`
	URLs       map[string]map[int32]string `json:"urls"`
	NeedsProbe bool                        `json:"needs_probe"`
	Withheld   int                         `json:"withheld"`
	// Moves lists every source or changelog partition whose active member
	// changes (from "" = it had none; to = the planned member, pending
	// included), sorted by topic and partition.
	Moves []PlanMove `json:"moves"`
	// MovedTasks counts the co-partitioned tasks behind Moves (a task moves
	// all topics of its group at once); Stateless those whose new member held
	// no standby of them (a full restore).
	MovedTasks int `json:"moved_tasks"`
	Stateless  int `json:"stateless"`
}

// PlanOutputMember is one member's share of the plan.
type PlanOutputMember struct {
	Actives  map[string][]int32 `json:"actives"`
	Standbys map[string][]int32 `json:"standbys,omitempty"`
	Warmups  map[string][]int32 `json:"warmups,omitempty"`
	Pending  map[string][]int32 `json:"pending,omitempty"`
	Globals  map[string][]int32 `json:"globals,omitempty"`
}

// PlanMove is one partition changing its active member.
type PlanMove struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      string `json:"from"`
	To        string `json:"to"`
}

// WhatIf edits a PlanInput before planning.
type WhatIf struct {
	// Add adds this many new members (new-1, new-2, ...) subscribing to every topic.
	Add int
	// Remove removes the members with these IDs.
	Remove []string
	// Cooperative forces PlanInput.Cooperative on.
	Cooperative bool
}

// PlanFromJSON reads a PlanInput, applies the what-if edits and plans it.
// Errors: malformed JSON or unknown fields, an unknown member to remove, and
// PlanAssignment's errors.
func PlanFromJSON(r io.Reader, what WhatIf) (PlanOutput, error) {
	var in PlanInput
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return PlanOutput{}, fmt.Errorf("read cluster description: %w", err)
	}
	all := make([]string, 0, len(in.Topics))
	for t := range in.Topics {
		all = append(all, t)
	}
	sort.Strings(all)
	in.Cooperative = in.Cooperative || what.Cooperative
	for _, id := range what.Remove {
		i := slices.IndexFunc(in.Members, func(m PlanInputMember) bool { return m.ID == id })
		if i < 0 {
			return PlanOutput{}, fmt.Errorf("remove %q: no such member", id)
		}
		in.Members = slices.Delete(in.Members, i, i+1)
	}
	for i := 1; i <= what.Add; i++ {
		in.Members = append(in.Members, PlanInputMember{ID: fmt.Sprintf("new-%d", i), Generation: -1})
	}
	c := assignor.Cluster{
		Topics: in.Topics, Changelogs: in.Changelogs, Globals: in.Globals, Replicas: in.Replicas,
		EndOffsets: in.EndOffsets, AcceptableRecoveryLag: in.AcceptableRecoveryLag, MaxWarmupReplicas: in.MaxWarmupReplicas,
		Cooperative: in.Cooperative,
	}
	prev := map[string]map[int32]string{}      // topic -> partition -> previous active member
	standby := map[string]map[int32][]string{} // topic -> partition -> previous standby members
	for _, m := range in.Members {
		topics := m.Topics
		if len(topics) == 0 {
			topics = all
		}
		c.Members = append(c.Members, assignor.Member{
			ID: m.ID, ProcessID: m.Process, URL: m.URL, Generation: m.Generation, Topics: topics,
			PrevActives: m.Actives, PrevStandbys: m.Standbys, Owned: m.Owned, Offsets: m.Offsets,
		})
		for t, ps := range m.Actives {
			for _, p := range ps {
				if prev[t] == nil {
					prev[t] = map[int32]string{}
				}
				prev[t][p] = m.ID
			}
		}
		for t, ps := range m.Standbys {
			for _, p := range ps {
				if standby[t] == nil {
					standby[t] = map[int32][]string{}
				}
				standby[t][p] = append(standby[t][p], m.ID)
			}
		}
	}
	plan, err := assignor.PlanAssignment(c)
	if err != nil {
		return PlanOutput{}, err
	}
	out := PlanOutput{Members: map[string]PlanOutputMember{}, URLs: plan.URLs, NeedsProbe: plan.NeedsProbe, Withheld: plan.Withheld, Moves: []PlanMove{}}
	now := map[string]map[int32]string{}
	for id, mp := range plan.Members {
		out.Members[id] = PlanOutputMember{Actives: mp.Actives, Standbys: nonEmpty(mp.Standbys), Warmups: nonEmpty(mp.Warmups), Pending: nonEmpty(mp.Pending), Globals: nonEmpty(mp.Globals)}
		for _, tm := range []map[string][]int32{mp.Actives, mp.Pending} {
			for t, ps := range tm {
				for _, p := range ps {
					if now[t] == nil {
						now[t] = map[int32]string{}
					}
					now[t][p] = id
				}
			}
		}
	}
	for _, t := range slices.Sorted(maps.Keys(now)) {
		for _, p := range slices.Sorted(maps.Keys(now[t])) {
			from, to := prev[t][p], now[t][p]
			if from == to {
				continue
			}
			out.Moves = append(out.Moves, PlanMove{Topic: t, Partition: p, From: from, To: to})
		}
	}
	// A task (co-partitioned group partition) moves all its topics at once:
	// count it once per (new member, partition, partition count).
	seen := map[string]bool{}
	for _, mv := range out.Moves {
		n := in.Topics[mv.Topic]
		if n == 0 {
			n = in.Changelogs[mv.Topic]
		}
		k := fmt.Sprintf("%s/%d/%d", mv.To, mv.Partition, n)
		if seen[k] {
			continue
		}
		seen[k] = true
		out.MovedTasks++
		state := false
		for cl, cn := range in.Changelogs {
			if cn == n && slices.Contains(standby[cl][mv.Partition], mv.To) {
				state = true
			}
		}
		if !state {
			out.Stateless++
		}
	}
	return out, nil
}

func nonEmpty(m map[string][]int32) map[string][]int32 {
	if len(m) == 0 {
		return nil
	}
	return m
}

// assignmentCommand is `assignment plan`: plan a cluster description offline.
func (a *App) assignmentCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "assignment", Short: "Inspect partition assignment"}
	var file string
	var what WhatIf
	plan := &cobra.Command{
		Use:   "plan",
		Short: "Print the assignor's plan for a cluster described in JSON (no broker needed)",
		Long: "Reads a cluster description (members with their previous actives and standbys, topics, changelogs,\n" +
			"replicas; docs/assignment.md) from --file (- for stdin) or piped stdin, or, with --brokers or\n" +
			"RUNNEL_BROKERS, from the app's live consumer group (DescribeGroups: each member's subscription and\n" +
			"assignment; highwaters of the changelogs), optionally adds or removes members, and prints the plan\n" +
			"and every partition that moves as JSON.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Where the cluster comes from: --file (- for stdin); else the
			// live group when brokers are named (--brokers or
			// RUNNEL_BROKERS; not WithBrokers, which every app may carry);
			// else stdin, unless it is a terminal nobody is typing into.
			var r io.Reader = cmd.InOrStdin()
			brokersFlag := cmd.Flags().Changed("brokers")
			switch {
			case file != "" && brokersFlag:
				return errors.New("assignment plan: --file and --brokers: give one (a described cluster, or the live group)")
			case file == "-":
				if isTerminal(r) {
					fmt.Fprintln(cmd.ErrOrStderr(), "assignment plan: reading the cluster description (JSON, docs/assignment.md) from the terminal; end it with Ctrl-D")
				}
			case file != "":
				f, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("assignment plan: %w", err)
				}
				defer f.Close()
				r = f
			case brokersFlag || os.Getenv("RUNNEL_BROKERS") != "":
				// The live group: its members' state from DescribeGroups.
				in, err := a.liveGroupInput()
				if err != nil {
					return fmt.Errorf("assignment plan: %w", err)
				}
				b, err := json.Marshal(in)
				if err != nil {
					return fmt.Errorf("assignment plan: %w", err)
				}
				r = bytes.NewReader(b)
			case isTerminal(r):
				return errors.New("assignment plan: nothing to plan: give --brokers (or RUNNEL_BROKERS) to read the app's live group, " +
					"or --file FILE (or the JSON on stdin) for a described cluster (docs/assignment.md)")
			}
			out, err := PlanFromJSON(r, what)
			if err != nil {
				return fmt.Errorf("assignment plan: %w", err)
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		},
	}
	plan.Flags().StringVarP(&file, "file", "f", "", "cluster description JSON (default stdin)")
	plan.Flags().IntVar(&what.Add, "add", 0, "add this many new members (new-1, new-2, ...) subscribing to every topic")
	plan.Flags().StringSliceVar(&what.Remove, "remove", nil, "remove these members (IDs, comma-separated)")
	plan.Flags().BoolVar(&what.Cooperative, "cooperative", false, "plan for the cooperative protocol: moves from a member that runs the partition now are withheld (pending)")
	cmd.AddCommand(plan)
	return cmd
}

// isTerminal reports whether r is a terminal (a character device): stdin
// that nobody pipes into. A variable for tests.
var isTerminal = terminalStdin

func terminalStdin(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// liveGroupInput describes the app's consumer group on its brokers
// (Config.Brokers) as a PlanInput: the members' state as they would report
// it at their next join (assignor.MembersFromGroup), the subscribed topics'
// partition counts, the app's changelogs and their highwaters (so the
// KIP-441 lag rule applies), the app's replicas and warm-up settings.
func (a *App) liveGroupInput() (PlanInput, error) {
	g, err := a.Topology()
	if err != nil {
		return PlanInput{}, err
	}
	brokers, err := resolveBrokers(a.cfg.Brokers)
	if err != nil {
		return PlanInput{}, err
	}
	if err := a.validate(); err != nil {
		return PlanInput{}, err
	}
	sec, err := a.cfg.security()
	if err != nil {
		return PlanInput{}, err
	}
	sc := kafka.Base("runnel-plan-"+a.id, sec)
	sc.Version = sarama.V2_1_0_0
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		return PlanInput{}, fmt.Errorf("connect to %s: %w", strings.Join(brokers, ","), err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return PlanInput{}, err
	}
	ds, err := admin.DescribeConsumerGroups([]string{a.id})
	if err != nil {
		return PlanInput{}, fmt.Errorf("describe group %s: %w", a.id, err)
	}
	if len(ds) == 0 || len(ds[0].Members) == 0 {
		return PlanInput{}, fmt.Errorf("group %s has no members (state %q)", a.id, groupState(ds))
	}
	members, errs, err := assignor.MembersFromGroup(ds[0])
	if err != nil {
		return PlanInput{}, err
	}
	for id, e := range errs {
		fmt.Fprintf(os.Stderr, "assignment plan: member %s planned without state: %v\n", id, e)
	}
	in := PlanInput{Topics: map[string]int32{}, Changelogs: map[string]int32{}, Globals: map[string]int32{},
		Replicas: a.cfg.Replicas, Cooperative: a.cfg.rebalanceProtocol() == sarama.RebalanceProtocolCooperative,
		EndOffsets: map[string]map[int32]int64{}, AcceptableRecoveryLag: a.cfg.AcceptableRecoveryLag, MaxWarmupReplicas: a.cfg.MaxWarmupReplicas}
	for _, m := range members {
		for _, t := range m.Topics {
			if _, ok := in.Topics[t]; ok {
				continue
			}
			ps, err := client.Partitions(t)
			if err != nil {
				return PlanInput{}, fmt.Errorf("partitions of %s: %w", t, err)
			}
			in.Topics[t] = int32(len(ps))
		}
		in.Members = append(in.Members, PlanInputMember{ID: m.ID, Process: m.ProcessID, URL: m.URL, Generation: m.Generation,
			Topics: m.Topics, Actives: m.PrevActives, Standbys: m.PrevStandbys, Offsets: m.Offsets})
	}
	for _, t := range g.Tables {
		global := false
		for _, d := range a.tables {
			if _, ok := tablestate.RuntimeOf(d).(tablestate.Replicated); ok && d.Name() == t.Name {
				global = true
			}
		}
		if global {
			in.Globals[t.Changelog] = t.Partitions
			continue
		}
		in.Changelogs[t.Changelog] = t.Partitions
		in.EndOffsets[t.Changelog] = map[int32]int64{}
		for p := range t.Partitions {
			hw, err := client.GetOffset(t.Changelog, p, sarama.OffsetNewest)
			if err != nil {
				return PlanInput{}, fmt.Errorf("highwater of %s[%d]: %w", t.Changelog, p, err)
			}
			in.EndOffsets[t.Changelog][p] = hw
		}
	}
	return in, nil
}

func groupState(ds []*sarama.GroupDescription) string {
	if len(ds) == 0 {
		return "unknown"
	}
	return ds[0].State
}
