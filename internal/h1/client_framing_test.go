package h1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The client side of issue 29's differential harness: answers of the
// smuggling and response-splitting families, read by ReadAnswer and by
// http.ReadResponse. The rule is DESIGN.md §13's: where ReadAnswer reads an
// answer, net/http reads the same one (status, fields, framing, body, and
// where it ends in the stream: compareReads); ReadAnswer may refuse what
// net/http reads, and each such case is listed below as stricter, with
// what net/http does with the bytes; it never reads what net/http refuses.

// framingVerdict is what the two readers make of an answer.
type framingVerdict uint8

const (
	// bothRead: both read the answer, and read it alike.
	bothRead framingVerdict = iota
	// neitherReads: both refuse it (its head, or its body).
	neitherReads
	// stricter: ReadAnswer refuses it (ErrMalformedAnswer), net/http reads
	// it, with a guess this table says. Stricter than net/http, on
	// purpose.
	stricter
)

func (v framingVerdict) String() string {
	return [...]string{"both read it", "neither reads it", "only net/http reads it"}[v]
}

type framingCase struct {
	name   string
	in     string // the backend's bytes: one answer, and what follows it
	method string // the request's; "" is GET
	want   framingVerdict
	// reuse, for an answer both read: whether its connection may carry
	// another request once the answer is read through (all of in having
	// arrived at once).
	reuse bool
	// netHTTP, for a stricter case: what net/http makes of the bytes.
	netHTTP string
}

// methodIndex is the case's method as compareReads takes it.
func (c framingCase) methodIndex() uint8 {
	switch c.method {
	case http.MethodPost:
		return 0
	case http.MethodHead:
		return 2
	}
	return 1
}

const (
	chunkedAbc = "3\r\nabc\r\n0\r\n\r\n"
	ok200      = "HTTP/1.1 200 OK\r\n"
	// smuggledAnswer looks like the answer to the next request.
	smuggledAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
	// smuggledChunk is a chunked body whose one chunk is smuggledAnswer,
	// its size line 4 bytes long: what follows a Content-Length of 4 is
	// an answer.
	smuggledChunk = "2e\r\n" + smuggledAnswer + "\r\n0\r\n\r\n"
)

