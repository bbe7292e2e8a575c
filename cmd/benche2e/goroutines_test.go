package main

import "testing"

// Goroutines are counted by the part whose function they run from, the
// outermost frame of their stack.
func TestGoroutineParts(t *testing.T) {
	profile := []byte(`goroutine profile: total 10
3 @ 0x43e 0x44f 0x5a1
#	0x5a0	net/http.(*persistConn).readLoop+0x7f	/go/src/net/http/transport.go:2300

2 @ 0x43e 0x44f 0x6b2 0x6c3
#	0x6b1	github.com/switchyard-llm/switchyard/replica-adapter.(*stream).keepalive+0x10	/x/stream.go:1
#	0x6c2	github.com/switchyard-llm/switchyard/replica-adapter.(*Adapter).onRequest.func1+0x20	/x/request.go:1

1 @ 0x43e
#	0x43d	net/http.(*conn).serve+0x1	/go/src/net/http/server.go:1

1 @ 0x43e
#	0x43d	net/http.(*connReader).backgroundRead+0x1	/go/src/net/http/server.go:1

1 @ 0x43e
#	0x43d	net/http.(*http2serverConn).serve+0x1	/go/src/net/http/h2_bundle.go:1

1 @ 0x43e
#	0x43d	github.com/nats-io/nats%2ego.(*Conn).readLoop+0x1	/x:1

1 @ 0x43e
#	0x43d	github.com/nats-io/nats-server/v2/server.(*client).readLoop+0x1	/x:1

1 @ 0x43e
#	0x43d	main.main+0x1	/x/main.go:1
`)
	got, err := goroutineParts(profile)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"net/http client": 3, "replica-adapter": 2, "net/http server": 3, "nats.go": 1, "nats-server": 1, "main": 1}
	if len(got) != len(want) {
		t.Fatalf("parts %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
}
