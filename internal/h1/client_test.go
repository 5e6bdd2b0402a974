package h1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// Answers of a go-sdk backend (v1, streamable HTTP), as read off its
// socket: the SSE stream of a call, the 202 of a notification, a 400 and
// a 404 of net/http's http.Error; and a 404 with a JSON-RPC body, as
// tether itself and other SDKs send.
const (
	sdkInitialize = "HTTP/1.1 200 OK\r\nCache-Control: no-cache, no-transform\r\nConnection: keep-alive\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: W767CD3D4JLJJRJET2CQD4LWGL\r\nDate: Mon, 30 Nov 2026 22:04:35 GMT\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"c0\r\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"capabilities\":{\"logging\":{},\"tools\":{\"listChanged\":true}},\"protocolVersion\":\"2025-06-18\",\"serverInfo\":{\"name\":\"b\",\"version\":\"1.0.0\"}}}\n\n\r\n0\r\n\r\n"
	sdkCall = "HTTP/1.1 200 OK\r\nCache-Control: no-cache, no-transform\r\nConnection: keep-alive\r\nContent-Type: text/event-stream\r\nDate: Mon, 30 Nov 2026 22:04:36 GMT\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"b3\r\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"{\\\"backend\\\":\\\"b\\\",\\\"text\\\":\\\"hi\\\"}\"}],\"structuredContent\":{\"backend\":\"b\",\"text\":\"hi\"}}}\n\n\r\n0\r\n\r\n"
	sdkAccepted   = "HTTP/1.1 202 Accepted\r\nDate: Mon, 30 Nov 2026 22:04:36 GMT\r\nContent-Length: 0\r\n\r\n"
	sdkBadRequest = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: Mon, 30 Nov 2026 22:04:37 GMT\r\nContent-Length: 64\r\n\r\n" +
		"malformed payload: unmarshaling jsonrpc message: unexpected EOF\n"
	sdkNotFound = "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: Mon, 30 Nov 2026 22:04:37 GMT\r\nContent-Length: 18\r\n\r\nsession not found\n"
	rpcNotFound = "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 79\r\n\r\n" +
		`{"jsonrpc":"2.0","id":3,"error":{"code":-32001,"message":"session not found"}}` + "\n"
)

// responseSeeds are answers ReadAnswer reads (the first ones), and
// others, nasty ones among them, that it reads or refuses; the framing
// table (client_framing_test.go) has more.
var responseSeeds = []string{
	sdkInitialize, sdkCall, sdkAccepted, sdkBadRequest, sdkNotFound, rpcNotFound,
	sdkCall + sdkAccepted + sdkCall, // keep-alive: one after another
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + sdkCall,
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Done, x-also\r\n\r\n3\r\nabc\r\n0\r\nX-Done: yes\r\nX-Extra: 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1 \r\nabc\r\n0\r\nX-Unannounced: v\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc",  // huge chunk size
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nabc", // 17 digits
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8000000000000000\r\nabc",  // past 63 bits
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",                // truncated chunk
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\nabc\r\n0\r\n\r\n",  // bad hex
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n",        // no final CRLF
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",   // data longer than its size
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",      // bare LF
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + strings.Repeat("y", 5000) + "\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTrailer: Content-Length\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nup to the close",
	"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the close",
	"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
	"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
	"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
	"HTTP/1.1 200 OK\r\nX-A: one\r\n folded\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\n X-A: one\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nBad Name: v\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX: a\x01b\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX: a\x80b\r\nx: \t two \t\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 +20 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("p", 100)+"\r\n", 50) + "\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r",
	"HTTP/1.1 200 O",
	"",
	"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
}

// FuzzReadAnswer reads the same bytes with ReadAnswer and with
// http.ReadResponse, as a client would on a keep-alive connection (up to
// four answers, each body read through), and requires the same answers,
// or a refusal from ReadAnswer (ErrMalformedAnswer) where net/http reads
// one; never an answer net/http refuses. method picks the request's
// method; shape picks how the bytes arrive (in pieces of what size, with
// the end of the input along with the last bytes or not), the reader's
// buffer size and the body read size.
func FuzzReadAnswer(f *testing.F) {
	for _, s := range responseSeeds {
		f.Add(s, uint8(0), uint16(0))
		f.Add(s, uint8(1), uint16(0x0103))
	}
	for _, c := range framingCases {
		f.Add(c.in, c.methodIndex(), uint16(0))
	}
	f.Fuzz(func(t *testing.T, in string, method uint8, shape uint16) {
		compareReads(t, in, method, shape, false)
	})
}

