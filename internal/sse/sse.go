// Package sse reads text/event-stream responses as a client does, one field
// line at a time, and recognises the media type. The parts that read a
// stream they did not write (the load generator, the tests) share it, so a
// long line, a CRLF or a comment is handled the same way everywhere.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"mime"
)

// ContentType is the media type of a server-sent event stream.
const ContentType = "text/event-stream"

// IsEventStream says whether a Content-Type header names an event stream,
// whatever its parameters and case ("text/event-stream; charset=utf-8").
func IsEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == ContentType
}

// Line is one field line of a stream: "data: {...}" is Field "data" and
// Value `{...}` (one leading space dropped, as the format says).
type Line struct {
	Field string
	Value []byte
	// Cut is set when the line was longer than the reader's limit: Value
	// is its beginning and the rest was skipped.
	Cut bool
}

// Done says whether the line is the OpenAI end of stream, data: [DONE].
func (l Line) Done() bool { return l.Field == "data" && string(l.Value) == "[DONE]" }

// Reader reads field lines, skipping blank lines (event boundaries) and
// comments (": keepalive"). It holds at most its limit of one line.
type Reader struct {
	br *bufio.Reader
}

// NewReader reads r with lines kept up to maxLine bytes (at least 16).
func NewReader(r io.Reader, maxLine int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, max(maxLine, 16))}
}

// Next returns the next field line. Its Value is valid until the next call.
// At the end of the stream it returns io.EOF (a last line without a newline
// is returned first).
func (r *Reader) Next() (Line, error) {
	for {
		raw, err := r.br.ReadSlice('\n')
		cut := false
		if errors.Is(err, bufio.ErrBufferFull) {
			cut = true
			raw = bytes.Clone(raw)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.br.ReadSlice('\n')
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return Line{}, err
		}
		raw = bytes.TrimRight(raw, "\r\n")
		if len(raw) > 0 && raw[0] != ':' {
			return parse(raw, cut), nil
		}
		if err != nil {
			return Line{}, err
		}
	}
}

func parse(raw []byte, cut bool) Line {
	field, value, found := bytes.Cut(raw, []byte(":"))
	if !found {
		return Line{Field: string(field), Cut: cut}
	}
	value, _ = bytes.CutPrefix(value, []byte(" "))
	return Line{Field: string(field), Value: value, Cut: cut}
}
