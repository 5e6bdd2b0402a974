package proxy

import (
	"io"
	"net/http/httptest"
	"testing"
)

// copyListen relays a listen stream until its backend departs, then ends
// the response cleanly when the client holds whole events only, and
// aborts it (an error) when the departure cut an event in half.
func TestCopyListenEndsAtAnEventBoundary(t *testing.T) {
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
			departed := make(chan struct{})
			rec := httptest.NewRecorder()
			result := make(chan error, 1)
			go func() { result <- copyListen(rec, pr, make([]byte, 8), departed) }()
			if tc.sent != "" {
				// The pipe hands over a write once it has been read whole, so
				// the relay has every byte when Write returns.
				if _, err := pw.Write([]byte(tc.sent)); err != nil {
					t.Fatal(err)
				}
			}
			close(departed)
			err := <-result
			if clean := err == nil; clean != tc.wantClean {
				t.Errorf("copyListen = %v; want a clean end: %v", err, tc.wantClean)
			}
			if got := rec.Body.String(); got != tc.sent {
				t.Errorf("client got %q, want %q", got, tc.sent)
			}
		})
	}
}

// A stream whose backend ends it is relayed to its end, departure or not.
func TestCopyListenRelaysToTheBackendsEnd(t *testing.T) {
	pr, pw := io.Pipe()
	rec := httptest.NewRecorder()
	result := make(chan error, 1)
	go func() { result <- copyListen(rec, pr, make([]byte, 8), nil) }()
	const sent = "data: {\"a\":1}\n\n"
	if _, err := pw.Write([]byte(sent)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-result; err != nil {
		t.Errorf("copyListen = %v at the backend's end, want nil", err)
	}
	if rec.Body.String() != sent || !rec.Flushed {
		t.Errorf("client got %q (flushed %v), want %q flushed", rec.Body.String(), rec.Flushed, sent)
	}
}
