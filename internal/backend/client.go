package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/internal/h1"
)

// The limits of Client's pool, those tether's http.Transport had.
const (
	maxIdleConnsPerBackend = 256
	maxIdleConns           = 1024
	idleConnTimeout        = 90 * time.Second
	// max1xxResponses bounds the informational answers (100 Continue, 103
	// Early Hints) skipped before the final one, as net/http does.
	max1xxResponses = 5
	// maxResponseHeadBytes bounds what is read of the socket while the
	// head of an answer is read (each 1xx answer gets it anew):
	// http.Transport's MaxResponseHeaderBytes default.
	maxResponseHeadBytes = 10 << 20
	// headStallTimeout bounds how long the rest of an answer's head may
	// take once its first bytes have come: a backend that stalls mid-head
	// holds a connection, a goroutine and a buffer until the client
	// leaves otherwise. (Nothing bounds the wait for the first byte: a
	// tool call may run for minutes, and the client's context ends it.)
	// net/http's server gives a request head ReadHeaderTimeout, tether's
	// own default 10 s.
	headStallTimeout = 10 * time.Second
)

// Client is tether's HTTP/1.1 client for backends. A request is written and
// its answer read on the goroutine that calls RoundTrip (and reads the
// body), over keep-alive connections kept in a pool per backend.
//
// It replaces http.Transport on this path for what that transport costs per
// request: two goroutines per connection (readLoop and writeLoop) that the
// caller hands each request and each answer to over channels, a futex
// wake-up on another thread each time. Answers are read by
// h1.ReadAnswer: http.ReadResponse's result, without its textproto
// allocations or a header map, and a body read with none. Nothing here
// reads an idle connection, so the backend's FIN on an idle connection is
// seen by peeking at the socket before the request is written
// (stateProbe), where net/http's readLoop would have noticed it.
//
// A request is sent again on another connection only as the retry
// contract allows (retry.go): when the backend cannot have had all of it
// (a pooled connection the backend had left, seen by the peek before the
// write; a write that failed before the request's last byte), or when it is
// idempotent and no byte of its answer came. Every other failure is
// returned, marked with what the backend may have seen.
type Client struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// headStallTimeout is headStallTimeout (tests shorten it).
	headStallTimeout time.Duration

	mu    sync.Mutex
	idle  map[string][]*clientConn // per backend address, most recently used last
	nidle int
	sweep *time.Timer // closes connections idle longer than idleConnTimeout
	swept bool        // sweep is armed

	// tls carries requests to https backends (an EndpointSlice port with
	// appProtocol https, an https:// in --backends): http.Transport with
	// the same limits, made at the first such request.
	tlsOnce sync.Once
	tls     atomic.Pointer[http.Transport]
}

