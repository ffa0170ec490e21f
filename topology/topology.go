package topology

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Graph is an app's declared topology.
type Graph struct {
	App    string  `json:"app"`
	Topics []Topic `json:"topics"`
	Agents []Agent `json:"agents"`
	Tables []Table `json:"tables"`
}

// Topic is a declared topic.
type Topic struct {
	Name       string `json:"name"`
	Partitions int32  `json:"partitions"`
	KeyCodec   string `json:"key_codec"`
	ValueCodec string `json:"value_codec"`
	// RepartitionOf names the topic an internal repartition topic re-keys
	// ("<app>-<name>-repartition"); empty for a declared topic.
	RepartitionOf string `json:"repartition_of,omitempty"`
}

// Agent is a declared agent: its source topic, the sink topics and tables it
// declared (agent.SendsTo, agent.WritesTo; the worker refuses any other) and
// its dead-letter topic.
type Agent struct {
	Name            string   `json:"name"`
	Source          string   `json:"source"`
	Sinks           []string `json:"sinks"`
	Tables          []string `json:"tables"`
	DeadLetterTopic string   `json:"dead_letter_topic"`
	// Lookups are the (partitioned) tables the agent reads by the record's
	// key: each must have the source topic's partition count.
	Lookups []string `json:"lookups,omitempty"`
	// Timers describe the agent's timers ("every 1h0m0s stream-time").
	Timers []string `json:"timers,omitempty"`
}

// Table is a declared table. Partitions 0 before Resolve means "as the sources".
type Table struct {
	Name       string `json:"name"`
	Changelog  string `json:"changelog"`
	Partitions int32  `json:"partitions"`
	KeyCodec   string `json:"key_codec"`
	ValueCodec string `json:"value_codec"`
	// JoinOf names the left and right tables of a joined table
	// (table.Join), and JoinKind the kind of join; the three tables must be
	// co-partitioned.
	JoinOf   []string `json:"join_of,omitempty"`
	JoinKind string   `json:"join_kind,omitempty"`
	// Windows describes a windowed table's windows, grace and retention
	// (table.NewWindowed): its keys are key@window-start; empty for a
	// table that is not windowed.
	Windows string `json:"windows,omitempty"`
}

