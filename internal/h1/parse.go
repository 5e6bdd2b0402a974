package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
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
	url            url.URL
	fields         Fields // without Host, which is host
	host           string
	contentLength  int64
	close          bool // the client asked for the connection to be closed (Request.Close)
	// wantsClose says the connection is to be closed after the answer: on
	// close, and as net/http's server also decides (see connectionClose).
	wantsClose bool
}

// method returns the method m names, if the fast path serves it: a
// constant, so that the request's Method is not an allocation (a switch:
// no hashing, which a map's look-up costs with cold caches). HEAD is left
// to net/http (a HEAD answer has no body whatever its headers say); so
// are CONNECT, TRACE and PRI (the h2c preface).
func method(m string) (string, bool) {
	switch m {
	case http.MethodGet:
		return http.MethodGet, true
	case http.MethodPost:
		return http.MethodPost, true
	case http.MethodDelete:
		return http.MethodDelete, true
	case http.MethodPut:
		return http.MethodPut, true
	case http.MethodPatch:
		return http.MethodPatch, true
	case http.MethodOptions:
		return http.MethodOptions, true
	}
	return "", false
}

// commonKeys are the canonical names of the headers MCP clients send
// (and backends answer with), interned so that a head's keys are mostly
// not allocations. At most 64: a head notes the ones it has seen in a
// bit set.
var commonKeys = [...]string{
	"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Baggage", "Cache-Control",
	"Connection", "Content-Length", "Content-Type", "Cookie", "Forwarded", "Host", "Last-Event-Id",
	"Mcp-Method", "Mcp-Name", "Mcp-Protocol-Version", "Mcp-Session-Id", "Origin", "Pragma",
	"Referer", "Sec-Fetch-Mode", "Traceparent", "Tracestate", "User-Agent",
	"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Request-Id",
	"Transfer-Encoding", "Expect", "Upgrade", "Trailer",
}

// The indices of the common keys parseHead and ReadAnswer look at.
var (
	keyCacheControl     = common("Cache-Control")
	keyConnection       = common("Connection")
	keyContentLength    = common("Content-Length")
	keyExpect           = common("Expect")
	keyHost             = common("Host")
	keyPragma           = common("Pragma")
	keyTrailer          = common("Trailer")
	keyTransferEncoding = common("Transfer-Encoding")
	keyUpgrade          = common("Upgrade")
)

// A head's bit set of common keys is a uint64.
var _ [64 - len(commonKeys)]struct{}

// commonIndexSize is commonIndex's, a power of two at least twice the
// number of names (short probes).
const commonIndexSize = 128

// commonIndex finds a name in commonKeys without a map's hashing: it is
// an open-addressing table, probed linearly from commonSlot; an entry is
// an index in commonKeys plus one, 0 an empty slot.
var commonIndex = func() (t [commonIndexSize]uint8) {
	for i, k := range commonKeys {
		s := commonSlot(k)
		for t[s] != 0 {
			s = (s + 1) % commonIndexSize
		}
		t[s] = uint8(i + 1)
	}
	return t
}()

// commonSlot is where the probe for a non-empty name k starts: the names
// differ in length, middle and last letter far more than in their first.
func commonSlot[K string | []byte](k K) int {
	n := len(k)
	return (n*37 + int(k[n/2])*7 + int(k[n-1])) % commonIndexSize
}

// common returns the index of k in commonKeys, or -1.
func common[K string | []byte](k K) int {
	for s := commonSlot(k); ; s = (s + 1) % commonIndexSize {
		e := commonIndex[s]
		if e == 0 {
			return -1
		}
		if commonKeys[e-1] == string(k) {
			return int(e - 1)
		}
	}
}

// maxHeaderLines bounds the header map of one request (net/http bounds it
// only by the header bytes; 64 KiB of one-byte headers would be 13,000
// map entries).
const maxHeaderLines = 256

