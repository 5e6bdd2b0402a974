package h1

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The connection-level differential harness (issue 29, DESIGN §13 "net/http
// is the floor"): the same raw bytes go over loopback TCP to h1's server and
// to a plain net/http server with the same limits, protocols and handler,
// and what follows is compared:
//
//   - what the handler saw, request by request (diffDescribe);
//   - the bytes of the answers, with the Date field made equal;
//   - how the connection ended: after which answer, with a FIN (EOF) or a
//     reset.
//
// Every exchange half-closes the connection after its last byte, so that
// each server ends it by itself and no outcome depends on a timeout (those
// are tested elsewhere; see TestTimeouts). The variations of a case are its
// bytes in one write, with a well-formed request pipelined behind them (which
// shows where each server thinks the case ended), one byte per write, one
// line per write with pauses, split in two writes with a pause between (at
// every boundary of a short case, at a sample of those of a long one), and
// cut short by the half-close. FuzzConnDiff sends any bytes, whole or split.
//
// The rule is net/http's: h1 may be stricter (answer an error or close where
// net/http serves), never looser. A difference is accepted only when it is
// one of acceptedDifferences, each with its reason; one in pendingFixes is a
// known bug of issue 29 being fixed, and is logged instead of failing until
// its entry is removed. Any other difference fails: h1 serving what net/http
// refuses, the handler seeing other request data, an answer going to
// another request.

// diffEvery makes TestConnDiff split every case at every boundary, and cut
// it short at every point, instead of at a sample of them.
var diffEvery = flag.Bool("h1diff.every", false, "TestConnDiff: split and cut every case at every byte boundary")

// The limits both servers get: tether's client listener's (internal/server).
// The timeouts are long enough that no exchange meets them.
const (
	diffMaxHeaderBytes    = 64 << 10
	diffReadHeaderTimeout = 10 * time.Second
	diffIdleTimeout       = 2 * time.Minute
)

// diffHeadLimit is the longest request head (request line, fields and the
// blank line) net/http's server reads: MaxHeaderBytes and 4 KiB of slack
// (server.go, initialReadLimitSize), counted from its first read for the
// request. A longer head is answered 431. A server that also speaks h2c
// first peeks at the bytes of "PRI * HTTP/2.0" (maybeServeUnencryptedHTTP2),
// outside that count: its heads may be diffH2CPeek bytes longer.
const (
	diffHeadLimit = diffMaxHeaderBytes + 4096
	diffH2CPeek   = len("PRI * HTTP/2.0")
)

// diffPause is how long a split exchange waits between its two writes, so
// that the server most likely reads the first part alone. It is a stimulus,
// not a synchronisation: outcomes are compared, never timings, and a server
// that read both parts at once must still give the same outcome.
const diffPause = 2 * time.Millisecond

// diffExchangeTimeout bounds one exchange: a server that has not closed a
// half-closed connection within it (nothing the harness sends waits for a
// timeout of the server's) fails the comparison, whichever server it is.
const diffExchangeTimeout = 10 * time.Second

// diffProbe is the well-formed request pipelined behind a case: its answer,
// or its absence, shows where the server thought the case's last request
// ended.
const diffProbe = "GET /probe HTTP/1.1\r\nHost: probe\r\n\r\n"

// diffServers is an h1 server and a net/http server that serve the same
// handler with the same configuration.
type diffServers struct {
	h1, std diffServer
}

// diffServer is one of them: its address, and what its handler saw.
type diffServer struct {
	addr string
	seen *diffRecorder
}

// startDiffServers starts the two servers for the rest of the test. With
// h2c they are as tether's client listener is, HTTP/1 and h2c by prior
// knowledge; without, HTTP/1 alone.
func startDiffServers(t testing.TB, h2c bool) diffServers {
	t.Helper()
	configure := func(std *http.Server) {
		std.ReadHeaderTimeout = diffReadHeaderTimeout
		std.IdleTimeout = diffIdleTimeout
		std.MaxHeaderBytes = diffMaxHeaderBytes
		std.ErrorLog = log.New(io.Discard, "", 0)
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(h2c)
		std.Protocols = &p
	}
	var ds diffServers
	ds.h1.seen = newDiffRecorder()
	ds.h1.addr, _ = startH1(t, ds.h1.seen, func(std *http.Server, _ *Server) { configure(std) })

	ds.std.seen = newDiffRecorder()
	std := &http.Server{Handler: ds.std.seen}
	configure(std)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); std.Serve(ln) }()
	t.Cleanup(func() { std.Close(); <-done })
	ds.std.addr = ln.Addr().String()
	return ds
}

