package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/table"
)

// diagnose writes, for the given keys of a table, every changelog record of
// the key (partition, offset, value, stamp: writer epoch, source offsets,
// before-image) and the input records that should have counted in it, with
// the group's committed offsets: what a finding's report needs to tell a
// double-applied or a lost record apart. keyOf extracts from an input
// record the key it feeds (nil: the input is not listed).
func diagnose(ctx context.Context, w io.Writer, client sarama.Client, d table.Def, keys []string, inputTopic string,
	keyOf func(*sarama.ConsumerMessage) []string, committed map[string]map[int32]int64) error {
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	fmt.Fprintf(w, "== %s: changelog %s, keys %s\n", d.Name(), d.Changelog(), strings.Join(keys, ", "))
	fmt.Fprintf(w, "committed offsets: %v\n", committed)
	type line struct {
		p   int32
		off int64
		s   string
	}
	var lines, whole []line
	parts := map[int32]bool{} // changelog partitions of the keys
	err := consumeAll(ctx, client, d.Changelog(), func(m *sarama.ConsumerMessage) {
		k, v, err := d.Format(m.Key, m.Value)
		if err != nil {
			return
		}
		s := fmt.Sprintf("changelog %s[%d]@%d key %s value %v", d.Name(), m.Partition, m.Offset, k, v)
		if st, ok := changelog.StampOf(m.Headers); ok {
			s += fmt.Sprintf(" epoch %d sources", st.Epoch)
			for _, src := range st.Sources {
				s += fmt.Sprintf(" %s[%d]@%d", src.Topic, src.Partition, src.Offset)
			}
			if st.HasBefore {
				if st.Before == nil {
					s += " before <absent>"
				} else if _, bv, err := d.Format(m.Key, st.Before); err == nil {
					s += fmt.Sprintf(" before %v", bv)
				}
			}
		}
		whole = append(whole, line{m.Partition, m.Offset, s})
		if want[k] {
			parts[m.Partition] = true
			lines = append(lines, line{m.Partition, m.Offset, s})
		}
	})
	if err != nil {
		return err
	}
	if keyOf != nil {
		err = consumeAll(ctx, client, inputTopic, func(m *sarama.ConsumerMessage) {
			for _, k := range keyOf(m) {
				if want[k] {
					lines = append(lines, line{-1, m.Offset, fmt.Sprintf("input %s[%d]@%d key %s: %s", inputTopic, m.Partition, m.Offset, k, m.Value)})
				}
			}
		})
		if err != nil {
			return err
		}
	}
	sort.SliceStable(lines, func(i, j int) bool {
		if lines[i].p != lines[j].p {
			return lines[i].p < lines[j].p
		}
		return lines[i].off < lines[j].off
	})
	for _, l := range lines {
		fmt.Fprintln(w, l.s)
	}
	// The whole changelog partitions of the keys, and the keys of the input
	// records of the same partitions, for an offline look at every cycle.
	fmt.Fprintf(w, "\n== every record of the changelog partitions %v\n", parts)
	for _, l := range whole {
		if parts[l.p] {
			fmt.Fprintln(w, l.s)
		}
	}
	if keyOf != nil {
		fmt.Fprintf(w, "\n== input records of partitions %v: offset and keys fed\n", parts)
		err = consumeAll(ctx, client, inputTopic, func(m *sarama.ConsumerMessage) {
			if parts[m.Partition] {
				fmt.Fprintf(w, "input %s[%d]@%d keys %s\n", inputTopic, m.Partition, m.Offset, strings.Join(keyOf(m), ","))
			}
		})
	}
	return err
}

// actorOf and dirsOf are the keys an input record feeds into the per-actor
// and the per-dir tables.
func actorOf(m *sarama.ConsumerMessage) []string { return []string{string(m.Key)} }

func dirsOf(m *sarama.ConsumerMessage) []string {
	var ev event
	if json.Unmarshal(m.Value, &ev) != nil {
		return nil
	}
	return ev.Dirs
}
