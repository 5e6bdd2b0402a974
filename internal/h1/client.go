package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
)

// This file reads the answers of backends, for tether's HTTP/1.1 client.
//
// http.ReadResponse costs a proxy more than the answer is worth: a
// textproto reader, a string per line and per header key, and a body in
// two layers (a locked body over a chunked reader or a LimitReader). The
// answer backends send is of one shape: a status line, a few CRLF-ended
// fields, and a body of a Content-Length, chunked (every SSE stream of
// go-sdk), or up to the close. ReadAnswer reads that shape from the
// bytes its reader has buffered, before consuming any of them, and hands
// everything else (a head longer than the buffer, bare LF line ends, an
// obsolete fold, repeated Content-Length, a transfer coding other than
// chunked, any malformed input) to http.ReadResponse over the same bytes:
// net/http keeps every edge case and its exact error.

// Answer is a response read by ReadAnswer: an http.Response whose header
// is a list of fields rather than a map. Header shadows Response.Header,
// which is nil: a proxy reads and edits the fields, and h1's response
// writer renders them (AdoptFields) without a map ever being built.
type Answer struct {
	*http.Response
	Header Fields
}

// HTTPResponse returns the answer as an http.Response, its header in a
// map: for code that needs one. The Answer is not to be used after.
func (a *Answer) HTTPResponse() *http.Response {
	a.Response.Header = a.Header.Header()
	return a.Response
}

// AnswerOf returns resp as an Answer, its header made a list of fields
// (each name's values in their order, the names in the map's); resp.Header
// is nil after. For a response that came from elsewhere than ReadAnswer
// (another transport).
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

// ReadAnswer reads an HTTP/1.x response, the answer to req (nil is a GET),
// from br, and returns what http.ReadResponse returns for the same bytes:
// the same status, header (as Fields: the same values for each name, in
// the same order), framing (ContentLength, TransferEncoding, Close,
// Trailer) and body, and an error where it fails. Errors differ from
// net/http's only in their text, and only for bytes that net/http would
// also refuse: the connection ended or failed within the head.
//
// The body of an answer of the common shape is Body, read on the caller's
// goroutine without an allocation per read. It differs from net/http's in
// what Close does: Close does not read the rest of the body to keep the
// connection usable (net/http's does, for a keep-alive answer), since
// the connection's owner knows best whether it is worth the wait; and
// once a read fails, every later read returns the same error.
func ReadAnswer(br *bufio.Reader, req *http.Request) (*Answer, error) {
	block, err := peekHead(br)
	if err != nil {
		return nil, err
	}
	if block == nil {
		return readStd(br, req)
	}
	r := new(answer)
	r.Answer.Response = &r.resp
	if !r.parse(string(block), req) {
		return readStd(br, req)
	}
	br.Discard(len(block))
	r.body.br = br
	r.resp.Request = req
	return &r.Answer, nil
}

// readStd reads an answer not of the common shape with http.ReadResponse.
func readStd(br *bufio.Reader, req *http.Request) (*Answer, error) {
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	return AnswerOf(resp), nil
}

// answer is an Answer with its response, body and fields, in one
// allocation.
type answer struct {
	Answer
	resp http.Response
	body Body
	te   [1]string
	// fields holds the fields of an answer that has no more (a backend's
	// answer has five or six).
	fields [8]Field
}

// peekHead returns the head at the start of br, through the blank line
// that ends it, without consuming it; nil when it is not of the common
// shape (a bare LF, or longer than br's buffer). It fails when br fails
// before the head is whole: http.ReadResponse would fail too, on an
// incomplete head, with the same error (an EOF as io.ErrUnexpectedEOF).
// The error is not left for http.ReadResponse to find: bufio.Reader gives
// a read error once, and the error is the caller's (a reset that tells
// the request was not read, say).
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
			return nil, nil
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

