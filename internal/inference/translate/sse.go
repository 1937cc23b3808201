// Package translate converts between the Anthropic Messages API and the
// OpenAI Chat Completions API: requests, responses and streamed events,
// both ways, so a client of one can be served by a backend of the other.
// What has no counterpart on the other side is refused with a *FieldError
// naming the field, never silently dropped when it changes the answer.
package translate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// FieldError says which request field cannot be translated and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("cannot translate %s: %s", e.Field, e.Reason)
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Event is one server-sent event: its name, its data lines joined by "\n",
// and its bytes exactly as read, blank line included.
type Event struct {
	Name string
	Data []byte
	Raw  []byte
}

// SSEReader splits a text/event-stream into events.
type SSEReader struct {
	br        *bufio.Reader
	raw, data []byte // reused from event to event
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{br: bufio.NewReaderSize(r, 32<<10)}
}

// Next returns the next event, whose bytes are valid until the next call
// (a relay writes each event before reading the next, so no copy). At a clean end of stream it returns io.EOF;
// a stream cut inside an event returns what was read with
// io.ErrUnexpectedEOF.
func (s *SSEReader) Next() (Event, error) {
	ev := Event{Raw: s.raw[:0], Data: s.data[:0]}
	defer func() { s.raw, s.data = ev.Raw, ev.Data }()
	hasData := false
	for {
		line, err := s.readLine()
		ev.Raw = append(ev.Raw, line...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				if len(bytes.TrimSpace(ev.Raw)) == 0 {
					return Event{}, io.EOF
				}
				parseLine(&ev, line, hasData)
				return ev, io.ErrUnexpectedEOF
			}
			return ev, fmt.Errorf("reading event stream: %w", err)
		}
		trimmed := bytes.TrimRight(line, "\r\n")
		if len(trimmed) == 0 {
			if len(bytes.TrimSpace(ev.Raw)) == 0 {
				// Stray blank lines between events carry nothing.
				ev.Raw = ev.Raw[:0]
				continue
			}
			return ev, nil
		}
		hasData = parseLine(&ev, trimmed, hasData)
	}
}

// readLine returns one line, valid until the next read.
func (s *SSEReader) readLine() ([]byte, error) {
	line, err := s.br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return line, err
	}
	long := append([]byte(nil), line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		line, err = s.br.ReadSlice('\n')
		long = append(long, line...)
	}
	return long, err
}

// Pending reports whether a whole next event has already been read from
// the source, so a relay can write it before flushing both together
// without delaying either.
func (s *SSEReader) Pending() bool {
	b, _ := s.br.Peek(s.br.Buffered())
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\r\n\r\n"))
}

// parseLine applies one line to ev and says whether ev has data now.
func parseLine(ev *Event, line []byte, hasData bool) bool {
	line = bytes.TrimRight(line, "\r\n")
	field, value, _ := bytes.Cut(line, []byte(":"))
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(field) {
	case "event":
		ev.Name = string(value)
	case "data":
		if hasData {
			ev.Data = append(ev.Data, '\n')
		}
		ev.Data = append(ev.Data, value...)
		return true
	}
	return hasData
}

// formatEvent renders an event with a JSON data payload.
func formatEvent(name string, data []byte) []byte {
	var b bytes.Buffer
	if name != "" {
		b.WriteString("event: ")
		b.WriteString(name)
		b.WriteByte('\n')
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}