// framingCases: CL/TE variants, obs-fold, duplicate and malformed
// Content-Length, bad chunk sizes and extensions, trailers, NUL, bare CR
// and LF, odd status lines, HTTP/1.0, and HEAD/1xx/204/304 answers with
// bytes after them.
var framingCases = []framingCase{
	// The common shapes.
	{name: "sdk SSE call", in: sdkCall, want: bothRead, reuse: true},
	{name: "sdk 202", in: sdkAccepted, want: bothRead, reuse: true},
	{name: "json 404", in: rpcNotFound, want: bothRead, reuse: true},
	{name: "chunked", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n" + chunkedAbc, want: bothRead, reuse: true},

	// Transfer-Encoding and Content-Length.
	{name: "TE and CL", in: ok200 + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: "drops the Content-Length, frames by the chunks (RFC 9112 §6.1: ought to be an error)"},
	{name: "CL and TE", in: ok200 + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: "drops the Content-Length, frames by the chunks"},
	{name: "space before colon, TE next to CL (issue 29)", in: ok200 + "Transfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: `a field named "Transfer-Encoding " (golang/go#34540); frames by Content-Length 4 and leaves the chunks on the connection`},
	{name: "space before colon, an answer in the chunk", in: ok200 + "Transfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n" + smuggledChunk,
		want: stricter, netHTTP: "frames by Content-Length 4 (the chunk's size line): the chunk's data is an answer, to the next request"},
	{name: "space before colon, TE alone", in: ok200 + "Transfer-Encoding : chunked\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: "reads the chunks, framing and all, as a body up to the close"},
	{name: "space before colon, CL", in: ok200 + "Content-Length : 160\r\n\r\nabc",
		want: stricter, netHTTP: "no Content-Length: a body up to the close, which runs past the answer's end"},
	{name: "tab before colon", in: ok200 + "Transfer-Encoding\t: chunked\r\nContent-Length: 4\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE chunked, identity", in: ok200 + "Transfer-Encoding: chunked, identity\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE identity, chunked", in: ok200 + "Transfer-Encoding: identity, chunked\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE gzip, chunked", in: ok200 + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE twice", in: ok200 + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE xchunked", in: ok200 + "Transfer-Encoding: xchunked\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE empty", in: ok200 + "Transfer-Encoding: \r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "TE vertical tab", in: ok200 + "Transfer-Encoding: \vchunked\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE tab", in: ok200 + "Transfer-Encoding:\tchunked\r\n\r\n" + chunkedAbc, want: bothRead, reuse: true},
	{name: "TE trailing tab", in: ok200 + "Transfer-Encoding: chunked\t\r\n\r\n" + chunkedAbc, want: bothRead, reuse: true},
	{name: "TE Chunked", in: ok200 + "Transfer-Encoding: Chunked\r\n\r\n" + chunkedAbc, want: bothRead, reuse: true},
	{name: "TE with a Kelvin sign", in: ok200 + "Transfer-Encoding: chun\u212aed\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "TE name with NUL", in: ok200 + "Transfer-Encoding\x00: chunked\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "Transfer_Encoding", in: ok200 + "Transfer_Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "fold at the first field", in: ok200 + " Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "fold hides TE", in: ok200 + "X-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: `joins the fold into X-A: "b Transfer-Encoding: chunked" (RFC 9112 §5.2: a proxy replaces it or answers 502)`},
	{name: "tab fold", in: ok200 + "X-A: b\r\n\tc\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: `joins the fold: X-A "b c"`},

	// Content-Length.
	{name: "CL twice, equal", in: ok200 + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "CL twice, differ", in: ok200 + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", want: neitherReads},
	{name: "CL twice, 3 and 03", in: ok200 + "Content-Length: 3\r\nContent-Length: 03\r\n\r\nabc", want: neitherReads},
	{name: "CL list", in: ok200 + "Content-Length: 3, 3\r\n\r\nabc", want: neitherReads},
	{name: "CL +4", in: ok200 + "Content-Length: +4\r\n\r\nabcd", want: neitherReads},
	{name: "CL 0x4", in: ok200 + "Content-Length: 0x4\r\n\r\nabcd", want: neitherReads},
	{name: "CL -1", in: ok200 + "Content-Length: -1\r\n\r\nabcd", want: neitherReads},
	{name: "CL empty", in: ok200 + "Content-Length: \r\n\r\nabcd", want: neitherReads},
	{name: "CL 4 4", in: ok200 + "Content-Length: 4 4\r\n\r\nabcd", want: neitherReads},
	{name: "CL overflow", in: ok200 + "Content-Length: 99999999999999999999\r\n\r\nabcd", want: neitherReads},
	{name: "CL trailing space", in: ok200 + "Content-Length: 4 \r\n\r\nabcd", want: bothRead, reuse: true},
	{name: "CL leading zero", in: ok200 + "Content-Length: 04\r\n\r\nabcd", want: bothRead, reuse: true},
	{name: "CL short of the body", in: ok200 + "Content-Length: 2\r\n\r\nabcd", want: bothRead, reuse: false},
	{name: "CL cut short", in: ok200 + "Content-Length: 8\r\n\r\nabcd", want: neitherReads},

	// Chunk sizes, line ends, extensions.
	{name: "chunk 0x10", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n0x10\r\n" + strings.Repeat("a", 16) + "\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk -1", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n-1\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk 17 digits", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n00000000000000003\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk 16 digits", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n0000000000000003\r\nabc\r\n0\r\n\r\n", want: bothRead, reuse: true},
	{name: "chunk 2^63", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n8000000000000000\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk empty size", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk leading space", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk trailing space", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n", want: bothRead, reuse: true},
	{name: "chunk space inside", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n1 0\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk bare LF", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk bare CR", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r;a\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk data, bare LF", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n", want: neitherReads},
	{name: "chunk data too long", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n", want: neitherReads},
	{name: "chunk without last", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", want: neitherReads},
	{name: "last chunk without CRLF", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n", want: neitherReads},
	{name: "ext token", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;a=b\r\nabc\r\n0;x\r\n\r\n", want: bothRead, reuse: true},
	{name: "ext quoted", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;a=\"q;\\\"x\"; b\r\nabc\r\n0\r\n\r\n", want: bothRead, reuse: true},
	{name: "ext BWS", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3; a = b ;c\r\nabc\r\n0\r\n\r\n", want: bothRead, reuse: true},
	{name: "ext space before ;", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3 ;a\r\nabc\r\n0\r\n\r\n", want: neitherReads},
	{name: "ext empty", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;\r\nabc\r\n0\r\n\r\n",
		want: stricter, netHTTP: "skips whatever follows the ;"},
	{name: "ext no name", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;=b\r\nabc\r\n0\r\n\r\n",
		want: stricter, netHTTP: "skips whatever follows the ;"},
	{name: "ext two words", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;a=b c\r\nabc\r\n0\r\n\r\n",
		want: stricter, netHTTP: "skips whatever follows the ;"},
	{name: "ext NUL", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;a=\x00\r\nabc\r\n0\r\n\r\n",
		want: stricter, netHTTP: "skips whatever follows the ;, NUL included"},
	{name: "ext open quote", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3;a=\"b\r\nabc\r\n0\r\n\r\n",
		want: stricter, netHTTP: "skips whatever follows the ;"},
	{name: "ext on the last chunk", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0;a=\"\\\x01\"\r\n\r\n",
		want: stricter, netHTTP: "skips whatever follows the ;, control bytes included"},

	// Trailers.
	{name: "trailer", in: ok200 + "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3\r\nabc\r\n0\r\nX-T: v\r\n\r\n", want: bothRead, reuse: true},
	{name: "trailer unannounced", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: v\r\nX-T: w\r\n\r\n", want: bothRead, reuse: true},
	{name: "trailer fold", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: v\r\n w\r\n\r\n",
		want: stricter, netHTTP: `joins the fold: X-T "v w"`},
	{name: "trailer bare LF", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: v\nX-U: w\r\n\r\n",
		want: stricter, netHTTP: "takes the bare LF for a line end"},
	{name: "trailer space before colon", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T : v\r\n\r\n",
		want: stricter, netHTTP: `a trailer named "X-T "`},
	{name: "trailer NUL", in: ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: \x00\r\n\r\n", want: neitherReads},
	{name: "trailer announces CL", in: ok200 + "Transfer-Encoding: chunked\r\nTrailer: Content-Length\r\n\r\n" + chunkedAbc, want: neitherReads},
	{name: "Trailer without chunks", in: ok200 + "Trailer: X-T\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},

	// NUL, bare CR, bare LF in the head.
	{name: "NUL in a value", in: ok200 + "X-A: a\x00b\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "NUL in a name", in: ok200 + "X-\x00A: b\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "NUL in the reason", in: "HTTP/1.1 200 O\x00K\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: `status "200 O\x00K"`},
	{name: "bare CR in a value", in: ok200 + "X-A: a\rb\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "bare CR ends the status line", in: "HTTP/1.1 200 OK\r\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: `status "200 OK\r"`},
	{name: "bare LF everywhere", in: "HTTP/1.1 200 OK\nContent-Length: 3\n\nabc",
		want: stricter, netHTTP: "takes a bare LF for a line end (RFC 9112 §2.2 allows it; a peer may not)"},
	{name: "bare LF ends a field", in: ok200 + "Content-Length: 3\n\r\nabc",
		want: stricter, netHTTP: "takes a bare LF for a line end"},
	{name: "bare LF inside a field", in: ok200 + "X-A: a\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "reads a Content-Length that a peer which ends lines with CRLF only reads as part of X-A, with no length"},
	{name: "blank line first", in: "\r\n" + ok200 + "Content-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "name not a token", in: ok200 + "X(A): b\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "empty name", in: ok200 + ": b\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "no colon", in: ok200 + "X-A b\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "underscore name", in: ok200 + "X_A: b\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "obs-text value", in: ok200 + "X-A: \xe9t\xe9\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "long head", in: ok200 + "X-Long: " + strings.Repeat("x", 5000) + "\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "256 fields", in: ok200 + strings.Repeat("X-N: 1\r\n", 255) + "Content-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "257 fields", in: ok200 + strings.Repeat("X-N: 1\r\n", 256) + "Content-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "bounds a head by its bytes only"},
	{name: "long head with 600 fields", in: ok200 + strings.Repeat("X-N: 1\r\n", 600) + "Content-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "bounds a head by its bytes only"},
	{name: "long head with a bare LF", in: ok200 + "X-Long: " + strings.Repeat("x", 5000) + "\r\nContent-Length: 3\n\r\nabc",
		want: stricter, netHTTP: "takes a bare LF for a line end"},

	// Status lines.
	{name: "status 000", in: "HTTP/1.1 000 OK\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "status 0 (issue 29 item 6: WriteHeader(0) panics)"},
	{name: "status 099", in: "HTTP/1.1 099 OK\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "status 99: no such status; WriteHeader panics"},
	{name: "status +20", in: "HTTP/1.1 +20 OK\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "status 20 (strconv.Atoi takes the sign)"},
	{name: "status -20", in: "HTTP/1.1 -20 OK\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "status 1000", in: "HTTP/1.1 1000 OK\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "status 20", in: "HTTP/1.1 20 OK\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},
	{name: "status after two spaces", in: "HTTP/1.1  200 OK\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "trims the spaces before the status"},
	{name: "status 999", in: "HTTP/1.1 999 Odd\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "status without reason", in: "HTTP/1.1 200\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "status with tab in reason", in: "HTTP/1.1 200 O\tK\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "HTTP/1.2", in: "HTTP/1.2 200 OK\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "reads it as HTTP/1.2 (ProtoMinor 2)"},
	{name: "HTTP/2.0", in: "HTTP/2.0 200 OK\r\nContent-Length: 3\r\n\r\nabc",
		want: stricter, netHTTP: "reads an HTTP/2.0 answer off an HTTP/1.1 connection"},
	{name: "http/1.1", in: "http/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", want: neitherReads},

	// HTTP/1.0.
	{name: "1.0 to the close", in: "HTTP/1.0 200 OK\r\n\r\nabc", want: bothRead, reuse: false},
	{name: "1.0 keep-alive", in: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: true},
	{name: "1.0 CL without keep-alive", in: "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: false},
	{name: "1.0 TE", in: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: "ignores Transfer-Encoding: the chunks, framing and all, up to the close (RFC 9112 §6.1: faulty framing)"},
	{name: "1.0 TE, CL, keep-alive", in: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: `frames by Content-Length 3 ("3\r\n") and keeps the connection, with the rest of the chunks on it`},

	// Answers without a body, and bytes after them.
	{name: "HEAD, CL, body sent", method: http.MethodHead, in: ok200 + "Content-Length: 5\r\n\r\nhello", want: bothRead, reuse: false},
	{name: "HEAD, CL", method: http.MethodHead, in: ok200 + "Content-Length: 5\r\n\r\n", want: bothRead, reuse: true},
	{name: "HEAD, chunked", method: http.MethodHead, in: ok200 + "Transfer-Encoding: chunked\r\n\r\n", want: bothRead, reuse: true},
	{name: "HEAD, chunked, body sent", method: http.MethodHead, in: ok200 + "Transfer-Encoding: chunked\r\n\r\n" + chunkedAbc, want: bothRead, reuse: false},
	{name: "204, CL 0", in: "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", want: bothRead, reuse: true},
	{name: "204, CL 5", in: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
		want: stricter, netHTTP: "no body; the 5 bytes stay on the connection (RFC 9110 §8.6: a 204 has no Content-Length)"},
	{name: "204, chunked", in: "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: "no body; the chunks stay on the connection (RFC 9112 §6.1: a 204 has no Transfer-Encoding)"},
	{name: "204, body sent", in: "HTTP/1.1 204 No Content\r\n\r\nhello", want: bothRead, reuse: false},
	{name: "304, CL", in: "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", want: bothRead, reuse: true},
	{name: "304, CL, body sent", in: "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nhello", want: bothRead, reuse: false},
	{name: "304, chunked, body sent", in: "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc, want: bothRead, reuse: false},
	{name: "100, CL 5", in: "HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\nhello",
		want: stricter, netHTTP: "no body; the 5 bytes are read as the next answer"},
	{name: "103, chunked", in: "HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc,
		want: stricter, netHTTP: "no body; the chunks are read as the next answer"},
	{name: "100, then junk", in: "HTTP/1.1 100 Continue\r\n\r\nhello", want: bothRead, reuse: false},
	{name: "101", in: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n", want: bothRead, reuse: false},
	{name: "close", in: ok200 + "Connection: close\r\nContent-Length: 3\r\n\r\nabc", want: bothRead, reuse: false},
	{name: "to the close", in: ok200 + "\r\nabc", want: bothRead, reuse: false},
	{name: "bytes after the answer", in: ok200 + "Content-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED", want: bothRead, reuse: false},
}

// framingOutcome is what one reader made of a case's first answer,
// read through.
type framingOutcome struct {
	resp *http.Response
	body string
	err  error
}

func readFirstAnswer(c framingCase, read func(*bufio.Reader, *http.Request) (*http.Response, error)) (framingOutcome, *bufio.Reader) {
	br := bufio.NewReader(strings.NewReader(c.in))
	req := &http.Request{Method: http.MethodGet}
	if c.method != "" {
		req.Method = c.method
	}
	resp, err := read(br, req)
	if err != nil {
		return framingOutcome{err: err}, br
	}
	body, err := io.ReadAll(resp.Body)
	return framingOutcome{resp: resp, body: string(body), err: err}, br
}

// TestAnswerFraming holds each case to its verdict, and the answers both
// read to compareReads' agreement (in several arrival shapes) and to
// Reusable's verdict on their connection.
func TestAnswerFraming(t *testing.T) {
	for _, c := range framingCases {
		t.Run(c.name, func(t *testing.T) {
			var answer *Answer
			got, br := readFirstAnswer(c, func(br *bufio.Reader, req *http.Request) (*http.Response, error) {
				a, err := ReadAnswer(br, req)
				if err != nil {
					return nil, err
				}
				answer = a
				return a.Response, nil
			})
			want, _ := readFirstAnswer(c, http.ReadResponse)
			var verdict framingVerdict
			switch {
			case got.err == nil && want.err == nil:
				verdict = bothRead
			case got.err != nil && want.err != nil:
				verdict = neitherReads
			case got.err != nil:
				verdict = stricter
			default:
				t.Fatalf("%q: read by ReadAnswer, refused by net/http (%v): looser than net/http", c.in, want.err)
			}
			if verdict != c.want {
				t.Fatalf("%q: %v (ReadAnswer: %v; net/http: %v), want %v", c.in, verdict, got.err, want.err, c.want)
			}
			switch verdict {
			case bothRead:
				for _, shape := range []uint16{0, 1, 0x0107, 0x8000, 0x4002} {
					compareReads(t, c.in, c.methodIndex(), shape, true)
				}
				if reuse := answer.Reusable(br); reuse != c.reuse {
					t.Errorf("Reusable %v, want %v", reuse, c.reuse)
				}
			case neitherReads:
				if !errors.Is(got.err, ErrMalformedAnswer) && !errors.Is(got.err, io.ErrUnexpectedEOF) {
					t.Errorf("error %v: want ErrMalformedAnswer, or io.ErrUnexpectedEOF for a cut answer", got.err)
				}
			case stricter:
				if !errors.Is(got.err, ErrMalformedAnswer) {
					t.Errorf("error %v, want ErrMalformedAnswer", got.err)
				}
				if c.netHTTP == "" {
					t.Errorf("a stricter case says what net/http makes of it")
				}
				t.Logf("stricter than net/http: %v; net/http %s (status %q, body %q)", got.err, c.netHTTP, want.resp.Status, want.body)
			}
		})
	}
}
