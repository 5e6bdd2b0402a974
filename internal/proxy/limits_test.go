package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An announced Content-Length reserves nothing beyond the first chunk: the
// body's buffer, and its reservation, grow with the bytes that arrive
// (issue 10: 500 connections announcing 4 MiB took RSS to 3 GB).
func TestBodyBufferGrowsWithBytesReceived(t *testing.T) {
	const announced = 4 << 20
	for _, tc := range []struct {
		name          string
		contentLength int64
	}{
		{"announced", announced},
		{"chunked", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			r.Body, r.ContentLength = pr, tc.contentLength
			budget := &byteBudget{max: 64 << 20}
			type result struct {
				body []byte
				rerr *requestError
			}
			done := make(chan result, 1)
			go func() {
				body, rerr := readBody(r, DefaultMaxBody, budget)
				done <- result{body, rerr}
			}()

			// Before a byte arrives, at most one chunk is reserved.
			sent := int64(0)
			chunk := bytes.Repeat([]byte("x"), 4<<10)
			for sent < announced {
				// A pipe write returns once readBody has taken the bytes,
				// so what is reserved now was reserved for them.
				if _, err := pw.Write(chunk); err != nil {
					t.Fatal(err)
				}
				sent += int64(len(chunk))
				if used := budget.used.Load(); used > max(bodyChunk, 2*sent) {
					t.Fatalf("after %d bytes received, %d bytes reserved (want at most %d)", sent, used, max(bodyChunk, 2*sent))
				}
			}
			pw.Close()
			res := <-done
			if res.rerr != nil {
				t.Fatalf("readBody: %v", res.rerr)
			}
			if int64(len(res.body)) != announced {
				t.Fatalf("body of %d bytes, want %d", len(res.body), announced)
			}
			if used := budget.used.Load(); used != int64(cap(res.body)) {
				t.Errorf("%d bytes reserved for a body of capacity %d", used, cap(res.body))
			}
			if tc.contentLength >= 0 && cap(res.body) != announced {
				t.Errorf("capacity %d for an announced %d-byte body, want exactly that", cap(res.body), announced)
			}
		})
	}
}

// A small body is read into one buffer of its announced size (the fast
// path allocates once), and a body at the budget's bound is refused with
// everything it had reserved given back.
func TestReadBodyBudgetAndLimits(t *testing.T) {
	post := func(body string, contentLength int64) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		r.ContentLength = contentLength
		return r
	}
	small := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	big := strings.Repeat("a", 40<<10)
	for _, tc := range []struct {
		name     string
		r        *http.Request
		budget   int64
		maxBody  int64
		wantErr  *requestError
		wantCap  int
		wantUsed int64
	}{
		{"small, announced", post(small, int64(len(small))), 1 << 20, 1 << 20, nil, len(small), int64(len(small))},
		{"small, chunked", post(small, -1), 1 << 20, 1 << 20, nil, bodyChunkUnknown, bodyChunkUnknown},
		{"first chunk over the budget", post(big, int64(len(big))), bodyChunk - 1, 1 << 20, errBodyBudget, 0, 0},
		{"growth over the budget", post(big, int64(len(big))), 2 * bodyChunk, 1 << 20, errBodyBudget, 0, 0},
		{"announced over the limit", post(big, int64(len(big))), 1 << 20, 1 << 10, errBodyTooLarge, 0, 0},
		{"chunked over the limit", post(big, -1), 1 << 20, 1 << 10, errBodyTooLarge, 0, 0},
		{"chunked at the limit", post(big, -1), 1 << 20, int64(len(big)), nil, len(big) + 1, int64(len(big) + 1)},
		{"shorter than announced", post(small, int64(len(small))+10), 1 << 20, 1 << 20, errReadBody, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budget := &byteBudget{max: tc.budget}
			body, rerr := readBody(tc.r, tc.maxBody, budget)
			if rerr != tc.wantErr {
				t.Fatalf("error %v, want %v", rerr, tc.wantErr)
			}
			if cap(body) != tc.wantCap {
				t.Errorf("capacity %d, want %d", cap(body), tc.wantCap)
			}
			if used := budget.used.Load(); used != tc.wantUsed {
				t.Errorf("%d bytes left reserved, want %d", used, tc.wantUsed)
			}
		})
	}
}

func TestByteBudget(t *testing.T) {
	b := &byteBudget{max: 100}
	if !b.reserve(60) || !b.reserve(40) {
		t.Fatal("reservations within the bound refused")
	}
	if b.reserve(1) {
		t.Fatal("a reservation past the bound was granted")
	}
	b.release(40)
	if !b.reserve(40) {
		t.Fatal("released bytes not reusable")
	}
	var unbounded *byteBudget
	if !unbounded.reserve(1 << 40) {
		t.Fatal("a nil budget refused")
	}
	s := &slots{max: 2}
	if !s.acquire() || !s.acquire() || s.acquire() {
		t.Fatal("slots: want two granted, the third refused")
	}
	s.release()
	if !s.acquire() || s.open.Load() != 2 {
		t.Fatalf("slots after a release: open %d", s.open.Load())
	}
}
