package adapter

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// engineHTTP is the adapter's HTTP side of its engine: the client that
// calls it, what its answers to requests say of it, when it last
// streamed, and the buffers its answers are relayed with.
type engineHTTP struct {
	client   *http.Client
	ownHTTP  *http.Transport // closed when Run returns, when newEngineHTTP made it
	outcomes outcomes
	// streamed is when bytes of an answer last came from the engine (Unix
	// nanoseconds): an engine that streams is not down, however slowly it
	// answers a scrape.
	streamed atomic.Int64

	bufs    sync.Pool // *[]byte of chunk, for a non-streamed body's reads
	sseBufs sync.Pool // *[]byte of sseChunkSize at most, for SSE body reads
	inline  int       // largest non-streamed answer sent as one message
	chunk   int
}

// sseChunkSize is the read buffer of an SSE stream, as large as the engine
// connection's own buffered reader (engineBufferSize), so a larger one
// would rarely fill.
const sseChunkSize = engineBufferSize

// engineBufferSize is the read and the write buffer of each engine
// connection (net/http's default is 4 KiB each). Every open stream holds
// its connection, so at thousands of streams the buffers are tens of MiB;
// an SSE event of a chat chunk is a few hundred bytes, a read larger than
// the buffer bypasses it, and a request body past the headers goes to the
// socket without it.
const engineBufferSize = 2 << 10

// init sets e up to call the engine with client (nil: a client
// of its own, engineTransport) and to relay its answers on a NATS server
// whose max payload is maxPayload (0: unknown).
func (e *engineHTTP) init(client *http.Client, maxPayload int) {
	if client == nil {
		e.ownHTTP = engineTransport()
		client = &http.Client{Transport: e.ownHTTP}
	}
	e.client = client
	// A data message carries one read; keep it well inside the server's
	// max payload, with room for headers.
	e.chunk = 32 << 10
	if mp := maxPayload; mp > 0 && mp-4096 < e.chunk {
		e.chunk = max(mp-4096, 1024)
	}
	chunk := e.chunk
	e.bufs.New = func() any { b := make([]byte, chunk); return &b }
	// A stream holds its buffer for as long as it lasts, mostly waiting
	// for the next token: thousands of open streams would hold 32 KiB
	// each. An SSE read is an event or a few; a burst larger than this goes
	// as several messages.
	sseChunk := min(e.chunk, sseChunkSize)
	e.sseBufs.New = func() any { b := make([]byte, sseChunk); return &b }
	// A non-streamed answer up to this size goes back as one message.
	e.inline = 1 << 20
	if mp := maxPayload; mp > 0 && mp-64<<10 < e.inline {
		e.inline = max(mp-64<<10, e.chunk)
	}
}

// engineTransport is tuned for many concurrent long streams to one engine:
// enough idle connections that every stream keeps its own, no response
// header timeout (a long prefill or a non-streamed generation sends headers
// late) and no compression (gzip would hold back SSE chunks). The engine is
// a local upstream, so no proxy.
func engineTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      engineBufferSize,
		WriteBufferSize:     engineBufferSize,
	}
}
