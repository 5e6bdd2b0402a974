package h1

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Connection states, for Shutdown: only an idle connection (waiting for
// the first byte of a request, nothing buffered) may be closed under it.
const (
	stateActive int32 = iota
	stateIdle
	stateClosed
)

const (
	// readBufferSize is a connection's read buffer: a request head and a
	// small body arrive in one read. It grows for a longer head, up to
	// the wrapped server's MaxHeaderBytes.
	readBufferSize = 4 << 10
	// maxDiscardBody is how much of a body the handler left unread is
	// read and dropped to keep the connection (net/http's
	// maxPostHandlerReadBytes); past it the connection is closed.
	maxDiscardBody = 256 << 10
	// discardTimeout bounds the wait for the rest of a body the handler
	// did not read, before its answer is sent.
	discardTimeout = 5 * time.Second
	// clientWatchDelay is how long a request runs, at least (and at most
	// twice that, see watch.go), before its connection is watched for the
	// client leaving, which cancels the request's context. Watching costs
	// a goroutine and a read per request; a request answered sooner than
	// this never needs it (the answer's write is what fails if the client
	// has gone), and a stream or a slow tool call is watched from then on.
	clientWatchDelay = 100 * time.Millisecond
	// lingerTimeout is how long a connection closed after an answer while
	// its request's body is still coming is kept half-closed, its write
	// side closed and what arrives read and dropped, before it is closed:
	// closed at once, with bytes unread, it would send the client a reset,
	// which may destroy the answer before the client has read it. It is
	// net/http's rstAvoidanceDelay (closeWriteAndWait), which sleeps as
	// long; reading lets a client that closes end the wait sooner.
	lingerTimeout = 500 * time.Millisecond
	// maxLingerReads bounds the reads of that wait, besides its time.
	maxLingerReads = 1 << 14
	// maxLeadingCRLF is how many CR or LF bytes before a request are
	// dropped after a POST (RFC 9112 §2.2: some old clients end a POST's
	// body with a CRLF it does not count): as net/http, those among the
	// next 4 bytes.
	maxLeadingCRLF = 4
	// idleSlack is the fraction of IdleTimeout by which a connection's idle
	// deadline may exceed IdleTimeout: the deadline set for one wait is kept
	// for the next ones until it is closer than IdleTimeout, so that a busy
	// connection re-arms it once per IdleTimeout/idleSlack, not twice per
	// request. An idle connection is closed between IdleTimeout and
	// IdleTimeout*(1+1/idleSlack) after its last request, never earlier
	// (the clients in front are meant to close an idle connection first).
	idleSlack = 8
)

// readBuffers holds the read buffers (readBufferSize) of connections that
// have a request to read. A connection waiting, idle, for its next request
// holds none (see idleReader), as nginx frees an idle keep-alive
// connection's buffers: after a burst, the hundreds of connections a load
// left open cost their goroutine and their small structs each.
var readBuffers = sync.Pool{New: func() any { return new([readBufferSize]byte) }}

func getReadBuffer() []byte { return readBuffers.Get().(*[readBufferSize]byte)[:] }

// putReadBuffer gives buf back to readBuffers when it is one of theirs (a
// buffer grown for a long head is left to the collector).
func putReadBuffer(buf []byte) {
	if cap(buf) == readBufferSize {
		readBuffers.Put((*[readBufferSize]byte)(buf[:readBufferSize]))
	}
}

// idleReader is a connection that can wait for bytes without holding a
// buffer (RawIO's on Linux): readIdle reads into *buf, setting it from
// readBuffers once there are bytes, and to nil while it waits.
type idleReader interface {
	readIdle(buf *[]byte) (int, error)
}

// aLongTimeAgo is a deadline in the past, which interrupts a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// errHandOff says the request is for net/http's server to answer.
var errHandOff = errors.New("h1: not a fast request")

// conn is one client connection on the fast path.
type conn struct {
	srv    *Server
	rwc    net.Conn
	io     net.Conn        // rwc's reads and writes (RawIO)
	ctx    context.Context // parent of the requests' contexts (see Serve)
	remote string
	state  atomic.Int32

	// buf[r:w] is read and not yet consumed.
	buf  []byte
	r, w int

	body   body
	resp   response
	header http.Header // the response header map (made on first use), cleared between requests
	fields Fields      // the request's fields, reused between requests (keptFields)

	// headDeadline is the header deadline of the head being read, zero
	// while none runs: from the accept for the first (see newConn), from
	// its first byte for a later one. A hand-over keeps it (handedConn).
	headDeadline time.Time
	// afterPost says the last request was a POST: the next may be preceded
	// by a CRLF (see maxLeadingCRLF).
	afterPost bool
	// linger says the connection is to be closed as lingerTimeout
	// describes.
	linger bool
	// send bounds the writes of the answers (Server.SendTimeout).
	send sendBound

	// mu guards the client watch (see clientWatchDelay and watch.go), the
	// request's cancellation (cancel.go) and, while a request runs, the
	// read deadlines; between requests only the connection's goroutine
	// uses the deadlines.
	mu sync.Mutex

	// Read deadlines are applied lazily: a timer operation for each set
	// and each clear is most of what a deadline costs, and most are
	// undone before any read needs them (a handler bounding a body that is
	// already in buf). rdWant is the deadline the next read of the socket
	// is to have, rdSet the one the socket has; applyReadDeadline makes
	// them one before each read. A deadline the socket keeps while nothing
	// reads it bounds nothing. socketRead says a body read waits on the
	// socket, which a new deadline must reach at once, as net.Conn's does.
	rdWant, rdSet time.Time
	socketRead    bool
	// bodyClosing says the handler has returned and its body's reads are
	// being ended (requestBody.close): a read about to wait on the socket
	// fails instead.
	bodyClosing bool

	// The client watch. reqSeq numbers the requests; watchSeq is the
	// number of the last one the server's watch timer saw running.
	watch     watchState
	watchDone chan struct{}
	reqSeq    uint64
	watchSeq  uint64
	bodyDone  bool
	gone      bool // the client closed, or its connection failed
	peeked    [1]byte
	hasPeeked bool

	// The running request's context, or the last one's, and its cancel
	// (see cancelLocked); onCancel is what AfterCancel registered on it,
	// stopOnCancel the stop func AfterCancel returns (c.stopAfterCancel,
	// made once).
	reqCtx       context.Context
	cancel       context.CancelCauseFunc
	onCancel     func()
	stopOnCancel func() bool

	// detach is set by Detach while the handler runs: the answer outlives
	// the handler, and detach runs once the connection's goroutine has let
	// go of it (detach.go). onDetachedCancel is Detach's cancelled,
	// guarded by mu.
	detach           func()
	onDetachedCancel func()
}

type watchState uint8

const (
	watchOff       watchState = iota // no request runs
	watchWaiting                     // a request runs, not yet for two ticks
	watchAfterBody                   // its ticks passed while the body was being read
	watchReading                     // a goroutine reads the connection
)

func newConn(s *Server, rwc net.Conn, ctx context.Context) *conn {
	c := &conn{srv: s, rwc: rwc, io: RawIO(rwc), ctx: ctx, remote: rwc.RemoteAddr().String()}
	c.state.Store(stateActive)
	c.body.c = c
	c.send.init(rwc, s.SendTimeout)
	if d := s.std.ReadHeaderTimeout; d > 0 {
		// As net/http: the first head's time runs from the accept (just
		// made), not from its first byte, so that a connection that sends
		// nothing is not held for an idle timeout.
		c.headDeadline = time.Now().Add(d)
	}
	if ctx.Done() == nil {
		// The requests' contexts are cancelled by c alone (a base with a
		// deadline cancels them itself): AfterCancel finds c through
		// them.
		c.ctx = context.WithValue(ctx, connKey{}, c)
		c.stopOnCancel = c.stopAfterCancel
	}
	return c
}

func (c *conn) maxHead() int {
	n := c.srv.std.MaxHeaderBytes
	if n <= 0 {
		n = http.DefaultMaxHeaderBytes
	}
	// As net/http: the limit is on the header bytes, and the request line
	// gets 4 KiB of slack.
	return n + 4096
}

// serve reads requests and answers them until the connection closes, is
// handed over, or carries a detached answer (detach.go).
func (c *conn) serve() {
	handedOff := false
	var ready func()
	defer func() {
		if v := recover(); v != nil {
			// A bug of this package (handler panics are recovered where the
			// handler runs): log it, as net/http does, and drop the connection.
			c.srv.logf("h1: panic serving %s: %v\n%s", c.remote, v, stack())
			ready = nil
		}
		switch {
		case ready != nil:
			// The answer is the Detached's now, and the connection with it.
			ready()
		case handedOff:
			c.forget()
		default:
			c.close()
		}
	}()
	for {
		h, err := c.readHead()
		if err == errHandOff {
			handedOff = c.handOff()
			return
		}
		if err != nil {
			return
		}
		if !c.serveRequest(&h) {
			return
		}
		if c.detach != nil {
			ready, c.detach = c.detach, nil
			return
		}
	}
}

// close closes the connection, once no request runs on it, and forgets
// it.
func (c *conn) close() {
	c.state.Store(stateClosed)
	if c.linger {
		c.closeWriteAndWait()
	}
	c.rwc.Close()
	putReadBuffer(c.buf)
	c.buf, c.r, c.w = nil, 0, 0
	c.forget()
}

// forget ends the server's part in a connection closed or handed over:
// a watch tick still to come does nothing, and Shutdown no longer waits
// for it.
func (c *conn) forget() {
	c.mu.Lock()
	if c.watch != watchReading {
		c.watch = watchOff
	}
	c.mu.Unlock()
	c.srv.untrack(c)
}

// readHead reads the next request's head. It returns errHandOff for a
// request that is not of the fast shape; its bytes are still in buf.
func (c *conn) readHead() (head, error) {
	if c.buf == nil {
		c.buf = getReadBuffer()
	}
	waited := c.r == c.w
	if waited {
		c.r, c.w = 0, 0
		if err := c.waitRequest(); err != nil {
			return head{}, err
		}
	}
	if c.afterPost {
		if err := c.skipLeadingCRLF(waited); err != nil {
			return head{}, err
		}
	}
	searched := 0
	deadline := false
	for {
		end, bare := headEnd(c.buf[c.r:c.w], searched)
		if bare {
			return head{}, errHandOff
		}
		if end > c.maxHead() {
			// Whole, but past the limit (the buffer holds a byte more, to
			// see the limit passed): net/http answers 431.
			return head{}, errHandOff
		}
		if end >= 0 {
			h, ok := parseHead(string(c.buf[c.r:c.r+end]), c.fields[:0])
			if !ok {
				return head{}, errHandOff
			}
			c.fields = h.fields // its array, perhaps grown, for the next
			c.r += end
			c.headDeadline = time.Time{}
			return h, nil
		}
		if c.w-c.r >= c.maxHead() {
			return head{}, errHandOff // net/http answers 431
		}
		if !deadline {
			// The head is not whole: it gets ReadHeaderTimeout from its
			// first byte, just read (and no idle deadline any more), or
			// from the accept for the first.
			deadline = true
			if d := c.srv.std.ReadHeaderTimeout; d > 0 && c.headDeadline.IsZero() {
				c.headDeadline = time.Now().Add(d)
			}
			c.rdWant = c.headDeadline
		}
		searched = c.w - c.r
		c.makeRoom()
		c.applyReadDeadline()
		n, err := c.io.Read(c.buf[c.w:])
		c.w += n
		if err != nil && n == 0 {
			return head{}, err
		}
	}
}

// waitRequest waits, idle, for the first bytes of a request: until the
// header deadline for the first (see newConn), the idle deadline for
// the others.
func (c *conn) waitRequest() error {
	c.rdWant = c.headDeadline
	if c.headDeadline.IsZero() {
		c.wantIdleDeadline()
	}
	return c.waitBytes()
}

// wantIdleDeadline makes the idle deadline the one the next read of the
// socket is to have: none without IdleTimeout.
func (c *conn) wantIdleDeadline() {
	c.rdWant = time.Time{}
	if d := c.srv.std.IdleTimeout; d > 0 {
		// The idle deadline of an earlier wait is kept while it is at
		// least IdleTimeout away (see idleSlack).
		earliest := time.Now().Add(d)
		c.rdWant = c.rdSet
		if c.rdSet.Before(earliest) || c.rdSet.After(earliest.Add(d/idleSlack)) {
			c.rdWant = earliest.Add(d / idleSlack)
		}
	}
}

// waitBytes waits, idle, for bytes to read into buf, which is empty, with
// the read deadline wanted.
func (c *conn) waitBytes() error {
	c.applyReadDeadline()
	if !c.state.CompareAndSwap(stateActive, stateIdle) || c.srv.closing.Load() {
		return net.ErrClosed
	}
	var n int
	var err error
	if ir, ok := c.io.(idleReader); ok && cap(c.buf) == readBufferSize {
		n, err = ir.readIdle(&c.buf)
	} else {
		n, err = c.io.Read(c.buf)
	}
	if !c.state.CompareAndSwap(stateIdle, stateActive) {
		return net.ErrClosed // Shutdown closed it
	}
	c.w = n
	if n == 0 {
		if err == nil {
			err = io.ErrNoProgress
		}
		return err
	}
	// The idle deadline stays on the socket: a request's reads of it
	// apply the request's deadline first.
	return nil
}

// skipLeadingCRLF drops the CR and LF bytes, up to maxLeadingCRLF, that
// start what comes after a POST, as net/http does; it waits for the bytes
// that follow them as for a request, idle, with one idle deadline for all
// its waits (as net/http's one Peek): the one of the wait before
// (waited), or one set at its first wait (the CR came with the body).
// What is left to read starts with another byte, or is empty after
// maxLeadingCRLF of them (the head's wait then begins, as net/http's).
func (c *conn) skipLeadingCRLF(waited bool) error {
	for range maxLeadingCRLF {
		if c.r == c.w {
			c.r, c.w = 0, 0
			if !waited {
				waited = true
				c.wantIdleDeadline()
			}
			if err := c.waitBytes(); err != nil {
				return err
			}
		}
		if b := c.buf[c.r]; b != '\r' && b != '\n' {
			return nil
		}
		c.r++
	}
	return nil
}

// applyReadDeadline gives the socket the wanted read deadline, before a
// read. While a request runs, c.mu is held.
func (c *conn) applyReadDeadline() error {
	if c.rdSet.Equal(c.rdWant) {
		return nil
	}
	c.rdSet = c.rdWant
	return c.rwc.SetReadDeadline(c.rdWant)
}

// setReadDeadline sets the deadline of a request's later reads of the
// socket: the body's (a handler's, through http.ResponseController), and
// the watch's. A read already waiting on the socket gets it at once.
func (c *conn) setReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdWant = t
	if c.socketRead || c.watch == watchReading {
		return c.applyReadDeadline()
	}
	return nil
}