// NewClient returns a Client that dials backends with dial.
func NewClient(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *Client {
	return &Client{dial: dial, idle: make(map[string][]*clientConn), headStallTimeout: headStallTimeout}
}

// clientConn is one keep-alive connection to a backend. It is used by one
// request at a time: RoundTrip, then the response body's reader.
type clientConn struct {
	c    *Client
	addr string
	conn net.Conn
	// br reads the answers; it is taken from backendReaders for a
	// request and given back when the connection goes idle.
	br *bufio.Reader
	// probe peeks at the socket before a request is written into a
	// reused connection; probed is false when it cannot (no descriptor).
	probe  stateProbe
	probed bool
	reused bool
	// unanswered is set when a request is written and cleared by the
	// first byte read after it; written counts the bytes of the current
	// request that reached the socket (a write that fails short of the
	// request's end is a notSentError, see writeFailed).
	unanswered bool
	written    int64
	// readLimit is what may still be read of the socket: the rest of
	// maxResponseHeadBytes while a head is read, unbounded otherwise.
	readLimit int64
	// inHead is set while a head is read, headStall once its first bytes
	// came and a read deadline (headStallTimeout) was set for the rest.
	// A head that arrives in one read sets no deadline.
	inHead, headStall bool
	// The request's last bytes (all of a request that fits the writer's
	// buffer), held for the first read of the answer to write (see Read):
	// holdWrite makes Write keep them in pending, a slice of held's
	// buffer, instead of writing them; writeErr is their write's failure.
	holdWrite bool
	pending   []byte
	held      *bufio.Writer
	writeErr  error
	idleSince time.Time
	// stop unregisters the current request's h1.AfterCancel, abortFunc
	// (pc.abort, made once rather than for each request); aborted is set
	// by that func, which closes the connection.
	stop      func() bool
	abortFunc func()
	aborted   atomic.Bool
	// connMu guards conn against the goroutines that close it (abort, a
	// body's Close) while Park swaps it; connClosed says one did.
	connMu     sync.Mutex
	connClosed bool
}

// Read reads the answer. The request has been written in full by then,
// but for its last bytes: the first read of an answer writes what the
// request held back (pending), in the same wait as the read
// (h1.WriteThenRead), so that no read is tried before the answer can have
// come; that write's failure is returned as it is, and kept in writeErr.
func (pc *clientConn) Read(p []byte) (int, error) {
	if pc.readLimit <= 0 {
		return 0, errHeadTooLong
	}
	if int64(len(p)) > pc.readLimit {
		p = p[:pc.readLimit]
	}
	if pc.inHead && !pc.headStall && pc.readLimit < maxResponseHeadBytes {
		// Part of the head is in: the rest gets headStallTimeout.
		pc.headStall = true
		pc.conn.SetReadDeadline(time.Now().Add(pc.c.headStallTimeout))
	}
	var n int
	var err error
	if pc.pending != nil {
		var written int
		written, n, err = h1.WriteThenRead(pc.conn, pc.pending, p)
		pc.written += int64(written)
		short := written < len(pc.pending)
		pc.releaseHeld()
		if short {
			pc.writeErr = err
			return 0, err
		}
	} else {
		n, err = pc.conn.Read(p)
	}
	pc.readLimit -= int64(n)
	if n > 0 {
		pc.unanswered = false
	}
	return n, err
}

// Write counts the bytes of the request that reached the socket. Under
// holdWrite, it keeps p for the answer's first read to write instead.
func (pc *clientConn) Write(p []byte) (int, error) {
	if pc.holdWrite {
		pc.pending = p
		return len(p), nil
	}
	n, err := pc.conn.Write(p)
	pc.written += int64(n)
	return n, err
}

// abort runs once the request's context is cancelled: closing the
// connection ends a blocked write or read on it, with no goroutine waiting
// per request.
func (pc *clientConn) abort() {
	pc.aborted.Store(true)
	pc.closeConn()
}

// closeConn closes the connection from any goroutine: one that closes it
// while the reader's Park swaps it for its sleeping form (h1.Sleep) closes
// the one in place after the swap.
func (pc *clientConn) closeConn() {
	pc.connMu.Lock()
	pc.connClosed = true
	conn := pc.conn
	pc.connMu.Unlock()
	conn.Close()
}

func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.URL.Host == "" {
		closeRequestBody(req)
		return nil, errors.New("tether: backend request without a host")
	}
	if req.URL.Scheme != "http" {
		c.tlsOnce.Do(func() { c.tls.Store(newHTTPTransport(c.dial)) })
		return c.tls.Load().RoundTrip(req)
	}
	ctx := req.Context()
	if req.ContentLength == 0 && req.Body != nil && req.Body != http.NoBody {
		// An empty body of unknown type would be sent chunked after
		// Request.Write's probe of it; there is nothing to send.
		req.Body.Close()
		again := *req
		again.Body = http.NoBody
		req = &again
	}
	a, err := c.send(ctx, DialAddr(req.URL.Host), request{req: req})
	if err != nil {
		return nil, err
	}
	return a.HTTPResponse(), nil
}

// Send sends a Request. The answer's header is the list of fields it
// came with: no map is built.
func (c *Client) Send(d *Request) (*h1.Answer, error) {
	return c.send(d.Client.Context(), DialAddr(d.URL.Host), request{direct: d})
}

// request is a request for the client to write: an *http.Request
// (RoundTrip), or a Request (Send), which has no header map.
type request struct {
	req    *http.Request
	direct *Request
}

// write writes the request to bw.
func (r request) write(bw *bufio.Writer) error {
	if r.direct != nil {
		return r.direct.Write(bw)
	}
	return h1.WriteRequest(bw, r.req)
}

