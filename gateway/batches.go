package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/subjects"
)

// batchCreate is the body of POST /v1/batches.
type batchCreate struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

func (c *batchCreate) check() *subjects.APIError {
	switch {
	case c.InputFileID == "":
		return badParam("input_file_id", "input_file_id is required")
	case !validBatchEndpoint(c.Endpoint):
		return badParam("endpoint", "endpoint must be one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses")
	case c.CompletionWindow != batch.CompletionWindow:
		return badParam("completion_window", `completion_window must be "24h"`)
	case len(c.Metadata) > 16:
		return badParam("metadata", "metadata may hold at most 16 pairs")
	}
	for k, v := range c.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return badParam("metadata", "metadata keys are at most 64 characters and values at most 512")
		}
	}
	return nil
}

func validBatchEndpoint(e string) bool {
	for _, x := range batch.Endpoints() {
		if x == e {
			return true
		}
	}
	return false
}

// serveBatchCreate is POST /v1/batches: the input file is read once here,
// so a line for another endpoint fails the creation with its number, and
// the record is written as validating; a batcher turns its lines into
// items.
func (g *Gateway) serveBatchCreate(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	body, apiErr := g.receiveBody(w, r)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	var c batchCreate
	if err := json.Unmarshal(body, &c); err != nil {
		writeError(w, subjects.NewError(400, subjects.CodeInvalidRequest, "the body is not a batch: "+err.Error()))
		return
	}
	if e := c.check(); e != nil {
		writeError(w, e)
		return
	}
	lines, requests, apiErr := st.CheckInput(r.Context(), tenant, c.InputFileID, c.Endpoint)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	now := time.Now()
	expires := now.Add(24 * time.Hour).Unix()
	if c.Metadata == nil {
		c.Metadata = map[string]string{}
	}
	rec := &batch.Record{
		Batch: batch.Batch{
			ID: batch.NewBatchID(now), Object: "batch", Endpoint: c.Endpoint, InputFileID: c.InputFileID,
			CompletionWindow: c.CompletionWindow, Status: batch.StatusValidating, CreatedAt: now.Unix(),
			ExpiresAt: &expires, RequestCounts: batch.RequestCounts{Total: requests}, Metadata: c.Metadata,
		},
		Tenant: tenant, Lines: lines,
	}
	if t := g.table.Load(); t != nil {
		// Its lines are charged to the budget of the key that created it.
		if tn, hash, e := g.keyOf(r, t); e == nil && tn == tenant {
			rec.KeyHash = hash
		}
	}
	if err := st.CreateBatch(r.Context(), rec); err != nil {
		writeError(w, unavailable(err))
		return
	}
	writeJSON(w, http.StatusOK, &rec.Batch)
}

func (g *Gateway) serveBatch(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	rec, err := st.Batch(r.Context(), tenant, id)
	switch {
	case errors.Is(err, batch.ErrNotFound):
		writeError(w, batch.BatchNotFound(id))
	case err != nil:
		writeError(w, unavailable(err))
	default:
		writeJSON(w, http.StatusOK, &rec.Batch)
	}
}

func (g *Gateway) serveBatchCancel(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	rec, apiErr := st.Cancel(r.Context(), tenant, r.PathValue("id"))
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	writeJSON(w, http.StatusOK, &rec.Batch)
}

// serveBatches is GET /v1/batches: the tenant's batches, newest first,
// limit (1 to 100, default 20) after the id named by after.
func (g *Gateway) serveBatches(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, badParam("limit", "limit must be a whole number from 1 to 100"))
			return
		}
		limit = n
	}
	after := q.Get("after")
	recs, err := st.Batches(r.Context(), tenant)
	if err != nil {
		writeError(w, unavailable(err))
		return
	}
	data := make([]*batch.Batch, 0, limit)
	more := false
	for _, rec := range recs {
		if after != "" && rec.ID >= after {
			continue // newest first: the page starts below after
		}
		if len(data) == limit {
			more = true
			break
		}
		data = append(data, &rec.Batch)
	}
	page := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		page["first_id"], page["last_id"] = data[0].ID, data[len(data)-1].ID
	}
	writeJSON(w, http.StatusOK, page)
}
