// Command floorproxy is a measuring stick, not a proxy: the least a Go
// HTTP/1.1 relay with a goroutine per connection can do for the bench's
// follow-ups. It routes by the session id's backend prefix, as the bench's
// nginx does, and copies heads and bodies as bytes: no header maps, no
// contexts, no timers, no limits beyond fixed buffer bounds, no error
// answers (a failure closes the connection). Its CPU per request, measured
// as tether's is, is the floor of tether's design (one goroutine per
// connection, one runtime thread, raw socket I/O): what tether costs above
// it is tether's HTTP machinery.
//
//	go build -o /tmp/floor ./hack/floorproxy
//	cd bench && go run ./cmd/tetherbench cpu -tether /tmp/tether,/tmp/floor
//
// FLOOR_HEADER_MAPS and FLOOR_PEEK (below) add one of tether's costs each:
//
//	printf '#!/bin/sh\nFLOOR_HEADER_MAPS=1 exec /tmp/floor "$@"\n' >/tmp/floor-maps; chmod +x /tmp/floor-maps
//	cd bench && go run ./cmd/tetherbench cpu -tether /tmp/floor,/tmp/floor-maps
//
// It takes tether's serve flags (--backends, --listen, --admin-listen; the
// others are ignored), so the bench starts it as it starts tether. The
// backends must be the bench's, with -named-ids: b0.…, b1.…, in the order
// of --backends.
package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/tether-mcp/tether/internal/h1"
)

type pool struct {
	addr string
	mu   sync.Mutex
	idle []*bconn
}

type bconn struct {
	raw net.Conn // c's net.Conn, for peek
	c   net.Conn
	buf []byte
}

var pools []*pool
var rr int

// Two of tether's costs can be added to the floor, to price them in the
// same regime (the bench starts the floor as it starts tether, so they are
// switched on from the environment, by a wrapper script):
// FLOOR_HEADER_MAPS=1 parses the fields of every request and answer head
// into an http.Header, as h1 does for tether's handler and client;
// FLOOR_PEEK=1 peeks at a pooled backend connection before reusing it, as
// tether's client does to find one the backend has closed.
var (
	withMaps = os.Getenv("FLOOR_HEADER_MAPS") == "1"
	withPeek = os.Getenv("FLOOR_PEEK") == "1"
	sink     int // keeps the parsed maps from being optimized away
)

// parseMap parses head's fields into an http.Header, when asked to.
func parseMap(head []byte) {
	if !withMaps {
		return
	}
	i := bytes.Index(head, []byte("\r\n"))
	h, ok := h1.ParseFields(string(head[i+2:]))
	if ok {
		sink += len(h)
	}
}

// peek peeks at c's socket without waiting, when asked to.
func peek(c net.Conn) {
	if !withPeek {
		return
	}
	rc, _ := c.(syscall.Conn).SyscallConn()
	var b [1]byte
	rc.Read(func(fd uintptr) bool {
		syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		return true
	})
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Args = append(os.Args[:1], os.Args[2:]...)
	}
	backends := flag.String("backends", "", "")
	listen := flag.String("listen", "", "")
	admin := flag.String("admin-listen", "", "")
	flag.String("log-level", "", "")
	flag.String("shutdown-grace", "", "")
	flag.Parse()
	runtime.GOMAXPROCS(1)
	for _, u := range strings.Split(*backends, ",") {
		pools = append(pools, &pool{addr: strings.TrimPrefix(u, "http://")})
	}
	go http.ListenAndServe(*admin, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		panic(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go serve(h1.RawIO(c))
	}
}

// headEnd returns the length of the head at the start of b, or -1.
func headEnd(b []byte) int {
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		return i + 4
	}
	return -1
}

// field returns the value of header name (lower case) in head.
func field(head []byte, name string) string {
	for len(head) > 0 {
		i := bytes.Index(head, []byte("\r\n"))
		if i < 0 {
			break
		}
		line := head[:i]
		head = head[i+2:]
		if len(line) > len(name) && line[len(name)] == ':' && strings.EqualFold(string(line[:len(name)]), name) {
			return strings.TrimSpace(string(line[len(name)+1:]))
		}
	}
	return ""
}

