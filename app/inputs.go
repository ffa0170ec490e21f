package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/topology"
)

// Input is one JSONL file that dev or send produces, and how: to which
// topic, keyed by which field, stamped with which field's time.
type Input struct {
	// Topic is the destination, a declared topic (its full name, or the
	// name given to app.Topic when the app has a topic prefix).
	Topic string
	// Path is the JSONL file (.gz allowed; "-" is standard input, for a
	// single input only).
	Path string
	// KeyField is the JSON string field used as the record key; empty sends
	// records without a key (dev: the DevInput key field for the dev
	// input topic).
	KeyField string
	// TimestampField is the JSON field holding each record's timestamp: an
	// RFC 3339 string or epoch milliseconds. Empty: the time of the send.
	TimestampField string
}

// inputFlags are the command-line flags that name inputs: dev's and send's.
type inputFlags struct {
	// inputs are the --input values: FILE, or TOPIC=FILE.
	inputs []string
	// topic is --topic: where a bare FILE goes (default: the dev input topic).
	topic string
	// keyFields and tsFields are the --key-field and --timestamp-field
	// values: FIELD (every input) or TOPIC=FIELD (that topic's inputs).
	keyFields, tsFields []string
}

// lookupTopic finds a declared topic by its full name or by the name given
// to app.Topic (without the WithTopicPrefix prefix).
func (a *App) lookupTopic(g *topology.Graph, name string) (topology.Topic, bool) {
	if t, ok := g.Topic(name); ok {
		return t, true
	}
	return g.Topic(a.cfg.topicPrefix + name)
}

// topicNames lists the declared topics, for error messages.
func topicNames(g *topology.Graph) string {
	names := make([]string, 0, len(g.Topics))
	for _, t := range g.Topics {
		names = append(names, t.Name)
	}
	return strings.Join(names, ", ")
}

// splitTopic splits "TOPIC=REST" when TOPIC names a declared topic; ok is
// false for a value without such a prefix (a bare file or field, which may
// itself contain '=').
func (a *App) splitTopic(g *topology.Graph, v string) (topic, rest string, ok bool) {
	name, rest, found := strings.Cut(v, "=")
	if !found {
		return "", v, false
	}
	t, declared := a.lookupTopic(g, name)
	if !declared {
		return "", v, false
	}
	return t.Name, rest, true
}

// resolveInputs turns the input flags into Inputs, in the order of the
// --input flags. A bare FILE goes to --topic, else to the dev input topic
// (co, from DevInput). An input's key field is its topic's TOPIC=FIELD
// value, else the bare FIELD, else the DevInput key field when it goes to
// the dev input topic; its timestamp field likewise (without a default).
// Errors name the flag and value: an undeclared topic, a bare FILE with no
// topic to go to, a field for a topic no --input names, two bare fields.
func (a *App) resolveInputs(g *topology.Graph, f inputFlags, co cliOptions) ([]Input, error) {
	var ins []Input
	for _, v := range f.inputs {
		topic, path, ok := a.splitTopic(g, v)
		if !ok {
			if name, _, found := strings.Cut(v, "="); found {
				if _, err := os.Stat(v); err != nil {
					return nil, fmt.Errorf("--input %s: %q is not a declared topic (topics: %s), and there is no file %q", v, name, topicNames(g), v)
				}
			}
			dest := f.topic
			if dest == "" {
				dest = co.devTopic
			}
			if dest == "" {
				return nil, fmt.Errorf("--input %s: no topic to send it to: use --input TOPIC=FILE or --topic (topics: %s)", v, topicNames(g))
			}
			t, declared := a.lookupTopic(g, dest)
			if !declared {
				return nil, fmt.Errorf("--input %s: topic %q is not declared (topics: %s; set it with --topic, --input TOPIC=FILE or app.DevInput)", v, dest, topicNames(g))
			}
			topic = t.Name
		}
		if path == "" {
			return nil, fmt.Errorf("--input %s: no file named", v)
		}
		ins = append(ins, Input{Topic: topic, Path: path})
	}
	if n := countStdin(ins); n > 0 && len(ins) > 1 {
		return nil, errors.New("--input -: standard input can be the only input (every input is validated before any is sent)")
	}
	keys, err := a.fieldFlags(g, "--key-field", f.keyFields, ins)
	if err != nil {
		return nil, err
	}
	stamps, err := a.fieldFlags(g, "--timestamp-field", f.tsFields, ins)
	if err != nil {
		return nil, err
	}
	devTopic := ""
	if t, ok := a.lookupTopic(g, co.devTopic); ok && co.devTopic != "" {
		devTopic = t.Name
	}
	for i := range ins {
		in := &ins[i]
		in.KeyField = firstNonEmpty(keys[in.Topic], keys[""])
		if in.KeyField == "" && in.Topic == devTopic {
			in.KeyField = co.devKeyField
		}
		in.TimestampField = firstNonEmpty(stamps[in.Topic], stamps[""])
	}
	return ins, nil
}