var validName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,200}$`)

// ValidName checks that s can be part of a Kafka topic name (letters, digits,
// '.', '_', '-'; at most 200 characters, leaving room for prefixes and suffixes).
func ValidName(s string) error {
	if !validName.MatchString(s) {
		return fmt.Errorf("name %q: use 1 to 200 of [a-zA-Z0-9._-]", s)
	}
	return nil
}

// Topic returns the declared topic named name.
func (g *Graph) Topic(name string) (Topic, bool) {
	for _, t := range g.Topics {
		if t.Name == name {
			return t, true
		}
	}
	return Topic{}, false
}

// Resolve checks the graph and fills in table partition counts: every agent's
// source topic must be declared with at least one partition; a table without a
// partition count takes that of the source topics, which must then all agree
// (co-partitioning: a table written from partition p of a source is partition p
// of the table). The error lists every problem found.
func (g *Graph) Resolve() (err error) {
	var errs []error
	counts := map[int32]bool{}
	for _, t := range g.Topics {
		if t.Partitions <= 0 {
			errs = append(errs, fmt.Errorf("topic %s: partitions must be > 0, got %d", t.Name, t.Partitions))
		}
	}
	for _, a := range g.Agents {
		t, ok := g.Topic(a.Source)
		if !ok {
			errs = append(errs, fmt.Errorf("agent %s: source topic %s is not declared", a.Name, a.Source))
			continue
		}
		counts[t.Partitions] = true
		for _, s := range a.Sinks {
			if _, ok := g.Topic(s); !ok {
				errs = append(errs, fmt.Errorf("agent %s: sink topic %s is not declared", a.Name, s))
			}
		}
		for _, name := range a.Tables {
			if !slices.ContainsFunc(g.Tables, func(t Table) bool { return t.Name == name }) {
				errs = append(errs, fmt.Errorf("agent %s: table %s is not declared", a.Name, name))
			}
		}
	}
	defer func() {
		// Lookups and joins are checked once every table has its partition
		// count.
		for _, j := range g.Tables {
			for _, name := range j.JoinOf {
				t, ok := g.table(name)
				switch {
				case !ok:
					errs = append(errs, fmt.Errorf("table %s: joins table %s, which is not declared", j.Name, name))
				case t.Partitions > 0 && j.Partitions > 0 && t.Partitions != j.Partitions:
					errs = append(errs, fmt.Errorf("table %s (%d partitions): joins table %s (%d partitions): the tables of a join must be co-partitioned (the same partition count)",
						j.Name, j.Partitions, name, t.Partitions))
				}
			}
		}
		for _, a := range g.Agents {
			src, ok := g.Topic(a.Source)
			if !ok {
				continue
			}
			for _, name := range a.Tables {
				t, ok := g.table(name)
				if ok && t.Partitions > 0 && t.Partitions != src.Partitions {
					errs = append(errs, fmt.Errorf("agent %s: writes table %s (%d partitions) from %s (%d partitions): "+
						"not co-partitioned, a record of partition p would write partition p of the table, which another task owns; "+
						"declare both with the same partition count, or re-key the stream to the table's key first (agent.Repartition)",
						a.Name, name, t.Partitions, a.Source, src.Partitions))
				}
			}
			for _, name := range a.Lookups {
				t, ok := g.table(name)
				switch {
				case !ok:
					errs = append(errs, fmt.Errorf("agent %s: looks up table %s, which is not declared", a.Name, name))
				case t.Partitions > 0 && t.Partitions != src.Partitions:
					errs = append(errs, fmt.Errorf("agent %s: looks up table %s (%d partitions) by the key of %s (%d partitions): "+
						"not co-partitioned, partition p of the topic would read partition p of the table, where the key is not; "+
						"declare both with the same partition count, re-key the stream to the table's key first (agent.Repartition), or make the table global",
						a.Name, name, t.Partitions, a.Source, src.Partitions))
				}
			}
		}
		// errors.Join, not a multierror: one problem reads as itself, with
		// no "1 error occurred" around it; several read one a line.
		err = errors.Join(errs...)
	}()
	for i, t := range g.Tables {
		if t.Partitions > 0 {
			continue
		}
		switch len(counts) {
		case 1:
			for n := range counts {
				g.Tables[i].Partitions = n
			}
		case 0:
			errs = append(errs, fmt.Errorf("table %s: no agent source to take a partition count from; declare it with table.Partitions(n)", t.Name))
		default:
			errs = append(errs, fmt.Errorf("table %s: source topics have different partition counts; declare the table's with table.Partitions(n) equal to the topics it is written from", t.Name))
		}
	}
	return nil // the deferred checks above set err
}

func (g *Graph) table(name string) (Table, bool) {
	for _, t := range g.Tables {
		if t.Name == name {
			return t, true
		}
	}
	return Table{}, false
}

// Subscriptions returns the topics agents consume, sorted.
func (g *Graph) Subscriptions() []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range g.Agents {
		if !seen[a.Source] {
			seen[a.Source] = true
			out = append(out, a.Source)
		}
	}
	sort.Strings(out)
	return out
}

// CoPartitionGroups groups the subscribed topics and the changelogs by
// partition count: whoever owns partition p of one member of a group owns
// partition p of all of them.
func (g *Graph) CoPartitionGroups() map[int32][]string {
	out := map[int32][]string{}
	for _, s := range g.Subscriptions() {
		t, _ := g.Topic(s)
		out[t.Partitions] = append(out[t.Partitions], s)
	}
	for _, t := range g.Tables {
		out[t.Partitions] = append(out[t.Partitions], t.Changelog)
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// WriteText renders the graph for `describe`.
func (g *Graph) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "app %s (consumer group %q)\n\ntopics:\n", g.App, g.App)
	for _, t := range g.Topics {
		fmt.Fprintf(&b, "  %-32s partitions=%-3d key=%s value=%s", t.Name, t.Partitions, t.KeyCodec, t.ValueCodec)
		if t.RepartitionOf != "" {
			fmt.Fprintf(&b, " (internal: repartition of %s)", t.RepartitionOf)
		}
		b.WriteString("\n")
	}
	b.WriteString("\nagents:\n")
	for _, a := range g.Agents {
		fmt.Fprintf(&b, "  %-32s <- %s", a.Name, a.Source)
		if len(a.Lookups) > 0 {
			fmt.Fprintf(&b, " (looks up %s)", strings.Join(a.Lookups, ", "))
		}
		for _, tm := range a.Timers {
			fmt.Fprintf(&b, " (timer %s)", tm)
		}
		b.WriteString("\n")
		if len(a.Sinks) > 0 {
			fmt.Fprintf(&b, "  %-32s    sends to %s\n", "", strings.Join(a.Sinks, ", "))
		}
		if len(a.Tables) > 0 {
			fmt.Fprintf(&b, "  %-32s    writes %s\n", "", strings.Join(a.Tables, ", "))
		}
		if a.DeadLetterTopic != "" {
			fmt.Fprintf(&b, "  %-32s    dead letters to %s\n", "", a.DeadLetterTopic)
		}
	}
	b.WriteString("\ntables:\n")
	for _, t := range g.Tables {
		fmt.Fprintf(&b, "  %-32s partitions=%-3d changelog=%s key=%s value=%s", t.Name, t.Partitions, t.Changelog, t.KeyCodec, t.ValueCodec)
		if len(t.JoinOf) == 2 {
			fmt.Fprintf(&b, " (%s join of %s and %s)", t.JoinKind, t.JoinOf[0], t.JoinOf[1])
		}
		if t.Windows != "" {
			fmt.Fprintf(&b, " (windowed: %s)", t.Windows)
		}
		b.WriteString("\n")
	}
	b.WriteString("\nco-partitioned groups (by partition count):\n")
	groups := g.CoPartitionGroups()
	keys := make([]int, 0, len(groups))
	for n := range groups {
		keys = append(keys, int(n))
	}
	sort.Ints(keys)
	for _, n := range keys {
		fmt.Fprintf(&b, "  %d: %s\n", n, strings.Join(groups[int32(n)], ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteDOT renders the graph in Graphviz DOT (describe --dot; `dot -Tsvg`):
// topics as ellipses, agents as boxes, tables as cylinders (their changelog
// in the label), dead-letter topics dashed. Edges: source topic -> agent ->
// sink topics and tables, agent -> dead-letter topic (dashed). Sinks and
// tables are those the agents declared (agent.SendsTo, agent.WritesTo),
// which the worker makes all of them: it refuses a send or a write an agent
// did not declare.
func (g *Graph) WriteDOT(w io.Writer) error {
	var b strings.Builder
	q := func(kind, name string) string { return strconv.Quote(kind + ":" + name) }
	fmt.Fprintf(&b, "digraph %s {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=11];\n", strconv.Quote(g.App))
	for _, t := range g.Topics {
		fmt.Fprintf(&b, "  %s [shape=ellipse, label=%s];\n", q("topic", t.Name), strconv.Quote(fmt.Sprintf("%s\n%d partitions", t.Name, t.Partitions)))
	}
	for _, t := range g.Tables {
		kind := "table"
		if t.Windows != "" {
			kind = "windowed table"
		}
		fmt.Fprintf(&b, "  %s [shape=cylinder, label=%s];\n", q("table", t.Name), strconv.Quote(fmt.Sprintf("%s %s\n%s", kind, t.Name, t.Changelog)))
	}
	dlqs := map[string]bool{}
	for _, a := range g.Agents {
		fmt.Fprintf(&b, "  %s [shape=box, style=rounded, label=%s];\n", q("agent", a.Name), strconv.Quote("agent "+a.Name))
		if a.DeadLetterTopic != "" && !dlqs[a.DeadLetterTopic] {
			dlqs[a.DeadLetterTopic] = true
			fmt.Fprintf(&b, "  %s [shape=ellipse, style=dashed, label=%s];\n", q("topic", a.DeadLetterTopic), strconv.Quote(a.DeadLetterTopic))
		}
	}
	for _, a := range g.Agents {
		fmt.Fprintf(&b, "  %s -> %s;\n", q("topic", a.Source), q("agent", a.Name))
		for _, s := range a.Sinks {
			fmt.Fprintf(&b, "  %s -> %s;\n", q("agent", a.Name), q("topic", s))
		}
		for _, t := range a.Tables {
			fmt.Fprintf(&b, "  %s -> %s;\n", q("agent", a.Name), q("table", t))
		}
		if a.DeadLetterTopic != "" {
			fmt.Fprintf(&b, "  %s -> %s [style=dashed];\n", q("agent", a.Name), q("topic", a.DeadLetterTopic))
		}
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON renders the graph as JSON.
func (g *Graph) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(g)
}
