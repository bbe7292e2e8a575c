package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/subjects"
)

// batchStore opens the files object store and the batches bucket the first
// time a Files or Batch API call needs them (creating them when absent):
// a gateway that serves no batch traffic never touches them.
type batchStore struct {
	mu    sync.Mutex
	store *batch.Store
}

func (g *Gateway) batches(r *http.Request) (*batch.Store, *subjects.APIError) {
	g.batch.mu.Lock()
	defer g.batch.mu.Unlock()
	if g.batch.store != nil {
		return g.batch.store, nil
	}
	js, err := jetstream.New(g.nc)
	if err == nil {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		g.batch.store, err = batch.OpenStore(ctx, js, g.cfg.BatchReplicas)
	}
	if err != nil {
		e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the batch store is unavailable: "+err.Error())
		e.RetryAfter = time.Second
		return nil, e
	}
	return g.batch.store, nil
}

// tenantFor authenticates a Files or Batch API call and opens the store.
func (g *Gateway) tenantFor(w http.ResponseWriter, r *http.Request) (string, *batch.Store, bool) {
	t := g.snapshot(w)
	if t == nil {
		return "", nil, false
	}
	tenant, apiErr := g.tenantOf(r, t)
	var st *batch.Store
	if apiErr == nil {
		st, apiErr = g.batches(r)
	}
	if apiErr != nil {
		writeError(w, apiErr)
		return "", nil, false
	}
	return tenant, st, true
}

// stallDeadline moves the connection's read deadline before every read of
// an upload: the upload is bounded by its progress, not by its length.
type stallDeadline struct {
	io.ReadCloser
	rc      *http.ResponseController
	every   time.Duration
	set     bool
	stalled bool
}

func (b *stallDeadline) Read(p []byte) (int, error) {
	b.set = b.rc.SetReadDeadline(time.Now().Add(b.every)) == nil
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.stalled = true
	}
	return n, err
}

// clear lifts the deadline once the upload is read, unless it expired:
// then the connection is done (letGo).
func (b *stallDeadline) clear() {
	if b.set && !b.stalled {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

// uploadReadError is the answer to an upload whose body could not be read:
// 408 when it stalled past the deadline, else 400.
func uploadReadError(err error, every time.Duration) *subjects.APIError {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return subjects.NewError(http.StatusRequestTimeout, subjects.CodeRequestTimeout,
			"the upload brought no bytes for "+every.String())
	}
	return subjects.NewError(400, subjects.CodeInvalidRequest, "multipart body: "+err.Error())
}

// serveFileUpload is POST /v1/files: a multipart form with purpose=batch and
// the JSONL file, streamed into the object store while each line is
// checked. A bad line fails the upload with its number, and nothing is kept.
func (g *Gateway) serveFileUpload(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "multipart/form-data" {
		writeError(w, subjects.NewError(400, subjects.CodeInvalidRequest, "the request must be multipart/form-data with the fields purpose and file"))
		return
	}
	// An upload may take long (up to --max-file-bytes), but never stall:
	// each read must bring bytes within --body-timeout, or the upload
	// fails 408 and letGo closes the connection, so a client trickling
	// nothing cannot hold it.
	body := &stallDeadline{ReadCloser: r.Body, rc: http.NewResponseController(w), every: g.cfg.BodyTimeout}
	r.Body = body
	defer body.clear()
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, subjects.NewError(400, subjects.CodeInvalidRequest, "multipart body: "+err.Error()))
		return
	}
	var purpose string
	var file *batch.File
	fail := func(e *subjects.APIError) {
		if file != nil {
			_ = st.DeleteFile(context.WithoutCancel(r.Context()), tenant, file.ID)
		}
		w.Header().Set("Connection", "close")
		writeError(w, e)
	}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(uploadReadError(err, g.cfg.BodyTimeout))
			return
		}
		switch part.FormName() {
		case "purpose":
			b, _ := io.ReadAll(io.LimitReader(part, 65))
			purpose = strings.TrimSpace(string(b))
			if purpose != batch.PurposeBatch {
				fail(badParam("purpose", `purpose must be "batch"`))
				return
			}
		case "file":
			if file != nil {
				fail(badParam("file", "only one file per upload"))
				return
			}
			name := part.FileName()
			if name == "" {
				name = "file.jsonl"
			}
			chk := batch.NewChecker(part, g.cfg.MaxFileBytes, g.cfg.MaxFileLines)
			f, err := st.PutFile(r.Context(), tenant, clip.Text(name, 256), batch.PurposeBatch, chk)
			var ae *subjects.APIError
			if errors.As(chk.Err(), &ae) {
				ae.Param = "file"
				fail(ae)
				return
			}
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					fail(uploadReadError(err, g.cfg.BodyTimeout))
					return
				}
				if r.Context().Err() != nil {
					return // the client went away: nothing was kept
				}
				fail(unavailable(err))
				return
			}
			file = f
		}
		_ = part.Close()
	}
	switch {
	case purpose == "":
		fail(badParam("purpose", `purpose is required ("batch")`))
	case file == nil:
		fail(badParam("file", "file is required"))
	default:
		writeJSON(w, http.StatusOK, file)
	}
}

func (g *Gateway) serveFile(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	switch r.Method {
	case http.MethodDelete:
		err := st.DeleteFile(r.Context(), tenant, id)
		if !writeStoreErr(w, err, id) {
			writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
		}
	default:
		f, err := st.File(r.Context(), tenant, id)
		if !writeStoreErr(w, err, id) {
			writeJSON(w, http.StatusOK, f)
		}
	}
}

func (g *Gateway) serveFileContent(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	rc, f, err := st.OpenFile(r.Context(), tenant, id)
	if writeStoreErr(w, err, id) {
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// The length promised is not met: the client sees a cut body.
		panic(http.ErrAbortHandler)
	}
}

func (g *Gateway) serveFiles(w http.ResponseWriter, r *http.Request) {
	tenant, st, ok := g.tenantFor(w, r)
	if !ok {
		return
	}
	files, err := st.Files(r.Context(), tenant, r.URL.Query().Get("purpose"))
	if err != nil {
		writeError(w, unavailable(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": files, "has_more": false})
}

// writeStoreErr answers err (nil: nothing) as the OpenAI error of a file.
func writeStoreErr(w http.ResponseWriter, err error, id string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, batch.ErrNotFound):
		writeError(w, subjects.NewError(404, subjects.CodeNotFound, "No such File object: "+id))
	default:
		writeError(w, unavailable(err))
	}
	return true
}

func unavailable(err error) *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the batch store is unavailable: "+err.Error())
	e.RetryAfter = time.Second
	return e
}

func badParam(param, msg string) *subjects.APIError {
	e := subjects.NewError(400, subjects.CodeInvalidRequest, msg)
	e.Param = param
	return e
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, subjects.NewError(500, subjects.CodeUpstreamError, err.Error()))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