func countStdin(ins []Input) int {
	n := 0
	for _, in := range ins {
		if in.Path == "-" {
			n++
		}
	}
	return n
}

// fieldFlags reads the values of a field flag (--key-field,
// --timestamp-field): topic name -> field, "" for the bare FIELD that
// applies to every input without one of its own.
func (a *App) fieldFlags(g *topology.Graph, flag string, values []string, ins []Input) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		topic, field, _ := a.splitTopic(g, v)
		if field == "" {
			return nil, fmt.Errorf("%s %s: no field named", flag, v)
		}
		if old, dup := out[topic]; dup && old != field {
			if topic == "" {
				return nil, fmt.Errorf("%s: two fields for every input (%q, %q): name the topic of each, as TOPIC=FIELD", flag, old, field)
			}
			return nil, fmt.Errorf("%s: two fields for topic %s (%q, %q)", flag, topic, old, field)
		}
		if topic != "" && !inputsTo(ins, topic) {
			return nil, fmt.Errorf("%s %s: no --input goes to topic %s", flag, v, topic)
		}
		out[topic] = field
	}
	return out, nil
}

func inputsTo(ins []Input, topic string) bool {
	for _, in := range ins {
		if in.Topic == topic {
			return true
		}
	}
	return false
}

// sendOptions returns the SendOptions of in: its declared topic's partition
// count and codec checks.
func (a *App) sendOptions(g *topology.Graph, in Input) (SendOptions, error) {
	t, ok := a.lookupTopic(g, in.Topic)
	if !ok {
		return SendOptions{}, fmt.Errorf("input %s: topic %q is not declared (topics: %s)", in.Path, in.Topic, topicNames(g))
	}
	return SendOptions{Topic: t.Name, Partitions: t.Partitions, KeyField: in.KeyField, TimestampField: in.TimestampField,
		CheckValue: a.valueCheck(t.Name), CheckKey: a.keyCheck(t.Name)}, nil
}

// sendInputs validates every input whole, then produces them one after the
// other, in order: a bad line in any input sends nothing (the error lists
// the bad lines of every input). before, if not nil, is called before each
// input is produced, with its index and options (dev draws its progress bar
// there); after, if not nil, with its stats once it is sent. A failure
// while producing input i says which inputs were sent whole before it and
// which were not sent; the *SendError of input i is wrapped, with the line
// to resume from.
func (a *App) sendInputs(ctx context.Context, client sarama.Client, g *topology.Graph, ins []Input,
	before func(i int, o *SendOptions), after func(i int, st SendStats)) error {
	prepared := make([]*preparedInput, 0, len(ins))
	defer func() {
		for _, p := range prepared {
			p.close()
		}
	}()
	var errs []error
	for i, in := range ins {
		o, err := a.sendOptions(g, in)
		if err != nil {
			return err
		}
		if before != nil {
			before(i, &o)
		}
		p, err := prepareInput(in.Path, o)
		if err != nil {
			errs = append(errs, fmt.Errorf("input for %s: %w", o.Topic, err))
			continue
		}
		prepared = append(prepared, p)
	}
	if len(errs) > 0 {
		if len(ins) > 1 {
			errs = append(errs, fmt.Errorf("none of the %d inputs was sent", len(ins)))
		}
		return errors.Join(errs...)
	}
	for i, p := range prepared {
		st, err := p.send(ctx, client)
		if err != nil {
			err = fmt.Errorf("send %s to %s: %w", p.path, p.o.Topic, err)
			if len(prepared) > 1 {
				err = fmt.Errorf("%w\n%s", err, inputsDone(ins, i))
			}
			return err
		}
		if after != nil {
			after(i, st)
		}
	}
	return nil
}

// inputsDone says which inputs were sent whole before input i failed, and
// which were not sent.
func inputsDone(ins []Input, i int) string {
	name := func(in Input) string { return in.Topic + "=" + in.Path }
	var sent, left []string
	for j, in := range ins {
		switch {
		case j < i:
			sent = append(sent, name(in))
		case j > i:
			left = append(left, name(in))
		}
	}
	var b strings.Builder
	if len(sent) > 0 {
		fmt.Fprintf(&b, "sent whole before it: %s; ", strings.Join(sent, ", "))
	}
	if len(left) > 0 {
		fmt.Fprintf(&b, "not sent: %s; ", strings.Join(left, ", "))
	}
	fmt.Fprintf(&b, "resume with --input %s --from-line N, then send the inputs not sent", name(ins[i]))
	return b.String()
}