// diffRecorder is the handler of both servers: it reads the request's body
// to its end, notes what it saw of the request under the client's address,
// and answers a digest of it, so that an answer tells which request it is
// for.
type diffRecorder struct {
	mu   sync.Mutex
	seen map[string][]string // by the client's address
}

func newDiffRecorder() *diffRecorder { return &diffRecorder{seen: make(map[string][]string)} }

func (rec *diffRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	seen := diffDescribe(r)
	rec.mu.Lock()
	rec.seen[r.RemoteAddr] = append(rec.seen[r.RemoteAddr], seen)
	rec.mu.Unlock()
	sum := sha256.Sum256([]byte(seen))
	fmt.Fprintf(w, "seen %x\n", sum[:8])
}

// take returns and forgets what the handler saw on the connection from
// client. Both servers close a connection only after its handler has
// returned, so once the client has seen the end, every request is noted.
func (rec *diffRecorder) take(client string) []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	seen := rec.seen[client]
	delete(rec.seen, client)
	return seen
}

// diffMaxBody bounds the body the handler reads (the cases' are small).
const diffMaxBody = 1 << 20

// diffDescribe reads r's body and describes the request as the handler
// sees it: every field of http.Request a handler (tether's proxy) acts on.
func diffDescribe(r *http.Request) string {
	body, err := io.ReadAll(io.LimitReader(r.Body, diffMaxBody))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s url=%s host=%s\n", diffQuote(r.Method), diffQuote(r.RequestURI), diffQuote(r.Proto), diffQuote(r.URL.String()), diffQuote(r.Host))
	for _, f := range diffFields(r.Header) {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	fmt.Fprintf(&b, "  length=%d transfer-encoding=%q close=%v\n", r.ContentLength, r.TransferEncoding, r.Close)
	fmt.Fprintf(&b, "  body=%s err=%s\n", diffQuote(string(body)), diffBodyError(err))
	for _, f := range diffFields(r.Trailer) {
		fmt.Fprintf(&b, "  trailer %s\n", f)
	}
	return b.String()
}

// diffFields lists h as quoted "Name: value" lines, sorted.
func diffFields(h http.Header) []string {
	var list []string
	for k, vv := range h {
		for _, v := range vv {
			list = append(list, diffQuote(k+": "+v))
		}
	}
	slices.Sort(list)
	return list
}

// diffQuote quotes s, shortened to its start, length and digest when long (the
// cases of heads at the size limit).
func diffQuote(s string) string {
	if len(s) <= 96 {
		return fmt.Sprintf("%q", s)
	}
	sum := sha256.Sum256([]byte(s))
	return fmt.Sprintf("%q...(%d bytes, sha256 %x)", s[:32], len(s), sum[:6])
}

// diffQuoteLong is diffQuote for what is worth showing whole up to 512 bytes.
func diffQuoteLong(s string) string {
	if len(s) <= 512 {
		return fmt.Sprintf("%q", s)
	}
	return diffQuote(s)
}

// diffBodyError describes a body's read error without what differs between
// two connections (addresses).
func diffBodyError(err error) string {
	var op *net.OpError
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &op):
		return "net: " + op.Err.Error()
	}
	return err.Error()
}

// diffOutcome is what a client saw of an exchange, and what the handler saw.
type diffOutcome struct {
	Seen    []string // the handler's descriptions, request by request
	Answers []string // the answers, in order, with the Date field normalised
	End     string   // "EOF", "reset", or what else ended the reading
}

func (o diffOutcome) equal(p diffOutcome) bool {
	return slices.Equal(o.Seen, p.Seen) && slices.Equal(o.Answers, p.Answers) && o.End == p.End
}

func (o diffOutcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  the handler saw %d request(s):\n", len(o.Seen))
	for i, s := range o.Seen {
		fmt.Fprintf(&b, "    %d: %s", i+1, strings.ReplaceAll(s, "\n  ", "\n         "))
	}
	fmt.Fprintf(&b, "  %d answer(s):\n", len(o.Answers))
	for i, a := range o.Answers {
		fmt.Fprintf(&b, "    %d: %s\n", i+1, diffQuoteLong(a))
	}
	fmt.Fprintf(&b, "  then %s\n", o.End)
	return b.String()
}

// diffPlan is how an exchange sends its bytes: the writes, in order, with
// a pause before each but the first when pause is set.
type diffPlan struct {
	name   string
	writes [][]byte
	pause  bool
}

