package proxy

import (
	"bufio"
	"bytes"
	"io"
	"mime"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
)

// isEventStream reports whether an answer of Content-Type ct is a
// Server-Sent Events stream.
func isEventStream(ct string) bool {
	if ct == "" {
		return false
	}
	if strings.IndexByte(ct, ';') < 0 {
		// No parameters (what MCP servers send): mime.ParseMediaType would
		// allocate a map on every response to say the same.
		return strings.EqualFold(textproto.TrimString(ct), "text/event-stream")
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// Event ids are tagged with the session's re-initialization generation once
// a session has moved, so that a Last-Event-ID only ever reaches the backend
// that issued it: a resumption id from the lost pod means nothing to the new
// one (go-sdk answers 400 to an id it cannot parse, which ends the client's
// session). Generation 0 ids pass through untouched.
const eventIDTagPrefix = "tether."

func tagEventID(gen uint32, id []byte) []byte {
	out := make([]byte, 0, len(eventIDTagPrefix)+12+len(id))
	out = append(out, eventIDTagPrefix...)
	out = strconv.AppendUint(out, uint64(gen), 10)
	out = append(out, '.')
	return append(out, id...)
}

// backendEventID translates a client's Last-Event-ID for a session at
// generation gen. ok is false when the id must not be forwarded (absent, or
// issued by a backend the session no longer lives on).
func backendEventID(clientID string, gen uint32) (id string, ok bool) {
	if clientID == "" {
		return "", false
	}
	rest, tagged := strings.CutPrefix(clientID, eventIDTagPrefix)
	if !tagged {
		if gen != 0 {
			return "", false
		}
		return clientID, true
	}
	genStr, orig, found := strings.Cut(rest, ".")
	if !found {
		return "", false
	}
	g, err := strconv.ParseUint(genStr, 10, 32)
	if err != nil || uint32(g) != gen {
		return "", false
	}
	return orig, true
}

// eventIDTagger rewrites the "id:" fields of an SSE stream with tagEventID.
// It relays complete lines only as they arrive, so events still flow one by
// one.
type eventIDTagger struct {
	src       io.ReadCloser
	br        *bufio.Reader
	gen       uint32
	pending   []byte
	lineStart bool // the next byte read starts a line
	err       error
}

func newEventIDTagger(body io.ReadCloser, gen uint32) io.ReadCloser {
	return &eventIDTagger{src: body, gen: gen, lineStart: true}
}

// taggerReaders are the taggers' readers, taken at a read and given back
// while the stream is parked.
var taggerReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// Park is the backend body's Park (park.go), when nothing is buffered
// here either: the reader and what pending grew to go back too.
func (t *eventIDTagger) Park() (net.Conn, bool) {
	if len(t.pending) > 0 || t.err != nil || t.br != nil && t.br.Buffered() > 0 {
		return nil, false
	}
	pb, ok := t.src.(parkableBody)
	if !ok {
		return nil, false
	}
	conn, ok := pb.Park()
	if !ok {
		return nil, false
	}
	if t.br != nil {
		t.br.Reset(nil)
		taggerReaders.Put(t.br)
		t.br = nil
	}
	t.pending = nil
	return conn, true
}

func (t *eventIDTagger) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		t.fill()
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// fill reads one line (blocking), then any further complete lines already
// buffered, into pending.
func (t *eventIDTagger) fill() {
	if t.br == nil {
		t.br = taggerReaders.Get().(*bufio.Reader)
		t.br.Reset(t.src)
	}
	t.pending = t.pending[:0]
	for {
		line, err := t.br.ReadSlice('\n')
		if len(line) > 0 {
			if t.lineStart && bytes.HasPrefix(line, []byte("id:")) && err == nil {
				value := bytes.TrimPrefix(line[3:], []byte(" "))
				value = bytes.TrimRight(value, "\r\n")
				t.pending = append(t.pending, "id: "...)
				t.pending = append(t.pending, tagEventID(t.gen, value)...)
				t.pending = append(t.pending, '\n')
			} else {
				t.pending = append(t.pending, line...)
			}
			// A line longer than the buffer arrives in pieces; only the
			// first piece starts a line.
			t.lineStart = err == nil
		}
		if err != nil && err != bufio.ErrBufferFull {
			t.err = err
			return
		}
		if t.br.Buffered() == 0 || bytes.IndexByte(peekAll(t.br), '\n') < 0 || len(t.pending) >= 16<<10 {
			return
		}
	}
}

func peekAll(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return b
}

func (t *eventIDTagger) Close() error { return t.src.Close() }