// http is the request the answer is read for (its method says whether
// the answer has a body): a direct request's client's, whose method it
// has.
func (r request) http() *http.Request {
	if r.direct != nil {
		return r.direct.Client
	}
	return r.req
}

// replayableBody reports whether the body can be sent again: a direct
// request's is in memory.
func (r request) replayableBody() bool {
	if r.direct != nil {
		return true
	}
	req := r.req
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// idempotent reports a request that may be sent again after it may have
// reached the backend: net/http's Request.isReplayable without the body
// check (a safe method, or an Idempotency-Key), and for a direct request
// what the proxy says of it (an MCP method that only reads, see
// readOnlyMethod).
func (r request) idempotent() bool {
	if d := r.direct; d != nil {
		return d.Idempotent
	}
	return idempotentHTTP(r.req.Method, r.req.Header)
}

// idempotentHTTP is net/http's rule: a safe method, or a request that
// carries an Idempotency-Key.
func idempotentHTTP(method string, h http.Header) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := h["Idempotency-Key"]
	_, b := h["X-Idempotency-Key"]
	return a || b
}

// closes reports a request that asks for the connection to be closed.
func (r request) closes() bool { return r.direct == nil && r.req.Close }

// closeBody closes the body of a request that will not be written, as a
// RoundTripper must.
func (r request) closeBody() {
	if r.req != nil {
		closeRequestBody(r.req)
	}
}

// send makes attempts on pooled or new connections to addr until one
// gets an answer or fails in a way the retry contract does not let it
// repeat here: a failure on a new connection is returned (the backend may
// be going away; the caller decides, see mayResend), as is every failure
// the backend may have acted on.
func (c *Client) send(ctx context.Context, addr string, r request) (*h1.Answer, error) {
	for {
		resp, pc, err := c.roundTrip(ctx, addr, r)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if pc == nil || !pc.reused || !r.replayableBody() || !MayResend(err, r.idempotent() && pc.unanswered) {
			return nil, err
		}
		if req := r.req; req != nil && req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			again := *req
			again.Body = body
			r.req = &again
		}
	}
}

// roundTrip makes one attempt on one connection. pc is the connection the
// request was written into, nil when none could be had.
func (c *Client) roundTrip(ctx context.Context, addr string, r request) (*h1.Answer, *clientConn, error) {
	pc, err := c.conn(ctx, addr)
	if err != nil {
		r.closeBody()
		return nil, nil, err
	}
	// h1.AfterCancel is context.AfterFunc without its allocations for
	// the context of a request h1 serves.
	pc.aborted.Store(false)
	pc.stop = h1.AfterCancel(ctx, pc.abortFunc)
	pc.written, pc.unanswered = 0, true
	req := r.http()
	bw := backendWriters.Get().(*bufio.Writer)
	bw.Reset(pc)
	err = r.write(bw)
	if err == nil {
		// What is left in bw goes out with the answer's first read.
		pc.holdWrite = true
		err = bw.Flush()
		pc.holdWrite = false
	}
	pc.held = bw
	if pc.pending == nil {
		pc.releaseHeld()
	}
	if pc.br == nil {
		pc.br = backendReaders.Get().(*bufio.Reader)
		pc.br.Reset(pc)
	}
	if err != nil {
		return pc.writeFailed(req, err)
	}
	var resp *h1.Answer
	for range max1xxResponses + 1 {
		resp, err = pc.readResponse(req)
		if err != nil || resp.StatusCode >= 200 || resp.StatusCode < 100 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		resp.Body.Close() // an informational answer has no body
		resp = nil
	}
	if err == nil && resp == nil {
		err = errors.New("tether: too many 1xx answers from the backend")
	}
	pc.releaseHeld() // written by the first read, unless it never came
	if werr := pc.writeErr; werr != nil {
		pc.writeErr = nil
		return pc.writeFailed(req, werr)
	}
	if err != nil {
		pc.close()
		return nil, pc, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Never asked for (forward.go refuses it); the connection is
		// no longer HTTP.
		resp.Body = &clientBody{pc: pc, rc: resp.Body, reuse: false}
		return resp, pc, nil
	}
	reuse := !r.closes()
	if resp.Body == http.NoBody {
		pc.release(reuse && resp.Reusable(pc.br))
		return resp, pc, nil
	}
	resp.Body = &clientBody{pc: pc, rc: resp.Body, reuse: reuse, answer: resp}
	return resp, pc, nil
}

