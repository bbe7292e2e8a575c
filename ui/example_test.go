package ui_test

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/ui"
)

// The dashboard is mounted on the gateway's mux and shows the gateway's own
// routing table; both run until ctx is done.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		return
	}
	defer nc.Close()
	var g *gateway.Gateway
	dash := ui.New(nc, ui.Config{Table: func() *table.Snapshot { return g.Table() }})
	g, err = gateway.New(nc, gateway.Config{Listen: "127.0.0.1:8080", Extra: dash.Mounts()})
	if err != nil {
		return
	}
	go func() { _ = dash.Run(ctx) }()
	_ = g.Run(ctx) // the page is at http://127.0.0.1:8080/ui
}

// Without a Table func the dashboard watches the routing-table bucket itself,
// and its Handler can be served on any mux.
func ExampleUI_Handler() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		return
	}
	defer nc.Close()
	dash := ui.New(nc, ui.Config{Bucket: "llm-routing"})
	mux := http.NewServeMux()
	mux.Handle("/ui", dash.Handler())
	mux.Handle("/ui/", dash.Handler())
	_ = http.ListenAndServe("127.0.0.1:8081", mux)
}
