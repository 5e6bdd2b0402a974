package h1

import (
	"bufio"
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// parseSeeds are request heads the fast path takes, and some it leaves.
var parseSeeds = []string{
	"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: abc\r\nContent-Length: 42\r\n\r\n",
	"GET /mcp HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\nmcp-session-id: s1\r\nlast-event-id: 7\r\n\r\n",
	"DELETE /mcp?x=1&y=%20 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	"GET /a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /a!b HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /? HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET //x HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nx-a: 2\r\nX-Very-Long-Header-Name-That-Is-Not-Common: v\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX-A:   spaced\t \r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: x\r\n\r\n",
	"GET / HTTP/1.1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n",
	"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
	"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX: \x01\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n",
	"OPTIONS /mcp HTTP/1.1\r\nHost: [::1]:80\r\nOrigin: http://a\r\n\r\n",
}

// FuzzParseHead checks the fast path against net/http: a head it parses
// must be one net/http's server accepts, read into the same request.
func FuzzParseHead(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		end, bare := headEnd([]byte(in), 0)
		if bare || end < 0 {
			return
		}
		in = in[:end]
		got, ok := parseHead(in, nil)
		if !ok {
			return
		}
		want, err := http.ReadRequest(bufio.NewReader(strings.NewReader(in)))
		if err != nil {
			t.Fatalf("fast path took %q, net/http refuses it: %v", in, err)
		}
		if reason := serverRefuses(in, want); reason != "" {
			t.Fatalf("fast path took %q, net/http's server refuses it: %s", in, reason)
		}
		if got.method != want.Method || got.target != want.RequestURI || got.host != want.Host ||
			got.contentLength != want.ContentLength || got.close != want.Close {
			t.Fatalf("%q:\nfast    %s %s host %q len %d close %v\nnet/http %s %s host %q len %d close %v", in,
				got.method, got.target, got.host, got.contentLength, got.close,
				want.Method, want.RequestURI, want.Host, want.ContentLength, want.Close)
		}
		if got.url != *want.URL {
			t.Fatalf("%q: URL %#v, net/http %#v", in, got.url, *want.URL)
		}
		if gotHeader := got.fields.Header(); !reflect.DeepEqual(gotHeader, want.Header) {
			t.Fatalf("%q: header %q, net/http %q", in, gotHeader, want.Header)
		}
		if len(want.TransferEncoding) > 0 || want.ProtoMinor != 1 {
			t.Fatalf("%q: net/http reads %v %s", in, want.TransferEncoding, want.Proto)
		}
	})
}

// serverRefuses is what net/http's server (not ReadRequest, which drops
// the Host header) checks of a request before its handler runs.
func serverRefuses(in string, r *http.Request) string {
	tp := textproto.NewReader(bufio.NewReader(strings.NewReader(in)))
	tp.ReadLine()
	raw, _ := tp.ReadMIMEHeader()
	if hosts := raw["Host"]; len(hosts) != 1 || !httpguts.ValidHostHeader(hosts[0]) {
		return "Host"
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return "header name " + k
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "header value of " + k
			}
		}
	}
	if r.Header.Get("Expect") != "" {
		return "Expect"
	}
	return ""
}

// TestParseSeeds pins which seeds the fast path takes.
func TestParseSeeds(t *testing.T) {
	fast := map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true, 10: true, 23: true, 24: true}
	for i, s := range parseSeeds {
		end, bare := headEnd([]byte(s), 0)
		_, ok := parseHead(s[:max(end, 0)], nil)
		ok = ok && !bare && end == len(s)
		if ok != fast[i] {
			t.Errorf("seed %d %q: fast %v, want %v", i, s, ok, fast[i])
		}
	}
}

