// Package topicdecl lets package app declare a typed topic (app.Topic) of
// package agent without agent exporting a second way to declare one: an
// *agent.Topic[K, V] made with new is given its name, partition count and
// codecs through Init, which package agent sets when it is initialized.
// app.Topic is the one declaration users write; agent.Repartition and
// agent.GroupBy declare the internal topics.
//
// It also lets the worker and the CLI ask a declared topic what only they
// need (Of: check and decode raw keys and values with the topic's codecs,
// the topic a repartition topic re-keys) without agent exporting it.
//
// topicdecl must never hold state beyond the functions agent sets, nor
// import a Runnel package (agent imports it).
package topicdecl

// Init gives t, an *agent.Topic[K, V] made with new, its name, its
// partition count and its codecs, which must be a codec.Codec[K] and a
// codec.Codec[V] (another type is a programming error of the caller inside
// Runnel, and panics). Package agent sets Init in its init function; it is
// nil in a program that does not import agent.
var Init func(t any, name string, partitions int32, keyCodec, valueCodec any)

// Runtime is what the worker and the CLI ask of a declared topic beyond its
// name, partitions and codec names: decoding a raw key or value with the
// topic's codecs as its agents do (the error names the codec; `send` checks
// every line, `dlq tail` and `dlq replay` decode dead letters with it), and
// the topic a repartition topic re-keys ("" for a declared topic; describe).
type Runtime interface {
	CheckKey(b []byte) error
	CheckValue(b []byte) error
	DecodeKey(b []byte) (any, error)
	DecodeValue(b []byte) (any, error)
	RepartitionOf() string
}

// Of returns t's Runtime when t is an *agent.Topic[K, V], false for any
// other topic definition. Package agent sets Of in its init function; it is
// nil in a program that does not import agent.
var Of func(t any) (Runtime, bool)
