package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody bounds a request body.
const maxBody = 32 << 20

// Handler serves vLLM's OpenAI-compatible API, /health and /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("POST /v1/completions", s.handleCompletion)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", s.handleGetResponse)
	mux.HandleFunc("DELETE /v1/responses/{id}", s.handleDeleteResponse)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLora)
	mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLora)
	mux.HandleFunc("POST /kv_transfer/pull", s.handlePull)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		// FastAPI's answer for an unknown path.
		writeJSONBytes(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
	})
	return s.withRequestID(mux)
}

// withRequestID echoes the client's X-Request-Id, or gives the request one;
// completion ids are built from it, as vLLM does.
func (s *Server) withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if id == "" {
			id = s.newID()
		}
		w.Header().Set("X-Request-Id", id)
		if tp := r.Header.Get("Traceparent"); tp != "" {
			s.recordTrace(tp)
		}
		next.ServeHTTP(w, r)
	})
}

// maxTraces bounds the traceparents a server remembers.
const maxTraces = 256

// recordTrace remembers a traceparent received: vLLM continues the trace
// of the request it serves, and a test reads which one it was given.
func (s *Server) recordTrace(tp string) {
	s.tracesMu.Lock()
	defer s.tracesMu.Unlock()
	if len(s.traces) == maxTraces {
		s.traces = append(s.traces[:0], s.traces[1:]...)
	}
	s.traces = append(s.traces, tp[:min(len(tp), 128)])
}

// Traceparents returns the traceparent headers of the last requests the
// server received, oldest first.
func (s *Server) Traceparents() []string {
	s.tracesMu.Lock()
	defer s.tracesMu.Unlock()
	return append([]string(nil), s.traces...)
}

// newID is a UUID-shaped id, unique for this server.
func (s *Server) newID() string {
	var b [16]byte
	n := s.seq.Add(1)
	a := xxhash.Sum64(fmt.Appendf(b[:0], "%d/%d", s.idSeed, n))
	c := xxhash.Sum64(fmt.Appendf(b[:0], "%d", a))
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", a>>32, (a>>16)&0xffff, a&0xffff, c>>48, c&0xffffffffffff)
}

func decode(r *http.Request, w http.ResponseWriter, v any) error {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v); err != nil {
		return errorf(http.StatusBadRequest, "invalid JSON body: %v", err)
	}
	return nil
}

// resolve maps a requested model name to the adapter to run with ("" for
// the base model).
func (s *Server) resolve(name string) (model, lora string, err error) {
	base := s.cfg.Engine.Model
	if name == "" || name == base {
		return base, "", nil
	}
	s.adaptersMu.RLock()
	_, ok := s.adapters[name]
	s.adaptersMu.RUnlock()
	if !ok {
		return "", "", errorf(http.StatusNotFound, "The model `%s` does not exist.", name)
	}
	return name, name, nil
}