// parse parses the head block (status line and fields, through the blank
// line) into r, with the framing rules of net/http's readTransfer. ok is
// false for a head not of the common shape: http.ReadResponse is to read
// it, for its answer or its error.
func (r *answer) parse(block string, req *http.Request) (ok bool) {
	line, rest, _ := strings.Cut(block, "\r\n")
	resp := &r.resp
	if !r.parseStatusLine(line) {
		return false
	}
	// The fields named are looked for only when present (most answers
	// have none of them but a Content-Length or Transfer-Encoding).
	h, has, ok := appendFields(r.fields[:0], rest, false)
	if !ok {
		return false
	}

	chunked := false
	if has.has(keyTransferEncoding) {
		te := h.Count("Transfer-Encoding")
		// net/http ignores a Transfer-Encoding in an HTTP/1.0 answer; it
		// refuses any coding but one "chunked" (in any case: net/http's).
		if resp.ProtoMinor == 1 {
			if te != 1 || h.Get("Transfer-Encoding") != "chunked" {
				return false
			}
			chunked = true
		}
		h.Del("Transfer-Encoding")
	}
	length := int64(-1) // the Content-Length, -1 when absent
	if has.has(keyContentLength) {
		if h.Count("Content-Length") > 1 {
			return false // repeated: net/http's
		}
		if length, ok = parseContentLength(h.Get("Content-Length")); !ok {
			return false // malformed: net/http's
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
	status := resp.StatusCode
	bodyAllowed := !(status >= 100 && status <= 199 || status == 204 || status == 304)
	// realLength is the body's length: 0 when the answer can have none, -1
	// when it is chunked or runs to the close.
	realLength := length
	switch {
	case head || status/100 == 1 || status == 204 || status == 304:
		realLength = 0
	case chunked:
		if has.has(keyContentLength) {
			h.Del("Content-Length")
		}
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
				return false // a forbidden key: net/http's error
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
	return true
}

// parseStatusLine parses "HTTP/1.1 200 OK" into r: HTTP/1.1 or HTTP/1.0,
// one space, three digits, and a reason phrase after a space, or none.
func (r *answer) parseStatusLine(line string) bool {
	resp := &r.resp
	proto, status, _ := strings.Cut(line, " ")
	switch proto {
	case "HTTP/1.1":
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	case "HTTP/1.0":
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
	default:
		return false
	}
	if len(status) < 3 || len(status) > 3 && status[3] != ' ' {
		return false
	}
	code := 0
	for i := range 3 {
		c := status[i]
		if c < '0' || c > '9' {
			return false
		}
		code = code*10 + int(c-'0')
	}
	resp.Status, resp.StatusCode = status, code
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
// close.
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
	errChunkLineTooLong = errors.New("h1: chunk-size line too long")
	errChunkBareLF      = errors.New("h1: chunk-size line ends with a bare LF")
	errChunkCR          = errors.New("h1: CR within a chunk-size line")
	errChunkEmpty       = errors.New("h1: empty chunk size")
	errChunkHex         = errors.New("h1: invalid byte in chunk size")
	errChunkTooLarge    = errors.New("h1: chunk size too large")
	errChunkExcess      = errors.New("h1: chunked encoding contains too much non-data")
	errChunkEnd         = errors.New("h1: chunk data not followed by CRLF")
	errTrailerEOF       = errors.New("h1: unexpected EOF reading trailer")
	errTrailerTooLong   = errors.New("h1: trailer longer than the read buffer")
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
	switch i := bytes.IndexByte(line, '\r'); {
	case i < 0:
		return errChunkBareLF
	case i != len(line)-2:
		return errChunkCR
	}
	line = line[:len(line)-2]
	if len(line) >= maxChunkLine {
		return errChunkLineTooLong
	}
	b.excess += int64(len(line)) + 2 // the line, and the CRLF after the data
	line = bytes.TrimRight(line, " \t")
	line, _, _ = bytes.Cut(line, []byte(";")) // extensions are ignored
	n, err := parseHexSize(line)
	if err != nil {
		return err
	}
	// As net/http, including its arithmetic for a size past 63 bits.
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

// parseHexSize parses a chunk size: hex digits, at most 16.
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

// readTrailer reads the trailer section after the last chunk into the
// response's Trailer, as net/http does: the common empty one on its own;
// any other through textproto, once its end is in the buffer (which
// bounds its size).
func (b *Body) readTrailer() error {
	buf, _ := b.br.Peek(2)
	if len(buf) == 2 && buf[0] == '\r' && buf[1] == '\n' {
		b.br.Discard(2)
		return nil
	}
	if len(buf) < 2 {
		return errTrailerEOF
	}
	if !b.trailerBuffered() {
		return errTrailerTooLong
	}
	t, err := textproto.NewReader(b.br).ReadMIMEHeader()
	if err != nil {
		if err == io.EOF {
			err = errTrailerEOF
		}
		return err
	}
	if b.resp.Trailer == nil {
		b.resp.Trailer = http.Header(t)
		return nil
	}
	for k, v := range t {
		b.resp.Trailer[k] = v
	}
	return nil
}

// trailerBuffered reports whether a CRLFCRLF is in what the reader can
// buffer, reading more until it is or the buffer is full.
func (b *Body) trailerBuffered() bool {
	searched := 0
	for {
		buf, _ := b.br.Peek(b.br.Buffered())
		if bytes.Contains(buf[max(searched-3, 0):], crlfcrlf) {
			return true
		}
		searched = len(buf)
		if _, err := b.br.Peek(len(buf) + 1); err != nil {
			return false
		}
	}
}
