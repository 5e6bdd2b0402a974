package proxy

import (
	"net/url"
	"testing"
)

// An event ends with a line terminator (CRLF, LF or CR) followed by an
// empty line, however the stream is cut into reads.
func TestEndsEvent(t *testing.T) {
	for _, tc := range []struct {
		reads []string
		want  bool
	}{
		{[]string{"data: x\n\n"}, true},
		{[]string{"data: x\r\n\r\n"}, true},
		{[]string{"data: x\r\r"}, true},
		{[]string{"data: x\n"}, false},
		{[]string{"data: x\r\n"}, false},
		{[]string{"data: x\n", "\n"}, true},
		{[]string{"data: x\r\n", "\r\n"}, true},
		{[]string{"data: x\r\n\r", "\n"}, true},
		{[]string{"data: x\r", "\n", "\r", "\n"}, true},
		{[]string{"data: x\r", "\n"}, false},
		{[]string{"\n", "\n"}, true},
		{[]string{"\r\n"}, false},
		{[]string{"data: x\n\n", "data: y"}, false},
		{[]string{"data: x\n\n", "data: y\n", "\n"}, true},
		{[]string{": ok\n\n"}, true},
	} {
		var tail eventTail
		var got bool
		for _, r := range tc.reads {
			got = tail.endsEvent([]byte(r))
		}
		if got != tc.want {
			t.Errorf("endsEvent after %q = %v, want %v", tc.reads, got, tc.want)
		}
	}
}

// The outgoing URL joins the backend's base and the request's path and
// query as net/http/httputil did, dropping query parameters a Go backend
// could not parse.
func TestOutgoingURL(t *testing.T) {
	for _, tc := range []struct{ base, req, want string }{
		{"http://10.0.0.1:8080", "/mcp", "http://10.0.0.1:8080/mcp"},
		{"http://10.0.0.1:8080/", "/mcp", "http://10.0.0.1:8080/mcp"},
		{"http://10.0.0.1:8080/api", "/mcp", "http://10.0.0.1:8080/api/mcp"},
		{"http://10.0.0.1:8080/api", "/mcp?a=1", "http://10.0.0.1:8080/api/mcp?a=1"},
		{"http://10.0.0.1:8080/api?k=v", "/mcp?a=1", "http://10.0.0.1:8080/api/mcp?k=v&a=1"},
		{"http://10.0.0.1:8080", "/mcp?a=1;b=2&c=3", "http://10.0.0.1:8080/mcp?c=3"},
		{"http://10.0.0.1:8080", "/mcp?a=%zz&c=3", "http://10.0.0.1:8080/mcp?c=3"},
		{"http://10.0.0.1:8080", "/a%2Fb", "http://10.0.0.1:8080/a%2Fb"},
	} {
		base, _ := url.Parse(tc.base)
		req, _ := url.Parse(tc.req)
		var u url.URL
		setOutgoingURL(&u, base, req)
		if got := u.String(); got != tc.want {
			t.Errorf("%s + %s = %s, want %s", tc.base, tc.req, got, tc.want)
		}
	}
}
