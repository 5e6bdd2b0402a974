package proxy

import "testing"

func TestStartsRequest(t *testing.T) {
	tests := []struct {
		name string
		p    string
		want bool
	}{
		{"post with headers", "POST /mcp HTTP/1.1\r\nHost: a\r\n\r\n{}", true},
		{"get", "GET / HTTP/1.1\r\n", true},
		{"extension method", "M-SEARCH * HTTP/1.1\r\n", true},
		{"absolute target", "DELETE http://10.0.0.1:8080/mcp?x=1 HTTP/1.1\r\n", true},
		{"json body", `{"jsonrpc":"2.0","id":2,"method":"tools/call"}`, false},
		{"body text mid-string", `POST /mcp and more","x":1}`, false},
		{"line without version", "POST /mcp\r\n", false},
		{"http/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false},
		{"leading space", " POST /mcp HTTP/1.1\r\n", false},
		{"separator in method", "PO{ST /mcp HTTP/1.1\r\n", false},
		{"method too long", "ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1\r\n", false},
		{"no line end yet", "POST /mcp HTTP/1.1", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		if got := startsRequest([]byte(tt.p)); got != tt.want {
			t.Errorf("%s: startsRequest(%q) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}