// maxTokens validates the requested max_tokens against the context length.
// A request without one gets the default and finishes with "stop".
func (s *Server) maxTokens(requested *int, promptTokens int) (int, string, error) {
	limit := s.cfg.MaxModelLen
	if requested == nil {
		n := min(s.cfg.DefaultMaxTokens, limit-promptTokens)
		if n < 1 {
			return 0, "", errorf(http.StatusBadRequest,
				"This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
				limit, promptTokens)
		}
		return n, "stop", nil
	}
	n := *requested
	if n < 1 {
		return 0, "", errorf(http.StatusBadRequest, "max_tokens must be at least 1, got %d.", n)
	}
	if promptTokens+n > limit {
		return 0, "", errorf(http.StatusBadRequest,
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			limit, promptTokens+n, promptTokens, n)
	}
	return n, "length", nil
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	maxTok := req.MaxCompletionTokens
	if maxTok == nil {
		maxTok = req.MaxTokens
	}
	g, err := s.newGeneration(w, true, req.Model, maxTok, req.Stream, req.StreamOptions, func() (input, error) {
		if len(req.Messages) == 0 {
			return input{}, errorf(http.StatusBadRequest, "messages must not be empty")
		}
		if req.ContinueFinalMessage && (req.AddGenerationPrompt == nil || *req.AddGenerationPrompt) {
			return input{}, errorf(http.StatusBadRequest, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		in, err := s.chatInput(req.Messages, req.ContinueFinalMessage)
		if err != nil {
			return input{}, errorf(http.StatusBadRequest, "%v", err)
		}
		return in, nil
	})
	if err == nil {
		g.returnTokenIDs = req.ReturnTokenIDs
		err = s.prioritize(g, req.Priority)
	}
	if err == nil {
		err = s.kvTransfer(r.Context(), g, req.KVTransferParams)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	s.generate(w, r, g)
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	g, err := s.newGeneration(w, false, req.Model, req.MaxTokens, req.Stream, req.StreamOptions, func() (input, error) {
		p, err := completionPrompt(req.Prompt)
		if err != nil {
			return input{}, errorf(http.StatusBadRequest, "%v", err)
		}
		return s.completionInput(p), nil
	})
	if err == nil {
		g.returnTokenIDs = req.ReturnTokenIDs
		err = s.prioritize(g, req.Priority)
	}
	if err == nil {
		err = s.kvTransfer(r.Context(), g, req.KVTransferParams)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	s.generate(w, r, g)
}

// newGeneration validates what chat and text completions share.
func (s *Server) newGeneration(w http.ResponseWriter, chat bool, name string, maxTok *int, stream bool,
	opts *streamOptions, readInput func() (input, error)) (*generation, error) {
	model, lora, err := s.resolve(name)
	if err != nil {
		return nil, err
	}
	in, err := readInput()
	if err != nil {
		return nil, err
	}
	p := in.prompt
	n, reason, err := s.maxTokens(maxTok, p.tokens)
	if err != nil {
		return nil, err
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	var ids []uint32
	if s.cfg.Engine.KVEvents {
		ids = p.tokenIDs()
	}
	return &generation{
		chat:    chat,
		id:      prefix + w.Header().Get("X-Request-Id"),
		model:   model,
		created: time.Now().Unix(),
		prompt:  p,
		req: Request{
			PromptTokens: p.tokens, MaxTokens: n, Lora: lora,
			Prefix:   prefixHashes(p.text, s.cfg.Engine.BlockTokens),
			TokenIDs: ids,
		},
		reason:       reason,
		seed:         in.seed,
		from:         in.from,
		stream:       stream,
		includeUsage: stream && opts != nil && opts.IncludeUsage,
	}, nil
}

// prioritize gives g the request's priority field, refused unless the
// engine schedules by priority, with vLLM's words.
func (s *Server) prioritize(g *generation, priority int64) error {
	if priority != 0 && s.cfg.Engine.Scheduling != SchedulingPriority {
		return errorf(http.StatusBadRequest, "Got priority %d but Priority scheduling is not enabled.", priority)
	}
	g.req.Priority = priority
	s.tracesMu.Lock()
	if len(s.priorities) == maxTraces {
		s.priorities = append(s.priorities[:0], s.priorities[1:]...)
	}
	s.priorities = append(s.priorities, priority)
	s.tracesMu.Unlock()
	return nil
}

// Priorities returns the priority fields of the last completions the
// server accepted, oldest first, for a test to read what the engine was
// given.
func (s *Server) Priorities() []int64 {
	s.tracesMu.Lock()
	defer s.tracesMu.Unlock()
	return append([]int64(nil), s.priorities...)
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	model, _, err := s.resolve(req.Model)
	if err != nil {
		writeError(w, err)
		return
	}
	inputs, err := embeddingInputs(req.Input)
	if err != nil {
		writeError(w, errorf(http.StatusBadRequest, "%v", err))
		return
	}
	out := embeddingList{ID: "embd-" + w.Header().Get("X-Request-Id"), Object: "list", Created: time.Now().Unix(), Model: model}
	for i, in := range inputs {
		if in.tokens > s.cfg.MaxModelLen {
			writeError(w, errorf(http.StatusBadRequest, "This model's maximum context length is %d tokens. However, input[%d] has %d tokens.",
				s.cfg.MaxModelLen, i, in.tokens))
			return
		}
		out.Data = append(out.Data, embedding{Index: i, Object: "embedding", Embedding: embed(in.text)})
		out.Usage.PromptTokens += in.tokens
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	base := s.cfg.Engine.Model
	created := time.Now().Unix()
	list := modelList{Object: "list", Data: []modelCard{{
		ID: base, Object: "model", Created: created, OwnedBy: "vllm", Root: base, MaxModelLen: s.cfg.MaxModelLen,
	}}}
	s.adaptersMu.RLock()
	for _, name := range s.adapterNamesLocked() {
		list.Data = append(list.Data, modelCard{
			ID: name, Object: "model", Created: created, OwnedBy: "vllm", Root: s.adapters[name],
			Parent: &base, MaxModelLen: s.cfg.MaxModelLen,
		})
	}
	s.adaptersMu.RUnlock()
	writeJSON(w, http.StatusOK, list)
}

type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

// handleLoadLora is vLLM's runtime adapter loading: the adapter becomes
// servable; its slot is taken when a request first uses it.
func (s *Server) handleLoadLora(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Name == "" || req.Path == "" {
		writeError(w, errorf(http.StatusBadRequest, "Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	if s.cfg.Engine.MaxLoras == 0 {
		writeError(w, errorf(http.StatusBadRequest, "LoRA is not enabled."))
		return
	}
	s.adaptersMu.Lock()
	_, exists := s.adapters[req.Name]
	if !exists {
		s.adapters[req.Name] = req.Path
	}
	s.adaptersMu.Unlock()
	if exists {
		writeError(w, errorf(http.StatusBadRequest, "The lora adapter '%s' has already been loaded.", req.Name))
		return
	}
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

func (s *Server) handleUnloadLora(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	s.adaptersMu.Lock()
	_, exists := s.adapters[req.Name]
	delete(s.adapters, req.Name)
	s.adaptersMu.Unlock()
	if !exists {
		writeError(w, errorf(http.StatusNotFound, "The lora adapter '%s' cannot be found.", req.Name))
		return
	}
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}
