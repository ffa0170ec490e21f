//go:build !race

package main

// raceEnabled: this binary was built without -race.
const raceEnabled = false