// TestReadAnswerSeeds runs the differential check over the seeds in a
// few shapes, and pins which seeds ReadAnswer reads.
func TestReadAnswerSeeds(t *testing.T) {
	for i, s := range responseSeeds {
		for _, method := range []uint8{0, 1, 2} {
			for _, shape := range []uint16{0, 1, 0x0107, 0x8000, 0x4002, 0x20ff} {
				compareReads(t, s, method, shape, false)
				compareReads(t, s, method, shape, true)
			}
		}
		if i < 10 && !readsAnswer(s) {
			t.Errorf("seed %d %.40q: refused", i, s)
		}
	}
}

// readsAnswer reports whether ReadAnswer reads the first answer of in,
// all at once.
func readsAnswer(in string) bool {
	_, err := ReadAnswer(bufio.NewReader(strings.NewReader(in)), nil)
	return err == nil
}

// compareReads reads in with ReadAnswer and with http.ReadResponse, answer
// after answer as a client does on a keep-alive connection, and requires
// that ReadAnswer reads each answer as net/http does or refuses it
// (ErrMalformedAnswer), answer or body; never that it reads one net/http
// refuses, nor a different answer. Each answer read through ends at the
// same byte of the stream for both (no byte countingReader twice or skipped).
// pooled reads on only as a pooling client does, while the answer is
// Reusable; otherwise up to four answers, until net/http's closes the
// connection.
func compareReads(t *testing.T, in string, method uint8, shape uint16, pooled bool) {
	t.Helper()
	req := &http.Request{Method: []string{http.MethodPost, http.MethodGet, http.MethodHead}[method%3]}
	size := 4096
	if shape&0x4000 != 0 {
		size = 64 // a small buffer: long heads, lines and trailers
	}
	gsrc, wsrc := &countingReader{r: source(in, shape)}, &countingReader{r: source(in, shape)}
	gbr := bufio.NewReaderSize(gsrc, size)
	wbr := bufio.NewReaderSize(wsrc, size)
	readSize := 1 + int(shape>>8&0x3f)
	for n := 0; ; n++ {
		where := func() string { return fmt.Sprintf("%q %s, shape %#x, answer %d", in, req.Method, shape, n) }
		got, gerr := ReadAnswer(gbr, req)
		want, werr := http.ReadResponse(wbr, req)
		switch {
		case gerr == nil && werr != nil:
			t.Fatalf("%s: read, where net/http refuses it: %v", where(), werr)
		case gerr != nil && werr == nil && !errors.Is(gerr, ErrMalformedAnswer):
			t.Fatalf("%s: error %v, where net/http reads it (a refusal must be ErrMalformedAnswer)", where(), gerr)
		case gerr != nil:
			return
		}
		diff := func(what string, g, w any) {
			t.Helper()
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("%s: %s %#v, net/http %#v", where(), what, g, w)
			}
		}
		diff("status", got.Status, want.Status)
		diff("status code", got.StatusCode, want.StatusCode)
		diff("proto", []any{got.Proto, got.ProtoMajor, got.ProtoMinor}, []any{want.Proto, want.ProtoMajor, want.ProtoMinor})
		diff("header", got.Header.Header(), want.Header)
		diff("header fields", got.Header, fieldsLike(got.Header, want.Header))
		if got.Response.Header != nil {
			t.Fatalf("%q: the response has a header map besides its fields", in)
		}
		diff("content length", got.ContentLength, want.ContentLength)
		diff("transfer encoding", got.TransferEncoding, want.TransferEncoding)
		diff("close", got.Close, want.Close)
		diff("trailer", got.Trailer, want.Trailer)
		diff("no body", got.Body == http.NoBody, want.Body == http.NoBody)
		if got.Request != req {
			t.Fatalf("%q: Request not set", in)
		}
		if got.StatusCode < 100 || got.StatusCode > 999 {
			t.Fatalf("%s: status %d read", where(), got.StatusCode)
		}
		gb, gerr := readBody(got.Body, readSize)
		wb, werr := readBody(want.Body, readSize)
		switch {
		case gerr == nil && werr != nil:
			t.Fatalf("%s: body read, where net/http's fails: %v", where(), werr)
		case gerr != nil && werr == nil && !errors.Is(gerr, ErrMalformedAnswer):
			t.Fatalf("%s: body error %v, where net/http reads it (a refusal must be ErrMalformedAnswer)", where(), gerr)
		case gerr != nil:
			// A refusal may come before bytes net/http gives and then fails
			// on (a chunk size past 63 bits).
			if !strings.HasPrefix(string(wb), string(gb)) {
				t.Fatalf("%s: body %q before its failure, net/http's %q", where(), gb, wb)
			}
		default:
			diff("body", string(gb), string(wb))
		}
		if gerr != nil {
			if got.Reusable(gbr) {
				t.Fatalf("%s: reusable after a failed body", where())
			}
			return
		}
		diff("trailer after the body", got.Trailer, want.Trailer)
		diff("end of the answer in the stream", gsrc.n-gbr.Buffered(), wsrc.n-wbr.Buffered())
		reusable := got.Reusable(gbr)
		if reusable && (want.Close || want.StatusCode == http.StatusSwitchingProtocols) {
			t.Fatalf("%s: reusable, where net/http's connection ends", where())
		}
		if pooled && !reusable {
			return // a pooling client closes the connection here
		}
		if want.Close || want.StatusCode == http.StatusSwitchingProtocols || n == 3 {
			// The connection ends here; what follows is the same.
			g, _ := io.ReadAll(gbr)
			w, _ := io.ReadAll(wbr)
			diff("bytes left", string(g), string(w))
			return
		}
	}
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// fieldsLike checks the accessors of got against net/http's header want,
// and returns got when they agreesWithNetHTTP: each name's values, in order, are
// want's, and got has no other field. (A failure shows as a difference.)
func fieldsLike(got Fields, want http.Header) Fields {
	n := 0
	for k, vv := range want {
		n += len(vv)
		if !reflect.DeepEqual(got.Values(k), vv) || got.Get(k) != vv[0] || !got.Has(k) || got.Count(k) != len(vv) {
			return nil
		}
	}
	if len(got) != n {
		return nil
	}
	return got
}

