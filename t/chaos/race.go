//go:build race

package main

// raceEnabled: this binary was built with -race, so the workers are too.
const raceEnabled = true
