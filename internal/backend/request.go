package backend

import (
	"bufio"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/tether-mcp/tether/internal/h1"
)

// Request is a request that Client writes from a list of header fields,
// with no header map: the proxy builds its header as a list from the
// client's, and h1 writes the list as it is. The caller keeps it (and may
// rewrite it for another attempt) once Send has returned: Send writes it
// on the caller's goroutine and is done with it by then.
type Request struct {
	// Client is the client's request: its method, and its context,
	// which bounds the backend request.
	Client *http.Request
	URL    url.URL   // where it goes
	Host   string    // the Host field
	Body   []byte    // nil when there is none
	Fields h1.Fields // the header, without Content-Length (Send frames the body)
	// Idempotent says the request may be sent again after it may have
	// reached the backend (see MayResend).
	Idempotent bool
}

// Writable reports whether a request of this method, URL and Host is of
// the shape h1 writes (an opaque URL, a Host net/http would convert, a
// method that is not a token are not): others go through an http.Transport.
func Writable(method string, u *url.URL, host string) bool {
	return u.Host != "" && h1.RequestWritable(method, u, host)
}

// Write writes the request to bw, as h1.WriteRequest writes an
// *http.Request.
func (d *Request) Write(bw *bufio.Writer) error {
	b := h1.AppendRequestHead(bw.AvailableBuffer(), d.Client.Method, &d.URL, d.Host, int64(len(d.Body)))
	b = h1.AppendFields(b, d.Fields)
	b = append(b, "\r\n"...)
	if _, err := bw.Write(b); err != nil {
		return err
	}
	_, err := bw.Write(d.Body)
	return err
}

// DialAddr is the host:port of a URL's host, port 80 by default.
func DialAddr(host string) string {
	if _, _, err := net.SplitHostPort(host); err != nil {
		return net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	return host
}
