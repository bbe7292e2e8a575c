package test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestADecidingGatewaysOwnSilentLinkIsNotTheReplicas: a gateway that
// decides sends a request into its own NATS link just as the link goes
// silent. Every replica's heartbeats stop with it, but the silence is the
// gateway's: it waits for its link's word instead of failing the request
// on the replica at the accept timeout, and when the link is given up the
// request, which no replica accepted, is answered 503 router_unavailable
// with X-Switchyard-Retry-Elsewhere, for another gateway to take, not 504.
func TestADecidingGatewaysOwnSilentLinkIsNotTheReplicas(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0")})
	rl := testkit.NewRelay(t, strings.TrimPrefix(st.NATSURL(), "nats://"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := natsconn.Connect(ctx, natsconn.Options{URL: rl.URL(), Creds: st.Creds(auth.Role{Kind: auth.RoleGateway}), Name: "gateway-via-relay"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// An accept timeout well inside the heartbeats' second, so that at
	// it the replica's last heartbeat is most often older than two of
	// them.
	_, url := gatewayOnConn(t, nc, gateway.Config{Decide: gateway.DecideLocal, AcceptTimeout: 300 * time.Millisecond})
	body := `{"model":"chat-small","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		status, _, b := chatOnce(t, url, body, nil)
		if status != 200 {
			return fmt.Errorf("%d %s", status, b)
		}
		return nil
	})

	rl.Cut()
	start := time.Now()
	status, h, b := chatOnce(t, url, body, nil)
	took := time.Since(start)
	if status != 503 || !strings.Contains(b, subjects.CodeRouterUnavailable) || h.Get(gateway.HdrRetryElsewhere) != "1" {
		t.Errorf("a request sent into the gateway's silent link: %d %s %s=%q after %v; want 503 %s with %s: 1",
			status, b, gateway.HdrRetryElsewhere, h.Get(gateway.HdrRetryElsewhere), took.Round(time.Millisecond),
			subjects.CodeRouterUnavailable, gateway.HdrRetryElsewhere)
	}
	t.Logf("answered %d after %v", status, took.Round(time.Millisecond))
}
