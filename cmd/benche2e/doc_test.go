package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

func TestSectionReplacesOnlyBetweenMarkers(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"empty file", "", "# Benchmarks\n\n" + markStart + "\nnew\n" + markEnd + "\n"},
		{"no markers: appended", "# Benchmarks\n\n## Micro\nfast\n", "# Benchmarks\n\n## Micro\nfast\n\n" + markStart + "\nnew\n" + markEnd + "\n"},
		{
			"markers: replaced, the rest kept",
			"# B\n\n## Micro\nfast\n\n" + markStart + "\nold\nlines\n" + markEnd + "\n\n## After\nkept\n",
			"# B\n\n## Micro\nfast\n\n" + markStart + "\nnew\n" + markEnd + "\n\n## After\nkept\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := string(replaceSection([]byte(c.doc), "new\n")); got != c.want {
				t.Errorf("got\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func TestWriteSectionTwiceIsStable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n\n## Micro-benchmarks\nBenchmarkDecide 900 ns/op\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"first run", "second run"} {
		if err := writeSection(path, s); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	got := string(b)
	if !strings.Contains(got, "BenchmarkDecide 900 ns/op") || strings.Contains(got, "first run") ||
		strings.Count(got, markStart) != 1 || !strings.Contains(got, "second run") {
		t.Errorf("after two runs:\n%s", got)
	}
}

func TestJudge(t *testing.T) {
	tr := func(ok, errs int, p99 time.Duration) *loadgen.TargetReport {
		return &loadgen.TargetReport{Scheduled: ok + errs, OK: ok, Errors: errs, Latency: loadgen.Summary{P99: loadgen.Dur(p99)}}
	}
	cases := []struct {
		name string
		t    *loadgen.TargetReport
		held bool
	}{
		{"fast, no errors", tr(5000, 0, 10*time.Millisecond), true},
		{"p99 at the limit", tr(5000, 0, 50*time.Millisecond), false},
		{"0.1% errors is tolerated", tr(4995, 5, 10*time.Millisecond), true},
		{"more errors fail", tr(4990, 10, 10*time.Millisecond), false},
		{"nothing succeeded", tr(0, 0, 0), false},
	}
	for _, c := range cases {
		if s := judge(1000, "p", c.t, 50*time.Millisecond); s.Held != c.held {
			t.Errorf("%s: held %v (%s), want %v", c.name, s.Held, s.Why, c.held)
		}
	}
}

func TestJudgeMany(t *testing.T) {
	tr := func(name string, errs int, first, gap time.Duration) loadgen.TargetReport {
		return loadgen.TargetReport{Name: name, OK: 100, Errors: errs,
			FirstData: &loadgen.Summary{P99: loadgen.Dur(first)}, Gaps: &loadgen.Summary{P99: loadgen.Dur(gap)}}
	}
	rep := func(sy loadgen.TargetReport) *loadgen.Report {
		return &loadgen.Report{Targets: []loadgen.TargetReport{tr("proxy", 0, 60*time.Millisecond, 110*time.Millisecond), sy}}
	}
	rss := map[string]float64{"proxy": 100, "stack": 150}
	cases := []struct {
		name string
		sy   loadgen.TargetReport
		rss  map[string]float64
		want string // "" = met
	}{
		{"within every target", tr("switchyard", 0, 109*time.Millisecond, 129*time.Millisecond), rss, ""},
		{"first data late", tr("switchyard", 0, 111*time.Millisecond, 110*time.Millisecond), rss, "first data"},
		{"gaps long", tr("switchyard", 0, 60*time.Millisecond, 131*time.Millisecond), rss, "chunk gap"},
		{"an error", tr("switchyard", 1, 60*time.Millisecond, 110*time.Millisecond), rss, "errors"},
		{"memory", tr("switchyard", 0, 60*time.Millisecond, 110*time.Millisecond), map[string]float64{"proxy": 100, "stack": 201}, "RSS"},
	}
	for _, c := range cases {
		met, why := judgeMany(rep(c.sy), c.rss)
		if met != (c.want == "") || !strings.Contains(why, c.want) {
			t.Errorf("%s: met %v (%s), want %q", c.name, met, why, c.want)
		}
	}
}

// The overload phase is judged on all three targets, and a lost request
// fails it whatever the latencies.
func TestJudgeOverload(t *testing.T) {
	ph := func(p99, refusal float64, lost int) *overloadPhase {
		return &overloadPhase{Capacity: 1000, CapacityP99: loadgen.Dur(10 * time.Millisecond), Lost: lost,
			Report: &loadgen.Report{Targets: []loadgen.TargetReport{{OKRate: 900,
				Latency: loadgen.Summary{P99: loadgen.Dur(time.Duration(p99 * float64(time.Millisecond)))},
				Refused: &loadgen.Summary{N: 10, P99: loadgen.Dur(time.Duration(refusal * float64(time.Millisecond)))},
			}}}}
	}
	for _, c := range []struct {
		p99, refusal float64
		lost         int
		met          bool
	}{{14, 2, 0, true}, {16, 2, 0, false}, {14, 6, 0, false}, {14, 2, 1, false}} {
		if met, why := judgeOverload(ph(c.p99, c.refusal, c.lost)); met != c.met {
			t.Errorf("p99 %v ms, refusal p99 %v ms, lost %d: met %v (%s), want %v", c.p99, c.refusal, c.lost, met, why, c.met)
		}
	}
	all := ph(0, 1, 0) // everything refused: no admitted latency at all
	all.Report.Targets[0].OKRate = 0
	if met, _ := judgeOverload(all); met {
		t.Error("met by refusing every request")
	}
}
