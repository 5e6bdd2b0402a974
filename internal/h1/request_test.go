package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// TestWriteRequestAsNetHTTP: what WriteRequest writes reads back as what
// Request.Write writes.
func TestWriteRequestAsNetHTTP(t *testing.T) {
	body := `{"jsonrpc":"2.0","id":2,"method":"tools/call"}`
	mk := func(method, target, host string, h http.Header, b string) *http.Request {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		r := &http.Request{Method: method, URL: u, Host: host, Header: h, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
		if b != "" {
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(b)), int64(len(b))
		}
		return r
	}
	for _, tc := range []struct {
		name string
		req  func() *http.Request
	}{
		{"follow-up", func() *http.Request {
			return mk("POST", "http://10.0.0.1:8080/mcp", "tether:8080", http.Header{
				"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"},
				"Mcp-Session-Id": {"abc"}, "User-Agent": {""}, "X-Multi": {"a", "b"}}, body)
		}},
		{"GET stream", func() *http.Request {
			return mk("GET", "http://10.0.0.1:8080/mcp?x=1", "", http.Header{"Accept": {"text/event-stream"}, "User-Agent": {"client/1"}}, "")
		}},
		{"DELETE without a body", func() *http.Request { return mk("DELETE", "http://b/mcp", "h", http.Header{}, "") }},
		{"POST without a body", func() *http.Request { return mk("POST", "http://b/", "h", http.Header{}, "") }},
		{"no User-Agent", func() *http.Request { return mk("GET", "http://b/p%2Fq", "h", http.Header{}, "") }},
		{"empty path", func() *http.Request { return mk("GET", "http://b", "h", http.Header{}, "") }},
		{"force query", func() *http.Request { return mk("GET", "http://b/x?", "h", http.Header{}, "") }},
		{"line break in a value", func() *http.Request {
			return mk("GET", "http://b/", "h", http.Header{"X-N": {"a\r\nX-Injected: b"}, "Content-Length": {"99"}}, "")
		}},
		{"closes (net/http writes it)", func() *http.Request {
			r := mk("GET", "http://b/", "h", http.Header{}, "")
			r.Close = true
			return r
		}},
		{"unicode host (net/http writes it)", func() *http.Request { return mk("GET", "http://b/", "bücher.example", http.Header{}, "") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got, want bytes.Buffer
			bw := bufio.NewWriter(&got)
			if err := WriteRequest(bw, tc.req()); err != nil {
				t.Fatal(err)
			}
			bw.Flush()
			if err := tc.req().Write(&want); err != nil {
				t.Fatal(err)
			}
			g, w := readBack(t, got.Bytes()), readBack(t, want.Bytes())
			if !reflect.DeepEqual(g, w) {
				t.Errorf("WriteRequest:\n%q\nreads as %+v\nRequest.Write:\n%q\nreads as %+v", got.String(), g, want.String(), w)
			}
		})
	}
}

type readRequest struct {
	Method, URI, Host string
	Header            http.Header
	Length            int64
	Chunked, Close    bool
	Body              string
}

func readBack(t *testing.T, b []byte) readRequest {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("%q: body: %v", b, err)
	}
	return readRequest{r.Method, r.RequestURI, r.Host, r.Header, r.ContentLength, len(r.TransferEncoding) > 0, r.Close, string(body)}
}

func TestWriteRequestAllocations(t *testing.T) {
	u, _ := url.Parse("http://10.0.0.1:8080/mcp")
	h := http.Header{"Content-Type": {"application/json"}, "Mcp-Session-Id": {"abc"}, "User-Agent": {""}}
	body := strings.NewReader("")
	bw := bufio.NewWriter(io.Discard)
	req := &http.Request{Method: "POST", URL: u, Host: "tether", Header: h, Body: io.NopCloser(body), ContentLength: 9}
	n := testing.AllocsPerRun(100, func() {
		body.Reset(`{"id":22}`)
		if err := WriteRequest(bw, req); err != nil {
			t.Fatal(err)
		}
	})
	if n > 0 {
		t.Errorf("WriteRequest: %v allocations per request, want 0", n)
	}
}
