package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// This file reads the answers of backends, for tether's HTTP/1.1 client.
//
// http.ReadResponse costs a proxy more than the answer is worth: a
// textproto reader, a string per line and per header key, and a body in
// two layers (a locked body over a chunked reader or a LimitReader). The
// answer backends send is of one shape: a status line, a few CRLF-ended
// fields, and a body of a Content-Length, chunked (every SSE stream of
// go-sdk), or up to the close. ReadAnswer reads that shape from the
// bytes its reader has buffered, before consuming any of them.
//
// It reads every other answer too, and refuses the ones that could be
// read in more than one way. A proxy that frames an answer otherwise than
// the backend meant it leaves the rest of it on a pooled connection,
// where it is read as the answer to the next request, from whichever
// client (response splitting, RFC 9112 §11.1). http.ReadResponse is
// lenient exactly there: it takes "Transfer-Encoding : chunked" for a
// field of another name (golang/go#34540) and frames the answer by the
// Content-Length beside it; it joins folded lines, takes a bare LF for a
// line end, frames a chunked answer by its chunks whatever Content-Length
// says, and an HTTP/1.0 answer by its Content-Length whatever
// Transfer-Encoding says. So ReadAnswer no longer hands anything to it:
// what net/http reads, ReadAnswer reads the same way (the same status,
// fields, framing and body: FuzzReadAnswer and the table of
// client_framing_test.go hold it to that) or refuses with
// ErrMalformedAnswer; it never reads an answer net/http refuses.

// ErrMalformedAnswer is the error, wrapped with what was wrong, of an
// answer ReadAnswer refuses and of a body whose framing turns out wrong:
// a head or a framing that is malformed or could be read in more than one
// way. The backend and tether may disagree on where such an answer ends:
// its connection must be closed, never used again, and a proxy answers
// 502 (Bad Gateway), as RFC 9112 §5.2 asks of one that receives an
// obsolete fold. Test with errors.Is.
var ErrMalformedAnswer = errors.New("h1: malformed answer")

// malformed is an ErrMalformedAnswer that says what was wrong.
type malformed string

func (e malformed) Error() string { return "h1: malformed answer: " + string(e) }
func (e malformed) Unwrap() error { return ErrMalformedAnswer }

// malformedLine is a malformed that quotes the start of the line at fault.
func malformedLine(what, line string) malformed {
	return malformed(fmt.Sprintf("%s %.64q", what, line))
}

var errBareLF = malformed("a line of the head ends with a bare LF")

// Answer is a response read by ReadAnswer: an http.Response whose header
// is a list of fields rather than a map. Header shadows Response.Header,
// which is nil: a proxy reads and edits the fields, and h1's response
// writer renders them (AdoptFields) without a map ever being built.
type Answer struct {
	*http.Response
	Header Fields

	// read is set on an answer of ReadAnswer; body is its Body, nil when
	// it has none (http.NoBody). Reusable looks at them, not at
	// Response.Body, which its reader may have wrapped.
	read bool
	body *Body
}

// HTTPResponse returns the answer as an http.Response, its header in a
// map: for code that needs one. The Answer is not to be used after, but
// for Reusable.
func (a *Answer) HTTPResponse() *http.Response {
	a.Response.Header = a.Header.Header()
	return a.Response
}

// ForgetHead lets go of the answer's fields and status text, for an
// answer relayed long after its head was (an open stream's): they are
// substrings of the head, which they would keep for the answer's life.
// The status code, the framing and the body stay.
func (a *Answer) ForgetHead() {
	clear(a.Header[:cap(a.Header)]) // the array the answer's fields are in
	a.Header = nil
	a.Status = ""
}

// AnswerOf returns resp as an Answer, its header made a list of fields
// (each name's values in their order, the names in the map's); resp.Header
// is nil after. For a response that came from elsewhere than ReadAnswer
// (another transport); its Reusable is false.
func AnswerOf(resp *http.Response) *Answer {
	a := new(stdAnswer)
	a.Response = resp
	a.Header = AppendHeader(a.fields[:0], resp.Header)
	resp.Header = nil
	return &a.Answer
}

