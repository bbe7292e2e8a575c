package test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestBenchPrintsTheStageBudget runs `switchyard bench --stages` against
// the dev stack recording its stages: the run's stage table follows the
// report, every request of the run in it (the warmup and anything before
// the run left out), each stage the path passes with its p50 and p99,
// beside the bus floor measured in the same run.
func TestBenchPrintsTheStageBudget(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		rec := stages.New(1)
		st := startStack(t, devstack.Config{Replicas: l8(), Gateway: gateway.Config{Decide: decide}, Stages: rec})
		// A request before the run: the table must not count it.
		if status, _ := post(t, st.GatewayURL(), "", `{"model":"chat-small","max_tokens":1,"messages":[{"role":"user","content":"before"}]}`); status != 200 {
			t.Fatalf("request before the run: %d", status)
		}
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, testkit.Cond("the request before to be recorded", func() bool { return rec.Summary().Requests == 1 }))
		out, errOut, code := sy(t, nil, "", "bench", "--target", st.GatewayURL(), "--rate", "50", "--requests", "20", "--duration", "0",
			"--warmup", "0", "--quiet", "--stages")
		if code != 0 {
			t.Fatalf("bench --stages: exit %d: %s %s", code, out, errOut)
		}
		want := []stages.Stage{stages.Published, stages.Decided, stages.AdapterReceived, stages.EngineFirstByte, stages.GatewayFirstChunk, stages.ClientFirstByte}
		if decide == gateway.DecideBroker {
			want = append(want, stages.BrokerReceived, stages.Forwarded)
		}
		for _, s := range want {
			row := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(s.String()) + ` \| 20 \| \d+\.\d{3} \| \d+\.\d{3} \|$`)
			if !row.MatchString(out) {
				t.Errorf("no row of 20 requests for %q in:\n%s", s, out)
			}
		}
		if decide == gateway.DecideLocal && strings.Contains(out, "| "+stages.BrokerReceived.String()+" |") {
			t.Errorf("a gateway that decides has a broker stage:\n%s", out)
		}
		if !regexp.MustCompile(`(?m)^\| bus floor: .* \| 200 \| \d+\.\d{3} \| \d+\.\d{3} \|$`).MatchString(out) {
			t.Errorf("no bus floor measured in the run:\n%s", out)
		}
	})
}
