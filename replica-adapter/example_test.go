package adapter_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
)

// An adapter in front of a vLLM server, drained on SIGTERM: brokers stop
// sending within a heartbeat, requests in flight finish, the replica
// deregisters and Run returns.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	a, err := adapter.New(nc, adapter.Config{
		Replica:     "l8-gen-0",
		Model:       "llama-3-8b-instruct",
		EngineModel: "meta-llama/Llama-3.1-8B-Instruct",
		Version:     "v1.0.0",
		Pool:        "general",
		Flavor:      adapter.FlavorVLLM,
		EngineURL:   "http://127.0.0.1:8000",
		MaxBatch:    32,
		MaxQueue:    128,
		MaxLoras:    4,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