// maxMessage bounds a head and its body.
const maxMessage = 1 << 20

var errTooLarge = errors.New("floorproxy: message too large")

// grow makes buf at least n long, within maxMessage.
func grow(buf []byte, n int) ([]byte, error) {
	if n > maxMessage {
		return buf, errTooLarge
	}
	if n > len(buf) {
		buf = append(buf, make([]byte, n-len(buf))...)
	}
	return buf, nil
}

func readHead(c net.Conn, buf []byte, n int) ([]byte, int, int, error) {
	for {
		if end := headEnd(buf[:n]); end >= 0 {
			return buf, n, end, nil
		}
		if n == len(buf) {
			var err error
			if buf, err = grow(buf, 2*len(buf)); err != nil {
				return buf, n, -1, err
			}
		}
		m, err := c.Read(buf[n:])
		n += m
		if err != nil && m == 0 {
			return buf, n, -1, err
		}
	}
}

func serve(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 8192)
	n := 0
	for {
		var end int
		var err error
		buf, n, end, err = readHead(c, buf, n)
		if err != nil {
			return
		}
		head := buf[:end]
		parseMap(head)
		cl, _ := strconv.Atoi(field(head, "content-length"))
		if cl < 0 {
			return
		}
		if buf, err = grow(buf, end+cl); err != nil {
			return
		}
		for n < end+cl {
			m, err := c.Read(buf[n:])
			n += m
			if err != nil && m == 0 {
				return
			}
		}
		p := pools[rr%len(pools)]
		if sid := field(head, "mcp-session-id"); len(sid) > 2 && sid[0] == 'b' {
			if i, err := strconv.Atoi(sid[1:strings.IndexByte(sid, '.')]); err == nil && i < len(pools) {
				p = pools[i]
			}
		} else {
			rr++
		}
		if !forward(p, c, buf[:end+cl]) {
			return
		}
		n = copy(buf, buf[end+cl:n])
	}
}

func forward(p *pool, c net.Conn, req []byte) bool {
	p.mu.Lock()
	var b *bconn
	if k := len(p.idle); k > 0 {
		b = p.idle[k-1]
		p.idle = p.idle[:k-1]
	}
	p.mu.Unlock()
	if b == nil {
		bc, err := net.Dial("tcp", p.addr)
		if err != nil {
			return false
		}
		b = &bconn{c: h1.RawIO(bc), raw: bc, buf: make([]byte, 8192)}
	} else {
		peek(b.raw)
	}
	if _, err := b.c.Write(req); err != nil {
		b.c.Close()
		return false
	}
	buf, n, end, err := readHead(b.c, b.buf, 0)
	b.buf = buf
	if err != nil {
		b.c.Close()
		return false
	}
	head := buf[:end]
	parseMap(head)
	if cl := field(head, "content-length"); cl != "" {
		k, err := strconv.Atoi(cl)
		if err != nil || k < 0 {
			b.c.Close()
			return false
		}
		if b.buf, err = grow(b.buf, end+k); err != nil {
			b.c.Close()
			return false
		}
		for n < end+k {
			m, err := b.c.Read(b.buf[n:])
			n += m
			if err != nil && m == 0 {
				b.c.Close()
				return false
			}
		}
		if _, err := c.Write(b.buf[:end+k]); err != nil {
			b.c.Close()
			return false
		}
	} else {
		// Chunked (go-sdk's SSE answers): relayed until the last chunk,
		// found by its bytes at the end of a read, which is enough for the
		// bench's backends and nothing else.
		if _, err := c.Write(b.buf[:n]); err != nil {
			b.c.Close()
			return false
		}
		tail := b.buf[:n]
		for !bytes.HasSuffix(tail, []byte("0\r\n\r\n")) {
			m, err := b.c.Read(b.buf)
			if err != nil && m == 0 {
				b.c.Close()
				return false
			}
			if _, err := c.Write(b.buf[:m]); err != nil {
				b.c.Close()
				return false
			}
			tail = b.buf[:m]
		}
	}
	p.mu.Lock()
	p.idle = append(p.idle, b)
	p.mu.Unlock()
	return true
}
