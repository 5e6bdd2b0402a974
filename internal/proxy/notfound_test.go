package proxy

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/h1"
)

func TestNotFoundIsAboutSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want bool
	}{
		{"go-sdk plain text", "session not found\n", true},
		{"empty", "", true},
		{"html", "<html><body>404</body></html>", true},
		{"json, not JSON-RPC", `{"detail":"Not Found"}`, true},
		{"not JSON", `{"jsonrpc":`, true},
		{"TypeScript SDK: id null", `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}`, true},
		{"id absent", `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request"}}`, true},
		{"session-not-found code with an id", `{"jsonrpc":"2.0","id":3,"error":{"code":-32001,"message":"gone"}}`, true},
		{"session-not-found message with an id", `{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"Session not found"}}`, true},
		{"go-sdk 2026-07-28: unknown method", `{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"JSON RPC not handled"}}`, false},
		{"missing resource", `{"jsonrpc":"2.0","id":"r1","error":{"code":-32602,"message":"Resource not found"}}`, false},
		{"a result", `{"jsonrpc":"2.0","id":7,"result":{}}`, false},
		{"batch answering requests", `[{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"x"}}]`, false},
		{"batch about the session", `[{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}]`, true},
		{"empty batch", `[]`, true},
	} {
		if got := notFoundIsAboutSession([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: %q about the session = %v, want %v", tc.name, tc.body, got, tc.want)
		}
	}
}

// A 404 that answers the request reaches the client whole, however long.
func TestSessionLostKeepsTheAnswer(t *testing.T) {
	p := New(Config{})
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"no such method"}}`,
		`{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"` + strings.Repeat("x", maxNotFoundBody) + `"}}`,
	} {
		resp := h1.AnswerOf(&http.Response{StatusCode: http.StatusNotFound, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(body))})
		lost, err := p.sessionLost(resp)
		if err != nil || lost {
			t.Fatalf("%d-byte answer: lost %v, err %v", len(body), lost, err)
		}
		got, _ := io.ReadAll(resp.Body)
		if !bytes.Equal(got, []byte(body)) {
			t.Errorf("%d-byte answer handed on as %d bytes", len(body), len(got))
		}
	}
}

func TestPrincipalDigest(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := newPrincipalDigester(key, []string{"authorization", "X-User"})
	alice := fieldsOf(http.Header{"Authorization": {"Bearer alice"}})
	if got := d.digest(fieldsOf(http.Header{"Cookie": {"c=1"}})); got != "" {
		t.Errorf("digest of no credentials = %q, want empty", got)
	}
	a := d.digest(alice)
	if a == "" || strings.Contains(a, "alice") {
		t.Fatalf("digest %q", a)
	}
	for name, h := range map[string]http.Header{
		"other token":      {"Authorization": {"Bearer bob"}},
		"extra header":     {"Authorization": {"Bearer alice"}, "X-User": {"x"}},
		"values regrouped": {"Authorization": {"Bearer", "alice"}},
	} {
		if d.matches(a, fieldsOf(h)) {
			t.Errorf("%s matches alice's digest", name)
		}
	}
	if !d.matches(a, slices.Clone(alice)) || !d.matches("", nil) {
		t.Error("the same credentials do not match")
	}
	if other := newPrincipalDigester([]byte("another key of thirty-two bytes!"), nil); other.digest(alice) == a {
		t.Error("two keys give the same digest")
	}
	if random := newPrincipalDigester(nil, nil); random.digest(alice) == a {
		t.Error("a random key gives the configured key's digest")
	}
	// Replicas of different versions share a store: the digest of a set of
	// credentials is what every version computes (this one, from a header
	// map, before request headers were lists).
	mixed := fieldsOf(http.Header{"Authorization": {"Bearer alice"}, "X-User": {"u1", "u2"}, "Cookie": {"c"}})
	if got, want := d.digest(mixed), "abca004b32f99c7893d74e9cd3f223e0feba292eb1386b6845764270079c1ecb"; got != want {
		t.Errorf("digest %s, want %s (the stored digests of earlier versions)", got, want)
	}
}

// fieldsOf is a header map as the list a request's header is.
func fieldsOf(h http.Header) h1.Fields { return h1.AppendHeader(nil, h) }

// tether's own error codes are none that an MCP specification or SDK
// assigns (-32002 became mcp-go's ErrResourceNotFound).
func TestOwnErrorCodesAreUnassigned(t *testing.T) {
	assigned := map[int]string{
		-32000: "connection closed (TypeScript, Python, Kotlin SDKs)",
		-32002: "resource not found (MCP up to 2025-11-25, mcp-go)",
		-32003: "client closing (go-sdk); missing client capability (TypeScript drafts)",
		-32004: "server closing (go-sdk); unsupported protocol version (TypeScript drafts)",
		-32005: "rejected by transport (go-sdk)",
		-32042: "URL elicitation required (MCP 2025-11-25)",
	}
	for _, code := range []int{codeBackendFailed, codeUnavailable} {
		if what, ok := assigned[code]; ok {
			t.Errorf("code %d is assigned: %s", code, what)
		}
		if code >= -32099 && code <= -32020 {
			t.Errorf("code %d is in the range MCP 2026-07-28 reserves for its own codes", code)
		}
	}
}
