package batch

import (
	"bufio"
	"errors"
	"io"
	"strconv"
)

// lineReader splits a stored file into lines of at most MaxLineBytes; the
// file passed the Checker, so a longer line means it was not stored by us.
type lineReader struct{ br *bufio.Reader }

func newLineReader(r io.Reader) *lineReader { return &lineReader{br: bufio.NewReaderSize(r, 64<<10)} }

func (l *lineReader) next() ([]byte, error) {
	var line []byte
	for {
		frag, err := l.br.ReadSlice('\n')
		if len(line) == 0 && err == nil {
			return frag[:len(frag)-1], nil
		}
		line = append(line, frag...)
		if len(line) > MaxLineBytes+1 {
			return nil, errors.New("a line is longer than " + strconv.Itoa(MaxLineBytes) + " bytes")
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			if len(line) == 0 {
				return nil, io.EOF
			}
			return line, nil
		default:
			return nil, err
		}
	}
}