// stdAnswer is an Answer of AnswerOf with room for its fields.
type stdAnswer struct {
	Answer
	fields [8]Field
}

// Reusable reports whether the connection an answer was read from, with
// br, may carry another request now; it is the one test a pooling client
// makes before it keeps a connection. It is true only when the answer's
// end is certain and nothing follows it:
//   - the answer was read by ReadAnswer (an error from ReadAnswer, or from
//     its body, leaves no answer whose end is known: close);
//   - it is a final answer (a 1xx is followed by one; after a 101 the
//     connection is not HTTP) that does not close the connection (Close:
//     HTTP/1.0 without keep-alive, "Connection: close", a body that runs
//     to the close);
//   - its body is http.NoBody, or was read through to io.EOF at the end
//     of its Content-Length or of its last chunk and trailer (a body
//     closed before its end leaves the rest of it on the connection);
//   - br holds no byte past the answer: bytes that came with it are an
//     answer to no request, or the rest of an answer the backend framed
//     otherwise (a HEAD, 204 or 304 answer with a body, a Content-Length
//     shorter than what was sent).
//
// Bytes that arrive after this test, while the connection is idle, are
// no answer either: a pooling client still peeks at an idle connection
// before it writes the next request into it, as net/http's Transport
// watches its idle connections (its "unsolicited response" check).
func (a *Answer) Reusable(br *bufio.Reader) bool {
	if !a.read || a.StatusCode < 200 || a.Close || br.Buffered() > 0 {
		return false
	}
	return a.body == nil || a.body.ended()
}

// ReadAnswer reads an HTTP/1.x response, the answer to req (nil is a GET),
// from br, and returns what http.ReadResponse returns for the same bytes:
// the same status, header (as Fields: the same values for each name, in
// the same order), framing (ContentLength, TransferEncoding, Close,
// Trailer) and body; or an error. Read errors within the head are the
// reader's, as they came (an EOF as io.ErrUnexpectedEOF). An answer
// net/http would refuse is refused, and so, on purpose, is one net/http
// would read with a guess (stricter than net/http; the errors wrap
// ErrMalformedAnswer):
//   - a status line other than "HTTP/1.1" or "HTTP/1.0", one space, a
//     status of three digits from 100, and a reason of visible
//     characters, spaces and tabs, or none. net/http takes "HTTP/1.2",
//     two spaces, "+20", a control character in the reason, and "000" (a
//     status under 100, on which WriteHeader panics);
//   - a line ended by a bare LF; an obsolete line fold; a space before a
//     field's colon; more than 256 fields;
//   - Transfer-Encoding beside Content-Length (RFC 9112 §6.1: "ought to
//     be handled as an error"; net/http drops the Content-Length), in an
//     HTTP/1.0 answer (§6.1: the framing is faulty; net/http ignores it),
//     or in a 1xx or 204 answer; a Content-Length other than 0 in a 1xx
//     or 204 answer (RFC 9110 §8.6: a server must not send one; the
//     backend may be sending a body nobody reads);
//   - a first chunk-size line that came with the head and is malformed
//     (see Body).
//
// Repeated equal Content-Length fields are read as one, as net/http does.
//
// The body of the answer is a Body, read on the caller's goroutine without
// an allocation per read. It differs from net/http's in what Close does:
// Close does not read the rest of the body to keep the connection usable
// (net/http's does, for a keep-alive answer), since the connection's
// owner knows best whether it is worth the wait; and once a read fails,
// every later read returns the same error. Whether the connection may
// carry another request is Reusable's to tell.
func ReadAnswer(br *bufio.Reader, req *http.Request) (*Answer, error) {
	block, err := peekHead(br)
	if err != nil {
		return nil, err
	}
	var head string
	if block != nil {
		head = string(block)
	} else if head, err = readLongHead(br); err != nil {
		return nil, err
	}
	var r *answer
	var fields []Field
	if req != nil && req.Method == http.MethodGet {
		// A GET is an event stream, most often, which keeps its answer
		// for its life but not the fields (ForgetHead): they go in an
		// array of their own, which the stream lets go of.
		r, fields = new(answer), make([]Field, 0, 8)
	} else {
		a := new(answerWithFields)
		r, fields = &a.answer, a.fields[:0]
	}
	r.Answer.Response = &r.resp
	if err := r.parse(head, req, fields); err != nil {
		return nil, err
	}
	if block != nil {
		br.Discard(len(block))
	}
	r.body.br = br
	r.resp.Request = req
	r.read = true
	if r.resp.Body != http.NoBody {
		r.Answer.body = &r.body
	}
	if r.body.mode == bodyChunked {
		if err := r.body.checkFirstChunk(); err != nil {
			return nil, err
		}
	}
	return &r.Answer, nil
}

