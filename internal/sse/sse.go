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
// and [Lines] read them: a line is returned as soon as its end arrives. It
// holds at most its limit of one line.
type Reader struct {
	br      *bufio.Reader
	afterCR bool // the last line ended with a CR: an LF next is its CRLF
}

// NewReader reads r with lines kept up to maxLine bytes (at least 16).
func NewReader(r io.Reader, maxLine int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, max(maxLine, 16))}
}

// Next returns the next field line. Its Value is valid until the next call.
// At the end of the stream it returns io.EOF (a last line without a line
// end is returned first).
func (r *Reader) Next() (Line, error) {
	for {
		raw, cut, err := r.line()
		if err != nil {
			return Line{}, err
		}
		if len(raw) > 0 && raw[0] != ':' {
			return parse(raw, cut), nil
		}
	}
}

// line returns the next line without its end. A line longer than the
// limit is returned cut (its beginning) and the rest of it skipped.
func (r *Reader) line() (raw []byte, cut bool, err error) {
	if r.afterCR {
		r.afterCR = false
		if b, err := r.br.Peek(1); err == nil && b[0] == '\n' {
			_, _ = r.br.Discard(1)
		}
	}
	scanned := 0
	for {
		buf, _ := r.br.Peek(r.br.Buffered())
		if i := bytes.IndexAny(buf[scanned:], "\r\n"); i >= 0 {
			i += scanned
			r.afterCR = buf[i] == '\r'
			_, _ = r.br.Discard(i + 1) // moves no bytes: buf stays valid
			return buf[:i], false, nil
		}
		scanned = len(buf)
		if len(buf) == r.br.Size() {
			raw = bytes.Clone(buf)
			_, _ = r.br.Discard(len(buf))
			r.skipLine() // an error is met again by the next call
			return raw, true, nil
		}
		if _, err := r.br.Peek(len(buf) + 1); err != nil {
			buf, _ = r.br.Peek(r.br.Buffered())
			if len(buf) == 0 || !errors.Is(err, io.EOF) {
				return nil, false, err
			}
			_, _ = r.br.Discard(len(buf))
			return buf, false, nil // the last line, with no end
		}
	}
}

// skipLine drops bytes up to and including the next line end.
func (r *Reader) skipLine() {
	for {
		buf, err := r.br.Peek(max(r.br.Buffered(), 1))
		if i := bytes.IndexAny(buf, "\r\n"); i >= 0 {
			r.afterCR = buf[i] == '\r'
			_, _ = r.br.Discard(i + 1)
			return
		}
		_, _ = r.br.Discard(len(buf))
		if err != nil {
			return
		}
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
