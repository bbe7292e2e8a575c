package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/switchyard-llm/switchyard/internal/sse"
)

// Error kinds that are not an HTTP status.
const (
	errTimeout    = "timeout"
	errTransport  = "transport"
	errCanceled   = "canceled"
	errIncomplete = "incomplete stream" // ended without its API's last event (data: [DONE] on chat)
	errEvent      = "stream error event"
	errEmpty      = "empty body"
)

// result is one request's measurements; times are absolute.
type result struct {
	sched, sent, head, first, end time.Time
	gaps                          []time.Duration // between successive data lines
	chunks                        int             // data lines before the stream's end
	replica, reason               string          // X-Switchyard-Replica and -Reason
	errKind                       string          // "" when the request succeeded
	errDetail                     string          // what the failure said, shortened
	code                          string          // an HTTP error's OpenAI error code ("" when none)
	refused                       bool            // answered with an HTTP error status
	noRetryAfter                  bool            // a 429 or 503 without Retry-After
	// usage is the stream's usage chunk, read when wantUsage is set.
	wantUsage bool
	usage     streamUsage
}

// streamUsage is what a stream's usage chunk (stream_options.include_usage)
// says; seen is false when the stream had none.
type streamUsage struct {
	seen                       bool
	prompt, cached, completion int
	cachedSeen                 bool // prompt_tokens_details.cached_tokens was there
}

var usageKey = []byte(`"usage"`)

// readUsage reads a data line that holds a usage object; it reports
// whether the line is a usage-only chunk (no choices), which is not a
// token.
func readUsage(data []byte, u *streamUsage) (usageOnly bool) {
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
			Details    *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil || c.Usage == nil {
		return false
	}
	u.seen, u.prompt, u.completion = true, max(c.Usage.Prompt, 0), max(c.Usage.Completion, 0)
	if d := c.Usage.Details; d != nil && d.Cached != nil {
		u.cached, u.cachedSeen = min(max(*d.Cached, 0), u.prompt), true
	}
	return len(c.Choices) == 0
}

// maxDetail bounds the error text kept per request.
const maxDetail = 300

func shorten(s string) string {
	if len(s) > maxDetail {
		return s[:maxDetail] + "…"
	}
	return s
}

var (
	errorData   = []byte(`{"error"`)
	contentType = []string{"application/json"}
)

// do sends one request and reads its answer to the end.
func (g *generator) do(ctx context.Context, target int, sched time.Time, out outgoing) result {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	r := result{sched: sched, wantUsage: out.usage}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.cfg.Targets[target], bytes.NewReader(out.body))
	if err != nil {
		r.errKind, r.end = errTransport, time.Now()
		return r
	}
	req.Header = out.header
	r.sent = time.Now()
	resp, err := g.client.Do(req)
	if err != nil {
		r.errKind, r.errDetail, r.end = classify(ctx, err), shorten(err.Error()), time.Now()
		return r
	}
	defer resp.Body.Close()
	r.head = time.Now()
	r.replica, r.reason = resp.Header.Get("X-Switchyard-Replica"), resp.Header.Get("X-Switchyard-Reason")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		r.errKind, r.errDetail, r.end = strconv.Itoa(resp.StatusCode), shorten(string(bytes.TrimSpace(b))), time.Now()
		r.code, r.refused = errorCode(b), true
		r.noRetryAfter = (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) &&
			resp.Header.Get("Retry-After") == ""
		return r
	}
	if out.stream {
		err = readStream(resp.Body, &r)
	} else {
		var n int64
		n, err = io.Copy(io.Discard, resp.Body)
		if err == nil && n == 0 {
			r.errKind = errEmpty
		}
	}
	r.end = time.Now()
	if err != nil {
		r.errKind, r.errDetail = classify(ctx, err), shorten(err.Error())
	}
	return r
}

// readStream reads server-sent events, timing each data line as it is read.
// Two lines that arrive in one read have a gap of about zero: that is what
// a client sees. A data line longer than the reader's limit is timed once,
// as its first part arrives.
func readStream(body io.Reader, r *result) error {
	sr := sse.NewReader(body, 16<<10)
	var last time.Time
	var event string // the event: line of the data line that follows, if any
	for {
		line, err := sr.Next()
		if errors.Is(err, io.EOF) {
			if r.errKind == "" {
				r.errKind = errIncomplete
			}
			return nil
		}
		if err != nil {
			return err
		}
		if line.Field == "event" {
			event = string(line.Value)
		}
		if line.Field != "data" {
			continue
		}
		now := time.Now()
		if r.wantUsage {
			// A trace's gaps are between tokens: neither the usage chunk
			// nor the end is one.
			if bytes.Contains(line.Value, usageKey) && readUsage(line.Value, &r.usage) {
				event = ""
				continue
			}
			if line.Done() {
				_, _ = io.Copy(io.Discard, body)
				return nil
			}
		}
		if last.IsZero() {
			r.first = now
		} else {
			r.gaps = append(r.gaps, now.Sub(last))
		}
		last = now
		end, failed := streamEnd(line, event)
		event = ""
		if failed && r.errKind == "" {
			r.errKind, r.errDetail = errEvent, shorten("data: "+string(line.Value))
		}
		if end {
			_, _ = io.Copy(io.Discard, body)
			return nil
		}
		if !failed {
			r.chunks++
		}
	}
}

// streamEnd tells whether a data line (after its event: line, if any) ends
// the stream, and whether it is a failure, in each API's own form: chat and
// completions end with data: [DONE] and fail with a data line holding an
// error object (as vLLM and Switchyard send it); the Responses API ends
// with response.completed and fails with error, response.failed or
// response.incomplete; the Messages API ends with message_stop and fails
// with error.
func streamEnd(line sse.Line, event string) (end, failed bool) {
	switch event {
	case "response.completed", "message_stop":
		return true, false
	case "response.failed", "response.incomplete":
		return true, true
	case "error":
		return false, true
	}
	if line.Done() {
		return true, false
	}
	return false, bytes.HasPrefix(bytes.TrimSpace(line.Value), errorData)
}

func classify(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return errTimeout
	case ctx.Err() != nil:
		return errCanceled
	default:
		return errTransport
	}
}

// errorCode is the code of an error body in the OpenAI shape
// ({"error": {"code": …}}), "" when it has none.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	switch c := e.Error.Code.(type) {
	case string:
		return shorten(c)
	case float64:
		return strconv.FormatFloat(c, 'f', -1, 64)
	}
	return ""
}