// makeRoom makes room at buf[w:] for another read: it moves what is
// unread to the front, or grows buf up to the head limit.
func (c *conn) makeRoom() {
	if c.w < len(c.buf) {
		return
	}
	if c.r > 0 {
		c.w = copy(c.buf, c.buf[c.r:c.w])
		c.r = 0
		return
	}
	nb := make([]byte, min(2*len(c.buf), c.maxHead()+1))
	c.w = copy(nb, c.buf[c.r:c.w])
	c.r = 0
	c.buf = nb
}

// handOff gives the connection, with what was read of it, to the wrapped
// server, and the header deadline of the head it has begun.
func (c *conn) handOff() bool {
	if !c.rdSet.IsZero() {
		// net/http is given the connection as it accepts one, without a
		// deadline: it sets none before some reads (an h2c preface's,
		// without ReadHeaderTimeout). Its first one is the header
		// deadline, which handedConn keeps no later than headDeadline.
		c.rwc.SetReadDeadline(time.Time{})
	}
	c.send.mu.Lock()
	if !c.send.set.IsZero() {
		c.rwc.SetWriteDeadline(time.Time{}) // nor a write deadline
	}
	c.send.mu.Unlock()
	pending := append([]byte(nil), c.buf[c.r:c.w]...)
	putReadBuffer(c.buf)
	c.buf = nil
	return c.srv.handoff.give(newHandedConn(c.rwc, pending, c.headDeadline, c.srv.SendTimeout))
}

