package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/h1"
)

func TestClassify(t *testing.T) {
	type result struct {
		Kind      kind
		Method    string
		ID        string
		Batch     bool
		SessionID string
		Status    int // 0 = accepted
	}
	tests := []struct {
		name   string
		method string
		sid    string
		body   string
		want   result
	}{
		{"request", "POST", "s1", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`,
			result{Kind: kindRequest, Method: "tools/call", ID: "1", SessionID: "s1"}},
		{"string id", "POST", "s1", `{"jsonrpc":"2.0","id":"a-1","method":"ping"}`,
			result{Kind: kindRequest, Method: "ping", ID: `"a-1"`, SessionID: "s1"}},
		{"initialize", "POST", "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`,
			result{Kind: kindInitialize, Method: "initialize", ID: "0"}},
		{"initialize with a session id is still initialize", "POST", "old", `{"jsonrpc":"2.0","id":0,"method":"initialize"}`,
			result{Kind: kindInitialize, Method: "initialize", ID: "0", SessionID: "old"}},
		{"notification", "POST", "s1", `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			result{Kind: kindNotification, Method: "notifications/initialized", SessionID: "s1"}},
		{"notification with null id", "POST", "s1", `{"jsonrpc":"2.0","id":null,"method":"notifications/cancelled"}`,
			result{Kind: kindNotification, Method: "notifications/cancelled", SessionID: "s1"}},
		{"response", "POST", "s1", `{"jsonrpc":"2.0","id":5,"result":{"roots":[]}}`,
			result{Kind: kindResponse, SessionID: "s1"}},
		{"error response", "POST", "s1", `{"jsonrpc":"2.0","id":5,"error":{"code":-1,"message":"no"}}`,
			result{Kind: kindResponse, SessionID: "s1"}},
		{"batch of requests", "POST", "s1", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","method":"notifications/x"}]`,
			result{Kind: kindRequest, Method: "tools/list", Batch: true, SessionID: "s1"}},
		{"batch holding initialize", "POST", "", `[{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":1,"method":"initialize"}]`,
			result{Kind: kindInitialize, Method: "initialize", Batch: true}},
		{"batch of notifications", "POST", "s1", `[{"jsonrpc":"2.0","method":"notifications/a"},{"jsonrpc":"2.0","method":"notifications/b"}]`,
			result{Kind: kindNotification, Method: "notifications/a", Batch: true, SessionID: "s1"}},
		{"batch of responses", "POST", "s1", `[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"result":{}}]`,
			result{Kind: kindResponse, Batch: true, SessionID: "s1"}},
		{"batch of responses and notifications", "POST", "s1", `[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","method":"notifications/a"}]`,
			result{Kind: kindNotification, Method: "notifications/a", Batch: true, SessionID: "s1"}},
		{"GET stream", "GET", "s1", "", result{Kind: kindStream, SessionID: "s1"}},
		{"GET without session", "GET", "", "", result{Kind: kindStream}},
		{"DELETE", "DELETE", "s1", "", result{Kind: kindDelete, SessionID: "s1"}},
		{"OPTIONS", "OPTIONS", "", "", result{Kind: kindOther}},
		{"whitespace around", "POST", "", " \n\t{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n", result{Kind: kindRequest, Method: "ping", ID: "1"}},

		{"empty", "POST", "", ``, result{Status: 400}},
		{"not json", "POST", "", `jsonrpc`, result{Status: 400}},
		{"truncated", "POST", "", `{"jsonrpc":"2.0","id":1,"method":"ping"`, result{Status: 400}},
		{"trailing garbage", "POST", "", `{"jsonrpc":"2.0","id":1,"method":"ping"} x`, result{Status: 400}},
		{"no version", "POST", "", `{"id":1,"method":"ping"}`, result{Status: 400}},
		{"empty method", "POST", "", `{"jsonrpc":"2.0","id":1,"method":""}`, result{Status: 400}},
		{"object id", "POST", "", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, result{Status: 400}},
		{"response without id", "POST", "", `{"jsonrpc":"2.0","result":{}}`, result{Status: 400}},
		{"result and error", "POST", "", `{"jsonrpc":"2.0","id":1,"result":{},"error":{}}`, result{Status: 400}},
		{"array of numbers", "POST", "", `[1,2]`, result{Status: 400}},
		{"empty batch", "POST", "", `[]`, result{Status: 400}},
		{"a string", "POST", "", `"hello"`, result{Status: 400}},
		{"bad session id", "POST", "bad\x7fid", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, result{Status: 400}},
		{"session id too long", "GET", strings.Repeat("a", 257), "", result{Status: 400}},
		{"session id at the limit", "GET", strings.Repeat("a", 256), "", result{Kind: kindStream, SessionID: strings.Repeat("a", 256)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, "/mcp", strings.NewReader(tt.body))
			if tt.sid != "" {
				r.Header.Set("Mcp-Session-Id", tt.sid)
			}
			c, rerr := classify(r, h1.AppendHeader(nil, r.Header), 1<<20, nil)
			var got result
			if rerr != nil {
				got.Status = rerr.status
			} else {
				got = result{Kind: c.Kind, Method: c.Method, ID: string(c.ID), Batch: c.Batch, SessionID: c.SessionID}
				if tt.method == "POST" && string(c.Body) != tt.body {
					t.Errorf("body not kept: %q", c.Body)
				}
			}
			if diff := cmp.Diff(got, tt.want); diff != "" {
				t.Errorf("classify (-got +want):\n%s", diff)
			}
		})
	}
}

