package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Fake is a RESP server that answers whatever its handler says: for the
// replies a real Redis never sends (wrong types, short arrays, nil where a
// value belongs, lengths meant to exhaust memory). Use a real server (Start)
// for everything else.
//
// It speaks RESP2: HELLO is refused, as an old Redis would, so clients fall
// back to RESP2. It listens on a random loopback port until the test ends.
type Fake struct {
	Port   int
	ln     net.Listener
	handle func(cmd []string) []byte

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartFake starts a fake server. handle gets each command (name first, as
// sent) and returns the raw reply bytes to write (see the reply helpers); nil
// means the default: +PONG for PING, an error for HELLO, and
// "-ERR unhandled" for anything else. handle runs on the connection's
// goroutine and must be safe for concurrent use.
func StartFake(tb testing.TB, handle func(cmd []string) []byte) *Fake {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &Fake{Port: ln.Addr().(*net.TCPAddr).Port, ln: ln, handle: handle, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	tb.Cleanup(f.Close)
	return f
}

// Addr is host:port.
func (f *Fake) Addr() string { return "127.0.0.1:" + strconv.Itoa(f.Port) }

// URL is a redis:// URL for the fake.
func (f *Fake) URL() string { return "redis://" + f.Addr() + "/0" }

// Close stops the server and ends its connections.
func (f *Fake) Close() {
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *Fake) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() {
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}()
			f.serve(c)
		}()
	}
}

func (f *Fake) serve(c net.Conn) {
	rd := bufio.NewReader(c)
	for {
		cmd, err := readCommand(rd)
		if err != nil {
			return
		}
		reply := f.handle(cmd)
		if reply == nil {
			switch strings.ToUpper(cmd[0]) {
			case "PING":
				reply = Status("PONG")
			case "HELLO":
				reply = Error("ERR unknown command 'HELLO'")
			default:
				reply = Error("ERR unhandled by the fake: " + cmd[0])
			}
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// Limits on what the fake reads, so that a test's client cannot make it
// allocate without bound either.
const (
	maxFakeArgs   = 1 << 10
	maxFakeArgLen = 64 << 20
)

// readCommand reads one command: an array of bulk strings.
func readCommand(rd *bufio.Reader) ([]string, error) {
	n, err := readLength(rd, '*', maxFakeArgs)
	if err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, errors.New("empty command")
	}
	cmd := make([]string, n)
	for i := range cmd {
		l, err := readLength(rd, '$', maxFakeArgLen)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, l+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		cmd[i] = string(buf[:l])
	}
	return cmd, nil
}

func readLength(rd *bufio.Reader, kind byte, limit int) (int, error) {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 4 || line[0] != kind || line[len(line)-2] != '\r' {
		return 0, fmt.Errorf("unexpected line %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil || n < 0 || n > limit {
		return 0, fmt.Errorf("bad length in %q", line)
	}
	return n, nil
}

// Reply helpers: each returns one RESP2 reply's bytes; Raw is for what they
// cannot express (a bad length, a truncated reply).

// Status is a simple string reply (+OK).
func Status(s string) []byte { return []byte("+" + s + "\r\n") }

// Error is an error reply.
func Error(s string) []byte { return []byte("-" + s + "\r\n") }

// Int is an integer reply.
func Int(n int64) []byte { return []byte(":" + strconv.FormatInt(n, 10) + "\r\n") }

// Bulk is a bulk string reply.
func Bulk(s string) []byte { return []byte("$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n") }

// NilBulk is RESP2's nil.
func NilBulk() []byte { return []byte("$-1\r\n") }

// NilArray is RESP2's nil array.
func NilArray() []byte { return []byte("*-1\r\n") }

// Array is an array of replies.
func Array(items ...[]byte) []byte {
	out := []byte("*" + strconv.Itoa(len(items)) + "\r\n")
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

// Bulks is an array of bulk strings (as HGETALL answers: field, value, ...).
func Bulks(ss ...string) []byte {
	items := make([][]byte, len(ss))
	for i, s := range ss {
		items[i] = Bulk(s)
	}
	return Array(items...)
}

// Raw is s as is.
func Raw(s string) []byte { return []byte(s) }