// exchange sends p's writes on a new connection to s, half-closes it, and
// reads until the server ends it.
func (s diffServer) exchange(p diffPlan) diffOutcome {
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		return diffOutcome{End: "dial: " + err.Error()}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(diffExchangeTimeout))
	for i, w := range p.writes {
		if i > 0 && p.pause {
			time.Sleep(diffPause)
		}
		// A write the server refused (it closed) is not an outcome: what
		// the client reads is.
		if _, err := c.Write(w); err != nil {
			break
		}
	}
	c.(*net.TCPConn).CloseWrite()
	var got bytes.Buffer
	_, err = io.Copy(&got, io.LimitReader(c, diffMaxBody))
	o := diffOutcome{Answers: diffSplitAnswers(got.Bytes()), End: diffEnd(err)}
	o.Seen = s.seen.take(c.LocalAddr().String())
	return o
}

// diffEnd names how reading a connection ended.
func diffEnd(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "EOF"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no end within %s", diffExchangeTimeout)
	}
	return "error: " + err.Error()
}

var (
	diffDateField = regexp.MustCompile(`(?m)^Date: [^\r\n]*\r$`)
	// diffAnswerStart is where an HTTP/1 answer starts: at a line start. The
	// handler's answers are "seen DIGEST" lines and net/http's own are a
	// status text, so no body has such a line.
	diffAnswerStart = regexp.MustCompile(`(?m)^HTTP/1\.[01] `)
)

// diffSplitAnswers splits what a client received into answers, normalised
// (diffNormalAnswer). What precedes the first status line (h2c frames, or bytes
// that are no answer) is an element of its own.
func diffSplitAnswers(b []byte) []string {
	b = diffDateField.ReplaceAll(b, []byte("Date: (normalised)\r"))
	var answers []string
	starts := diffAnswerStart.FindAllIndex(b, -1)
	if len(starts) == 0 || starts[0][0] > 0 {
		end := len(b)
		if len(starts) > 0 {
			end = starts[0][0]
		}
		if end > 0 {
			answers = append(answers, string(b[:end]))
		}
	}
	for i, s := range starts {
		end := len(b)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		answers = append(answers, diffNormalAnswer(string(b[s[0]:end])))
	}
	return answers
}

// diffNormalAnswer is an answer with its Date field's value replaced, and its
// fields in the order of their names (the order of fields of different
// names means nothing, RFC 9110 §5.3; net/http writes them sorted, h1 in
// another order).
func diffNormalAnswer(a string) string {
	head, body, ok := strings.Cut(a, "\r\n\r\n")
	if !ok {
		return a
	}
	lines := strings.Split(head, "\r\n")
	fields := lines[1:]
	slices.SortStableFunc(fields, func(x, y string) int {
		nx, _, _ := strings.Cut(x, ":")
		ny, _, _ := strings.Cut(y, ":")
		return strings.Compare(strings.ToLower(nx), strings.ToLower(ny))
	})
	return strings.Join(lines, "\r\n") + "\r\n\r\n" + body
}

// diffSlots bounds the exchanges in flight: each holds two connections, and
// most of them wait in a pause or a lingering close.
var diffSlots = make(chan struct{}, 16)

// compare runs plan against both servers at once and returns both outcomes.
func (ds diffServers) compare(p diffPlan) (h1, std diffOutcome) {
	diffSlots <- struct{}{}
	defer func() { <-diffSlots }()
	var wg sync.WaitGroup
	wg.Go(func() { h1 = ds.h1.exchange(p) })
	wg.Go(func() { std = ds.std.exchange(p) })
	wg.Wait()
	return h1, std
}

// diffException is a difference between h1 and net/http that the harness
// knows of: the outcomes it applies to (each checks the whole shape of the
// difference, so that nothing else hides behind it), and why it is there.
type diffException struct {
	name    string
	reason  string
	item    int // the item of issue 29 that removes it (pendingFixes)
	applies func(h1, std diffOutcome) bool
}

