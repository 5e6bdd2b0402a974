package h1

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// bufferBeforeCommit is how much of a body is held before the head is
// written (net/http's bufferBeforeChunkingSize): an answer that ends
// within it goes out with a Content-Length, in the same write as its head.
const bufferBeforeCommit = 2048

// writeBufferSize is the connection's write buffer while it answers.
const writeBufferSize = 4 << 10

// out is what a response writes through, pooled: a connection waiting for
// a request holds none.
type out struct {
	bw      *bufio.Writer
	head    []byte // the header lines, rendered when the status was set
	pending []byte // the body before the head is written
}

var outs = sync.Pool{New: func() any {
	return &out{
		bw:      bufio.NewWriterSize(nil, writeBufferSize),
		head:    make([]byte, 0, 512),
		pending: make([]byte, 0, bufferBeforeCommit),
	}
}}

// response is the http.ResponseWriter of the fast path. Its semantics are
// net/http's: the header map is read when the status is set (later changes
// are trailers); a body of unknown length is chunked unless the handler
// returns with it under bufferBeforeCommit, when it gets a Content-Length;
// Flush writes what is held; a Date, and a sniffed Content-Type when there
// is none, are added.
type response struct {
	c      *conn
	req    *http.Request
	body   *requestBody // req's Body, nil without one
	header http.Header
	// fields are adopted fields (AdoptFields), rendered after header's.
	// Header merges them into header: with fields set, header holds only
	// what the handler set before it adopted them.
	fields Fields
	o      *out

	status        int
	wroteHeader   bool
	committed     bool
	chunked       bool
	contentLength int64 // declared by the handler, or -1
	written       int64
	closeAfter    bool
	handlerDone   bool
	hasDate       bool
	hasType       bool
	headerClose   bool   // the handler's header says "Connection: close"
	trailer       string // the Trailer header's names, comma-separated
	err           error  // the first write to the connection that failed
}

func (w *response) reset(c *conn, req *http.Request, body *requestBody, header http.Header) {
	*w = response{c: c, req: req, body: body, header: header, contentLength: -1, closeAfter: req.Close}
}

// release returns the write buffers to the pool.
func (w *response) release() {
	if w.o != nil {
		w.o.bw.Reset(nil)
		outs.Put(w.o)
		w.o = nil
	}
}

func (w *response) buffers() *out {
	if w.o == nil {
		w.o = outs.Get().(*out)
		w.o.bw.Reset(w.c.writer())
		w.o.head = w.o.head[:0]
		w.o.pending = w.o.pending[:0]
	}
	return w.o
}

// Header returns the response's header map; fields adopted before are
// moved into it first (each value after those the map has), so that it
// holds the whole header, as net/http's does.
func (w *response) Header() http.Header {
	if w.header == nil {
		// Made on first use and kept by the connection for its next
		// answers: a proxy's answers adopt fields and never ask for it,
		// and an open stream's connection then holds no map.
		w.header = make(http.Header)
		w.c.header = w.header
	}
	if w.fields != nil {
		w.fields.AddTo(w.header)
		w.fields = nil
	}
	return w.header
}

// AdoptFields makes f the response's header fields, so that a proxy hands
// over the header of a backend's answer (ReadAnswer's) without building a
// map of it: they are rendered as they are, after what the handler has
// set in Header, as if each had been added to it. From then on f is the
// response's: the caller gives it up. Header still returns the whole
// header, at the cost of the map f is merged into: a proxy that adopts
// fields leaves Header alone unless it has something to add (trailers).
// It reports false, and changes nothing, once the head is set
// (WriteHeader): the header is read then. (net/http's ResponseWriter
// offers no such thing; a proxy copies into its Header.)
func (w *response) AdoptFields(f Fields) bool {
	if w.wroteHeader {
		return false
	}
	if w.fields != nil {
		w.Header() // fields adopted before are the map's
	}
	w.fields = f
	return true
}

func (w *response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.wroteHeader {
		w.c.srv.logf("http: superfluous response.WriteHeader call (status %d after %d)", code, w.status)
		return
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.writeInterim(code)
		return
	}
	w.wroteHeader = true
	w.status = code
	o := w.buffers()
	o.head = w.renderHeader(o.head[:0])
}

// renderHeader appends the header lines to b, the map's and then the
// adopted fields', and notes what the head's framing depends on.
func (w *response) renderHeader(b []byte) []byte {
	keepLength := w.noteContentLength()
	for k, vv := range w.header {
		if w.noteField(k, vv, keepLength) {
			for _, v := range vv {
				b = appendHeaderLine(b, k, v)
			}
		}
	}
	for _, f := range w.fields {
		if w.noteField(f.Name, []string{f.Value}, keepLength) {
			b = appendHeaderLine(b, f.Name, f.Value)
		}
	}
	return b
}