// source is in as a reader of the given shape: the low byte is the
// largest read (0 for all at once); 0x8000 returns the end of the input
// with the last bytes.
func source(in string, shape uint16) io.Reader {
	var r io.Reader = strings.NewReader(in)
	if shape&0x8000 != 0 {
		r = iotest.DataErrReader(r)
	}
	if max := int(shape & 0xff); max > 0 {
		r = &pieces{r: r, max: max}
	}
	return r
}

// pieces reads at most max bytes at a time.
type pieces struct {
	r   io.Reader
	max int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(b) > p.max {
		b = b[:p.max]
	}
	return p.r.Read(b)
}

// readBody reads body to its end or failure, size bytes at a time.
func readBody(body io.Reader, size int) ([]byte, error) {
	var out []byte
	buf := make([]byte, size)
	for {
		n, err := body.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if len(out) > 1<<20 {
			return out, errors.New("body runs on")
		}
	}
}

// A read error within the head is the caller's, as it came: tether's
// client tells a reset that means the request was not read by its type.
func TestReadAnswerKeepsReadErrors(t *testing.T) {
	mine := errors.New("reset")
	for _, before := range []string{"", "HTTP/1.1 200 OK\r\n"} {
		br := bufio.NewReader(io.MultiReader(strings.NewReader(before), iotest.ErrReader(mine)))
		if _, err := ReadAnswer(br, nil); err != mine {
			t.Errorf("after %q: error %v, want the reader's", before, err)
		}
	}
	for _, in := range []string{"", "HTTP/1.1 200 OK\r\n"} {
		if _, err := ReadAnswer(bufio.NewReader(strings.NewReader(in)), nil); err != io.ErrUnexpectedEOF {
			t.Errorf("%q: error %v, want io.ErrUnexpectedEOF", in, err)
		}
	}
}

