package lab

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Trace formats (TraceReader).
const (
	// FormatMooncake is Mooncake's FAST '25 traces (kvcache-ai/Mooncake,
	// FAST25-release/traces/): JSON lines of timestamp (ms from the
	// trace's start), input_length and output_length (tokens), and hash_ids,
	// one id per block of the trace's block size (512 tokens), the last
	// block partial; equal ids at a position mean equal prefixes up to it.
	FormatMooncake = "mooncake"
	// FormatAzure is Azure's public LLM inference traces
	// (Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_*.csv): a
	// header TIMESTAMP,ContextTokens,GeneratedTokens, then one request a
	// line, its timestamp a date and time with fractional seconds. No
	// prefix information: every block is unique.
	FormatAzure = "azure"
)

// TraceFormats are the formats TraceReader reads.
func TraceFormats() []string { return []string{FormatMooncake, FormatAzure} }

// TraceRecord is one request of a trace.
type TraceRecord struct {
	At     time.Duration // from the trace's first request
	Input  int           // prompt tokens
	Output int           // answer tokens
	Hashes []uint64      // prefix block ids (Mooncake), nil when none
	Line   int           // the line it was read from
}

// TraceReader streams a trace one request at a time: it never holds more
// than a line. A line it cannot read stops it with an error naming the file
// and the line ("trace.jsonl: line 3: input_length is not a number").
type TraceReader struct {
	name        string
	format      string
	blockTokens int
	r           *bufio.Reader
	line        int
	n           int // requests read
	last        time.Duration
	// Azure: the first request's time, the origin.
	origin time.Time
	buf    []byte
	raw    map[string]json.RawMessage
}

// maxTraceLine bounds one line (a Mooncake request of 2 M tokens has 4096
// hash ids, about 40 KB).
const maxTraceLine = 16 << 20

// NewTraceReader reads the trace named name (for errors) from r, in format
// (FormatMooncake when ""), with blockTokens tokens per hash id.
func NewTraceReader(name string, r io.Reader, format string, blockTokens int) (*TraceReader, error) {
	switch format {
	case "":
		format = FormatMooncake
	case FormatMooncake, FormatAzure:
	default:
		return nil, fmt.Errorf("unknown trace format %q (want one of %v)", format, TraceFormats())
	}
	if blockTokens <= 0 {
		return nil, fmt.Errorf("block tokens must be positive, got %d", blockTokens)
	}
	return &TraceReader{name: name, format: format, blockTokens: blockTokens, r: bufio.NewReaderSize(r, 64<<10)}, nil
}

// errf is an error at the current line.
func (t *TraceReader) errf(format string, args ...any) error {
	return fmt.Errorf("%s: line %d: %s", t.name, t.line, fmt.Sprintf(format, args...))
}

// readLine returns the next line without its end, false at the end of the
// input.
func (t *TraceReader) readLine() ([]byte, bool, error) {
	t.buf = t.buf[:0]
	for {
		chunk, err := t.r.ReadSlice('\n')
		t.buf = append(t.buf, chunk...)
		if len(t.buf) > maxTraceLine {
			t.line++
			return nil, false, t.errf("longer than %d bytes", maxTraceLine)
		}
		switch {
		case err == nil:
			t.line++
			return bytes.TrimRight(t.buf, "\r\n"), true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(t.buf) == 0 {
				return nil, false, nil
			}
			t.line++
			return bytes.TrimRight(t.buf, "\r\n"), true, nil
		default:
			return nil, false, fmt.Errorf("%s: %w", t.name, err)
		}
	}
}

// Next reads the next request into rec (its Hashes reused). It returns
// false at the end of the trace; an empty trace is an error.
func (t *TraceReader) Next(rec *TraceRecord) (bool, error) {
	for {
		line, ok, err := t.readLine()
		if err != nil {
			return false, err
		}
		if !ok {
			if t.n == 0 {
				return false, fmt.Errorf("%s: no requests", t.name)
			}
			return false, nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue // blank lines (a trailing one) carry nothing
		}
		if t.format == FormatAzure && t.line == 1 {
			if err := t.azureHeader(line); err != nil {
				return false, err
			}
			continue
		}
		rec.Line = t.line
		if t.format == FormatAzure {
			err = t.azure(line, rec)
		} else {
			err = t.mooncake(line, rec)
		}
		if err != nil {
			return false, err
		}
		if t.n > 0 && rec.At < t.last {
			return false, t.errf("timestamp %s is before the previous request's %s: timestamps go backwards",
				fmtMs(rec.At), fmtMs(t.last))
		}
		t.last = rec.At
		t.n++
		return true, nil
	}
}

