package proxy

import (
	"bytes"
	"encoding/json"
	"testing"
)

// parseMessagesReference is the classifier as encoding/json sees it: the
// scanner must agree with it on every input.
func parseMessagesReference(body []byte, c *classification) *requestError {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return errEmptyBody
	}
	if trimmed[0] != '[' {
		m, rerr := decodeWithJSON(body)
		if rerr != nil {
			return rerr
		}
		kind, rerr := messageKind(&m)
		if rerr != nil {
			return rerr
		}
		c.Kind, c.Method, c.Params = kind, m.Method, m.Params
		if kind == kindRequest || kind == kindInitialize {
			c.ID = m.ID
		}
		return nil
	}
	var batch []jsonMessage
	if err := json.Unmarshal(body, &batch); err != nil {
		return jsonError(err)
	}
	if len(batch) == 0 {
		return errEmptyBatch
	}
	// Decoding is what differs; folding the members' kinds is shared.
	var bk batchKind
	bk.start(c)
	for _, j := range batch {
		m := wireMessage{JSONRPC: j.JSONRPC, ID: j.ID, Result: j.Result, Error: j.Error}
		if j.Method != nil {
			m.Method, m.HasMethod = *j.Method, true
		}
		if rerr := bk.add(c, &m); rerr != nil {
			return rerr
		}
	}
	bk.finish(c)
	return nil
}

var scanSeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":[1,{"b":"}"}]}}}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	`{"jsonrpc":"2.0","id":"x","result":{}}`, `{"jsonrpc":"2.0","id":null,"error":{"code":1}}`,
	`{"jsonrpc":"2.0","id":5,"result":null}`, `{"jsonrpc":"2.0","id":5,"result":1,"error":2}`,
	`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]`, `[ ]`, `[1]`, `[null]`,
	`{"JSONRPC":"2.0","METHOD":"ping","Id":1}`, `{"jsonrpc":"2.0","jsonrpc":null,"method":"x"}`,
	`{"jsonrpc":"2.0","method":"a","method":null,"id":1}`, `{"jsonrpc":"2\u002e0","method":"p","id":1}`,
	`{"jsonrpc":"2.0","meth\u006fd":"ping","id":1}`, `{"jsonrpc":"2.0","method":"caf\u00e9","id":1}`,
	"{\"jsonrpc\":\"2.0\",\"method\":\"bad\xff\",\"id\":1}", `{"jsonrpc":2,"method":"x"}`,
	`{"jsonrpc":"2.0","method":["x"]}`, `{"jsonrpc":"2.0","id":{},"method":"x"}`, `null`, `"x"`, `5`, `true`,
	` {"jsonrpc" : "2.0" , "id" : -1.5e3 , "method" : "initialize" } `, `{"jsonrpc":"2.0","id":1e400,"method":"a"}`,
	`{}`, `{"jsonrpc":"2.0"}`, `{"jsonrpc":"2.0","method":""}`, `[{"jsonrpc":"2.0","id":1,"result":{}}]`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"PARAMS":{"name":"b"}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}`, `{"jsonrpc":"2.0","id":1,"method":"x","p\u0061rams":[1]}`,
}

func classifyBoth(t *testing.T, body []byte) {
	t.Helper()
	var got, want classification
	gotErr := parseMessages(body, &got)
	if !json.Valid(body) {
		if gotErr == nil && len(bytes.TrimSpace(body)) > 0 {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		return // both reject; the reference decoder's error class may differ only for invalid JSON
	}
	wantErr := parseMessagesReference(body, &want)
	switch {
	case (gotErr == nil) != (wantErr == nil):
		t.Fatalf("%q: scanner error %v, encoding/json error %v", body, gotErr, wantErr)
	case gotErr != nil:
		if gotErr.status != wantErr.status || gotErr.code != wantErr.code {
			t.Fatalf("%q: scanner %d/%d, encoding/json %d/%d", body, gotErr.status, gotErr.code, wantErr.status, wantErr.code)
		}
	default:
		if got.Kind != want.Kind || got.Method != want.Method || !bytes.Equal(got.ID, want.ID) || got.Batch != want.Batch ||
			!bytes.Equal(got.Params, want.Params) {
			t.Fatalf("%q: scanner %+v, encoding/json %+v", body, got, want)
		}
	}
}

func TestScanMatchesEncodingJSON(t *testing.T) {
	for _, s := range scanSeeds {
		classifyBoth(t, []byte(s))
	}
}

// FuzzScanMatchesEncodingJSON: the in-place scanner and encoding/json
// classify every input alike.
func FuzzScanMatchesEncodingJSON(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) { classifyBoth(t, []byte(body)) })
}

func TestParseMessagesAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	body := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`)
	allocs := testing.AllocsPerRun(100, func() {
		var c classification
		if err := parseMessages(body, &c); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("classifying a tools/call allocates %.0f times, want 0", allocs)
	}
}

