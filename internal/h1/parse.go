package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// This file parses the request head of the common shape: a request line
// in origin form, HTTP/1.1, CRLF line ends, a Host header, and a body that
// is either absent or of a Content-Length. Anything else (chunked bodies,
// Expect, Upgrade, HTTP/1.0, the h2c preface, obsolete line folding, any
// malformed input) is reported as not fast, and the connection is handed
// to net/http's server with the bytes read so far: net/http keeps the
// answer to every edge case, this file only the common one.

// head is a parsed request head.
type head struct {
	method, target string
	url            *url.URL
	header         http.Header
	host           string
	contentLength  int64
	close          bool // the client asked for the connection to be closed
}

// methods are the methods served on the fast path, by their wire form, so
// that the request's Method is a constant, not an allocation. HEAD is left
// to net/http (a HEAD answer has no body whatever its headers say); so are
// CONNECT, TRACE and PRI (the h2c preface).
var methods = map[string]string{
	http.MethodGet: http.MethodGet, http.MethodPost: http.MethodPost, http.MethodDelete: http.MethodDelete,
	http.MethodPut: http.MethodPut, http.MethodPatch: http.MethodPatch, http.MethodOptions: http.MethodOptions,
}

// commonKeys interns the canonical names of the headers MCP clients send,
// so that a request's header keys are mostly not allocations.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Baggage", "Cache-Control",
		"Connection", "Content-Length", "Content-Type", "Cookie", "Forwarded", "Host", "Last-Event-Id",
		"Mcp-Method", "Mcp-Name", "Mcp-Protocol-Version", "Mcp-Session-Id", "Origin", "Pragma",
		"Referer", "Sec-Fetch-Mode", "Traceparent", "Tracestate", "User-Agent",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Request-Id",
	} {
		m[k] = k
	}
	return m
}()

// maxHeaderLines bounds the header map of one request (net/http bounds it
// only by the header bytes; 64 KiB of one-byte headers would be 13,000
// map entries).
const maxHeaderLines = 256

// parseHead parses the request head in b, which ends with the blank line
// ("\r\n\r\n"). block is b as one string: the header values and the keys
// already in canonical form are substrings of it, not allocations. ok is
// false when the request is not of the fast shape, or is malformed:
// net/http is to answer it.
func parseHead(block string) (h head, ok bool) {
	line, rest, _ := strings.Cut(block, "\r\n")
	if h, ok = parseRequestLine(line); !ok {
		return head{}, false
	}
	n := strings.Count(rest, "\r\n") - 1 // header lines; the blank one ends the head
	if n > maxHeaderLines {
		return head{}, false
	}
	h.header = make(http.Header, n)
	// One backing array for the values, as net/http's textproto does: a key
	// seen once (almost every key) costs no slice allocation of its own.
	values := make([]string, n)
	hosts := 0
	for i := 0; ; i++ {
		line, rest, _ = strings.Cut(rest, "\r\n")
		if line == "" {
			break
		}
		k, v, found := strings.Cut(line, ":")
		if !found || !httpguts.ValidHeaderFieldName(k) {
			// No colon, a space before it (RFC 9112 §5.1 says reject), an
			// obsolete line fold (a line starting with a space), a bad name.
			return head{}, false
		}
		v = strings.Trim(v, " \t")
		if !httpguts.ValidHeaderFieldValue(v) || strings.IndexByte(v, '\n') >= 0 {
			return head{}, false
		}
		key := canonicalKey(k)
		switch key {
		case "Host":
			hosts++
			h.host = v
		case "Content-Length":
			if _, dup := h.header[key]; dup {
				return head{}, false
			}
			cl, err := strconv.ParseUint(v, 10, 63)
			if err != nil || v == "" || v[0] == '+' {
				return head{}, false
			}
			h.contentLength = int64(cl)
		case "Transfer-Encoding", "Expect", "Upgrade":
			// Chunked bodies, 100-continue, protocol switches: net/http's.
			return head{}, false
		case "Connection":
			if httpguts.HeaderValuesContainsToken([]string{v}, "close") {
				h.close = true
			}
		}
		if vv := h.header[key]; vv != nil {
			h.header[key] = append(vv, v)
			continue
		}
		values[i] = v
		h.header[key] = values[i : i+1 : i+1]
	}
	if hosts != 1 || !httpguts.ValidHostHeader(h.host) {
		return head{}, false
	}
	// As net/http's server: the Host header moves to Request.Host.
	delete(h.header, "Host")
	// As net/http's ReadRequest: HTTP/1.0's "Pragma: no-cache" means
	// "Cache-Control: no-cache" when the latter is absent.
	if p := h.header["Pragma"]; len(p) > 0 && p[0] == "no-cache" {
		if _, ok := h.header["Cache-Control"]; !ok {
			h.header["Cache-Control"] = []string{"no-cache"}
		}
	}
	return h, true
}

