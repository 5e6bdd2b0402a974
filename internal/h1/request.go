package h1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"golang.org/x/net/http/httpguts"
)

// errLeaveToNetHTTP says a request is not of the shape WriteRequest writes.
var errLeaveToNetHTTP = errors.New("h1: request left to net/http")

// WriteRequest writes req to bw as net/http's Request.Write does, for the
// requests a proxy sends: a body of known length or none, no trailers.
// Any other request is written by Request.Write itself. The header is
// written in map order (net/http sorts it; HTTP gives order no meaning
// across field names). req.Body is closed, as Request.Write does.
func WriteRequest(bw *bufio.Writer, req *http.Request) error {
	err := writeRequest(bw, req)
	if err == errLeaveToNetHTTP {
		return req.Write(unbuffered{bw})
	}
	return err
}

// unbuffered hides the *bufio.Writer type from Request.Write, which
// flushes the headers on their own before any body it does not know to be
// in memory: one write per request instead of two. It is still an
// io.ByteWriter, so Request.Write does not add a buffer of its own, and it
// flushes by itself past the buffer's size, so a large body still streams.
type unbuffered struct{ *bufio.Writer }

func writeRequest(bw *bufio.Writer, req *http.Request) (err error) {
	u := req.URL
	hasBody := req.Body != nil && req.Body != http.NoBody
	if u == nil || len(req.Trailer) > 0 || len(req.TransferEncoding) > 0 || req.Close ||
		req.ContentLength < 0 || req.ContentLength > 0 && !hasBody ||
		req.ContentLength == 0 && hasBody { // net/http probes such a body
		return errLeaveToNetHTTP
	}
	host := req.Host
	if host == "" {
		host = u.Host
	}
	if !RequestWritable(req.Method, u, host) {
		return errLeaveToNetHTTP
	}
	if req.Body != nil {
		defer func() {
			if cerr := req.Body.Close(); err == nil {
				err = cerr
			}
		}()
	}
	b := AppendRequestHead(bw.AvailableBuffer(), req.Method, u, host, req.ContentLength)
	// As net/http: its own User-Agent when there is none (AppendField
	// writes one that is there).
	if _, ok := req.Header["User-Agent"]; !ok {
		b = append(b, "User-Agent: Go-http-client/1.1\r\n"...)
	}
	for k, vv := range req.Header {
		b = AppendField(b, k, vv)
	}
	b = append(b, "\r\n"...)
	if _, err := bw.Write(b); err != nil {
		return err
	}
	return copyBody(bw, req.Body, req.ContentLength)
}

// RequestWritable reports whether WriteRequest writes a request of this
// method, URL and Host itself, with AppendRequestHead: a method that is a
// token, a URL that is not opaque, a valid Host of ASCII without a zone.
// net/http converts any other Host (punycode), or refuses the request.
func RequestWritable(method string, u *url.URL, host string) bool {
	return u.Opaque == "" && plainHost(host) && validMethod(method)
}

// AppendRequestHead appends what WriteRequest writes of a request before
// its header fields: the request line (HTTP/1.1, the URL's path and
// query), the Host field, and, as net/http, a Content-Length for a body
// and for the methods servers expect a body with, even when it is 0. The
// request must be RequestWritable. After it come the fields
// (AppendField), the blank line, and the body of contentLength bytes.
func AppendRequestHead(b []byte, method string, u *url.URL, host string, contentLength int64) []byte {
	b = append(b, method...)
	b = append(b, ' ')
	if path := u.EscapedPath(); path != "" {
		b = append(b, path...)
	} else {
		b = append(b, '/')
	}
	if u.ForceQuery || u.RawQuery != "" {
		b = append(b, '?')
		b = append(b, u.RawQuery...)
	}
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	if contentLength > 0 || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, contentLength, 10)
		b = append(b, "\r\n"...)
	}
	return b
}

// AppendField appends the lines of the header field name with values vv as
// WriteRequest writes them, as net/http's Request.Write does: nothing for
// the fields the head has already (Host, Content-Length), those net/http
// writes itself (Transfer-Encoding, Trailer), or a name that is not a
// valid field name; a User-Agent's first value only, nothing when that is
// empty; each value with its line breaks made spaces, trimmed.
func AppendField(b []byte, name string, vv []string) []byte {
	switch name {
	case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
		return b // written by AppendRequestHead, or net/http's to write
	case "User-Agent":
		if len(vv) > 0 && vv[0] != "" {
			b = appendHeaderLine(b, name, vv[0])
		}
		return b
	}
	if !httpguts.ValidHeaderFieldName(name) {
		return b
	}
	for _, v := range vv {
		b = appendHeaderLine(b, name, v)
	}
	return b
}

// AppendFields appends the lines of a request's fields as AppendField
// appends them, name by name: a User-Agent's first field only, nothing
// when that is empty.
func AppendFields(b []byte, f Fields) []byte {
	userAgent := false
	for _, fl := range f {
		switch fl.Name {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			continue // written by AppendRequestHead, or net/http's to write
		case "User-Agent":
			if userAgent {
				continue
			}
			userAgent = true
			if fl.Value == "" {
				continue
			}
		default:
			if !httpguts.ValidHeaderFieldName(fl.Name) {
				continue
			}
		}
		b = appendHeaderLine(b, fl.Name, fl.Value)
	}
	return b
}

// copyBody copies n bytes of body into bw's buffer, flushing it as it
// fills (io.Copy would allocate a reader to limit it).
func copyBody(bw *bufio.Writer, body io.Reader, n int64) error {
	for empty := 0; n > 0; {
		if bw.Available() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		buf := bw.AvailableBuffer()
		buf = buf[:min(int64(cap(buf)), n)]
		r, err := body.Read(buf)
		bw.Write(buf[:r])
		n -= int64(r)
		if empty++; r > 0 {
			empty = 0
		} else if err == nil && empty > 100 {
			return io.ErrNoProgress // as bufio does with a reader that returns nothing
		}
		if err == io.EOF && n > 0 {
			return errors.New("h1: request body shorter than its ContentLength")
		}
		if err != nil && err != io.EOF {
			return err
		}
	}
	return nil
}

// plainHost reports a valid Host of ASCII without a zone: written as it
// is (net/http converts an internationalised one to punycode).
func plainHost(h string) bool {
	if !httpguts.ValidHostHeader(h) {
		return false
	}
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 || h[i] == '%' {
			return false
		}
	}
	return true
}

// validMethod reports a method that is a token (RFC 9110 §9.1).
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return true
}
