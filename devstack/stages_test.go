package devstack_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestStageBudgetCoversThePath sends requests through a stack whose parts
// share a stage recorder, and checks the table has every stage the path
// passes, in the order they happen, and the bus floor beside it: whichever
// part decides.
func TestStageBudgetCoversThePath(t *testing.T) {
	all := func(skip ...stages.Stage) []string {
		var want []string
		for s := stages.Published; s < stages.NumStages; s++ {
			if !slices.Contains(skip, s) {
				want = append(want, s.String())
			}
		}
		return want
	}
	local := all(stages.BrokerReceived, stages.Forwarded, stages.Published, stages.Decided)
	local = append([]string{stages.Decided.String(), stages.Published.String()}, local...)
	for _, c := range []struct {
		decide string
		want   []string
	}{
		{gateway.DecideBroker, all()},
		{gateway.DecideLocal, local},
	} {
		t.Run(c.decide, func(t *testing.T) { stageBudget(t, c.decide, c.want) })
	}
}

func stageBudget(t *testing.T, decide string, want []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := stages.New(1)
	st, err := devstack.Start(ctx, devstack.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", DataDir: t.TempDir(), Speed: 20,
		Replicas: devstack.ReplicasNamed("l8-gen-0"), HeartbeatEvery: 100 * time.Millisecond, ScrapeEvery: 100 * time.Millisecond,
		Stages: rec, Gateway: gateway.Config{Decide: decide},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := st.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, answers200(t, st.GatewayURL(), "start"))
	for range 5 {
		if code, body := chat(t, st.GatewayURL()); code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
	}
	sum, err := st.StageSummary()
	if err != nil {
		t.Fatal(err)
	}
	if sum.Requests < 5 {
		t.Fatalf("%d requests recorded, want at least 5", sum.Requests)
	}
	var got []string
	for _, s := range sum.Stages {
		got = append(got, s.Stage)
	}
	if !slices.Equal(got, want) {
		t.Errorf("stages\n%q\nwant\n%q", got, want)
	}
	if sum.Total.P50 <= 0 || sum.BusFloor.Requests == 0 || sum.BusFloor.P50 <= 0 {
		t.Errorf("total %+v, bus floor %+v", sum.Total, sum.BusFloor)
	}
}