// acceptedDifferences are the differences the rule allows: where they are,
// h1 serves no request net/http does not, gives the handler the same
// requests and the client the same answers to them, and differs only in an
// error answer or in how it closes.
var acceptedDifferences = []diffException{
	{
		name: "no 400 after a head cut short",
		reason: "the client's EOF ends a request head midway: net/http answers 400, h1 (which reads the head " +
			"itself, and hands nothing over at EOF) closes without an answer; nothing is served either way",
		applies: func(h1, std diffOutcome) bool {
			n := len(h1.Answers)
			return slices.Equal(h1.Seen, std.Seen) && len(std.Answers) == n+1 &&
				slices.Equal(h1.Answers, std.Answers[:n]) && isBadRequest(std.Answers[n])
		},
	},
	{
		name: "400 for a remnant net/http drops",
		reason: "fewer than 4 bytes with a line end (\"\\n\"), then the client's EOF, after a served request: " +
			"net/http, waiting for 4 bytes of the next request (Peek(4)), closes without an answer; h1 hands " +
			"them to net/http as a new connection's first request, which it answers 400; nothing is served " +
			"either way",
		applies: func(h1, std diffOutcome) bool {
			n := len(std.Answers)
			return slices.Equal(h1.Seen, std.Seen) && len(h1.Answers) == n+1 &&
				slices.Equal(h1.Answers[:n], std.Answers) && isBadRequest(h1.Answers[n])
		},
	},
	{
		name: "Connection: close announced after a body cut short",
		reason: "a Content-Length body ends early with the client's EOF: both answer and close, h1's answer " +
			"says so (Connection: close), net/http's does not",
		applies: func(h1, std diffOutcome) bool {
			if !slices.Equal(h1.Seen, std.Seen) || len(h1.Answers) != len(std.Answers) || h1.End != std.End {
				return false
			}
			for i, a := range h1.Answers {
				if a != std.Answers[i] && strings.Replace(a, "Connection: close\r\n", "", 1) != std.Answers[i] {
					return false
				}
			}
			return true
		},
	},
	{
		name: "FIN where net/http resets",
		reason: "net/http closed with bytes of the client unread (it lingers only after some answers), h1 " +
			"read them first: the same answers, and an end the client reads whole",
		applies: func(h1, std diffOutcome) bool {
			return slices.Equal(h1.Seen, std.Seen) && slices.Equal(h1.Answers, std.Answers) &&
				h1.End == "EOF" && std.End == "reset"
		},
	},
}

// pendingFixes are differences that the fixes of issue 29's items remove,
// being made as this harness is written: until then they are logged, not
// failed. Remove an entry when its fix lands; the harness then fails if the
// difference is still there.
var pendingFixes []diffException // none: items 5 and 7 of issue 29 are fixed

// isBadRequest reports whether answer is net/http's own 400.
func isBadRequest(answer string) bool {
	return strings.HasPrefix(answer, "HTTP/1.1 400 Bad Request\r\n")
}

// diffVerdict is what diffJudge makes of a difference.
type diffVerdict struct {
	fail    bool
	note    string // why it fails, or the pending fix it is
	pending int    // the index in pendingFixes of the fix it awaits, or -1
}

// diffJudge compares the two outcomes of in's exchange, sent in writes
// writes. They pass when they are the same or the difference is accepted,
// with a note when it is a pending fix's; they fail when h1 is looser than
// net/http, or just other. When the bytes went in more than one write, a
// close seen as a reset and one seen as EOF are the same outcome: whether a
// close meets bytes still unread races the client's later writes.
func diffJudge(in []byte, writes int, h1, std diffOutcome) diffVerdict {
	pass := diffVerdict{pending: -1}
	if bytes.HasPrefix(in, []byte(diffH2Preface)) {
		// HTTP/2 has no half-close: net/http's h2c server ends the
		// connection at the client's FIN, racing its own SETTINGS
		// frame, so no outcome is certain. h2spec tests h2c (e2e).
		return pass
	}
	if !diffClosed(h1.End) || !diffClosed(std.End) {
		return diffVerdict{fail: true, note: "a server did not end a connection its client had half-closed", pending: -1}
	}
	if writes > 1 {
		h1.End, std.End = diffClosedAs(h1.End), diffClosedAs(std.End)
	}
	if h1.equal(std) {
		return pass
	}
	for i, e := range pendingFixes {
		if e.applies(h1, std) {
			return diffVerdict{note: fmt.Sprintf("pending fix of issue 29 item %d (%s): %s", e.item, e.name, e.reason), pending: i}
		}
	}
	for _, e := range acceptedDifferences {
		if e.applies(h1, std) {
			return pass
		}
	}
	return diffVerdict{fail: true, note: "h1 differs from net/http", pending: -1}
}

// diffH2Preface is HTTP/2's connection preface, which starts h2c.
const diffH2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// diffClosed reports whether end is a close: EOF or a reset.
func diffClosed(end string) bool { return end == "EOF" || end == "reset" }

// diffClosedAs merges the two ways a connection closes.
func diffClosedAs(end string) string {
	if diffClosed(end) {
		return "closed (EOF or reset)"
	}
	return end
}

// diffReport is the failure message of a difference.
func diffReport(caseName string, p diffPlan, h1, std diffOutcome, why string) string {
	var sent strings.Builder
	if len(p.writes) <= 4 {
		for i, w := range p.writes {
			if i > 0 {
				sent.WriteString(" | ")
				if p.pause {
					sent.WriteString("(pause) ")
				}
			}
			sent.WriteString(diffQuote(string(w)))
		}
	} else {
		fmt.Fprintf(&sent, "%s in %d writes", diffQuote(string(bytes.Join(p.writes, nil))), len(p.writes))
	}
	return fmt.Sprintf("%s, %s: %s\nsent: %s (then half-closed)\nh1:\n%snet/http:\n%s", caseName, p.name, why, sent.String(), h1, std)
}
