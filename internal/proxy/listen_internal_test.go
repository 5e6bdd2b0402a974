package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

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
