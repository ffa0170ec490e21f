package app

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the settings table")

const configurationDoc = "../docs/configuration.md"

// configurationMarkdown renders docs/configuration.md from settings: the
// reference is generated, never edited by hand.
func configurationMarkdown() []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

<!-- Generated from the settings table in app/config.go by
     go test ./app -run TestConfigurationDoc -update
     Do not edit by hand: the test fails when this file is stale. -->

Every setting of a Runnel app has an option (` + "`app.With…`" + `, passed to ` + "`app.New`" + `), and
most have an environment variable (read by ` + "`app.New`" + `) and a flag of the app's command
line. A later source wins: **options < environment < flags**. A worker, and every command
that connects to the brokers, validates the result first; an error names the option, the
variable and the flag, and what they allow. A default written "0 (x)" means the field's zero
value, which stands for x.

Flags marked (worker) belong to the ` + "`worker`" + ` command; the others are accepted by
every command. ` + "`--log-level`" + ` (debug, info, warn, error) and ` + "`--log-format`" + ` (text, json)
replace the logger of ` + "`WithLogger`" + `.

## Connecting to a secured cluster

TLS is on when ` + "`WithTLS`" + `, ` + "`--tls`" + ` or one of the TLS files is given; SASL when a mechanism
is. Both together are Kafka's SASL_SSL. Every client Runnel opens (the version probe, the
worker's group consumer, producers (transactional too), admin, restores, standbys, global
tables, and the ` + "`send`" + `, ` + "`tables dump`" + `, ` + "`dlq`" + `, ` + "`replay`" + ` and ` + "`assignment plan`" + ` commands) gets
them. The password is never logged nor put in an error; prefer ` + "`RUNNEL_SASL_PASSWORD`" + ` to
the flag, which other users of the host can read in the process list. PLAIN sends the
password as it is: use it over TLS. ` + "`dev`" + ` runs its own in-process broker and ignores them.

    RUNNEL_BROKERS=kafka-1:9093 RUNNEL_TLS_CA_FILE=ca.pem \
    RUNNEL_SASL_MECHANISM=SCRAM-SHA-512 RUNNEL_SASL_USER=app RUNNEL_SASL_PASSWORD=... \
    ./myapp worker

## Settings

| Setting | Option | Environment | Flag | Default | Unit / values | Kafka name, KIP | What it does |
|---|---|---|---|---|---|---|---|
`)
	cell := func(s string) string {
		if s == "" {
			return "–"
		}
		return strings.ReplaceAll(s, "|", `\|`)
	}
	code := func(s string) string {
		if s == "" {
			return "–"
		}
		return "`" + s + "`"
	}
	for _, s := range settings {
		fl := ""
		if s.flag != "" {
			fl = "--" + s.flag
		}
		fcell := code(fl)
		if s.worker {
			fcell += " (worker)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", cell(s.name), code(s.option), code(s.env),
			fcell, cell(s.def), cell(s.unit), cell(s.source), cell(s.usage))
	}
	return b.Bytes()
}

// TestConfigurationDoc fails when docs/configuration.md is not what the
// settings table generates; -update rewrites it.
func TestConfigurationDoc(t *testing.T) {
	want := configurationMarkdown()
	if *update {
		if err := os.WriteFile(configurationDoc, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./app -run TestConfigurationDoc -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: regenerate it with go test ./app -run TestConfigurationDoc -update", configurationDoc)
	}
}