// The body returns its end with its last bytes, when they are buffered:
// the client gives the connection back without another read. A read that
// has bytes does not wait for the next chunk's size line.
func TestBodyEndsWithItsLastBytes(t *testing.T) {
	for _, in := range []string{sdkCall, sdkBadRequest} {
		resp, err := ReadAnswer(bufio.NewReader(strings.NewReader(in)), nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := resp.Body.Read(make([]byte, 4096))
		if n == 0 || err != io.EOF {
			t.Errorf("%.20q: read %d, %v; want the body and io.EOF", in, n, err)
		}
	}
	// The first chunk's bytes come back while the next chunk is still on
	// its way (the reader would block for it).
	br := bufio.NewReader(&pieces{r: io.MultiReader(strings.NewReader(
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"), blockingReader{}), max: 4096})
	resp, err := ReadAnswer(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); string(buf[:n]) != "abc" || err != nil {
		t.Fatalf("read %q, %v; want abc", buf[:n], err)
	}
}

// blockingReader fails the test instead of blocking.
type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { panic("read would block") }

func TestBodyAfterClose(t *testing.T) {
	resp, err := ReadAnswer(bufio.NewReader(strings.NewReader(sdkCall)), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 8)); err != http.ErrBodyReadAfterClose {
		t.Errorf("read after Close: %v, want http.ErrBodyReadAfterClose", err)
	}
}

// maxReadAllocs bounds the allocations of reading a go-sdk SSE answer:
// the answer with its body and fields, and the head's string.
const maxReadAllocs = 2

func TestReadAnswerAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	rd := strings.NewReader(sdkCall)
	br := bufio.NewReader(rd)
	buf := make([]byte, 512)
	n := testing.AllocsPerRun(100, func() {
		rd.Reset(sdkCall)
		br.Reset(rd)
		resp, err := ReadAnswer(br, nil)
		if err != nil {
			panic(err)
		}
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				break
			}
		}
	})
	if n > maxReadAllocs {
		t.Errorf("%v allocations per answer, want at most %d", n, maxReadAllocs)
	}
	if wantN := testing.AllocsPerRun(100, func() {
		rd.Reset(sdkCall)
		br.Reset(rd)
		resp, _ := http.ReadResponse(br, nil)
		io.Copy(io.Discard, resp.Body)
	}); true {
		t.Logf("allocations per answer: %v, net/http's %v", n, wantN)
	}
}

// readAnswer is ReadAnswer with http.ReadResponse's result, for a table
// of both; the header map is not built.
func readAnswer(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	a, err := ReadAnswer(br, req)
	if err != nil {
		return nil, err
	}
	return a.Response, nil
}

func BenchmarkReadAnswer(b *testing.B) {
	for _, tt := range []struct {
		name string
		read func(*bufio.Reader, *http.Request) (*http.Response, error)
	}{{"h1", readAnswer}, {"net-http", http.ReadResponse}} {
		for _, in := range []string{sdkCall, rpcNotFound} {
			b.Run(fmt.Sprintf("%s/%.8s", tt.name, in[9:]), func(b *testing.B) {
				rd := strings.NewReader(in)
				br := bufio.NewReader(rd)
				buf := make([]byte, 512)
				b.ReportAllocs()
				for b.Loop() {
					rd.Reset(in)
					br.Reset(rd)
					resp, err := tt.read(br, nil)
					if err != nil {
						b.Fatal(err)
					}
					for {
						if _, err := resp.Body.Read(buf); err != nil {
							break
						}
					}
				}
			})
		}
	}
}

// An answer relayed long after its head (an open stream's) lets go of its
// fields and status text, substrings of the head that would keep it for
// the answer's life; its status code and its body stay.
func TestForgetHead(t *testing.T) {
	in := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
		"Mcp-Session-Id: abc\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata: 1\n\r\n1\r\n\n\r\n0\r\n\r\n"
	a, err := ReadAnswer(bufio.NewReader(strings.NewReader(in)), nil)
	if err != nil {
		t.Fatal(err)
	}
	fields := a.Header[:cap(a.Header)]
	if len(a.Header) != 3 {
		t.Fatalf("fields %v", a.Header)
	}
	a.ForgetHead()
	for i, f := range fields {
		if f != (Field{}) {
			t.Errorf("field %d still holds %q: %q", i, f.Name, f.Value)
		}
	}
	if a.Header != nil || a.Status != "" || a.StatusCode != 200 {
		t.Errorf("after ForgetHead: header %v, status %q, code %d", a.Header, a.Status, a.StatusCode)
	}
	if body, err := io.ReadAll(a.Body); err != nil || string(body) != "data: 1\n\n" {
		t.Errorf("body %q, %v", body, err)
	}
}
