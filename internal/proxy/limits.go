package proxy

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/internal/telemetry"

	"github.com/tether-mcp/tether/internal/h1"
)

// Defaults of the limits a Proxy enforces on what clients send
// (docs/design.md#limits).
const (
	// DefaultMaxInflightBodyBytes bounds the request-body bytes held at once
	// by all requests together (--max-inflight-body-bytes): 16 bodies at the
	// 4 MiB --max-body, or thousands of ordinary (1–4 KiB) MCP requests.
	DefaultMaxInflightBodyBytes = 64 << 20
	// DefaultBodyTimeout bounds the time a request body may take to arrive,
	// whole (--body-timeout). nginx's client_body_timeout is 60 s between
	// two reads; applied to the whole body, 60 s still lets a 4 MiB body
	// through at 0.6 Mbit/s, and a body that never arrives no longer holds
	// its connection for ever.
	DefaultBodyTimeout = 60 * time.Second
	// DefaultMaxStreams bounds the GET (server-to-client SSE) streams open
	// through tether at once (--max-streams). An MCP session holds at most
	// one, so this is the number of clients that can listen at once. A
	// parked stream costs some 4.6 KB of RSS (cmd/tether's streamMemCost),
	// so the bound is about 46 MB: a ceiling against runaway growth where
	// no memory limit says more (with one, the default follows from it).
	DefaultMaxStreams = 10000
)

// Sizes of the request-body buffer. It starts at the announced length when
// that is small (one allocation, the common case), else at bodyChunk, and
// doubles as bytes arrive, up to the announced length (or --max-body + 1
// when none is announced). An announced Content-Length therefore costs at
// most bodyChunk before a byte of the body has arrived.
const (
	bodyChunk        = 16 << 10
	bodyChunkUnknown = 1 << 10 // first buffer of a body of unknown length (chunked)
)

// streamCopyBufferSize is the copy buffer of a GET stream's response. A
// stream idles for its whole life holding its buffer; server-to-client
// messages are small, and a larger event is simply relayed in several
// writes. Other responses keep 32 KiB buffers (fewer syscalls for large
// results).
const streamCopyBufferSize = 4 << 10

// Labels of tether_limit_rejections_total.
const (
	limitInflightBody = "inflight_body"
	limitStreams      = "streams"
	limitBodyTimeout  = "body_timeout"
	limitBodySize     = "body_size"
	// limitInitBody is --max-init-body, and limitInitAddress the 8 KiB
	// bound on an initialize's Host and path: both kept with the session.
	limitInitBody    = "init_body_size"
	limitInitAddress = "init_address"
	// limitClientSend is --client-send-timeout: a client that took
	// nothing of an answer for that long (its write failed on the
	// deadline h1.Server.SendTimeout sets).
	limitClientSend = "client_send_timeout"
)

var (
	errBodyBudget     = &requestError{http.StatusServiceUnavailable, codeUnavailable, "too many request bodies in flight; retry later"}
	errBodyTimeout    = &requestError{http.StatusRequestTimeout, codeInvalidRequest, "request body not received in time"}
	errTooManyStreams = &requestError{http.StatusServiceUnavailable, codeUnavailable, "too many open streams; retry later"}
)

// byteBudget bounds a number of bytes held at once by many holders. It
// takes no lock: reservations are a compare-and-swap on one counter, and a
// reservation that would pass the bound fails instead of waiting.
type byteBudget struct {
	max  int64 // <= 0: unbounded (only counted)
	used atomic.Int64
}

// reserve takes n bytes and reports whether they fit.
func (b *byteBudget) reserve(n int64) bool {
	if b == nil {
		return true
	}
	for {
		used := b.used.Load()
		if b.max > 0 && used+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// release returns n reserved bytes.
func (b *byteBudget) release(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}

// slots bounds a number of things open at once (GET streams).
type slots struct {
	max  int64 // <= 0: unbounded (only counted)
	open atomic.Int64
}

func (s *slots) acquire() bool {
	if n := s.open.Add(1); s.max > 0 && n > s.max {
		s.open.Add(-1)
		return false
	}
	return true
}

func (s *slots) release() { s.open.Add(-1) }

// LimitStats reports the client limits' current use (for the metrics).
func (p *Proxy) LimitStats() telemetry.LimitStat {
	return telemetry.LimitStat{InflightBodyBytes: p.bodies.used.Load(), OpenStreams: p.streams.open.Load()}
}

// classifyBounded is classify under the body limits: the body must arrive
// within the body timeout (a per-request read deadline, cleared once the
// body is read), and its buffer is reserved from the in-flight budget as it
// grows. The caller releases cap(Body) when the request is done.
//
// The deadline is set through the ResponseController, which bounds the
// connection's reads on HTTP/1.1 and the stream's on HTTP/2, rather than
// with http.Server.ReadTimeout: a read deadline still in force when the
// server's background read runs fails that read and cancels the request,
// ending a long SSE response (golang/go#18447, #70834). The background
// read starts when the body has been read to its end (or at once, for a
// request without one); so the deadline is set only on requests with a
// body, before it is read, and cleared as soon as it has been. A body the
// server has already read whole (h1's, for a body that came with its
// head: most) cannot stall, and gets none.
func (p *Proxy) classifyBounded(w http.ResponseWriter, r *http.Request, h h1.Fields) (classification, *requestError) {
	if r.Body == nil || r.Body == http.NoBody || bodyBuffered(r.Body) {
		return classify(r, h, p.maxBody, &p.bodies)
	}
	rc := http.NewResponseController(w)
	deadlineSet := rc.SetReadDeadline(time.Now().Add(p.bodyTimeout)) == nil
	c, rerr := classify(r, h, p.maxBody, &p.bodies)
	if deadlineSet && rerr != errBodyTimeout {
		// The rest of the request (a long SSE response) is not bounded by
		// the body's deadline. After a timeout the connection is closed,
		// and clearing the deadline would let an HTTP/1.1 read resume.
		rc.SetReadDeadline(time.Time{})
	}
	return c, rerr
}

// bodyBuffered reports a request body whose rest the server has already
// read from the connection (h1's Buffered).
func bodyBuffered(body io.Reader) bool {
	b, ok := body.(interface{ Buffered() bool })
	return ok && b.Buffered()
}

// refuse answers a request refused before routing.
func (p *Proxy) refuse(w http.ResponseWriter, c *classification, rerr *requestError) {
	h := w.Header()
	switch rerr {
	case errBodyTooLarge, errBodyBudget, errBodyTimeout:
		// The rest of the body is unread: the connection cannot carry
		// another request.
		h.Set("Connection", "close")
	}
	switch rerr {
	case errBodyTooLarge:
		p.metrics.LimitRejected(limitBodySize)
	case errBodyBudget:
		p.metrics.LimitRejected(limitInflightBody)
	case errBodyTimeout:
		p.metrics.LimitRejected(limitBodyTimeout)
	case errTooManyStreams:
		p.metrics.LimitRejected(limitStreams)
	}
	if rerr.status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	writeRequestError(w, c.ID, rerr)
}