func TestClassifyBodyLimit(t *testing.T) {
	body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	for _, tt := range []struct {
		name    string
		limit   int64
		chunked bool
		want    int
	}{
		{"exactly the limit", int64(len(body)), false, 0},
		{"one byte over", int64(len(body)) - 1, false, 413},
		{"chunked, exactly the limit", int64(len(body)), true, 0},
		{"chunked, one byte over", int64(len(body)) - 1, true, 413},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
			if tt.chunked {
				r.ContentLength = -1
			}
			_, rerr := classify(r, h1.AppendHeader(nil, r.Header), tt.limit, nil)
			got := 0
			if rerr != nil {
				got = rerr.status
			}
			if got != tt.want {
				t.Errorf("status %d, want %d", got, tt.want)
			}
		})
	}
}

func TestClassifyDuplicateSessionHeader(t *testing.T) {
	r := httptest.NewRequest("GET", "/mcp", nil)
	r.Header.Add("Mcp-Session-Id", "a")
	r.Header.Add("Mcp-Session-Id", "b")
	if _, rerr := classify(r, h1.AppendHeader(nil, r.Header), 1024, nil); rerr == nil || rerr.status != 400 {
		t.Errorf("two session ids accepted: %v", rerr)
	}
}

// FuzzClassify: the classifier never panics, and whatever it accepts is
// valid JSON whose kind agrees with its shape.
func FuzzClassify(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"x","result":{}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]`,
		`[]`, `{}`, `[`, `null`, `"x"`, `{"jsonrpc":"2.0","id":1e400,"method":"a"}`,
		`{"jsonrpc":"2.0","id":[1],"method":"a"}`, "\xff\xfe",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
		c, rerr := classify(r, h1.AppendHeader(nil, r.Header), 1<<16, nil)
		if rerr != nil {
			if rerr.status != http.StatusBadRequest && rerr.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d", rerr.status)
			}
			return
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if c.Kind > kindResponse {
			t.Fatalf("POST classified as %v", c.Kind)
		}
		if (c.Kind == kindRequest || c.Kind == kindInitialize || c.Kind == kindNotification) && c.Method == "" {
			t.Fatalf("%v without a method: %q", c.Kind, body)
		}
	})
}

// validIDNumbers are numbers around where validID stops trusting their
// length and asks strconv.ParseFloat.
var validIDNumbers = []string{
	"0", "-0", "2", "1.5", "-12.25", "1e400", "1E-400", "1e308", "2e308", "-1.8e308",
	strings.Repeat("9", 308), strings.Repeat("9", 309), "-" + strings.Repeat("9", 308),
	"1" + strings.Repeat("0", 308), "18" + strings.Repeat("0", 307), "17" + strings.Repeat("0", 307),
	"0." + strings.Repeat("0", 400) + "1", "1" + strings.Repeat("0", 307) + ".5",
}

func checkValidID(t *testing.T, num string) {
	// Only number tokens, as the scanner cuts an id out of a body.
	if !json.Valid([]byte(num)) || strings.TrimSpace(num) != num || (num[0] != '-' && (num[0] < '0' || num[0] > '9')) {
		return
	}
	_, err := strconv.ParseFloat(num, 64)
	if got := validID(json.RawMessage(num)); got != (err == nil) {
		t.Fatalf("validID(%.40s... (%d bytes)) = %v, ParseFloat error %v", num, len(num), got, err)
	}
}

// validID's shortcut for numbers without an exponent agrees with
// strconv.ParseFloat.
func TestValidIDNumbers(t *testing.T) {
	for _, num := range validIDNumbers {
		checkValidID(t, num)
	}
}

func FuzzValidIDNumbers(f *testing.F) {
	for _, num := range validIDNumbers {
		f.Add(num)
	}
	f.Fuzz(checkValidID)
}