// noteContentLength notes the header's Content-Length, its first value,
// and reports whether its fields are to be written: not when it is
// invalid, nor when the status allows no body (but a 304's).
func (w *response) noteContentLength() (keep bool) {
	v, ok := "", false
	if vv := w.header["Content-Length"]; len(vv) > 0 {
		v, ok = vv[0], true
	} else {
		for _, f := range w.fields {
			if f.Name == "Content-Length" {
				v, ok = f.Value, true
				break
			}
		}
	}
	if !ok {
		return false
	}
	cl, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || cl < 0 {
		w.c.srv.logf("http: invalid Content-Length of %q", v)
		return false
	}
	if !bodyAllowed(w.status) && w.status != http.StatusNotModified {
		return false
	}
	w.contentLength = cl
	return true
}

// noteField notes what the head's framing depends on in the values vv of
// the field k (all the map's, or one field's), and reports whether they
// are written: the framing fields are this writer's, and keepLength says
// whether Content-Length is.
func (w *response) noteField(k string, vv []string, keepLength bool) bool {
	switch {
	case strings.HasPrefix(k, http.TrailerPrefix), !httpguts.ValidHeaderFieldName(k):
		return false
	case k == "Transfer-Encoding":
		return false // the framing is this writer's
	case k == "Content-Length":
		return keepLength
	case k == "Date":
		w.hasDate = true
	case k == "Content-Type":
		w.hasType = true
	case k == "Connection":
		if httpguts.HeaderValuesContainsToken(vv, "close") {
			w.closeAfter, w.headerClose = true, true
		}
	case k == "Trailer":
		for _, v := range vv {
			if w.trailer != "" {
				w.trailer += ","
			}
			w.trailer += v
		}
	}
	return true
}