// initializeBody is a realistic ~2 KiB initialize: a client advertising
// its capabilities, with a described, iconed clientInfo and a few
// escaped characters, as desktop clients send.
var initializeBody = []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{` +
	`"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true},` +
	`"sampling":{"context":{},"tools":{}},"elicitation":{"form":{},"url":{}},` +
	`"tasks":{"list":{},"cancel":{},"requests":{"sampling":{"createMessage":{}},"elicitation":{"create":{}}}},` +
	`"experimental":{"com.example/streaming":{"chunkSize":65536,"compression":["gzip","zstd","br"],"window":1.5e3}}},` +
	`"clientInfo":{"name":"example-desktop","title":"Example Desktop \u2014 Assistant","version":"3.14.159-beta.2+build.2718",` +
	`"description":"A desktop assistant that connects to local and remote MCP servers, lists their tools, prompts and resources, and calls them on the user's behalf.\nIt keeps one session per server and reconnects with Last-Event-ID when the network drops.",` +
	`"websiteUrl":"https://example.com/desktop/assistant?ref=mcp&utm_source=initialize&utm_medium=client",` +
	`"icons":[{"src":"https://example.com/static/icons/assistant-16x16.png","mimeType":"image/png","sizes":["16x16"],"theme":"light"},` +
	`{"src":"https://example.com/static/icons/assistant-32x32.png","mimeType":"image/png","sizes":["32x32"],"theme":"light"},` +
	`{"src":"https://example.com/static/icons/assistant-64x64.png","mimeType":"image/png","sizes":["64x64"],"theme":"dark"},` +
	`{"src":"https://example.com/static/icons/assistant.svg","mimeType":"image/svg+xml","sizes":["any"],"theme":"dark"}]},` +
	`"_meta":{"progressToken":"init-0b5c2f9e-7d41-4c3a-9a8e-2f6d1e0c4b7a","io.example/trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",` +
	`"tracestate":"vendor1=opaque-value-1,vendor2=opaque-value-2","baggage":"userId=alice,serverNode=DF%2028,isProduction=false"},` +
	`"io.example/locale":{"language":"en-GB","timeZone":"Europe/London","units":"metric","numbers":[1,-2,3.25,4e-2,0,-0.5E+3,true,false,null]},` +
	`"io.example/workspace":{"roots":["file:///home/alice/projects/tether","file:///home/alice/projects/notes","file:///home/alice/Documents/reports/2026/q1"],` +
	`"openFiles":["internal/proxy/classify.go","internal/proxy/jsonscan.go","internal/proxy/jsonscan_test.go","docs/DESIGN.md"],"quote":"she said \"hi\"\t\\o/"}}}}`)

func benchmarkParseMessages(b *testing.B, body []byte) {
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var c classification
		if err := parseMessages(body, &c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseMessagesFollowUp(b *testing.B) {
	benchmarkParseMessages(b, []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`))
}

func BenchmarkParseMessagesInitialize(b *testing.B) { benchmarkParseMessages(b, initializeBody) }
