package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
)

func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		cfg  gateway.Config
		flag string
	}{
		{gateway.Config{MaxBody: -1}, "--max-body"},
		{gateway.Config{MaxBody: 64 << 30}, "--max-body"},
		{gateway.Config{MaxRetries: -2}, "--max-retries"},
		{gateway.Config{MaxRetries: gateway.MaxRetriesCeiling + 1}, "--max-retries"},
		{gateway.Config{RetryBudget: 1.5}, "--retry-budget"},
		{gateway.Config{ShutdownGrace: -time.Second}, "--shutdown-grace"},
		{gateway.Config{ID: "a.b"}, "--id"},
		{gateway.Config{HeaderTimeout: -time.Second}, "--header-timeout"},
		{gateway.Config{KeepAliveTimeout: 2 * time.Hour}, "--keepalive-timeout"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.flag)
		}
	}
	for _, ok := range []gateway.Config{{}, {MaxBody: gateway.MaxBodyCeiling, MaxRetries: -1, RetryBudget: 1}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", ok, err)
		}
	}
}

// A body limit the server cannot carry is refused, never quietly lowered;
// the default fits itself to the server.
func TestMaxBodyMustFitTheServer(t *testing.T) {
	_, url := natstest.Start(t) // nats-server's default max payload, 1 MiB
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	room := nc.MaxPayload() - gateway.HeaderRoom
	if _, err := gateway.New(nc, gateway.Config{MaxBody: room + 1}); err == nil || !strings.Contains(err.Error(), "--max-body") {
		t.Errorf("MaxBody above the server's room: %v, want an error naming --max-body", err)
	}
	if _, err := gateway.New(nc, gateway.Config{MaxBody: room}); err != nil {
		t.Errorf("MaxBody = the server's room: %v", err)
	}
	if _, err := gateway.New(nc, gateway.Config{}); err != nil {
		t.Errorf("default MaxBody on a 1 MiB server: %v", err)
	}
}