// writeFailed ends a request whose write failed: the backend's early
// answer, if it sent one, else err, marked as a request the backend did
// not get whole (see notSentError).
func (pc *clientConn) writeFailed(req *http.Request, err error) (*h1.Answer, *clientConn, error) {
	if resp := pc.earlyAnswer(req); resp != nil {
		return resp, pc, nil
	}
	pc.close()
	return nil, pc, &notSentError{err: err, written: pc.written}
}

// releaseHeld gives the writer whose buffer held the request's last bytes
// back to the pool, once they are written or will not be.
func (pc *clientConn) releaseHeld() {
	pc.pending = nil
	if bw := pc.held; bw != nil {
		pc.held = nil
		bw.Reset(nil)
		backendWriters.Put(bw)
	}
}

// readResponse reads the head of an answer to req, within
// maxResponseHeadBytes; the body is read as the caller reads it.
func (pc *clientConn) readResponse(req *http.Request) (*h1.Answer, error) {
	pc.readLimit = maxResponseHeadBytes
	pc.inHead = true
	resp, err := h1.ReadAnswer(pc.br, req)
	pc.inHead = false
	pc.readLimit = math.MaxInt64
	if pc.headStall {
		pc.headStall = false
		pc.conn.SetReadDeadline(time.Time{})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w (%v): %w", errHeadStalled, pc.c.headStallTimeout, err)
		}
	}
	return resp, err
}

// earlyAnswerWait bounds the wait for an answer after a failed write, as
// net/http waits for one (maxWriteWaitBeforeConnReuse).
const earlyAnswerWait = 50 * time.Millisecond

// earlyAnswer reads the answer a backend may have sent before it stopped
// reading the request (a 413 for a body it will not take, then a close
// that failed the write), so that the client gets that answer rather than
// a 502. The connection is not reused after it.
func (pc *clientConn) earlyAnswer(req *http.Request) *h1.Answer {
	if pc.written == 0 || pc.aborted.Load() {
		return nil
	}
	pc.conn.SetReadDeadline(time.Now().Add(earlyAnswerWait))
	resp, err := pc.readResponse(req)
	if err != nil || resp.StatusCode < 200 {
		return nil
	}
	pc.conn.SetReadDeadline(time.Time{})
	resp.Close = true
	resp.Body = &clientBody{pc: pc, rc: resp.Body, reuse: false}
	return resp
}

// conn takes the most recently used idle connection to addr that the
// backend has not left, or dials a new one.
func (c *Client) conn(ctx context.Context, addr string) (*clientConn, error) {
	for {
		pc := c.takeIdle(addr)
		if pc == nil {
			break
		}
		if pc.probed && pc.probe.peerGone() {
			pc.conn.Close() // it never carried this request: try the next
			continue
		}
		return pc, nil
	}
	conn, err := c.dialFor(ctx, addr)
	if err != nil {
		return nil, err
	}
	pc := &clientConn{c: c, addr: addr, conn: h1.RawIO(conn), readLimit: math.MaxInt64}
	pc.abortFunc = pc.abort
	pc.probed = pc.probe.init(conn)
	return pc, nil
}

// dialFor dials addr for a request whose context is ctx, within
// dialTimeout or ctx's deadline, whichever comes first. The dial runs
// under one context of its own, cancelled with ctx (h1.AfterCancel):
// a context derived from ctx (a timeout) would make ctx's Done channel
// and its children's map, which a request h1 serves would then keep for
// its life, and a stream's life is long (some 350 bytes of each open
// stream's). Its deadline is the dialer's too (net.Dialer derives no
// context of its own when the one it is given ends first): one context,
// whose parent cannot be cancelled, which links it to nothing, rather
// than a chain of up to three (456 bytes and 5 allocations less a dial,
// BenchmarkStreamOpen).
func (c *Client) dialFor(ctx context.Context, addr string) (net.Conn, error) {
	deadline := time.Now().Add(dialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		// ctx's deadline is the dial's own, so that it fails as a dial
		// past its deadline does (a timeout), not as a cancelled one.
		deadline = d
	}
	dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	stop := h1.AfterCancel(ctx, func() {
		if ctx.Err() != context.DeadlineExceeded {
			cancel() // send reports ctx's cause
		}
	})
	conn, err := c.dial(dctx, "tcp", addr)
	stop()
	return conn, err
}

