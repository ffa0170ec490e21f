package topology

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/go-multierror"
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
}

// Agent is a declared agent: its source topic, the sink topics and tables it
// declared (agent.SendsTo, agent.WritesTo) and its dead-letter topic.
type Agent struct {
	Name            string   `json:"name"`
	Source          string   `json:"source"`
	Sinks           []string `json:"sinks"`
	Tables          []string `json:"tables"`
	DeadLetterTopic string   `json:"dead_letter_topic"`
}

// Table is a declared table. Partitions 0 before Resolve means "as the sources".
type Table struct {
	Name       string `json:"name"`
	Changelog  string `json:"changelog"`
	Partitions int32  `json:"partitions"`
	KeyCodec   string `json:"key_codec"`
	ValueCodec string `json:"value_codec"`
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
func (g *Graph) Resolve() error {
	var errs *multierror.Error
	counts := map[int32]bool{}
	for _, t := range g.Topics {
		if t.Partitions <= 0 {
			errs = multierror.Append(errs, fmt.Errorf("topic %s: partitions must be > 0, got %d", t.Name, t.Partitions))
		}
	}
	for _, a := range g.Agents {
		t, ok := g.Topic(a.Source)
		if !ok {
			errs = multierror.Append(errs, fmt.Errorf("agent %s: source topic %s is not declared", a.Name, a.Source))
			continue
		}
		counts[t.Partitions] = true
		for _, s := range a.Sinks {
			if _, ok := g.Topic(s); !ok {
				errs = multierror.Append(errs, fmt.Errorf("agent %s: sink topic %s is not declared", a.Name, s))
			}
		}
		for _, name := range a.Tables {
			if !slices.ContainsFunc(g.Tables, func(t Table) bool { return t.Name == name }) {
				errs = multierror.Append(errs, fmt.Errorf("agent %s: table %s is not declared", a.Name, name))
			}
		}
	}
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
			errs = multierror.Append(errs, fmt.Errorf("table %s: no agent source to take a partition count from; declare it with table.Partitions(n)", t.Name))
		default:
			errs = multierror.Append(errs, fmt.Errorf("table %s: source topics have different partition counts; declare the table's with table.Partitions(n) equal to the topics it is written from", t.Name))
		}
	}
	return errs.ErrorOrNil()
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
		fmt.Fprintf(&b, "  %-32s partitions=%-3d key=%s value=%s\n", t.Name, t.Partitions, t.KeyCodec, t.ValueCodec)
	}
	b.WriteString("\nagents:\n")
	for _, a := range g.Agents {
		fmt.Fprintf(&b, "  %-32s <- %s\n", a.Name, a.Source)
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
		fmt.Fprintf(&b, "  %-32s partitions=%-3d changelog=%s key=%s value=%s\n", t.Name, t.Partitions, t.Changelog, t.KeyCodec, t.ValueCodec)
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
// tables appear as far as the agents declared them (agent.SendsTo,
// agent.WritesTo).
func (g *Graph) WriteDOT(w io.Writer) error {
	var b strings.Builder
	q := func(kind, name string) string { return strconv.Quote(kind + ":" + name) }
	fmt.Fprintf(&b, "digraph %s {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=11];\n", strconv.Quote(g.App))
	for _, t := range g.Topics {
		fmt.Fprintf(&b, "  %s [shape=ellipse, label=%s];\n", q("topic", t.Name), strconv.Quote(fmt.Sprintf("%s\n%d partitions", t.Name, t.Partitions)))
	}
	for _, t := range g.Tables {
		fmt.Fprintf(&b, "  %s [shape=cylinder, label=%s];\n", q("table", t.Name), strconv.Quote(fmt.Sprintf("table %s\n%s", t.Name, t.Changelog)))
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
