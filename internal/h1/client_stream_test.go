package h1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// FuzzAnswerStream is a backend's stream on one pooled connection, as
// two writes: w1, what it sends for a first request (in[:cut]), and w2,
// what it sends once a second request came (the rest). A client pools the
// connection as tether's does: it reads the first answer (past 1xx
// answers) and its body from w1 (more is not coming: a read past w1
// fails), and sends the second request on the connection only when
// Answer.Reusable says so and no byte of w1 is left unread (its peek at
// the idle socket); then it reads the second answer. Properties:
//   - each answer ReadAnswer reads, net/http reads alike from the same
//     bytes: the first from w1, the second from w2;
//   - the connection is reused only after an answer whose end is certain
//     and with every byte of w1 accounted for: no byte is countingReader twice,
//     and none that came before the second request is read as its answer.
//
// Its seeds are the framing table's cases, each followed by a fresh
// answer (or by an answer-shaped tail, then the fresh answer): `go test`
// runs them as a bounded corpus, `go test -fuzz FuzzAnswerStream` explores.
func FuzzAnswerStream(f *testing.F) {
	for _, c := range framingCases {
		f.Add(c.in+freshAnswer, c.methodIndex(), uint16(len(c.in)))
		f.Add(c.in+smuggledAnswer+freshAnswer, c.methodIndex(), uint16(len(c.in)+len(smuggledAnswer)))
		f.Add(c.in+smuggledAnswer+freshAnswer, c.methodIndex(), uint16(len(c.in)))
	}
	f.Fuzz(func(t *testing.T, in string, method uint8, cut uint16) {
		n := int(cut) % (len(in) + 1)
		pooledStream(t, in[:n], in[n:], method)
	})
}

// errNotYet is the read of a byte the backend has not sent: it sends the
// second write only once the second request came.
var errNotYet = errors.New("no more bytes before the next request")

// twoWrites reads w1, then fails with errNotYet until next is called, then
// reads w2.
type twoWrites struct {
	w1, w2 *strings.Reader
	sent   bool // the second request went out
}

func (s *twoWrites) Read(p []byte) (int, error) {
	if s.w1.Len() > 0 {
		return s.w1.Read(p)
	}
	if !s.sent {
		return 0, errNotYet
	}
	return s.w2.Read(p)
}

func pooledStream(t *testing.T, w1, w2 string, method uint8) {
	t.Helper()
	req := &http.Request{Method: []string{http.MethodPost, http.MethodGet, http.MethodHead}[method%3]}
	src := &twoWrites{w1: strings.NewReader(w1), w2: strings.NewReader(w2)}
	br := bufio.NewReader(src)

	a, body, err := readFinal(br, req)
	if err != nil {
		return // the client closes the connection
	}
	// Read from w1 alone: net/http reads the same answer from w1 alone.
	agreesWithNetHTTP(t, "first answer", a, body, w1, req)
	if !a.Reusable(br) || src.w1.Len() > 0 {
		return // closed: what is left of w1 is never read
	}
	if a.Close || a.StatusCode < 200 {
		t.Fatalf("%q: reusable after an answer that ends the connection or is not final", w1)
	}
	// Every byte of w1 belongs to the first answer (and its 1xx answers):
	// nothing of w1 is left to be read as the answer to the next request.
	src.sent = true
	second := &http.Request{Method: http.MethodGet}
	a, body, err = readFinal(br, second)
	if err != nil {
		return
	}
	agreesWithNetHTTP(t, "second answer", a, body, w2, second)
}

// readFinal reads the final answer (past up to four 1xx answers) and its
// body, as a pooling client does.
func readFinal(br *bufio.Reader, req *http.Request) (*Answer, []byte, error) {
	for range 5 {
		a, err := ReadAnswer(br, req)
		if err != nil {
			return nil, nil, err
		}
		if a.StatusCode >= 200 || a.StatusCode == http.StatusSwitchingProtocols {
			body, err := readBody(a.Body, 512)
			return a, body, err
		}
		if a.Reusable(br) {
			return nil, nil, errors.New("reusable after a 1xx answer")
		}
	}
	return nil, nil, errors.New("too many 1xx answers")
}

// agreesWithNetHTTP requires that net/http reads from in, alone, the
// final answer a with its body, that ReadAnswer read from in.
func agreesWithNetHTTP(t *testing.T, what string, a *Answer, body []byte, in string, req *http.Request) {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(in))
	for range 5 {
		want, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("%s %q: read by ReadAnswer, refused by net/http: %v", what, in, err)
		}
		if want.StatusCode < 200 && want.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		wbody, err := io.ReadAll(want.Body)
		if err != nil {
			t.Fatalf("%s %q: body read by ReadAnswer, net/http's fails: %v", what, in, err)
		}
		if a.StatusCode != want.StatusCode || string(body) != string(wbody) ||
			!reflect.DeepEqual(a.Header.Header(), want.Header) || a.Close != want.Close {
			t.Fatalf("%s %q: status %d, body %q, header %v, close %v; net/http's %d, %q, %v, %v",
				what, in, a.StatusCode, body, a.Header.Header(), a.Close, want.StatusCode, wbody, want.Header, want.Close)
		}
		return
	}
	t.Fatalf("%s %q: net/http reads too many 1xx answers", what, in)
}