// answer is an Answer with its response and body, in one allocation: an
// open stream keeps it for its life (288 bytes).
type answer struct {
	Answer
	resp http.Response
	body Body
	te   [1]string
}

// answerWithFields is an answer with room for its fields, for an answer
// that is read once and let go of (a request's other than a GET): one
// allocation for the whole. Seven fields, not eight (a backend's answer
// has five or six): it is then 504 bytes, in the allocator's 512-byte
// class instead of the 576 one.
type answerWithFields struct {
	answer
	fields [7]Field
}

// peekHead returns the head at the start of br, through the blank line
// that ends it, without consuming it; nil when it is longer than br's
// buffer (readLongHead reads it then). It fails when br fails before the
// head is whole, with the reader's error (an EOF as io.ErrUnexpectedEOF,
// as http.ReadResponse has it): the error is the caller's (a reset that
// tells the request was not read, say). A line ended by a bare LF fails
// it: net/http reads one as a line end, a peer may not.
func peekHead(br *bufio.Reader) ([]byte, error) {
	searched := 0
	for {
		// Peek past what is buffered, for a fill when nothing is.
		if _, err := br.Peek(searched + 1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		b, _ := br.Peek(br.Buffered())
		end, bare := headEnd(b, searched)
		if bare {
			return nil, errBareLF
		}
		if end >= 0 {
			return b[:end], nil
		}
		if len(b) == br.Size() {
			return nil, nil // longer than the buffer
		}
		searched = len(b)
	}
}

// readLongHead reads a head longer than br's buffer, through the blank
// line that ends it, into a string of its own (rare: a backend's head is
// a few hundred bytes). Its lines are held to peekHead's rule, and there
// are no more of them than a head may have fields: a stream of short
// lines fails early. Its size is bounded by what br's reader will give
// (tether's client stops a head at 10 MiB, as net/http's Transport).
func readLongHead(br *bufio.Reader) (string, error) {
	var head []byte
	lineStart, lines := 0, 0
	for {
		frag, err := br.ReadSlice('\n')
		head = append(head, frag...)
		if err == bufio.ErrBufferFull {
			continue // a line longer than the buffer
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return "", err
		}
		line := head[lineStart:]
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return "", errBareLF
		}
		if len(line) == 2 && lineStart > 0 {
			return string(head), nil
		}
		if lines++; lines > maxHeaderLines+1 { // the status line, and the fields
			return "", errTooManyFields
		}
		lineStart = len(head)
	}
}

var errTooManyFields = malformed(fmt.Sprintf("head of more than %d fields", maxHeaderLines))

