package metrics_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/metrics"
)

// readmeMetrics reads the README's metrics table: each vibejobs_ metric it
// names, with the labels it gives (a name without braces takes those of
// the first name of its row that has them, as the table writes a row of
// related series; none at all when no name of the row has any).
func readmeMetrics(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile("`(vibejobs_[a-z_]+)(?:\\{([a-z_,]*)\\})?`")
	docs := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "| `vibejobs_") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|") // the metric column
		var rowLabels []string
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			if m[2] != "" && rowLabels == nil {
				rowLabels = strings.Split(m[2], ",")
			}
		}
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			labels := rowLabels
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
			}
			slices.Sort(labels)
			docs[m[1]] = labels
		}
	}
	if len(docs) == 0 {
		t.Fatal("no metrics table found in the README")
	}
	return docs
}

// servedMetrics parses a scrape in the text format: each metric family
// (histograms by their base name) and the label names of its samples.
func servedMetrics(t *testing.T, text string) map[string][][]string {
	t.Helper()
	types := map[string]string{}
	served := map[string][][]string{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			types[name] = typ
			served[name] = nil
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		series, _, _ := strings.Cut(line, " ")
		name, labelText, _ := strings.Cut(series, "{")
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && types[base] == "histogram" {
				name = base
			}
		}
		var labels []string
		for pair := range strings.SplitSeq(strings.TrimSuffix(labelText, "}"), ",") {
			if k, _, ok := strings.Cut(pair, "="); ok && k != "le" {
				labels = append(labels, k)
			}
		}
		slices.Sort(labels)
		served[name] = append(served[name], labels)
	}
	return served
}

// TestReadmeMetricsTable: every metric the README's table names is served,
// by the installation administrator's scrape, with exactly the labels the
// table gives; every vibejobs_ metric served is in the table; the Go and
// process collectors are there; and no label names a run, a job or a URL,
// which would make the series unbounded (and a URL a leak).
func TestReadmeMetricsTable(t *testing.T) {
	m := metrics.New()
	ok := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	m.WatchLoops(func() time.Time { return ok }, metrics.Loop{Name: "scheduler", FailingSince: func() time.Time { return time.Time{} }})
	m.WatchSubscriptions(func(context.Context) ([]*vibejobs.Subscription, error) {
		return []*vibejobs.Subscription{{ID: "sub_a", ProjectID: "prj_1", LastSuccessAt: &ok}}, nil
	})
	m.WatchClockSkew(func() (time.Duration, bool) { return 0, true })
	served := servedMetrics(t, scrape(t, m))
	docs := readmeMetrics(t)
	for name, labels := range docs {
		samples, ok := served[name]
		if !ok || len(samples) == 0 {
			t.Errorf("the README lists %s, which is not served", name)
			continue
		}
		for _, got := range samples {
			if !slices.Equal(got, labels) {
				t.Errorf("%s: a series with labels %v, the README says %v", name, got, labels)
				break
			}
		}
	}
	for name, samples := range served {
		if strings.HasPrefix(name, "vibejobs_") {
			if _, ok := docs[name]; !ok {
				t.Errorf("%s is served but not in the README's table", name)
			}
		}
		for _, labels := range samples {
			for _, l := range labels {
				if strings.Contains(l, "url") || strings.Contains(l, "run") || strings.Contains(l, "job") || strings.Contains(l, "secret") {
					t.Errorf("%s has the label %s: unbounded, or a leak", name, l)
				}
			}
		}
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := served[name]; !ok {
			t.Errorf("%s is not served", name)
		}
	}
}