// parseHead parses a request head: block is the head as one string,
// through the blank line that ends it; its fields are appended to dst.
// ok is false when the
// request is not of the fast shape, or is malformed: net/http is to
// answer it.
func parseHead(block string, dst Fields) (h head, ok bool) {
	line, rest, _ := strings.Cut(block, "\r\n")
	if h, ok = parseRequestLine(line); !ok {
		return head{}, false
	}
	// As net/http's server: the Host header is Request.Host, not a field
	// of Request.Header.
	var f fieldSet
	if h.fields, f, ok = appendFields(dst, rest, true); !ok {
		return head{}, false
	}
	if f.has(keyTransferEncoding) || f.has(keyExpect) || f.has(keyUpgrade) {
		// Chunked bodies, 100-continue, protocol switches: net/http's.
		return head{}, false
	}
	if f.hosts != 1 || !httpguts.ValidHostHeader(f.host) {
		return head{}, false
	}
	h.host = f.host
	if f.has(keyContentLength) {
		if h.fields.Count("Content-Length") != 1 {
			return head{}, false // a repeated field is net/http's, which accepts equal copies
		}
		if h.contentLength, ok = parseContentLength(h.fields.Get("Content-Length")); !ok {
			return head{}, false
		}
	}
	if f.has(keyConnection) {
		h.close = h.fields.containsToken("Connection", "close")
		h.wantsClose = h.close || connectionClose(h.fields.Get("Connection"))
	}
	// As net/http's ReadRequest: HTTP/1.0's "Pragma: no-cache" means
	// "Cache-Control: no-cache" when the latter is absent.
	if f.has(keyPragma) && !f.has(keyCacheControl) && h.fields.Get("Pragma") == "no-cache" {
		h.fields = append(h.fields, Field{"Cache-Control", "no-cache"})
	}
	return h, true
}

// connectionClose reports whether net/http's server closes the connection
// after the answer for a request whose first Connection field is v (its
// wantsClose, hasToken): "close", in any case, between spaces, tabs or
// commas, such as "Close 0", which Request.Close (a comma-separated list
// of tokens) does not count.
func connectionClose(v string) bool {
	const token = "close"
	boundary := func(b byte) bool { return b == ' ' || b == '\t' || b == ',' }
	for i := 0; i+len(token) <= len(v); i++ {
		if (i == 0 || boundary(v[i-1])) && (i+len(token) == len(v) || boundary(v[i+len(token)])) &&
			strings.EqualFold(v[i:i+len(token)], token) {
			return true
		}
	}
	return false
}

// parseContentLength parses a Content-Length field's value: digits only.
func parseContentLength(v string) (int64, bool) {
	if v == "" || v[0] < '0' || v[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 63)
	return int64(n), err == nil
}

// ParseFields parses header fields: "Name: value" lines ended by CRLF,
// through the blank line that ends them (rest of a head after its first
// line), into a map. Keys are made canonical (without an allocation for a
// key already canonical or commonly sent); values are trimmed substrings of
// fields, so a value kept beyond its request keeps the whole head in
// memory: strings.Clone what is stored.
// ok is false for anything RFC 9112 §5 lets a recipient reject: a name
// that is not a token, a space before the colon, an obsolete line fold, a
// value with control characters, a line not ended by CRLF; and for more
// than maxHeaderLines fields. What follows the blank line is not read,
// but its line ends count towards the limit.
func ParseFields(fields string) (h http.Header, ok bool) {
	sc, n, ok := scanFields(fields)
	if !ok {
		return nil, false
	}
	h = make(http.Header, n)
	// One backing array for the values, as net/http's textproto does: a key
	// seen once (almost every key) costs no slice allocation of its own.
	values := make([]string, n)
	var seen uint64 // the common keys seen, by index in commonKeys
	for i := 0; ; i++ {
		key, c, v, more := sc.next()
		if !more {
			return h, sc.ok
		}
		// A common key seen for the first time is known to be new
		// without a look-up in h.
		if c >= 0 && seen&(1<<c) == 0 {
			seen |= 1 << c
		} else if vv := h[key]; vv != nil {
			h[key] = append(vv, v)
			continue
		}
		values[i] = v
		h[key] = values[i : i+1 : i+1]
	}
}

// fieldSet is what appendFields tells of the fields besides the list.
type fieldSet struct {
	seen  uint64 // the common keys present, by index in commonKeys
	host  string // with hostApart, the first Host field's value
	hosts int    // with hostApart, the number of Host fields
}

// has reports whether the common key of index c is present.
func (f *fieldSet) has(c int) bool { return f.seen&(1<<c) != 0 }

