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

	body body
	resp response
	// req and url are the running request's, reused between requests: a
	// handler does not keep its request past its return (net/http's rule),
	// and they were two allocations of every request.
	req    http.Request
	url    url.URL
	header http.Header // the response header map, cleared between requests
	fields Fields      // the request's fields, reused between requests (keptFields)

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

// serve reads requests and answers them until the connection closes, or
// hands it over.
func (c *conn) serve() {
	handedOff := false
	defer func() {
		if v := recover(); v != nil {
			// A bug of this package (handler panics are recovered where the
			// handler runs): log it, as net/http does, and drop the connection.
			c.srv.logf("h1: panic serving %s: %v\n%s", c.remote, v, stack())
		}
		c.mu.Lock()
		if c.watch != watchReading {
			c.watch = watchOff // a tick still to come does nothing
		}
		c.mu.Unlock()
		if !handedOff {
			c.state.Store(stateClosed)
			c.rwc.Close()
			putReadBuffer(c.buf)
			c.buf, c.r, c.w = nil, 0, 0
		}
		c.srv.untrack(c)
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
	}
}

// readHead reads the next request's head. It returns errHandOff for a
// request that is not of the fast shape; its bytes are still in buf.
func (c *conn) readHead() (head, error) {
	if c.buf == nil {
		c.buf = getReadBuffer()
	}
	if c.r == c.w {
		c.r, c.w = 0, 0
		if err := c.waitRequest(); err != nil {
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
		if end >= 0 {
			h, ok := parseHead(string(c.buf[c.r:c.r+end]), c.fields[:0], &c.url)
			if !ok {
				return head{}, errHandOff
			}
			c.fields = h.fields // its array, perhaps grown, for the next
			c.r += end
			return h, nil
		}
		if c.w-c.r >= c.maxHead() {
			return head{}, errHandOff // net/http answers 431
		}
		if !deadline {
			// The head is not whole: it gets ReadHeaderTimeout from now
			// (and no idle deadline any more).
			deadline = true
			c.rdWant = time.Time{}
			if d := c.srv.std.ReadHeaderTimeout; d > 0 {
				c.rdWant = time.Now().Add(d)
			}
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

// waitRequest waits, idle, for the first bytes of a request.
func (c *conn) waitRequest() error {
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
// server.
func (c *conn) handOff() bool {
	if !c.rdSet.IsZero() {
		// net/http is given the connection as it accepts one, without a
		// deadline: it sets none before some reads (an h2c preface's,
		// without ReadHeaderTimeout).
		c.rwc.SetReadDeadline(time.Time{})
	}
	pending := append([]byte(nil), c.buf[c.r:c.w]...)
	putReadBuffer(c.buf)
	c.buf = nil
	return c.srv.handoff.give(&replayConn{Conn: c.rwc, pending: pending})
}

// serveRequest answers one request; it reports whether the connection can
// carry another.
func (c *conn) serveRequest(h *head) bool {
	ctx, cancel := context.WithCancelCause(c.ctx)
	var reqBody io.ReadCloser = http.NoBody
	if h.contentLength > 0 {
		c.body.remain = h.contentLength
		reqBody = &c.body
	}
	c.body.err = nil
	fh, _ := c.srv.std.Handler.(FieldsHandler)
	var header http.Header
	if fh == nil {
		header = h.fields.Header()
	}
	r := http.Request{
		Method:        h.method,
		URL:           h.url,
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
	// WithContext's copy stays on the stack: the request is c's.
	c.req = *r.WithContext(ctx)
	req := &c.req
	if c.header == nil {
		c.header = make(http.Header)
	}
	w := &c.resp
	w.reset(c, req, c.header)
	c.armWatch(ctx, cancel, h.contentLength == 0)
	if base := c.srv.base; base != nil && base.Err() != nil {
		// Ended before cancelRequests could see this request.
		cancel(context.Cause(base))
	}

	aborted := c.runHandler(w, req, fh, h.fields)
	c.endRequest()
	c.releaseFields()
	if aborted {
		return false
	}
	w.finish()
	if w.err != nil || w.closeAfter || c.gone {
		return false
	}
	w.release()
	clear(c.header)
	// An idle connection keeps nothing of its last request: the request
	// and its URL point into the head, and at its context.
	c.req, c.url = http.Request{}, url.URL{}
	return !c.srv.closing.Load()
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
func (c *conn) discardBody() bool {
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
	c.applyReadDeadline()
	c.socketRead = true
	c.mu.Unlock()
	n, err := c.io.Read(p)
	c.mu.Lock()
	c.socketRead = false
	c.mu.Unlock()
	return n, err
}

// Close is a no-op: the unread rest of a body is dropped, or the
// connection closed, once the handler has returned.
func (b *body) Close() error { return nil }