// appendHeaderLine appends "k: v\r\n", with v's line breaks made spaces
// and the result trimmed, as net/http does (a header value must not end
// the head early).
func appendHeaderLine(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	start := len(b)
	for len(v) > 0 && isSpace(v[0]) {
		v = v[1:]
	}
	b = append(b, v...)
	for i := start; i < len(b); i++ {
		if b[i] == '\r' || b[i] == '\n' {
			b[i] = ' '
		}
	}
	for len(b) > start && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return append(b, "\r\n"...)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// writeInterim writes a 1xx answer at once; the final one follows.
func (w *response) writeInterim(code int) {
	o := w.buffers()
	b := appendStatusLine(o.head[:0], code)
	for k, vv := range w.header {
		if httpguts.ValidHeaderFieldName(k) && !strings.HasPrefix(k, http.TrailerPrefix) {
			for _, v := range vv {
				b = appendHeaderLine(b, k, v)
			}
		}
	}
	for _, f := range w.fields {
		if httpguts.ValidHeaderFieldName(f.Name) && !strings.HasPrefix(f.Name, http.TrailerPrefix) {
			b = appendHeaderLine(b, f.Name, f.Value)
		}
	}
	b = append(b, "\r\n"...)
	o.head = b[:0]
	w.write(b)
	w.flush()
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, w.err
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	o := w.o
	if !w.committed {
		if len(o.pending)+len(p) <= cap(o.pending) {
			o.pending = append(o.pending, p...)
			return len(p), nil
		}
		w.commit(p)
	}
	w.writeBody(p)
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// WriteString is Write for a string.
func (w *response) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// writeBody writes p, chunked or not, after the head.
func (w *response) writeBody(p []byte) {
	if len(p) == 0 {
		return
	}
	if w.chunked {
		w.writeChunkSize(len(p))
		w.write(p)
		w.write(crlf)
		return
	}
	w.write(p)
}

// writeChunkSize writes a chunk's size line. It is appended to the
// writer's free buffer, flushed first when nearly full: a local array for
// it would escape (bufio.Writer may pass what it is given to the
// connection), one allocation a chunk.
func (w *response) writeChunkSize(n int) {
	if w.err != nil {
		return
	}
	bw := w.o.bw
	if bw.Available() < 18 { // 16 hex digits and CRLF
		w.flush() // what a Write past the buffer's end would do
		if w.err != nil {
			return
		}
	}
	w.write(append(strconv.AppendUint(bw.AvailableBuffer(), uint64(n), 16), '\r', '\n'))
}

func (w *response) write(p []byte) {
	if w.err != nil {
		return
	}
	if _, err := w.o.bw.Write(p); err != nil {
		w.fail(err)
	}
}

func (w *response) flush() {
	if w.err != nil {
		return
	}
	if err := w.o.bw.Flush(); err != nil {
		w.fail(err)
	}
}

// fail notes the first failed write to the connection, and cancels the
// request's context with it as the cause, as net/http does (its
// checkConnErrorWriter): the client is gone, or read nothing for
// SendTimeout, and the handler is to stop.
func (w *response) fail(err error) {
	w.err = err
	w.c.mu.Lock()
	w.c.cancelLocked(err)
	w.c.mu.Unlock()
}

var crlf = []byte("\r\n")

// commit writes the head, with the framing the body so far decides, then
// the body held until now. next is the write that caused it, if any: with
// nothing held, its start is what a missing Content-Type is sniffed from.
func (w *response) commit(next []byte) {
	w.committed = true
	o := w.o
	b := o.bw.AvailableBuffer()
	b = appendStatusLine(b, w.status)
	b = append(b, o.head...)
	switch {
	case !bodyAllowed(w.status):
	case w.contentLength >= 0:
	case w.handlerDone && !w.hasTrailers():
		w.contentLength = int64(len(o.pending))
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, w.contentLength, 10)
		b = append(b, "\r\n"...)
	default:
		w.chunked = true
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	sniff := o.pending
	if len(sniff) == 0 {
		sniff = next
	}
	if !w.hasType && len(sniff) > 0 && bodyAllowed(w.status) {
		b = appendHeaderLine(b, "Content-Type", http.DetectContentType(sniff))
	}
	if !w.hasDate {
		b = append(b, "Date: "...)
		b = appendDate(b)
		b = append(b, "\r\n"...)
	}
	if w.c.srv.closing.Load() || !w.c.discardBody(w.body) {
		w.closeAfter = true
	}
	if w.closeAfter && !w.headerClose {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	w.write(b)
	pending := o.pending
	o.pending = o.pending[:0]
	w.writeBody(pending)
}

// hasTrailers reports trailers to send: declared in the Trailer header, or
// set under http.TrailerPrefix.
func (w *response) hasTrailers() bool {
	if w.trailer != "" {
		return true
	}
	for k := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	for _, f := range w.fields {
		if strings.HasPrefix(f.Name, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

func (w *response) Flush() { w.FlushError() }

// FlushError writes what is held to the client (http.ResponseController
// prefers it to Flush: it reports a failed write).
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(nil)
	}
	w.flush()
	return w.err
}

// SetReadDeadline bounds the connection's reads (the request body's, for
// http.ResponseController). It reaches the socket when a read needs it.
func (w *response) SetReadDeadline(t time.Time) error { return w.c.setReadDeadline(t) }

// SetWriteDeadline bounds the connection's writes, within SendTimeout's
// bound, until the request ends.
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.send.setDeadline(t) }

// finish completes the answer after the handler has returned.
func (w *response) finish() {
	w.handlerDone = true
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(nil)
	}
	if w.chunked {
		b := append(w.o.bw.AvailableBuffer(), "0\r\n"...)
		b = w.appendTrailers(b)
		w.write(append(b, "\r\n"...))
	} else if w.contentLength >= 0 && w.written != w.contentLength && bodyAllowed(w.status) {
		// Short of what the head promised: the client can only tell by
		// the connection's end.
		w.closeAfter = true
	}
	w.flush()
}

// appendTrailers appends the trailer lines: the names declared in the
// Trailer header, and the keys under http.TrailerPrefix.
func (w *response) appendTrailers(b []byte) []byte {
	if w.fields != nil && w.hasTrailers() {
		w.Header() // the fields' values too: rare enough for a map
	}
	for name := range strings.SplitSeq(w.trailer, ",") {
		name = http.CanonicalHeaderKey(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		for _, v := range w.header[name] {
			b = appendHeaderLine(b, name, v)
		}
	}
	for k, vv := range w.header {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && httpguts.ValidHeaderFieldName(name) {
			for _, v := range vv {
				b = appendHeaderLine(b, name, v)
			}
		}
	}
	return b
}

// bodyAllowed reports whether a status may carry a body (RFC 9110 §15).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func appendStatusLine(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if text := http.StatusText(code); text != "" {
		b = append(b, text...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	return append(b, "\r\n"...)
}

// The Date header's text, formatted once a second.
type dateText struct {
	unix int64
	text []byte
}

var date atomic.Pointer[dateText]

func appendDate(b []byte) []byte {
	now := time.Now()
	d := date.Load()
	if d == nil || d.unix != now.Unix() {
		d = &dateText{unix: now.Unix(), text: now.UTC().AppendFormat(nil, http.TimeFormat)}
		date.Store(d)
	}
	return append(b, d.text...)
}
