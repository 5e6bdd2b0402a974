package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unsafe"

	"github.com/tether-mcp/tether/internal/h1"
)

// relayTo is an eventStream relaying body to rec, as its handler does
// (no parking: a recorder has no connection).
func relayTo(rec *httptest.ResponseRecorder, body io.ReadCloser) *eventStream {
	return &eventStream{w: rec, resp: &h1.Answer{Response: &http.Response{Body: body}}, whole: true}
}

// A stream relays until it is stopped (its backend departs, its session
// moves), then ends the response cleanly when the client holds whole
// events only, and aborts it (an error) when the stop cut an event in
// half.
func TestStoppedStreamEndsAtAnEventBoundary(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sent      string
		wantClean bool
	}{
		{"after whole events", "event: message\ndata: {\"a\":1}\n\ndata: {\"b\":2}\n\n", true},
		{"in the middle of an event", "data: {\"a\":1}\n\ndata: {\"b\"", false},
		{"before any event", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			rec := httptest.NewRecorder()
			s := relayTo(rec, pr)
			result := make(chan error, 1)
			go func() {
				_, err := s.copy(make([]byte, 8), false, false)
				result <- err
			}()
			if tc.sent != "" {
				// The pipe hands over a write once it has been read whole, so
				// the relay has every byte when Write returns.
				if _, err := pw.Write([]byte(tc.sent)); err != nil {
					t.Fatal(err)
				}
			}
			s.stop()
			err := <-result
			if clean := err == nil; clean != tc.wantClean {
				t.Errorf("copy = %v; want a clean end: %v", err, tc.wantClean)
			}
			if got := rec.Body.String(); got != tc.sent {
				t.Errorf("client got %q, want %q", got, tc.sent)
			}
		})
	}
}

// A stream whose backend ends it is relayed to its end.
func TestStreamRelaysToTheBackendsEnd(t *testing.T) {
	pr, pw := io.Pipe()
	rec := httptest.NewRecorder()
	s := relayTo(rec, pr)
	result := make(chan error, 1)
	go func() {
		_, err := s.copy(make([]byte, 8), false, false)
		result <- err
	}()
	const sent = "data: {\"a\":1}\n\n"
	if _, err := pw.Write([]byte(sent)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-result; err != nil {
		t.Errorf("copy = %v at the backend's end, want nil", err)
	}
	if rec.Body.String() != sent || !rec.Flushed {
		t.Errorf("client got %q (flushed %v), want %q flushed", rec.Body.String(), rec.Flushed, sent)
	}
}

// A stream about to park keeps copies of its request's header values,
// not substrings of the head they came in (which would stay for the
// stream's life), and gives its body and its reservation back.
func TestLightenedStreamKeepsNoHead(t *testing.T) {
	head := "GET /mcp HTTP/1.1\r\nMcp-Session-Id: 0123456789abcdef\r\nMcp-Protocol-Version: 2025-06-18\r\n\r\n"
	within := func(s string) bool {
		if s == "" {
			return false
		}
		p, lo := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(head)))
		return p >= lo && p < lo+uintptr(len(head))
	}
	field := func(name string) string {
		i := strings.Index(head, name+": ") + len(name) + 2
		return head[i : i+strings.Index(head[i:], "\r\n")]
	}
	p := &Proxy{}
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{}}`)
	p.bodies.reserve(int64(cap(body)))
	s := &eventStream{p: p}
	s.ex.class = classification{SessionID: field("Mcp-Session-Id"), ProtocolVersion: field("Mcp-Protocol-Version"),
		Method: "subscriptions/listen", Body: body, Params: body[len(body)-3 : len(body)-1], ID: body[24:25]}
	s.ex.bodyHeld = int64(cap(body))
	if !within(s.ex.class.SessionID) || !within(s.ex.class.ProtocolVersion) {
		t.Fatal("the test's values are not substrings of its head")
	}
	s.lighten()
	c := s.ex.class
	if within(c.SessionID) || within(c.ProtocolVersion) {
		t.Error("the stream keeps a substring of the request's head")
	}
	if c.SessionID != "0123456789abcdef" || c.ProtocolVersion != "2025-06-18" {
		t.Errorf("values %q, %q after lighten", c.SessionID, c.ProtocolVersion)
	}
	if c.Body != nil || c.Params != nil || c.ID != nil {
		t.Error("the stream keeps its request's body")
	}
	if used := p.bodies.used.Load(); used != 0 || s.ex.bodyHeld != 0 {
		t.Errorf("%d body bytes reserved after lighten (held %d), want 0", used, s.ex.bodyHeld)
	}
}
