package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Disaggregated prefill and decode, as vLLM serves them with a KV-transfer
// connector (NIXL): a request with kv_transfer_params.do_remote_decode is a
// prefill leg: the engine computes the prompt (max_tokens 1, not streamed),
// holds its KV blocks for a while and answers with the kv_transfer_params a
// decode instance needs to pull them. A request with do_remote_prefill and
// those parameters is a decode leg: the engine pulls the blocks from the
// remote engine (here over the remote's HTTP port, /kv_transfer/pull, in
// place of NIXL's side channel), pays KVTransferPerToken for each instead
// of prefilling it, and generates as usual. Blocks a decode leg cannot pull
// (unknown, expired, another engine's) fail the request as vLLM fails it.

// KVTransferParams is the kv_transfer_params object of vLLM's NIXL
// connector, in a request and in a prefill's answer.
type KVTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	RemoteRequestID string  `json:"remote_request_id,omitempty"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// DefaultKVHold is how long a prefill's blocks wait for their decode leg
// (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT is 480 s; a simulation wants
// failures sooner).
const DefaultKVHold = 60 * time.Second

// maxHeld bounds the prefills a server holds blocks for; the oldest goes
// first, as if it had expired.
const maxHeld = 4096

// errKVLoad is vLLM's answer to a request whose KV could not be loaded
// (kv_load_failure_policy "fail": the request ends with finish reason
// error, served as a 500 GenerationError).
func errKVLoad() *engineError {
	return errorf(http.StatusInternalServerError, "Internal server error")
}

// heldKV is one prefill's blocks, held for its decode leg.
type heldKV struct {
	blocks  []int
	tokens  int
	expires time.Time
}

// kvHold keeps the blocks of finished prefills until pulled or expired.
type kvHold struct {
	mu     sync.Mutex
	byReq  map[string]heldKV
	order  []string // request ids, oldest first
	nextID int
	seen   []KVTransferParams // the last maxTraces kv_transfer_params received
}

// hold records the blocks of a finished prefill and returns their ids.
func (h *kvHold) hold(req string, nblocks, tokens int, expires time.Time) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byReq == nil {
		h.byReq = map[string]heldKV{}
	}
	for len(h.order) >= maxHeld {
		delete(h.byReq, h.order[0])
		h.order = h.order[1:]
	}
	ids := make([]int, nblocks)
	for i := range ids {
		h.nextID++
		ids[i] = h.nextID
	}
	h.byReq[req] = heldKV{blocks: ids, tokens: tokens, expires: expires}
	h.order = append(h.order, req)
	return ids
}

// take releases the blocks of req to the decode leg that names them, and
// returns how many prompt tokens they hold.
func (h *kvHold) take(req string, blocks []int, now time.Time) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kv, ok := h.byReq[req]
	if !ok {
		return 0, false
	}
	delete(h.byReq, req)
	h.order = slices.DeleteFunc(h.order, func(id string) bool { return id == req })
	if now.After(kv.expires) || !slices.Equal(kv.blocks, blocks) {
		return 0, false
	}
	return kv.tokens, true
}

func (h *kvHold) record(p KVTransferParams) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) == maxTraces {
		h.seen = slices.Delete(h.seen, 0, 1)
	}
	h.seen = append(h.seen, p)
}

// KVTransfers returns the kv_transfer_params of the last requests that
// carried them, oldest first: which legs the engine was asked to play.
func (s *Server) KVTransfers() []KVTransferParams {
	s.kv.mu.Lock()
	defer s.kv.mu.Unlock()
	return slices.Clone(s.kv.seen)
}

// EngineID is the engine's NIXL engine id, remote_engine_id in the
// parameters its prefills return.
func (s *Server) EngineID() string { return s.engineID }

// kvTransfer prepares g for the leg its kv_transfer_params ask for: a
// prefill is marked to hold its blocks when done; a decode pulls the
// blocks the parameters name from the remote engine.
func (s *Server) kvTransfer(ctx context.Context, g *generation, p *KVTransferParams) error {
	if p == nil {
		return nil
	}
	s.kv.record(*p)
	switch {
	case p.DoRemoteDecode && p.DoRemotePrefill:
		return errorf(http.StatusBadRequest, "kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive")
	case p.DoRemoteDecode:
		if g.stream {
			// vLLM's prefill answers once, with the parameters.
			return errorf(http.StatusBadRequest, "Prefill does not support streaming")
		}
		g.remoteDecode = true
	case p.DoRemotePrefill:
		if p.RemoteEngineID == nil || p.RemoteHost == nil || p.RemotePort == nil || len(p.RemoteBlockIDs) == 0 {
			return errorf(http.StatusBadRequest, "kv_transfer_params: do_remote_prefill needs remote_engine_id, remote_block_ids, remote_host and remote_port")
		}
		tokens, err := s.pull(ctx, p)
		if err != nil {
			s.log.Warn("KV load failed", "remote_engine_id", *p.RemoteEngineID, "remote_request_id", p.RemoteRequestID, "err", err)
			return errKVLoad()
		}
		g.req.Transferred = min(tokens, g.req.PromptTokens)
	}
	return nil
}

// pullRequest is what a decode engine asks the remote prefill engine for.
type pullRequest struct {
	EngineID  string `json:"remote_engine_id"`
	RequestID string `json:"remote_request_id"`
	BlockIDs  []int  `json:"remote_block_ids"`
}

type pullReply struct {
	Tokens int `json:"tokens"`
}

// pull fetches the blocks p names from their engine.
func (s *Server) pull(ctx context.Context, p *KVTransferParams) (int, error) {
	b, err := json.Marshal(pullRequest{EngineID: *p.RemoteEngineID, RequestID: p.RemoteRequestID, BlockIDs: p.RemoteBlockIDs})
	if err != nil {
		return 0, err
	}
	url := "http://" + net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort)) + "/kv_transfer/pull"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.kvClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("remote engine answered %s", resp.Status)
	}
	var r pullReply
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<10)).Decode(&r); err != nil {
		return 0, err
	}
	if r.Tokens < 0 {
		return 0, errors.New("negative token count")
	}
	return r.Tokens, nil
}

// handlePull serves a decode engine's pull: the blocks go to it once.
func (s *Server) handlePull(w http.ResponseWriter, r *http.Request) {
	var req pullRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.EngineID != s.engineID {
		writeError(w, errorf(http.StatusNotFound, "engine %s is not %s", s.engineID, req.EngineID))
		return
	}
	tokens, ok := s.kv.take(req.RequestID, req.BlockIDs, time.Now())
	if !ok {
		writeError(w, errorf(http.StatusNotFound, "no KV blocks held for request %q (unknown, expired or already pulled)", req.RequestID))
		return
	}
	writeJSON(w, http.StatusOK, pullReply{Tokens: tokens})
}

// heldParams holds a finished prefill's blocks and returns the parameters
// its decode leg needs; r is the prefill's HTTP request, whose Host is the
// address a decode engine reaches this one at.
func (s *Server) heldParams(r *http.Request, g *generation) *KVTransferParams {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, "80"
	}
	pn, _ := strconv.Atoi(port)
	bt := s.cfg.Engine.BlockTokens
	ids := s.kv.hold(g.id, (g.req.PromptTokens+bt-1)/bt, g.req.PromptTokens, time.Now().Add(s.cfg.KVHold))
	engineID := s.engineID
	return &KVTransferParams{
		DoRemotePrefill: true,
		RemoteEngineID:  &engineID,
		RemoteBlockIDs:  ids,
		RemoteHost:      &host,
		RemotePort:      &pn,
		RemoteRequestID: g.id,
		TPSize:          1,
	}
}
