package session

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Limits on what a Redis server may send. go-redis sizes its allocations by
// the lengths a reply announces (make([]byte, n), make([]any, n), a map
// hint) before reading the bytes: "*9999999999999" panics with "makeslice:
// len out of range" in the calling goroutine, "$2000000000" allocates 2 GB,
// a line without an end grows a buffer without limit, and deep nesting
// grows the reader's stack. The guard below reads the reply stream as it
// arrives and breaks the connection (an error, never a panic) before go-redis
// sees a length beyond these.
const (
	// maxReplyBulk is the largest string accepted: 16 times the largest
	// body the proxy ever accepted by default (--max-body 4 MiB), and 1,000
	// times the 64 KiB --max-init-body.
	maxReplyBulk = 64 << 20
	// maxReplyElems bounds an aggregate's elements; tether's replies have a
	// few dozen at most.
	maxReplyElems = 1 << 20
	// maxReplyDepth bounds nesting; tether's replies nest two deep.
	maxReplyDepth = 16
	// maxReplyLine bounds a simple line (status, error, number).
	maxReplyLine = 64 << 10
)

// errHostileReply is wrapped by every guard error.
var errHostileReply = errors.New("session: Redis reply beyond tether's limits")

// guardDialer wraps dial so that every connection's replies are checked by
// a respScanner.
func guardDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &guardedConn{Conn: c}, nil
	}
}

// guardedConn checks the bytes it reads; after a violation every read fails
// and go-redis drops the connection.
type guardedConn struct {
	net.Conn
	scan respScanner
	err  error
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if serr := c.scan.feed(p[:n]); serr != nil {
			c.err = serr
			c.Conn.Close()
			return 0, serr
		}
	}
	return n, err
}

// respScanner follows a stream of RESP2/RESP3 replies just enough to check
// announced lengths and nesting. It never buffers: bulk data is skipped by
// count, and a header line is parsed as it arrives.
type respScanner struct {
	state   scanState
	typ     byte
	neg     bool
	num     int64
	digits  int
	lineLen int
	skip    int64   // bytes of bulk data (and its CRLF) still to come
	open    []frame // aggregates still expecting elements, innermost last
}

type frame struct {
	left int64
	attr bool // an attribute: it describes the next value, it is not one
}

type scanState uint8

const (
	scanType   scanState = iota // expecting a reply's type byte
	scanLen                     // in the length of a bulk or aggregate
	scanLenEnd                  // after the length's '\r'
	scanLine                    // in a simple line (status, error, number…)
	scanData                    // in bulk data
)

func (s *respScanner) feed(p []byte) error {
	for i := 0; i < len(p); {
		switch s.state {
		case scanData:
			k := min(int64(len(p)-i), s.skip)
			s.skip -= k
			i += int(k)
			if s.skip == 0 {
				s.state = scanType
				s.done()
			}
			continue
		case scanType:
			s.typ = p[i]
			switch s.typ {
			case '$', '!', '=', '*', '~', '>', '%', '|':
				s.state, s.neg, s.num, s.digits = scanLen, false, 0, 0
			case '+', '-', ':', '_', ',', '#', '(':
				s.state, s.lineLen = scanLine, 0
			default:
				return fmt.Errorf("%w: unknown reply type %q", errHostileReply, s.typ)
			}
		case scanLine:
			if p[i] == '\n' {
				s.state = scanType
				s.done()
			} else if s.lineLen++; s.lineLen > maxReplyLine {
				return fmt.Errorf("%w: a line longer than %d bytes", errHostileReply, maxReplyLine)
			}
		case scanLen:
			c := p[i]
			switch {
			case c == '-' && s.digits == 0 && !s.neg:
				s.neg = true
			case c >= '0' && c <= '9':
				s.num = s.num*10 + int64(c-'0')
				if s.digits++; s.num > maxReplyBulk {
					return fmt.Errorf("%w: %c length over %d", errHostileReply, s.typ, maxReplyBulk)
				}
			case c == '\r' && s.digits > 0:
				s.state = scanLenEnd
			default:
				return fmt.Errorf("%w: bad %c length", errHostileReply, s.typ)
			}
		case scanLenEnd:
			if p[i] != '\n' {
				return fmt.Errorf("%w: bad %c length", errHostileReply, s.typ)
			}
			if err := s.header(); err != nil {
				return err
			}
		}
		i++
	}
	return nil
}

// header acts on a complete length line.
func (s *respScanner) header() error {
	s.state = scanType
	n := s.num
	if s.neg {
		if n != 1 {
			return fmt.Errorf("%w: negative %c length", errHostileReply, s.typ)
		}
		s.done() // a RESP2 null
		return nil
	}
	switch s.typ {
	case '$', '!', '=':
		s.skip, s.state = n+2, scanData
		return nil
	case '%', '|':
		n *= 2 // pairs
	}
	if n > maxReplyElems {
		return fmt.Errorf("%w: %c of %d elements", errHostileReply, s.typ, n)
	}
	switch {
	case n > 0:
		if len(s.open) >= maxReplyDepth {
			return fmt.Errorf("%w: replies nested deeper than %d", errHostileReply, maxReplyDepth)
		}
		s.open = append(s.open, frame{left: n, attr: s.typ == '|'})
	case s.typ != '|':
		s.done() // an empty aggregate is a complete value
	}
	return nil
}

// done records a complete value: it fills a slot of the innermost open
// aggregate, which may complete it in turn.
func (s *respScanner) done() {
	for len(s.open) > 0 {
		top := &s.open[len(s.open)-1]
		if top.left--; top.left > 0 {
			return
		}
		attr := top.attr
		s.open = s.open[:len(s.open)-1]
		if attr {
			return // the value the attribute describes is still to come
		}
	}
}
