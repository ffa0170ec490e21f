// Package changelog names and creates changelog topics and restores stores from
// them: a restorer reads a changelog partition from the checkpointed offset up to
// the end offset captured when it started.
//
// changelog never writes a checkpoint ahead of the data it covers.
package changelog
