package app

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The status page (GET /) is rendered on the server from Status with the
// template web/index.html, so that curl, a screenshot or a browser without
// JavaScript see the content. Its script reloads the page's main element
// (GET /?part=main, the template "main" alone) every 2 s: one rendering path,
// in Go; /api/status is the same Status as JSON.

// pagePart is the query parameter that asks for the main element alone.
const pagePart = "part"

// statusPage parses the embedded template once.
var statusPage = sync.OnceValues(func() (*template.Template, error) {
	t, err := template.New("index.html").Funcs(pageFuncs).ParseFS(web, "web/index.html")
	if err != nil {
		return nil, fmt.Errorf("status page template: %w", err)
	}
	return t, nil
})

// servePage renders the status page, or its main element alone with
// ?part=main.
func (w *Worker) servePage(rw http.ResponseWriter, r *http.Request) {
	t, err := statusPage()
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	name := "index.html"
	switch part := r.URL.Query().Get(pagePart); part {
	case "":
	case "main":
		name = "main"
	default:
		http.Error(rw, fmt.Sprintf("unknown part %q (main is the only one)", part), http.StatusBadRequest)
		return
	}
	var b bytes.Buffer // rendered whole first: a template error is a 500, not half a page
	if err := t.ExecuteTemplate(&b, name, w.Status()); err != nil {
		http.Error(rw, fmt.Sprintf("status page: %v", err), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	rw.Header().Set("Cache-Control", "no-store")
	_, _ = b.WriteTo(rw)
}

// pageFuncs are the template's helpers: formatting only, no decisions the
// JSON does not show.
var pageFuncs = template.FuncMap{
	"parts":      topicPartsText,
	"href":       memberHref,
	"rate":       rateText,
	"secs":       func(ms float64) string { return strconv.FormatFloat(ms/1000, 'f', 1, 64) + " s" },
	"round":      func(f float64) int64 { return int64(math.Round(f)) },
	"when":       func(t time.Time) string { return t.UTC().Format(time.DateTime) },
	"join":       func(s []string) string { return strings.Join(s, ", ") },
	"taskLag":    taskLagOf,
	"assigned":   assignmentRows,
	"brokerBad":  func(b BrokerAnswers) bool { return b.Stale || b.Error != "" || b.RefreshingMS > ms(brokerWait) },
	"stateOK":    func(s string) bool { return s == TaskRunning || s == TaskStandby },
	"roleBad":    func(r string) bool { return r == RoleRestoring || r == RolePending },
	"zeroTime":   func(t time.Time) bool { return t.IsZero() },
	"positiveMS": func(ms float64) bool { return ms > 0 },
}

// topicPartsText is topic -> partitions as "topic [0,2] other [1]", topics
// sorted, empty ones left out.
func topicPartsText(m map[string][]int32) string {
	var b strings.Builder
	for _, t := range sortedKeys(m) {
		ps := m[t]
		if len(ps) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(t + " [" + partitionsText(ps) + "]")
	}
	return b.String()
}

// partitionsText is ps as "0,2".
func partitionsText(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// memberHref is the link to the status page of the worker at addr, a
// member's HTTP address as the assignment carries it ("host:port", or an
// http or https URL); "" when addr names no host and port to link to
// (":8080").
func memberHref(addr string) string {
	if addr == "" {
		return ""
	}
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return ""
		}
		if u.Path == "" {
			u.Path = "/"
		}
		return u.String()
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return ""
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return ""
	}
	return "http://" + addr + "/"
}

// rateText is a rate in records/s: one decimal below 10, none above.
func rateText(r float64) string {
	if r < 10 {
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'f', 0, 64)
}

// taskLag is a task's changelog lag as the tasks table shows it: the sum
// over its changelogs, Unknown when one has no end offset, Shown only for
// a task with changelogs (restoring or standby).
type taskLag struct {
	Shown, Unknown bool
	Lag            int64
}

func taskLagOf(t TaskStatus) taskLag {
	l := taskLag{Shown: len(t.Changelogs) > 0}
	for _, c := range t.Changelogs {
		if c.Lag < 0 {
			l.Unknown = true
		}
		l.Lag += max(c.Lag, 0)
	}
	return l
}

// assignmentRow is one line of the assignment table.
type assignmentRow struct {
	Kind, Topic, Partitions string
}

// assignmentRows lists a's partitions by kind and topic.
func assignmentRows(a AssignmentView) []assignmentRow {
	var out []assignmentRow
	for _, k := range []struct {
		kind string
		m    map[string][]int32
	}{{"active", a.Actives}, {"standby", a.Standbys}, {"warm-up", a.Warmups}, {"pending", a.Pending}, {"global", a.Globals}} {
		for _, t := range sortedKeys(k.m) {
			if len(k.m[t]) > 0 {
				out = append(out, assignmentRow{Kind: k.kind, Topic: t, Partitions: partitionsText(k.m[t])})
			}
		}
	}
	return out
}