// closeWriteAndWait closes the connection's write side, after an answer
// sent while the request's body was still coming, then reads and drops
// what arrives until the client closes, for lingerTimeout at most: see
// lingerTimeout. net/http's does the same for its connections
// (handedConn lets it close their write side).
func (c *conn) closeWriteAndWait() {
	if cw, ok := c.rwc.(closeWriter); ok {
		cw.CloseWrite()
	}
	if c.rwc.SetReadDeadline(time.Now().Add(lingerTimeout)) != nil {
		return
	}
	buf := c.buf
	if buf == nil {
		buf = getReadBuffer()
		defer putReadBuffer(buf)
	}
	for range maxLingerReads {
		if _, err := c.io.Read(buf); err != nil {
			return
		}
	}
}

// serveRequest answers one request; it reports whether the connection can
// carry another.
func (c *conn) serveRequest(h *head) bool {
	ctx, cancel := context.WithCancelCause(c.ctx)
	x := new(servedRequest)
	x.url = h.url
	var reqBody io.ReadCloser = http.NoBody
	var rb *requestBody
	if h.contentLength > 0 {
		c.body.remain = h.contentLength
		x.body.b = &c.body
		rb = &x.body
		reqBody = rb
	}
	c.body.err = nil
	fh, _ := c.srv.std.Handler.(FieldsHandler)
	var header http.Header
	if fh == nil {
		header = h.fields.Header()
	}
	r := http.Request{
		Method:        h.method,
		URL:           &x.url,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Body:          reqBody,
		ContentLength: h.contentLength,
		Host:          h.host,
		RemoteAddr:    c.remote,
		RequestURI:    h.target,
		Close:         h.close,
	}
	// WithContext's copy stays on the stack: the request is x's.
	x.req = *r.WithContext(ctx)
	req := &x.req
	c.afterPost = h.method == http.MethodPost
	w := &c.resp
	w.reset(c, req, rb, c.header)
	w.closeAfter = h.wantsClose
	c.armWatch(ctx, cancel, h.contentLength == 0)
	if base := c.srv.base; base != nil && base.Err() != nil {
		// Ended before cancelRequests could see this request.
		cancel(context.Cause(base))
	}

	aborted := c.runHandler(w, req, fh, h.fields)
	if c.detach != nil && !aborted {
		// The answer goes on without its handler (detach.go): the request
		// stays running, and its context live.
		c.releaseFields()
		rb.close(c)
		c.detached()
		return true
	}
	c.detach = nil
	c.endRequest()
	c.releaseFields()
	rb.close(c)
	if aborted {
		return false
	}
	w.finish()
	// A handler's write deadline bounds its answer, to the end (as
	// net/http's), and no more.
	c.send.clearAsked()
	if w.err != nil || w.closeAfter || c.gone {
		// With the body still coming, the client may not read the answer
		// before it has sent it all: closed at once, the connection would
		// reset, answer and all.
		c.linger = w.err == nil && !c.gone && c.body.remain > int64(c.w-c.r)
		return false
	}
	w.release()
	clear(c.header)
	return !c.srv.closing.Load()
}

