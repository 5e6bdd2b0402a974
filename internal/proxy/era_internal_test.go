package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/h1"
)

func TestRequestEra(t *testing.T) {
	for _, tc := range []struct {
		version, sid string
		kind         kind
		want         protocolEra
	}{
		{"2026-07-28", "", kindRequest, eraModern},
		{"2027-01-01", "", kindRequest, eraModern}, // later versions keep the headers
		{"2026-07-28", "", kindNotification, eraModern},
		{"2026-07-28", "", kindStream, eraModern},
		{"2025-11-25", "", kindRequest, eraLegacy},
		{"", "", kindRequest, eraLegacy},
		{"2026-07-28", "s-1", kindRequest, eraLegacy},    // a session is legacy
		{"2026-07-28", "", kindInitialize, eraLegacy},    // so is initialize
		{"9", "", kindRequest, eraLegacy},                // "9" > "2026-..." as strings, but no date
		{"2026-07-28 ", "", kindRequest, eraLegacy},      // not a date's shape
		{"2026-07-2x", "", kindRequest, eraLegacy},       // nor this
		{"2026-7-28", "", kindRequest, eraLegacy},        // nor this
		{"2026-07-27", "", kindRequest, eraLegacy},       // the day before
		{"2026_07_28", "", kindRequest, eraLegacy},       // separators matter
		{"20260-7-28", "", kindRequest, eraLegacy},       // positions too
		{"2099-99-99", "", kindRequest, eraModern},       // shape only: the backend refuses unknown versions
		{"2026-07-28", "", kindResponse, eraModern},      // modern, though never validated (no routing headers on responses)
		{"2025-06-18", "s-1", kindDelete, eraLegacy},     // legacy session end
		{"2026-07-28", "", kindOther, eraModern},         // an OPTIONS preflight of a modern client
		{"2024-11-05", "", kindNotification, eraLegacy},  // an old client's notification
		{"2026-07-28", "x", kindNotification, eraLegacy}, // a session's notification
	} {
		c := classification{Kind: tc.kind, ProtocolVersion: tc.version, SessionID: tc.sid}
		if got := requestEra(&c); got != tc.want {
			t.Errorf("version %q session %q kind %v: era %v, want %v", tc.version, tc.sid, tc.kind, got, tc.want)
		}
	}
}

func TestDecodeHeaderValue(t *testing.T) {
	// The examples of streamable-http.mdx, "Value Encoding".
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"us-west1", "us-west1", true},
		{"=?base64?SGVsbG8sIOS4lueVjA==?=", "Hello, 世界", true},
		{"=?base64?IHBhZGRlZCA=?=", " padded ", true},
		{"=?base64?bGluZTEKbGluZTI=?=", "line1\nline2", true},
		{"=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=", "=?base64?literal?=", true},
		{"=?base64?SGVsbG8?=", "", false},                    // invalid padding (SEP-2243: reject)
		{"=?base64?SGVs!!!bG8=?=", "", false},                // invalid characters (SEP-2243: reject)
		{"SGVsbG8=", "SGVsbG8=", true},                       // missing prefix: literal
		{"=?base64?SGVsbG8=", "=?base64?SGVsbG8=", true},     // missing suffix: literal
		{"=?BASE64?SGVsbG8=?=", "=?BASE64?SGVsbG8=?=", true}, // markers are case-sensitive
		{"=?base64??=", "", true},
	} {
		got, ok := decodeHeaderValue(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("decode %q = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestMethodLabelIsBounded(t *testing.T) {
	for method, want := range map[string]string{
		"tools/call": "tools/call", "server/discover": "server/discover", "tasks/get": "tasks/get",
		"initialize": "initialize", "": "", "tools/CALL": "other", "x/" + strings.Repeat("y", 100): "other",
	} {
		if got := methodLabel(method); got != want {
			t.Errorf("methodLabel(%q) = %q, want %q", method, got, want)
		}
	}
}

// FuzzClassifyModern drives the classifier with a body and the routing
// headers. Whatever comes, a request is refused with 400 (or 413), and
// one that is accepted as modern has headers that agree with its body as
// encoding/json reads it; legacy requests are never refused for their
// headers.
func FuzzClassifyModern(f *testing.F) {
	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	for _, seed := range []struct{ body, version, method, name string }{
		{call, "2026-07-28", "tools/call", "a"},
		{call, "2026-07-28", "tools/call", "b"},
		{call, "2026-07-28", "tools/call", "=?base64?YQ==?="},
		{call, "2026-07-28", "", ""},
		{call, "2025-11-25", "x", "y"},
		{`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///x"}}`, "2026-07-28", "resources/read", "file:///x"},
		{`{"jsonrpc":"2.0","id":"t","method":"tasks/get","params":{"taskId":"t-1"}}`, "2026-07-28", "tasks/get", "t-1"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"a","name":"a"}}`, "2026-07-28", "tools/call", "a"},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled"}`, "2026-07-28", "", ""},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, "2026-07-28", "ping", ""},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, "2026-07-28", "x", ""},
	} {
		f.Add(seed.body, seed.version, seed.method, seed.name)
	}
	f.Fuzz(func(t *testing.T, body, version, method, name string) {
		r := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
		r.Header.Set("Mcp-Protocol-Version", version)
		if method != "" {
			r.Header.Set("Mcp-Method", method)
		}
		if name != "" {
			r.Header.Set("Mcp-Name", name)
		}
		c, rerr := classify(r, h1.AppendHeader(nil, r.Header), 1<<16, nil)
		if rerr != nil {
			if rerr.status != http.StatusBadRequest && rerr.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d", rerr.status)
			}
			if rerr.code == codeHeaderMismatch && c.Era != eraModern {
				t.Fatalf("a %v request refused for its headers: %s", c.Era, rerr.message)
			}
			return
		}
		if c.Era != requestEra(&c) {
			t.Fatalf("era %v, the rule says %v", c.Era, requestEra(&c))
		}
		if c.Era != eraModern {
			return
		}
		if c.Batch {
			t.Fatalf("modern batch accepted: %q", body)
		}
		if c.Kind != kindRequest {
			return
		}
		if method != c.Method {
			t.Fatalf("accepted Mcp-Method %q for body method %q", method, c.Method)
		}
		member := nameMember(c.Method)
		if member == "" {
			return
		}
		// encoding/json's reading of the body: exact member names, as the
		// SDKs read them.
		var msg struct {
			Params map[string]json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal([]byte(body), &msg); err != nil {
			t.Fatalf("accepted a body encoding/json refuses: %v", err)
		}
		var want string
		if err := json.Unmarshal(msg.Params[member], &want); err != nil {
			t.Fatalf("accepted %s without a string params.%s: %q", c.Method, member, body)
		}
		decoded, ok := decodeHeaderValue(name)
		if !ok || decoded != want || c.Name != want {
			t.Fatalf("accepted Mcp-Name %q (decoded %q) and name %q for body value %q", name, decoded, c.Name, want)
		}
	})
}
