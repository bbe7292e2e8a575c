// Package sse reads text/event-stream responses, and recognises the media
// type. A client pulls field lines from a [Reader] (the load generator, the
// benchmarks, the tests); a relay or an observer pushes the bytes it passes
// on into [Events], which hands back whole events, and reads an event's
// data with [Data] (the gateway, the replica adapter). Both cut lines and
// fields the same way, so a long line, a CR, a CRLF, a comment, a data
// field split over lines or written without its space is read alike
// everywhere.
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
// comments (": keepalive"). Lines end with LF, CR or CRLF, as [Events]
// and [Lines] read them. It holds at most its limit of one line.
type Reader struct {
	br   *bufio.Reader
	rest []byte // what the last read holds beyond the lines returned
	cut  bool   // rest ends in a line longer than the limit
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
		for len(r.rest) > 0 {
			var raw []byte
			raw, r.rest = cutLine(r.rest)
			if len(raw) > 0 && raw[0] != ':' {
				return parse(raw, r.cut && len(r.rest) == 0), nil
			}
		}
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
		if len(raw) == 0 {
			return Line{}, err
		}
		r.rest, r.cut = raw, cut
	}
}

func parse(raw []byte, cut bool) Line {
	field, value, found := bytes.Cut(raw, []byte(":"))
	if !found {
		return Line{Field: fieldName(field), Cut: cut}
	}
	value, _ = bytes.CutPrefix(value, []byte(" "))
	return Line{Field: fieldName(field), Value: value, Cut: cut}
}

// fieldName is the field as a string, without an allocation for the
// fields the format defines (one per chunk on a relay's path).
func fieldName(b []byte) string {
	switch string(b) {
	case "data":
		return "data"
	case "event":
		return "event"
	case "id":
		return "id"
	case "retry":
		return "retry"
	}
	return string(b)
}