// servedRequest is a request the fast path serves: its *http.Request, with
// the URL and the Body it points to, in one allocation. Each request has
// its own, as net/http's do, so that a handler may keep r after it
// returns (an access log written later, a goroutine it started): what it
// reads there stays this request's. The body's reads end when the handler
// returns (requestBody.close), as net/http's, for a handler that read it
// later would read the connection's next request.
type servedRequest struct {
	req  http.Request
	url  url.URL
	body requestBody
}

// runHandler runs the handler, with the request's fields when it is a
// FieldsHandler; aborted reports a panic, after which the answer is cut
// off (http.ErrAbortHandler is how a handler asks for that).
func (c *conn) runHandler(w *response, req *http.Request, fh FieldsHandler, f Fields) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				c.srv.logf("http: panic serving %s: %v\n%s", c.remote, v, stack())
			}
			aborted = true
		}
	}()
	if fh != nil {
		fh.ServeFields(w, req, f)
	} else {
		c.srv.std.Handler.ServeHTTP(w, req)
	}
	return false
}

// keptFields is the most fields a connection's list keeps room for
// between requests: a head of more (up to maxHeaderLines) gets a list of
// its own, dropped after it, so that a few large heads cannot make every
// idle connection hold 8 KiB.
const keptFields = 32

// releaseFields ends the request's hold on the fields list: its strings
// (substrings of the head) are cleared, so that an idle connection keeps
// no head in memory, and a large list is dropped.
func (c *conn) releaseFields() {
	if cap(c.fields) > keptFields {
		c.fields = nil
		return
	}
	clear(c.fields[:cap(c.fields)])
	c.fields = c.fields[:0]
}