func (c *Client) takeIdle(addr string) *clientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		conns := c.idle[addr]
		if len(conns) == 0 {
			return nil
		}
		pc := conns[len(conns)-1]
		conns[len(conns)-1] = nil
		// Emptied, the list stays, for put to append to without an
		// allocation (closeExpired drops it once the backend is quiet).
		c.idle[addr] = conns[:len(conns)-1]
		c.nidle--
		if time.Since(pc.idleSince) < idleConnTimeout {
			pc.reused = true
			return pc
		}
		pc.conn.Close()
	}
}

// release ends the current request on pc: back to the pool when reuse, the
// request's context did not close it, and nothing unasked for follows the
// answer; closed otherwise.
func (pc *clientConn) release(reuse bool) {
	if pc.stop != nil {
		if !pc.stop() {
			reuse = false // abortFunc ran: the connection is closed
		}
		pc.stop = nil
	}
	if !reuse || pc.aborted.Load() || pc.br.Buffered() > 0 || h1.Asleep(pc.conn) {
		// The reader is not pooled: a Close from another goroutine may
		// end a read still running in it. Nor is an event stream's
		// connection that slept (Park): its socket is registered with the
		// stream's poller under the sleeping descriptor, which only the
		// socket's close is sure to undo once that descriptor is gone; a
		// stream's end is rare, and the next request dials.
		pc.closeConn()
		return
	}
	// Only the goroutine that reads the answer gets here: the reader
	// goes back to the pool, and the idle connection holds no buffer,
	// nor the wait hook a parked stream set on it (Park).
	h1.OnWait(pc.conn, nil)
	pc.br.Reset(nil)
	backendReaders.Put(pc.br)
	pc.br = nil
	pc.c.put(pc)
}

// The buffers of backend connections, held only while a request is written
// (the writer) or its answer read (the reader): an idle connection of the
// pool holds neither, so the hundreds a burst leaves behind cost a socket
// and a small struct each, not 8 KiB.
var (
	backendReaders = sync.Pool{New: func() any { return bufio.NewReader(nil) }}
	backendWriters = sync.Pool{New: func() any { return bufio.NewWriter(nil) }}
)

// close ends the current request on pc and closes it.
func (pc *clientConn) close() { pc.release(false) }

func (c *Client) put(pc *clientConn) {
	pc.idleSince = time.Now()
	c.mu.Lock()
	if c.nidle >= maxIdleConns || len(c.idle[pc.addr]) >= maxIdleConnsPerBackend {
		c.mu.Unlock()
		pc.conn.Close()
		return
	}
	c.idle[pc.addr] = append(c.idle[pc.addr], pc)
	c.nidle++
	if !c.swept {
		c.swept = true
		if c.sweep == nil {
			c.sweep = time.AfterFunc(idleConnTimeout, c.closeExpired)
		} else {
			c.sweep.Reset(idleConnTimeout)
		}
	}
	c.mu.Unlock()
}

// closeExpired closes the connections idle for idleConnTimeout, and runs
// again when the oldest of the others expires.
func (c *Client) closeExpired() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.swept = false
	now := time.Now()
	var next time.Duration
	for addr, conns := range c.idle {
		keep := conns[:0]
		for _, pc := range conns {
			if age := now.Sub(pc.idleSince); age >= idleConnTimeout {
				pc.conn.Close()
				c.nidle--
			} else {
				keep = append(keep, pc)
				if left := idleConnTimeout - age; next == 0 || left < next {
					next = left
				}
			}
		}
		clear(conns[len(keep):])
		if len(keep) == 0 {
			delete(c.idle, addr)
		} else {
			c.idle[addr] = keep
		}
	}
	if next > 0 {
		c.swept = true
		c.sweep.Reset(next)
	}
}