// appendFields parses fields as ParseFields does, into a list: their
// fields are appended to dst, which is given room for all of them. The
// fieldSet tells the common keys present; with hostApart, the Host fields
// are not appended but told in the fieldSet.
func appendFields(dst Fields, fields string, hostApart bool) (Fields, fieldSet, bool) {
	sc, n, ok := scanFields(fields)
	if !ok {
		return nil, fieldSet{}, false
	}
	dst = slices.Grow(dst, n)
	var f fieldSet
	for {
		key, c, v, more := sc.next()
		if !more {
			return dst, f, sc.ok
		}
		if c >= 0 {
			f.seen |= 1 << c
		}
		if c == keyHost && hostApart {
			if f.hosts++; f.hosts == 1 {
				f.host = v
			}
			continue
		}
		dst = append(dst, Field{key, v})
	}
}

// fieldScanner reads header fields one line at a time, with ParseFields's
// rules.
type fieldScanner struct {
	rest  string // the lines not read yet
	lines int    // the field lines rest can still hold
	ok    bool   // the fields ended with the blank line, all well-formed
}

// scanFields returns a scanner of fields, and the number of field lines
// they can hold (their line ends but the blank line's); ok is false past
// maxHeaderLines.
func scanFields(fields string) (sc fieldScanner, n int, ok bool) {
	n = strings.Count(fields, "\n") - 1 // the blank line ends the fields
	if n < 0 || n > maxHeaderLines {
		return fieldScanner{}, 0, false
	}
	return fieldScanner{rest: fields, lines: n}, n, true
}

// next returns the next field: its canonical key, the key's index in
// commonKeys (or -1), and its value, trimmed. more is false at the blank
// line that ends the fields, or at a malformed line; sc.ok tells which.
func (sc *fieldScanner) next() (key string, c int, v string, more bool) {
	end := strings.IndexByte(sc.rest, '\n')
	if end < 1 || sc.rest[end-1] != '\r' {
		return "", -1, "", false // a bare LF, or no line end
	}
	line := sc.rest[:end-1]
	sc.rest = sc.rest[end+1:]
	if line == "" {
		sc.ok = true
		return "", -1, "", false
	}
	if sc.lines == 0 {
		return "", -1, "", false // the last line end, and no blank line
	}
	sc.lines--
	k, v, found := strings.Cut(line, ":")
	if !found || !httpguts.ValidHeaderFieldName(k) {
		return "", -1, "", false
	}
	v = trimOWS(v)
	if !httpguts.ValidHeaderFieldValue(v) {
		return "", -1, "", false
	}
	key, c = canonicalKey(k)
	return key, c, v, true
}

// trimOWS trims the spaces and tabs around a field value (RFC 9110 §5.5).
func trimOWS(v string) string {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// parseRequestLine parses "METHOD /target HTTP/1.1".
func parseRequestLine(line string) (h head, ok bool) {
	m, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" {
		return head{}, false
	}
	if h.method, ok = method(m); !ok {
		return head{}, false
	}
	if !parseTarget(target, &h.url) {
		return head{}, false
	}
	h.target = target
	return h, true
}

// parseTarget parses an origin-form request target. A target of plain
// characters is split by hand, to the same URL url.ParseRequestURI makes
// of it; any other goes through url.ParseRequestURI itself.
func parseTarget(target string, u *url.URL) bool {
	if target == "" || target[0] != '/' {
		return false // absolute form, asterisk form: net/http's
	}
	path, query, hasQuery := strings.Cut(target, "?")
	if plainPath(path) && plainQuery(query) {
		*u = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
		return true
	}
	parsed, err := url.ParseRequestURI(target)
	if err != nil {
		return false
	}
	*u = *parsed
	return true
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
// commonly sent in another case (the interned name is returned). k is not
// empty. c is the key's index in commonKeys, or -1.
func canonicalKey(k string) (key string, c int) {
	if isCanonical(k) {
		if c := common(k); c >= 0 {
			return commonKeys[c], c
		}
		return k, -1
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
		if c := common(b); c >= 0 {
			return commonKeys[c], c
		}
	}
	return textproto.CanonicalMIMEHeaderKey(k), -1
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