// discardBody reads and drops what the handler has not read of the body,
// up to maxDiscardBody, as net/http does when the answer's head is
// written: a client that sends its whole request before it reads the
// answer would otherwise be stuck. It reports whether the connection can
// carry another request: not after a failed body read, nor past the limit.
// rb is the request's Body (nil without one): its lock keeps a read of
// the handler's out while this one reads.
func (c *conn) discardBody(rb *requestBody) bool {
	if rb != nil {
		rb.mu.Lock()
		defer rb.mu.Unlock()
	}
	if c.body.err != nil || c.body.remain >= maxDiscardBody {
		return false
	}
	if c.body.remain > 0 {
		// net/http waits for the rest as long as the client likes; a
		// client that stalls here holds the answer back, so it gets
		// discardTimeout, then the connection closes after the answer.
		c.setReadDeadline(time.Now().Add(discardTimeout))
		io.Copy(io.Discard, &c.body)
		c.setReadDeadline(time.Time{})
	}
	return c.body.err == nil && c.body.remain == 0
}

func stack() []byte {
	buf := make([]byte, 64<<10)
	return buf[:runtime.Stack(buf, false)]
}

// requestBody is a request's Body: the connection's body while the
// handler runs. Its reads are locked, so that the connection's own
// (discardBody) and the end of the request (close) wait for a read of the
// handler's; after close they return http.ErrBodyReadAfterClose, as
// net/http's do once the handler has returned.
type requestBody struct {
	mu     sync.Mutex
	b      *body
	closed bool
}

