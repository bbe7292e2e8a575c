// Package batch is OpenAI's Files and Batch APIs on JetStream. Files live in
// an object store (llm-files), owned by the tenant that uploaded them; a
// batch is a record in a KV bucket (llm-batches) that any gateway answers
// for; its lines become items of a work-queue stream (LLM_BATCH_ITEMS) that
// the batchers take, send through the brokers on llm.batch.<tenant> with
// batch priority, and answer into a results bucket (llm-batch-results), one
// key per line, before acknowledging the item. A batch is finalized from
// that bucket, so a line is answered at most once whatever part dies
// (docs/protocol.md, "Batches").
package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nuid"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Limits of an upload (--max-file-bytes, --max-file-lines); --max-body does
// not apply to /v1/files.
const (
	DefaultMaxFileBytes = 200 << 20
	DefaultMaxFileLines = 50_000
	// MaxLineBytes bounds one line: an item must fit in one NATS message.
	MaxLineBytes = 960 << 10
	// MaxCustomID bounds a custom_id (OpenAI allows 64 characters).
	MaxCustomID = 64
)

// Purposes of a file.
const (
	PurposeBatch       = "batch"
	PurposeBatchOutput = "batch_output"
)

// CompletionWindow is the one window OpenAI accepts.
const CompletionWindow = "24h"

// Statuses of a batch, OpenAI's state machine: validating → in_progress →
// finalizing → completed; failed from validating; expired past the window;
// cancelling → cancelled.
const (
	StatusValidating = "validating"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusFailed     = "failed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// Statuses lists every status, for metrics and listings.
func Statuses() []string {
	return []string{StatusValidating, StatusInProgress, StatusFinalizing, StatusCompleted, StatusFailed,
		StatusExpired, StatusCancelling, StatusCancelled}
}

// Done reports whether status is final.
func Done(status string) bool {
	switch status {
	case StatusCompleted, StatusFailed, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// Endpoints a batch may name.
func Endpoints() []string {
	return []string{subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings, subjects.EndpointResponses}
}

func validEndpoint(e string) bool {
	for _, x := range Endpoints() {
		if x == e {
			return true
		}
	}
	return false
}

// File is OpenAI's file object.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Status    string `json:"status"`
}

// RequestCounts are a batch's lines: all, answered, failed.
type RequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// LineError is one entry of a batch's errors: why it failed validation.
type LineError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// Errors is OpenAI's list of a failed batch's errors.
type Errors struct {
	Object string      `json:"object"`
	Data   []LineError `json:"data"`
}

// Batch is OpenAI's batch object.
type Batch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *Errors           `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
}

// Record is a batch as the KV bucket keeps it: the batch and what only
// Switchyard sees. Tenant is written by the gateway that authenticated the
// creator; the batchers route every line for it.
type Record struct {
	Batch
	Tenant string `json:"tenant"`
	// KeyHash is the sha256 hex of the API key that created the batch (""
	// when anonymous): its lines are charged to that key's budget as well
	// as the tenant's (Llm-Key), as the key's own requests are.
	KeyHash string `json:"key_hash,omitempty"`
	// Lines is the input file's line count (blank lines included), so that
	// finalizing knows every line number.
	Lines int `json:"lines"`
	// Owner and OwnedUnixMs are the batcher working on a transition that
	// takes time (expanding the file, finalizing) and since when: another
	// waits until the claim is stale.
	Owner       string `json:"owner,omitempty"`
	OwnedUnixMs int64  `json:"owned_unix_ms,omitempty"`
	// Ending is the status a finalizing batch ends in: completed, expired
	// or cancelled.
	Ending string `json:"ending,omitempty"`
}

// Key is the record's key: <tenant>.<batch id>, so a tenant's listing is one
// filtered walk and another tenant's id is simply not found.
func (r *Record) Key() string { return recordKey(r.Tenant, r.ID) }

func recordKey(tenant, id string) string { return tenant + "." + id }

// ErrNotFound is an unknown file or batch, or another tenant's.
var ErrNotFound = errors.New("not found")

// newID makes an id that sorts by creation time (newest last): prefix, 12
// hex digits of unix milliseconds, and a random tail.
func newID(prefix string, now time.Time) string {
	return fmt.Sprintf("%s%012x%s", prefix, now.UnixMilli(), nuid.Next()[12:])
}

// NewFileID and NewBatchID make the ids of a new file and batch.
func NewFileID(now time.Time) string  { return newID("file-", now) }
func NewBatchID(now time.Time) string { return newID("batch_", now) }

// ValidID reports whether id can be one of ours with prefix: it becomes a
// KV key and a subject token.
func ValidID(prefix, id string) bool {
	if len(id) <= len(prefix) || len(id) > 64 || id[:len(prefix)] != prefix {
		return false
	}
	return subjects.ValidToken(id) == nil
}

func unixPtr(t time.Time) *int64 { u := t.Unix(); return &u }

// resultKey is a line's key in the results bucket: <batch>.<line>.
func resultKey(batch string, line int) string { return batch + "." + strconv.Itoa(line) }

// Result kinds, the first byte of a stored result: the line goes to the
// output file or to the error file.
const (
	kindOutput = 'o'
	kindError  = 'e'
)

// OutputLine is one line of an output or error file, OpenAI's format.
type OutputLine struct {
	ID       string          `json:"id"`
	CustomID string          `json:"custom_id"`
	Response *LineResponse   `json:"response"`
	Error    *OutputLineFail `json:"error"`
}

// LineResponse is the answer a line got.
type LineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// OutputLineFail is why a line got no answer.
type OutputLineFail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Item is one line in the work-queue stream. It carries no tenant: the
// batcher takes that from the batch record.
type Item struct {
	Line     int             `json:"line"`
	CustomID string          `json:"custom_id"`
	Body     json.RawMessage `json:"body"`
}