// parse parses the head block (status line and fields, through the blank
// line) into r, with the framing rules of net/http's readTransfer, and
// refuses (ErrMalformedAnswer) what ReadAnswer's doc lists.
func (r *answer) parse(block string, req *http.Request, fields []Field) error {
	line, rest, _ := strings.Cut(block, "\r\n")
	resp := &r.resp
	if err := r.parseStatusLine(line); err != nil {
		return err
	}
	// The fields named are looked for only when present (most answers
	// have none of them but a Content-Length or Transfer-Encoding).
	h, has, ok := appendFields(fields, rest, false)
	if !ok {
		return badFields("head", rest)
	}
	status := resp.StatusCode
	// noBody: the statuses whose answers have no body, and whose sender
	// must not frame one (RFC 9110 §8.6, RFC 9112 §6.1); 304 may tell the
	// framing the representation would have had.
	noBody := status/100 == 1 || status == http.StatusNoContent

	chunked := false
	if has.has(keyTransferEncoding) {
		if err := checkTransferEncoding(h, resp.ProtoMinor, has.has(keyContentLength), noBody); err != nil {
			return err
		}
		chunked = true
		h.Del("Transfer-Encoding")
	}
	length := int64(-1) // the Content-Length, -1 when absent
	if has.has(keyContentLength) {
		v := h.Get("Content-Length")
		if h.Count("Content-Length") > 1 {
			// As net/http: equal copies are one field, in the first's place.
			for _, f := range h {
				if f.Name == "Content-Length" && f.Value != v {
					return malformedLine("Content-Length values differ:", strings.Join(h.Values("Content-Length"), ", "))
				}
			}
			h.Set("Content-Length", v)
		}
		if length, ok = parseContentLength(v); !ok {
			return malformedLine("Content-Length", v)
		}
		if noBody && length != 0 {
			return malformedLine(fmt.Sprintf("Content-Length in a %d answer:", status), v)
		}
	}

	// shouldClose, as net/http: HTTP/1.0 closes unless kept alive; an
	// HTTP/1.1 "Connection: close" closes and leaves the header.
	conn := has.has(keyConnection)
	closing := conn && h.containsToken("Connection", "close")
	if resp.ProtoMinor == 0 {
		closing = closing || !(conn && h.containsToken("Connection", "keep-alive"))
	} else if closing {
		h.Del("Connection")
	}

	head := req != nil && req.Method == http.MethodHead
	bodyAllowed := !(noBody || status == http.StatusNotModified)
	// realLength is the body's length: 0 when the answer can have none, -1
	// when it is chunked or runs to the close.
	realLength := length
	switch {
	case head || !bodyAllowed:
		realLength = 0
	case chunked:
		realLength = -1
	}
	resp.ContentLength = realLength
	if head {
		resp.ContentLength = length
	}
	if chunked {
		r.te[0] = "chunked"
		resp.TransferEncoding = r.te[:]
		if has.has(keyTrailer) {
			if resp.Trailer, ok = parseTrailer(&h); !ok {
				return malformedLine("Trailer announces a framing field:", strings.Join(h.Values("Trailer"), ", "))
			}
		}
	}
	if realLength == -1 && !chunked && bodyAllowed {
		closing = true // the body runs to the close
	}
	resp.Close = closing

	switch {
	case chunked && (head || !bodyAllowed), realLength == 0:
		resp.Body = http.NoBody
	case chunked:
		r.body.mode = bodyChunked
		r.body.resp = resp
		resp.Body = &r.body
	case realLength > 0:
		r.body.mode = bodyLength
		r.body.n = uint64(realLength)
		resp.Body = &r.body
	default: // realLength < 0, and so closing
		r.body.mode = bodyToEOF
		resp.Body = &r.body
	}

	// As net/http: HTTP/1.0's "Pragma: no-cache" means "Cache-Control:
	// no-cache" when the latter is absent.
	if has.has(keyPragma) && !has.has(keyCacheControl) && h.Get("Pragma") == "no-cache" {
		h = append(h, Field{"Cache-Control", "no-cache"})
	}
	r.Header = h
	return nil
}

// checkTransferEncoding refuses an answer's Transfer-Encoding unless it is
// one field, "chunked" (in any case, as net/http), in an HTTP/1.1 answer
// that may have a body and has no Content-Length besides.
func checkTransferEncoding(h Fields, minor int, hasLength, noBody bool) error {
	te := h.Get("Transfer-Encoding")
	switch {
	case h.Count("Transfer-Encoding") != 1 || !equalFoldASCII(te, "chunked"):
		// net/http refuses these too: a coding it cannot undo, or chunked
		// not alone (and so, RFC 9112 §6.3, a body up to the close).
		return malformedLine("Transfer-Encoding other than chunked:", strings.Join(h.Values("Transfer-Encoding"), ", "))
	case hasLength:
		return malformed("Transfer-Encoding and Content-Length together")
	case minor == 0:
		return malformed("Transfer-Encoding in an HTTP/1.0 answer")
	case noBody:
		return malformed("Transfer-Encoding in an answer that has no body (1xx, 204)")
	}
	return nil
}

