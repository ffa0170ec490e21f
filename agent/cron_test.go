package agent

import (
	"context"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine has

	"github.com/runnel-dev/runnel/internal/kafka"
)

func cronTimer(t *testing.T, spec string, opts ...CronOption) timer {
	t.Helper()
	var s settings
	Cron(spec, func(context.Context, *Tick) error { return nil }, opts...)(&s)
	tm := s.Timers[0]
	if err := tm.Validate(); err != nil {
		t.Fatalf("Cron(%q): %v", spec, err)
	}
	return tm
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// The 5 fields are minute, hour, day of month, month, day of week, read in
// UTC by default; names and descriptors are accepted.
func TestCronNextStandardFields(t *testing.T) {
	for _, c := range []struct{ spec, from, want string }{
		{"0 9 * * MON", "2026-12-01T10:00:00Z", "2026-12-07T09:00:00Z"}, // Tue 1 Dec -> Mon 7 Dec
		{"0 9 * * MON", "2026-12-07T08:59:59Z", "2026-12-07T09:00:00Z"},
		{"0 9 * * MON", "2026-12-07T09:00:00Z", "2026-12-14T09:00:00Z"}, // strictly after
		{"*/15 * * * *", "2026-12-01T10:07:00Z", "2026-12-01T10:15:00Z"},
		{"0 0 1 JAN *", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"@daily", "2026-12-01T10:00:00Z", "2026-12-02T00:00:00Z"},
		{"5 4 29 2 *", "2026-12-01T00:00:00Z", "2028-02-29T04:05:00Z"},
	} {
		if got := cronTimer(t, c.spec).Next(utc(c.from)); !got.Equal(utc(c.want)) {
			t.Errorf("%q after %s: %s, want %s", c.spec, c.from, got.UTC().Format(time.RFC3339), c.want)
		}
	}
}

// CronLocation reads the schedule in a zone, daylight saving included; a
// CRON_TZ prefix wins over it.
func TestCronLocation(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	tm := cronTimer(t, "0 9 * * *", CronLocation(ny))
	if got := tm.Next(utc("2026-12-01T00:00:00Z")); !got.Equal(utc("2026-12-01T14:00:00Z")) { // EST, UTC-5
		t.Errorf("winter: %s", got.UTC())
	}
	if got := tm.Next(utc("2026-07-01T00:00:00Z")); !got.Equal(utc("2026-07-01T13:00:00Z")) { // EDT, UTC-4
		t.Errorf("summer: %s", got.UTC())
	}
	if s := tm.String(); s != "cron 0 9 * * * (America/New_York)" {
		t.Errorf("String %q", s)
	}
	prefixed := cronTimer(t, "CRON_TZ=Asia/Tokyo 0 9 * * *", CronLocation(ny))
	if got := prefixed.Next(utc("2026-12-01T00:00:00Z")); !got.Equal(utc("2026-12-02T00:00:00Z")) { // JST, UTC+9
		t.Errorf("CRON_TZ: %s", got.UTC())
	}
	// 2026-03-08 02:30 does not exist in New York (02:00 -> 03:00): that
	// day has no firing of "30 2 * * *"; the next is on the 9th.
	dst := cronTimer(t, "30 2 * * *", CronLocation(ny))
	if got := dst.Next(utc("2026-03-08T05:00:00Z")); !got.Equal(utc("2026-03-09T06:30:00Z")) {
		t.Errorf("spring forward: %s", got.UTC())
	}
	// 2026-11-01 01:30 exists twice in New York (02:00 -> 01:00): it fires
	// at both (robfig/cron's answer; documented on CronLocation).
	fall := cronTimer(t, "30 1 * * *", CronLocation(ny))
	first := fall.Next(utc("2026-11-01T04:00:00Z"))
	if !first.Equal(utc("2026-11-01T05:30:00Z")) {
		t.Errorf("fall back, first: %s", first.UTC())
	}
	if got := fall.Next(first); !got.Equal(utc("2026-11-01T06:30:00Z")) {
		t.Errorf("fall back, second: %s, want 01:30 EST", got.UTC())
	}
}

// Prev answers the latest scheduled time in (after, now]: what a partition
// that missed runs fires once, at start.
func TestCronPrev(t *testing.T) {
	daily := cronTimer(t, "0 9 * * *")
	for _, c := range []struct {
		after, now, want string // want "" = none
	}{
		{"2026-12-01T09:00:00Z", "2026-12-01T23:00:00Z", ""},                     // fired today, nothing since
		{"2026-12-01T09:00:00Z", "2026-12-02T09:00:00Z", "2026-12-02T09:00:00Z"}, // now is a scheduled time
		{"2026-12-01T09:00:00Z", "2026-12-04T10:00:00Z", "2026-12-04T09:00:00Z"}, // three missed: the latest
		{"2026-12-01T08:00:00Z", "2026-12-01T08:30:00Z", ""},
		{"2025-01-01T00:00:00Z", "2026-12-01T10:00:00Z", "2026-12-01T09:00:00Z"}, // two years down
	} {
		got, ok := daily.Prev(utc(c.after), utc(c.now))
		if c.want == "" {
			if ok {
				t.Errorf("Prev(%s, %s) = %s, want none", c.after, c.now, got.UTC())
			}
			continue
		}
		if !ok || !got.Equal(utc(c.want)) {
			t.Errorf("Prev(%s, %s) = %s %v, want %s", c.after, c.now, got.UTC(), ok, c.want)
		}
	}
	every := cronTimer(t, "* * * * *")
	if got, ok := every.Prev(utc("2025-12-01T00:00:00Z"), utc("2026-12-01T10:00:30Z")); !ok || !got.Equal(utc("2026-12-01T10:00:00Z")) {
		t.Errorf("every minute, a year down: %s %v", got.UTC(), ok)
	}
	weekly := cronTimer(t, "0 9 * * MON")
	if got, ok := weekly.Prev(utc("2026-11-30T09:00:00Z"), utc("2026-12-06T23:59:00Z")); ok {
		t.Errorf("weekly, nothing missed: %s", got.UTC())
	}
}

// A spec that does not parse, @every (Every's job) and a missing function
// are reported by Validate, so the App refuses to build.
func TestCronValidate(t *testing.T) {
	for spec, want := range map[string]string{
		"0 9 * *":                     "expected exactly 5 fields",
		"61 * * * *":                  "above maximum",
		"@every 1h":                   "use agent.Every",
		"CRON_TZ=Nowhere/X 0 9 * * *": "provided bad location",
	} {
		var s settings
		Cron(spec, func(context.Context, *Tick) error { return nil })(&s)
		if err := s.Timers[0].Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Cron(%q).Validate() = %v, want %q", spec, err, want)
		}
	}
	var s settings
	Cron("0 9 * * *", nil)(&s)
	if err := s.Timers[0].Validate(); err == nil || !strings.Contains(err.Error(), "no function") {
		t.Errorf("no function: %v", err)
	}
}

// The row of partition p in the cron table hashes to p (a table key must
// belong to the partition that writes it) and names the schedule.
func TestCronKeyPerPartition(t *testing.T) {
	tm := cronTimer(t, "0 9 * * MON")
	for _, parts := range []int32{1, 3, 8, 64} {
		for p := range parts {
			k, err := tm.cronKey(p, parts)
			if err != nil {
				t.Fatal(err)
			}
			if q := kafka.PartitionFor([]byte(k), parts); q != p || !strings.HasPrefix(k, "0 9 * * MON @UTC #") {
				t.Fatalf("key %q for partition %d of %d hashes to %d", k, p, parts, q)
			}
		}
	}
}