// parseRequestLine parses "METHOD /target HTTP/1.1".
func parseRequestLine(line string) (h head, ok bool) {
	m, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" {
		return head{}, false
	}
	if h.method, ok = methods[m]; !ok {
		return head{}, false
	}
	if h.url, ok = parseTarget(target); !ok {
		return head{}, false
	}
	h.target = target
	return h, true
}

// parseTarget parses an origin-form request target. A target of plain
// characters is split by hand, to the same URL url.ParseRequestURI makes
// of it; any other goes through url.ParseRequestURI itself.
func parseTarget(target string) (*url.URL, bool) {
	if target == "" || target[0] != '/' {
		return nil, false // absolute form, asterisk form: net/http's
	}
	path, query, hasQuery := strings.Cut(target, "?")
	if plainPath(path) && plainQuery(query) {
		return &url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}, true
	}
	u, err := url.ParseRequestURI(target)
	return u, err == nil
}

// plainPath reports whether url.ParseRequestURI would take path as it is:
// no escapes to decode and no character its encoding would escape, so
// that RawPath stays empty.
func plainPath(path string) bool {
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("-_.~$&+,/:;=@", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// plainQuery reports whether the raw query has only printable ASCII and
// no fragment mark: url.ParseRequestURI keeps such a query verbatim.
func plainQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		if c := q[i]; c <= ' ' || c >= 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// canonicalKey is textproto.CanonicalMIMEHeaderKey(k) without an
// allocation for a key already canonical (a substring is returned) or
// commonly sent in another case (the interned name is returned).
func canonicalKey(k string) string {
	if isCanonical(k) {
		if c, ok := commonKeys[k]; ok {
			return c
		}
		return k
	}
	if len(k) <= 64 {
		var buf [64]byte
		b := buf[:len(k)]
		copy(b, k)
		upper := true
		for i, c := range b {
			if upper && 'a' <= c && c <= 'z' {
				b[i] = c - ('a' - 'A')
			} else if !upper && 'A' <= c && c <= 'Z' {
				b[i] = c + ('a' - 'A')
			}
			upper = c == '-'
		}
		if c, ok := commonKeys[string(b)]; ok {
			return c
		}
	}
	return textproto.CanonicalMIMEHeaderKey(k)
}

// isCanonical reports whether k is in canonical form: an upper-case letter
// at the start and after each hyphen, lower case elsewhere.
func isCanonical(k string) bool {
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return false
		}
		upper = c == '-'
	}
	return true
}

// headEnd returns the length of the request head at the start of b,
// through the blank line that ends it, or -1 if b does not hold a whole
// head yet. from is where to start looking (bytes before it were already
// searched). bare reports a line ended by LF alone, which net/http
// accepts and the fast path leaves to it.
func headEnd(b []byte, from int) (end int, bare bool) {
	from = max(from-3, 0)
	end = -1
	if i := bytes.Index(b[from:], crlfcrlf); i >= 0 {
		end = from + i + len(crlfcrlf)
		b = b[:end]
	}
	for i := from; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return end, false
		}
		if i+j == 0 || b[i+j-1] != '\r' {
			return end, true
		}
		i += j + 1
	}
}

var crlfcrlf = []byte("\r\n\r\n")