// CloseIdleConnections closes every idle connection; those in use are
// closed when their request ends.
func (c *Client) CloseIdleConnections() {
	if t := c.tls.Load(); t != nil {
		t.CloseIdleConnections()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, conns := range c.idle {
		for _, pc := range conns {
			pc.conn.Close()
		}
		delete(c.idle, addr)
	}
	c.nidle = 0
}

// clientBody is a response body read on the caller's goroutine: at its
// clean end the connection goes back to the pool; closed early or failed,
// the connection is closed (what is left of the answer is not drained).
type clientBody struct {
	pc    *clientConn
	rc    io.ReadCloser
	reuse bool
	// answer is the answer whose body this is (h1.Answer.Reusable),
	// nil when the connection is not reused anyway.
	answer *h1.Answer
	state  atomic.Int32 // bodyOpen, bodyEOF or bodyClosed
	// parked: the reader went back to the pool (Park); Read's goroutine
	// only.
	parked bool
}

const (
	bodyOpen = iota
	bodyEOF
	bodyClosed
)

func (b *clientBody) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyEOF:
		return 0, io.EOF
	case bodyClosed:
		return 0, errBodyClosed
	}
	if b.parked {
		// Idle since Park: a reader again for the bytes that came.
		b.parked = false
		b.pc.br = backendReaders.Get().(*bufio.Reader)
		b.pc.br.Reset(b.pc)
		b.rc.(*h1.Body).SetReader(b.pc.br)
	}
	n, err := b.rc.Read(p)
	if err != nil {
		if err == io.EOF {
			// The answer's own test: its end certain, nothing after it.
			b.finish(bodyEOF, b.reuse && b.answer.Reusable(b.pc.br))
		} else {
			if b.pc.aborted.Load() {
				// The request's context ended the connection.
				err = context.Canceled
			}
			b.finish(bodyClosed, false)
		}
	}
	return n, err
}

// Park gives the body's read buffer back to the pool while the stream
// waits for its next bytes, if nothing is buffered in it, and returns the
// connection to wait on; the next Read takes a buffer again. A stream open
// for hours then holds a socket and a few structs, not a 4 KiB buffer.
// It must be called where Read is (not at the same time), never after
// Close. The connection is put to sleep (h1.Sleep: a descriptor, not a
// net.Conn, while the stream waits), or else is a RawIO one; the caller
// may hook its waits (h1.OnWait) while the body is its: the hook is
// cleared when the connection goes back to the pool.
func (b *clientBody) Park() (net.Conn, bool) {
	if b.parked {
		return b.pc.conn, true
	}
	body, ok := b.rc.(*h1.Body)
	pc := b.pc
	if !ok || b.state.Load() != bodyOpen || pc.br == nil || pc.br.Buffered() > 0 || pc.pending != nil {
		return nil, false
	}
	b.parked = true
	body.SetReader(nil)
	br := pc.br
	pc.br = nil
	br.Reset(nil)
	backendReaders.Put(br)
	// The connection sleeps too (h1.Sleep): its socket's descriptor alone,
	// not a net.Conn, until a read must wait. Its probe's hold on the
	// net.Conn goes with it: a connection that slept is not pooled again
	// (release).
	pc.connMu.Lock()
	if !pc.connClosed {
		if conn, ok := h1.Sleep(pc.conn); ok {
			pc.conn = conn
			pc.probe, pc.probed = stateProbe{}, false
		}
	}
	conn := pc.conn
	pc.connMu.Unlock()
	return conn, true
}

// Close closes the connection unless the body was read to its end; it may
// be called from another goroutine than Read's (the close unblocks it).
func (b *clientBody) Close() error {
	b.finish(bodyClosed, false)
	return nil
}

func (b *clientBody) finish(state int32, reuse bool) {
	if b.state.CompareAndSwap(bodyOpen, state) {
		b.pc.release(reuse)
	}
}

// closeRequestBody closes the body of a request that will not be written,
// as a RoundTripper must.
func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

var (
	errBodyClosed  = errors.New("http: read on closed response body")
	errHeadTooLong = errors.New("tether: the backend's answer has a head longer than 10 MiB")
	errHeadStalled = errors.New("tether: the backend stalled in the middle of its answer's head")
)
