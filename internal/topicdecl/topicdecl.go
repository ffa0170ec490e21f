// Package topicdecl lets package app declare a typed topic (app.Topic) of
// package agent without agent exporting a second way to declare one: an
// *agent.Topic[K, V] made with new is given its name, partition count and
// codecs through Init, which package agent sets when it is initialized.
// app.Topic is the one declaration users write; agent.Repartition and
// agent.GroupBy declare the internal topics.
//
// topicdecl must never hold state beyond the one function agent sets, nor
// import a Runnel package (agent imports it).
package topicdecl

// Init gives t, an *agent.Topic[K, V] made with new, its name, its
// partition count and its codecs, which must be a codec.Codec[K] and a
// codec.Codec[V] (another type is a programming error of the caller inside
// Runnel, and panics). Package agent sets Init in its init function; it is
// nil in a program that does not import agent.
var Init func(t any, name string, partitions int32, keyCodec, valueCodec any)