// TestParseFieldsLineEnds: fields must end with the blank line, each
// line with CRLF.
func TestParseFieldsLineEnds(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"A: b\r\n\r\n", true},
		{"\r\n", true},
		{"A: b\r\nA: c\r\n\r\n", true},
		{"A: b\r\n", false},
		{"A: b\r\nC: d", false},
		{"A: b\nC: d\r\n\r\n", false},
		{"A: b\r\n\n", false},
		{"", false},
		{"\n", false},
	} {
		if h, ok := ParseFields(tc.in); ok != tc.ok || ok && len(h) == 0 && tc.in != "\r\n" {
			t.Errorf("ParseFields(%q) = %v, %v; want ok %v", tc.in, h, ok, tc.ok)
		}
	}
	h, _ := ParseFields("A: b\r\nMcp-Session-Id: s\r\nA: c\r\nmcp-session-id: t\r\n\r\n")
	if want := (http.Header{"A": {"b", "c"}, "Mcp-Session-Id": {"s", "t"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("repeated fields: %q, want %q", h, want)
	}
}

func TestHeadEnd(t *testing.T) {
	for _, tc := range []struct {
		in        string
		from, end int
		bare      bool
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 27, false},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET", 0, 27, false},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r", 0, -1, false},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 25, 27, false}, // the blank line split across reads
		{"GET / HTTP/1.1\nHost: x\n\n", 0, -1, true},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n\nbody", 0, 27, false}, // a body's LF is not the head's
		{"\n", 0, -1, true},
	} {
		end, bare := headEnd([]byte(tc.in), tc.from)
		if end != tc.end || bare != tc.bare {
			t.Errorf("headEnd(%q, %d) = %d, %v; want %d, %v", tc.in, tc.from, end, bare, tc.end, tc.bare)
		}
	}
}

func TestCanonicalKey(t *testing.T) {
	for _, k := range []string{"content-type", "CONTENT-TYPE", "Content-Type", "mcp-session-id", "X-Request-Id", "x-request-iD", "X-Request-Ie", "x-custom-thing", "X-Custom-Thing", "a", "x_y", "-x-", strings.Repeat("ab-", 30)} {
		got, c := canonicalKey(k)
		if want := http.CanonicalHeaderKey(k); got != want {
			t.Errorf("canonicalKey(%q) = %q, want %q", k, got, want)
		}
		if want := slices.Index(commonKeys[:], got); c != want {
			t.Errorf("canonicalKey(%q): common index %d, want %d", k, c, want)
		}
	}
	for i, k := range commonKeys {
		if c := common(k); c != i {
			t.Errorf("common(%q) = %d, want %d", k, c, i)
		}
		if c := common([]byte(strings.ToLower(k))); c != -1 && k != strings.ToLower(k) {
			t.Errorf("common(%q) = %d, want -1", strings.ToLower(k), c)
		}
	}
	if n := testing.AllocsPerRun(100, func() { canonicalKey("mcp-session-id") }); n != 0 {
		t.Errorf("canonicalKey of a common key in lower case: %v allocations, want 0", n)
	}
}

// BenchmarkParseFields parses the header fields of a follow-up as MCP
// clients send it.
func BenchmarkParseFields(b *testing.B) {
	fields := "Host: tether\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: 0123456789abcdef\r\nUser-Agent: node\r\nAccept-Encoding: gzip, deflate\r\nContent-Length: 42\r\n\r\n"
	b.ReportAllocs()
	for range b.N {
		if _, ok := ParseFields(fields); !ok {
			b.Fatal("not parsed")
		}
	}
}

// BenchmarkParseHead parses the head of a follow-up into a list a connection
// reuses: as the bench's load
// generator sends it (eight fields besides Host), and as a Node MCP client
// does (fetch's fields too).
func BenchmarkParseHead(b *testing.B) {
	for _, tc := range []struct{ name, head string }{
		{"bench", "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 112\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: 0123456789abcdef0123456789abcdef\r\nX-Vegeta-Seq: 12345\r\nAccept-Encoding: gzip\r\n\r\n"},
		{"node", "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nconnection: keep-alive\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-session-id: 0123456789abcdef0123456789abcdef\r\nmcp-protocol-version: 2025-06-18\r\naccept-language: *\r\nsec-fetch-mode: cors\r\nuser-agent: node\r\naccept-encoding: gzip, deflate\r\ncontent-length: 112\r\n\r\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var fields Fields // reused, as a connection does
			for range b.N {
				h, ok := parseHead(tc.head, fields[:0])
				if !ok {
					b.Fatal("not parsed")
				}
				fields = h.fields
			}
		})
	}
}