func fmtMs(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64) + " ms"
}

// mooncake reads one JSON line.
func (t *TraceReader) mooncake(line []byte, rec *TraceRecord) error {
	clear(t.raw)
	if t.raw == nil {
		t.raw = map[string]json.RawMessage{}
	}
	if err := json.Unmarshal(line, &t.raw); err != nil {
		return t.errf("not a JSON object: %v", err)
	}
	ts, err := t.number("timestamp", false)
	if err != nil {
		return err
	}
	in, err := t.number("input_length", true)
	if err != nil {
		return err
	}
	out, err := t.number("output_length", true)
	if err != nil {
		return err
	}
	rec.At = time.Duration(ts * float64(time.Millisecond))
	rec.Input, rec.Output = int(in), int(out)
	rec.Hashes = rec.Hashes[:0]
	raw, ok := t.raw["hash_ids"]
	if !ok {
		return t.errf("hash_ids is missing")
	}
	var ids []json.Number
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&ids); err != nil {
		return t.errf("hash_ids is not a list of numbers")
	}
	for k, s := range ids {
		v, err := strconv.ParseUint(s.String(), 10, 64)
		if err != nil {
			return t.errf("hash_ids[%d] is not a whole number ≥ 0: %s", k, s)
		}
		rec.Hashes = append(rec.Hashes, v)
	}
	if allowed := (rec.Input + t.blockTokens - 1) / t.blockTokens; len(rec.Hashes) > allowed {
		return t.errf("%d hash_ids, more than input_length %d allows at %d tokens a block (%d)",
			len(rec.Hashes), rec.Input, t.blockTokens, allowed)
	}
	return nil
}

// number reads a numeric field: present, a number, not negative, and a
// whole number when whole.
func (t *TraceReader) number(field string, whole bool) (float64, error) {
	raw, ok := t.raw[field]
	if !ok || string(raw) == "null" {
		return 0, t.errf("%s is missing", field)
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, t.errf("%s is not a number", field)
	}
	switch {
	case v < 0:
		return 0, t.errf("%s is negative: %s", field, raw)
	case whole && v != math.Trunc(v):
		return 0, t.errf("%s is not a whole number: %s", field, raw)
	case whole && v > math.MaxInt32:
		return 0, t.errf("%s is too large: %s", field, raw)
	}
	return v, nil
}

// azureColumns is the header of Azure's LLM inference traces.
var azureColumns = [...]string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

func (t *TraceReader) azureHeader(line []byte) error {
	cols := strings.Split(strings.TrimPrefix(string(line), "\ufeff"), ",")
	if len(cols) != len(azureColumns) {
		return t.errf("the header is %q, want %s", line, strings.Join(azureColumns[:], ","))
	}
	for i, c := range cols {
		if strings.TrimSpace(c) != azureColumns[i] {
			return t.errf("the header is %q, want %s", line, strings.Join(azureColumns[:], ","))
		}
	}
	return nil
}

// azureTime is the layout of Azure's timestamps ("2023-11-16
// 18:15:46.6805900"), fractional seconds optional.
const azureTime = "2006-01-02 15:04:05.999999999"

// azure reads one CSV line.
func (t *TraceReader) azure(line []byte, rec *TraceRecord) error {
	cols := strings.Split(string(line), ",")
	if len(cols) != len(azureColumns) {
		return t.errf("%d fields, want %d (%s)", len(cols), len(azureColumns), strings.Join(azureColumns[:], ","))
	}
	at, err := time.Parse(azureTime, strings.TrimSpace(cols[0]))
	if err != nil {
		return t.errf("TIMESTAMP is not a date and time like 2023-11-16 18:15:46.6805900: %q", cols[0])
	}
	if t.n == 0 {
		t.origin = at
	}
	rec.At = at.Sub(t.origin)
	for k, dst := range []*int{&rec.Input, &rec.Output} {
		name, s := azureColumns[k+1], strings.TrimSpace(cols[k+1])
		if s == "" {
			return t.errf("%s is missing", name)
		}
		v, err := strconv.ParseInt(s, 10, 32)
		switch {
		case err != nil:
			return t.errf("%s is not a number: %q", name, s)
		case v < 0:
			return t.errf("%s is negative: %s", name, s)
		}
		*dst = int(v)
	}
	rec.Hashes = rec.Hashes[:0]
	return nil
}