func (rb *requestBody) Read(p []byte) (int, error) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return rb.b.Read(p)
}

// Buffered reports whether the rest of the body has already been read
// from the connection (a small body arrives with its head): reading it
// cannot wait for the client, so a deadline for it bounds nothing.
func (rb *requestBody) Buffered() bool {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.closed || rb.b.Buffered()
}

// Close is a no-op: the unread rest of a body is dropped, or the
// connection closed, once the handler has returned.
func (rb *requestBody) Close() error { return nil }

// close ends the handler's reads of the body, once it has returned. A read
// still running (a goroutine the handler left behind) is waited for; if it
// waits on the socket, or is about to, it is interrupted first, so that
// the connection does not wait for the client: that body then failed, and
// the connection closes after the answer. rb may be nil (no body).
func (rb *requestBody) close(c *conn) {
	if rb == nil {
		return
	}
	// A body's reads are over when its handler returns, but for a
	// handler that left one running: the lock is free.
	if !rb.mu.TryLock() {
		c.mu.Lock()
		c.bodyClosing = true
		if c.socketRead {
			c.rdSet = aLongTimeAgo
			c.rwc.SetReadDeadline(aLongTimeAgo)
		}
		c.mu.Unlock()
		rb.mu.Lock()
		c.mu.Lock()
		c.bodyClosing = false
		c.mu.Unlock()
	}
	rb.closed = true
	rb.mu.Unlock()
}

// errBodyAbandoned is the error of a body read its handler left running.
var errBodyAbandoned = errors.New("h1: request body read after its handler returned")

// body is a request body of known length, read from the connection's
// buffer, then from the connection.
type body struct {
	c      *conn
	remain int64
	err    error
}

func (b *body) Read(p []byte) (int, error) {
	if b.remain == 0 {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	c := b.c
	if int64(len(p)) > b.remain {
		p = p[:b.remain]
	}
	var n int
	if c.r < c.w {
		n = copy(p, c.buf[c.r:c.w])
		c.r += n
	} else {
		var err error
		n, err = c.readSocket(p)
		if err != nil && n == 0 {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			b.err = err
			return 0, err
		}
	}
	b.remain -= int64(n)
	if b.remain == 0 {
		c.bodyRead()
		return n, io.EOF
	}
	return n, nil
}

// Buffered reports whether the rest of the body has already been read
// from the connection (a small body arrives with its head): reading it
// cannot wait for the client, so a deadline for it bounds nothing.
func (b *body) Buffered() bool { return int64(b.c.w-b.c.r) >= b.remain }

// readSocket is a body's read of the socket, with the request's deadline.
func (c *conn) readSocket(p []byte) (int, error) {
	c.mu.Lock()
	if c.bodyClosing {
		c.mu.Unlock()
		return 0, errBodyAbandoned
	}
	c.applyReadDeadline()
	c.socketRead = true
	c.mu.Unlock()
	n, err := c.io.Read(p)
	c.mu.Lock()
	c.socketRead = false
	c.mu.Unlock()
	return n, err
}

// connWriter is what the fast path's answers are written to: the
// connection's RawIO, within the send bound. (A conversion of *conn: no
// allocation.)
type connWriter conn

func (w *connWriter) Write(p []byte) (int, error) {
	c := (*conn)(w)
	return c.send.write(c.io, p)
}

// writer is where an answer is written: the connection's RawIO, through
// the send bound when there is one.
func (c *conn) writer() io.Writer {
	if c.send.timeout > 0 {
		return (*connWriter)(c)
	}
	return c.io
}