// equalFoldASCII reports whether s is lower, a lower-case ASCII word, in
// any case; bytes outside ASCII match nothing (strings.EqualFold would
// match the Kelvin sign with a k).
func equalFoldASCII(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// badFields returns the error of the fields of a head or a trailer
// (section) that appendFields refused: the line at fault, or their
// number.
func badFields(section, fields string) error {
	sc, _, ok := scanFields(fields)
	if !ok {
		return malformed(fmt.Sprintf("%s of more than %d fields", section, maxHeaderLines))
	}
	for {
		before := sc.rest
		if _, _, _, more := sc.next(); !more {
			line, _, _ := strings.Cut(before, "\n")
			line = strings.TrimSuffix(line, "\r")
			return malformedLine(section+" line (a name that is not a token, a space before the colon, a fold, a control character or a bare line end):", line)
		}
	}
}

// parseStatusLine parses "HTTP/1.1 200 OK" into r: HTTP/1.1 or HTTP/1.0,
// one space, three digits from 100, and a reason phrase after a space,
// or none.
func (r *answer) parseStatusLine(line string) error {
	resp := &r.resp
	proto, status, _ := strings.Cut(line, " ")
	switch proto {
	case "HTTP/1.1":
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	case "HTTP/1.0":
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
	default:
		return malformedLine("status line", line)
	}
	if len(status) < 3 || len(status) > 3 && (status[3] != ' ' || !validReason(status[4:])) {
		return malformedLine("status line", line)
	}
	code := 0
	for i := range 3 {
		c := status[i]
		if c < '0' || c > '9' {
			return malformedLine("status line", line)
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		// No such status; net/http reads one, and its WriteHeader panics
		// on it.
		return malformedLine("status line", line)
	}
	resp.Status, resp.StatusCode = status, code
	return nil
}

// validReason reports whether reason is a reason phrase: tabs, spaces,
// visible ASCII and obs-text (RFC 9112 §4), no other control character.
func validReason(reason string) bool {
	for i := 0; i < len(reason); i++ {
		if c := reason[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// parseTrailer takes the Trailer fields out of h and returns the keys they
// announce, each with a nil value, as net/http's fixTrailer does; nil when
// they announce none. ok is false when they announce a key that cannot be
// a trailer.
func parseTrailer(h *Fields) (trailer http.Header, ok bool) {
	for _, f := range *h {
		if f.Name != "Trailer" {
			continue
		}
		for _, k := range strings.Split(f.Value, ",") {
			if k = textproto.TrimString(k); k == "" {
				continue
			}
			switch k = http.CanonicalHeaderKey(k); k {
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return nil, false
			}
			if trailer == nil {
				trailer = make(http.Header)
			}
			trailer[k] = nil
		}
	}
	h.Del("Trailer")
	return trailer, true
}

// Body is the body of an answer read by ReadAnswer: a Content-Length's
// worth of bytes, a chunked body and its trailer, or the bytes up to the
// close. A read that fails returns, and keeps returning, an error that is
// not io.EOF: io.ErrUnexpectedEOF (or an error wrapping it) for a body
// cut short, the reader's own error, or one wrapping ErrMalformedAnswer
// for chunked framing that is wrong or could be read in more than one
// way. Where net/http's chunked reader reads a body, Body reads the same
// bytes, but that it refuses, on purpose:
//   - a chunk size of 2^63 or more (net/http takes up to 2^64-1);
//   - chunk extensions not of RFC 9112 §7.1.1's grammar (";" name, and
//     "=" and a token or quoted string), which net/http skips unread;
//   - a trailer section with a line net/http's textproto would read with
//     a guess (a bare LF, an obsolete fold, a space before a colon), or
//     more than 256 fields.
type Body struct {
	br   *bufio.Reader
	mode uint8
	// n is what is left of the body (bodyLength) or of the current chunk
	// (bodyChunked).
	n   uint64
	err error // sticky: the body's end, or its failure
	// Chunked bodies only: resp gets the trailer; checkEnd is set when a
	// chunk's data was read and the CRLF after it was not; excess counts
	// the bytes of chunk framing beyond what the data justifies.
	resp     *http.Response
	checkEnd bool
	excess   int64
	closed   bool
}

const (
	bodyLength = iota + 1
	bodyChunked
	bodyToEOF
)

// ended reports whether the body was read to its certain end: io.EOF at
// the end of its Content-Length, or after its last chunk and trailer. A
// body up to the close ends with the connection.
func (b *Body) ended() bool {
	return b.err == io.EOF && b.mode != bodyToEOF
}

// Limits of chunked framing, net/http's: a chunk-size line is bounded by
// the reader's buffer and by maxChunkLine; framing beyond the data's share
// (16 bytes and the data's size again, per chunk) by maxChunkExcess, so
// that a stream of tiny chunks with long extensions is refused. The
// trailer section must fit in the reader's buffer.
const (
	maxChunkLine   = 4096
	maxChunkExcess = 16 << 10
)

var (
	errChunkLineTooLong = malformed("chunk-size line too long")
	errChunkBareLF      = malformed("chunk-size line ends with a bare LF")
	errChunkCR          = malformed("CR within a chunk-size line")
	errChunkEmpty       = malformed("empty chunk size")
	errChunkHex         = malformed("invalid byte in chunk size")
	errChunkTooLarge    = malformed("chunk size too large")
	errChunkExtension   = malformed("chunk extension not of RFC 9112's grammar")
	errChunkExcess      = malformed("chunked encoding contains too much non-data")
	errChunkEnd         = malformed("chunk data not followed by CRLF")
	errTrailerTooLong   = malformed("trailer longer than the read buffer")
	errTrailerEOF       = fmt.Errorf("h1: EOF within the trailer: %w", io.ErrUnexpectedEOF)
)

// Read reads the body. It returns the end of the body (io.EOF) with its
// last bytes when they are buffered, so that the caller can give the
// connection back without another call; a body cut short is
// io.ErrUnexpectedEOF.
func (b *Body) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.err != nil {
		return 0, b.err
	}
	switch b.mode {
	case bodyLength:
		if uint64(len(p)) > b.n {
			p = p[:b.n]
		}
		n, err := b.br.Read(p)
		b.n -= uint64(n)
		switch {
		case b.n == 0:
			err = io.EOF
		case err == io.EOF:
			err = io.ErrUnexpectedEOF
		}
		b.err = err
		return n, err
	case bodyChunked:
		n, err := b.readChunked(p)
		if err == io.EOF {
			if terr := b.readTrailer(); terr != nil {
				err = terr
			}
		}
		b.err = err
		return n, err
	default:
		n, err := b.br.Read(p)
		b.err = err
		return n, err
	}
}

// SetReader makes br the reader the body reads from: its owner may give
// the reader's buffer back while nothing is buffered in it (a stream idle
// between events), and take another for the next read, which must read
// the same connection. The body's framing state is its own, not the
// reader's.
func (b *Body) SetReader(br *bufio.Reader) { b.br = br }

// Close marks the body closed: later reads fail. It does not read what is
// left of the body, and must not be called while a Read runs (the caller
// closes the connection to end a blocked Read).
func (b *Body) Close() error {
	b.closed = true
	return nil
}

// readChunked reads chunk data into p, as net/http's chunked reader does:
// it reads the next chunk-size line only when p is still empty or the
// line is already buffered, so that a read never waits for more once it
// has bytes. It returns io.EOF after the last chunk (size 0).
func (b *Body) readChunked(p []byte) (n int, err error) {
	for {
		if b.checkEnd {
			if n > 0 && b.br.Buffered() < 2 {
				return n, nil
			}
			crlf, err := b.br.Peek(2)
			if len(crlf) < 2 {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
			if crlf[0] != '\r' || crlf[1] != '\n' {
				return n, errChunkEnd
			}
			b.br.Discard(2)
			b.checkEnd = false
		}
		if b.n == 0 {
			if n > 0 && !b.chunkLineBuffered() {
				return n, nil
			}
			if err := b.beginChunk(); err != nil {
				return n, err
			}
			continue
		}
		if len(p) == 0 {
			return n, nil
		}
		q := p
		if uint64(len(q)) > b.n {
			q = q[:b.n]
		}
		m, err := b.br.Read(q)
		n += m
		p = p[m:]
		b.n -= uint64(m)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
		if b.n == 0 {
			b.checkEnd = true
		}
	}
}

// chunkLineBuffered reports whether a whole line is buffered.
func (b *Body) chunkLineBuffered() bool {
	n := b.br.Buffered()
	if n == 0 {
		return false
	}
	buf, _ := b.br.Peek(n)
	return bytes.IndexByte(buf, '\n') >= 0
}

// checkFirstChunk refuses a chunked body whose first chunk-size line came
// with the head and is malformed: a backend writes its head and first
// chunk at once, and ReadAnswer's error lets a proxy answer 502 instead
// of cutting an answer it has begun to relay. A line not buffered yet is
// checked when the body is read. Nothing is consumed.
func (b *Body) checkFirstChunk() error {
	n := b.br.Buffered()
	if n == 0 {
		return nil
	}
	buf, _ := b.br.Peek(n)
	end := bytes.IndexByte(buf, '\n')
	if end < 0 {
		return nil
	}
	line, err := chunkLine(buf[:end+1])
	if err != nil {
		return err
	}
	_, err = chunkSize(line)
	return err
}

// beginChunk reads a chunk-size line ("1a;ext=v\r\n") into b.n; io.EOF
// for the last chunk.
func (b *Body) beginChunk() error {
	line, err := b.br.ReadSlice('\n')
	if err != nil {
		switch err {
		case io.EOF:
			err = io.ErrUnexpectedEOF
		case bufio.ErrBufferFull:
			err = errChunkLineTooLong
		}
		return err
	}
	if line, err = chunkLine(line); err != nil {
		return err
	}
	b.excess += int64(len(line)) + 2 // the line, and the CRLF after the data
	n, err := chunkSize(line)
	if err != nil {
		return err
	}
	// As net/http, including its arithmetic for a size past 62 bits.
	b.excess = max(b.excess-(16+2*int64(n)), 0)
	if b.excess > maxChunkExcess {
		return errChunkExcess
	}
	b.n = n
	if n == 0 {
		return io.EOF
	}
	return nil
}

// chunkLine checks a chunk-size line, through its LF, as net/http does:
// CRLF-ended, no other CR, shorter than maxChunkLine; it returns the line
// without its CRLF.
func chunkLine(line []byte) ([]byte, error) {
	switch i := bytes.IndexByte(line, '\r'); {
	case i < 0:
		return nil, errChunkBareLF
	case i != len(line)-2:
		return nil, errChunkCR
	}
	line = line[:len(line)-2]
	if len(line) >= maxChunkLine {
		return nil, errChunkLineTooLong
	}
	return line, nil
}

// chunkSize parses a chunk-size line without its CRLF: hex digits, then
// extensions after a ";", then spaces or tabs. As net/http, there is no
// space between the size and the ";"; unlike it, the extensions are held
// to their grammar and the size to 63 bits.
func chunkSize(line []byte) (uint64, error) {
	line = bytes.TrimRight(line, " \t")
	size, ext, hasExt := bytes.Cut(line, []byte(";"))
	n, err := parseHexSize(size)
	if err != nil {
		return 0, err
	}
	if hasExt && !validChunkExt(ext) {
		return 0, errChunkExtension
	}
	return n, nil
}

// parseHexSize parses a chunk size: hex digits, at most 16, below 2^63.
func parseHexSize(v []byte) (uint64, error) {
	if len(v) == 0 {
		return 0, errChunkEmpty
	}
	if len(v) > 16 {
		return 0, errChunkTooLarge
	}
	var n uint64
	for _, c := range v {
		d := hexDigit(c)
		if d < 0 {
			return 0, errChunkHex
		}
		n = n<<4 | uint64(d)
	}
	if n > math.MaxInt64 {
		return 0, errChunkTooLarge
	}
	return n, nil
}

func hexDigit(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// validChunkExt reports whether ext, what follows a chunk size's first
// ";" (trailing spaces trimmed), is a list of chunk extensions (RFC 9112
// §7.1.1):
//
//	chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
//	chunk-ext-val = token / quoted-string
func validChunkExt(ext []byte) bool {
	for {
		ext = trimLeftBWS(ext)
		name := tokenPrefix(ext)
		if name == 0 {
			return false
		}
		ext = trimLeftBWS(ext[name:])
		if len(ext) > 0 && ext[0] == '=' {
			ext = trimLeftBWS(ext[1:])
			val := tokenPrefix(ext)
			if len(ext) > 0 && ext[0] == '"' {
				val = quotedStringPrefix(ext)
			}
			if val == 0 {
				return false
			}
			ext = trimLeftBWS(ext[val:])
		}
		if len(ext) == 0 {
			return true
		}
		if ext[0] != ';' {
			return false
		}
		ext = ext[1:]
	}
}

func trimLeftBWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// tokenPrefix returns the length of the token at the start of b.
func tokenPrefix(b []byte) int {
	for i, c := range b {
		if !httpguts.IsTokenRune(rune(c)) {
			return i
		}
	}
	return len(b)
}

// quotedStringPrefix returns the length of the quoted string at the start
// of b (RFC 9110 §5.6.4), 0 when there is none.
func quotedStringPrefix(b []byte) int {
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			// quoted-pair: a backslash and HTAB, SP, VCHAR or obs-text.
			if i++; i == len(b) || !qdText(b[i]) && b[i] != '"' && b[i] != '\\' {
				return 0
			}
		case !qdText(c):
			return 0
		}
	}
	return 0 // not closed
}

// qdText reports whether c may stand in a quoted string as it is: HTAB,
// SP, visible ASCII but '"' and '\', obs-text.
func qdText(c byte) bool {
	return c == '\t' || c == ' ' || 0x21 <= c && c <= 0x7e && c != '"' && c != '\\' || c >= 0x80
}

// readTrailer reads the trailer section after the last chunk into the
// response's Trailer, as net/http does: the common empty one on its own;
// any other once its end is in the buffer (which bounds its size), with
// the rules of a head's fields.
func (b *Body) readTrailer() error {
	buf, err := b.br.Peek(2)
	if len(buf) == 2 && buf[0] == '\r' && buf[1] == '\n' {
		b.br.Discard(2)
		return nil
	}
	if len(buf) < 2 {
		if err == io.EOF {
			err = errTrailerEOF
		}
		return err
	}
	end, err := b.trailerEnd()
	if err != nil {
		return err
	}
	buf, _ = b.br.Peek(end)
	block := string(buf)
	b.br.Discard(end)
	fields, _, ok := appendFields(nil, block, false)
	if !ok {
		return badFields("trailer", block)
	}
	t := fields.Header()
	if b.resp.Trailer == nil {
		b.resp.Trailer = t
		return nil
	}
	for k, v := range t {
		b.resp.Trailer[k] = v
	}
	return nil
}

// trailerEnd returns the length of the trailer section at the start of
// the reader, through the CRLFCRLF that ends it, reading more until it is
// buffered; it fails when the buffer fills first, or the reader does.
func (b *Body) trailerEnd() (int, error) {
	searched := 0
	for {
		buf, _ := b.br.Peek(b.br.Buffered())
		if i := bytes.Index(buf[max(searched-3, 0):], crlfcrlf); i >= 0 {
			return max(searched-3, 0) + i + len(crlfcrlf), nil
		}
		searched = len(buf)
		if _, err := b.br.Peek(len(buf) + 1); err != nil {
			switch err {
			case bufio.ErrBufferFull:
				err = errTrailerTooLong
			case io.EOF:
				err = errTrailerEOF
			}
			return 0, err
		}
	}
}
