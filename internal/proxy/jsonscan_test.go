package proxy

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
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
		// Refused as a whole, whatever the scan read before the error.
		wantErr := errNotJSON
		if len(bytes.Trim(body, " \t\r\n")) == 0 {
			wantErr = errEmptyBody
		}
		if gotErr != wantErr || !reflect.DeepEqual(got, classification{}) {
			t.Fatalf("invalid JSON %q: %v, %+v; want %v and nothing read", body, gotErr, got, wantErr)
		}
		return
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

// scanValid is the scanner's syntax check alone: one value and nothing but
// space around it, as json.Valid reads a document.
func scanValid(b []byte) bool {
	end, ok := scanValue(b, skipSpace(b, 0), 0)
	return ok && skipSpace(b, end) == len(b)
}

// validCases are inputs where a JSON validator can slip, with what
// json.Valid says of them.
var validCases = []struct {
	in    string
	valid bool
}{
	{"", false}, {" \t\r\n", false}, {"\v1", false}, {"\f1", false}, {"1\u00a0", false},
	{"\xef\xbb\xbf{}", false}, // a byte order mark
	{"{}", true}, {" [ ] ", true}, {"[}", false}, {"{]", false}, {"[1}", false}, {`{"a":1]`, false},
	{"[[]", false}, {"[]]", false}, {"{}}", false}, {"[", false}, {"{", false}, {"]", false}, {"}", false},
	{`{"a" 1}`, false}, {`{"a":}`, false}, {`{"a"}`, false}, {`{,}`, false}, {`{"a":1,}`, false},
	{`{"a":1 "b":2}`, false}, {`{1:2}`, false}, {`{a:1}`, false}, {`{"a":1,"a":2}`, true}, {`{"a"::1}`, false},
	{"[1,]", false}, {"[,1]", false}, {"[1 2]", false}, {"[1,,2]", false}, {"[ 1 , 2 ]", true},
	{"0", true}, {"-0", true}, {"01", false}, {"-01", false}, {"00", false}, {"0.0", true}, {"-", false},
	{"1.", false}, {".5", false}, {"+1", false}, {"1e", false}, {"1e+", false}, {"1E-0", true}, {"1e05", true},
	{"1.5e+3", true}, {"1.e5", false}, {"0x10", false}, {"1_000", false}, {"-.5", false}, {"--1", false},
	{"1e400", true}, {"123456789012345678901234567890", true}, {"[01]", false}, {"[-]", false}, {"[1.]", false},
	{"true", true}, {"tru", false}, {"truex", false}, {"True", false}, {"null", true}, {"nul", false},
	{"nulll", false}, {"false", true}, {"[true,false,null]", true}, {"[truefalse]", false}, {"NaN", false},
	{`""`, true}, {`"abc`, false}, {`"`, false}, {`"\`, false}, {`"\"`, false}, {`"\""`, true},
	{`"\x"`, false}, {`"\'"`, false}, {`"\a"`, false}, {`"\/"`, true}, {`"\b\f\n\r\t\\"`, true},
	{`"\u"`, false}, {`"\u12"`, false}, {`"\u12G4"`, false}, {`"\u00e9"`, true}, {`"\uABCD"`, true},
	{`"\uD800"`, true}, {`"\uDC00\uD800"`, true}, {`"\u00"`, false}, {`"\U00e9"`, false}, {`"\u 123"`, false},
	{"\"a\x00b\"", false}, {"\"a\x01b\"", false}, {"\"\x1f\"", false}, {"\"\t\"", false}, {"\"\n\"", false},
	{"\"\x7f\"", true}, {"\"\xff\"", true}, {"\"\xc3\"", true}, {"\"\xed\xa0\x80\"", true}, {"\"caf\xc3\xa9\"", true},
	{"\xff", false}, {"[\xff]", false}, {"{\"\xff\":1}", true},
	{"{} x", false}, {"1 2", false}, {"[] ]", false}, {"{}\x00", false}, {"\"a\"\"b\"", false}, {"nullnull", false},
	{strings.Repeat("[", maxNestingDepth) + strings.Repeat("]", maxNestingDepth), true},
	{strings.Repeat("[", maxNestingDepth+1) + strings.Repeat("]", maxNestingDepth+1), false},
	{strings.Repeat(`{"a":`, maxNestingDepth) + "1" + strings.Repeat("}", maxNestingDepth), true},
	{strings.Repeat(`{"a":`, maxNestingDepth+1) + "1" + strings.Repeat("}", maxNestingDepth+1), false},
	{strings.Repeat(`[{"a":`, maxNestingDepth/2) + "[]" + strings.Repeat("}]", maxNestingDepth/2), false},
	{strings.Repeat(`[{"a":`, maxNestingDepth/2) + "0" + strings.Repeat("}]", maxNestingDepth/2), true},
	{strings.Repeat("[", 64) + strings.Repeat("]", 64), true},
	{strings.Repeat("[", 65) + strings.Repeat("]", 65), true},
	{strings.Repeat("[", 65) + "}" + strings.Repeat("]", 64), false},
	{`{"a":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + "}", true},
	{`{"a":` + strings.Repeat("[", 64) + strings.Repeat("]", 63) + "}}", false},
	{`{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `,"b":1}`, true},
	{`[` + strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70) + `,2]`, true},
	{`[` + strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 69) + `],2]`, false},
}

// wrapped places a value where the classifier's own loops read it: a
// message member, a batch member, a batch member's member.
func wrapped(v string) []string {
	return []string{
		v,
		`{"jsonrpc":"2.0","id":1,"method":"m","params":` + v + `}`,
		`{"jsonrpc":"2.0","id":1,"method":"m","params":` + v + `,"x":0}`,
		`{"jsonrpc":` + v + `,"method":"m"}`,
		`[` + v + `]`, `[` + v + `,{}]`, `[{},` + v + `]`,
		`[{"jsonrpc":"2.0","method":"m","params":` + v + `}]`,
		`[{"params":` + v + `,"jsonrpc":5}, {"method":` + v + `}]`,
	}
}

// checkValid fails unless the scanner and the classifier agree with
// json.Valid on b.
func checkValid(t *testing.T, b []byte) {
	t.Helper()
	want := json.Valid(b)
	if got := scanValid(b); got != want {
		t.Fatalf("%.200q: scanner says valid %v, json.Valid %v", b, got, want)
	}
	var c classification
	blank := len(bytes.Trim(b, " \t\r\n")) == 0
	if notJSON := parseMessages(b, &c) == errNotJSON; notJSON != (!want && !blank) {
		t.Fatalf("%.200q: parseMessages refuses as not JSON %v, json.Valid %v", b, notJSON, want)
	}
	if !want && !reflect.DeepEqual(c, classification{}) {
		t.Fatalf("%.200q: parseMessages refused invalid JSON but read %+v", b, c)
	}
	if _, response, ok := parseTaskResponse(b); !want && (response || ok) {
		t.Fatalf("%.200q: parseTaskResponse read invalid JSON", b)
	}
}

func TestScanValidMatchesEncodingJSON(t *testing.T) {
	for _, tc := range validCases {
		if json.Valid([]byte(tc.in)) != tc.valid {
			t.Fatalf("%.200q: json.Valid says %v, the table %v", tc.in, !tc.valid, tc.valid)
		}
		for _, w := range wrapped(tc.in) {
			checkValid(t, []byte(w))
		}
	}
}

// Random nesting past the scanner's first 64 levels, where its bitset of
// open objects moves off the stack word, then one byte changed.
func TestScanValidDeepNesting(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		depth := 1 + rng.IntN(300)
		var open, close strings.Builder
		for range depth {
			if rng.IntN(2) == 0 {
				open.WriteString(`[1,`)
				close.WriteString(`]`)
			} else {
				open.WriteString(`{"k":0,"a":`)
				close.WriteString(`}`)
			}
		}
		closing := []byte(close.String())
		for i, j := 0, len(closing)-1; i < j; i, j = i+1, j-1 {
			closing[i], closing[j] = closing[j], closing[i]
		}
		doc := []byte(open.String() + `"x"` + string(closing))
		for _, w := range wrapped(string(doc)) {
			checkValid(t, []byte(w))
		}
		for range 5 {
			mutated := bytes.Clone(doc)
			const bytesToTry = `[]{},:"1 \`
			mutated[rng.IntN(len(mutated))] = bytesToTry[rng.IntN(len(bytesToTry))]
			for _, w := range wrapped(string(mutated)) {
				checkValid(t, []byte(w))
			}
		}
	}
}

// FuzzScanValidMatchesEncodingJSON: the scanner's syntax check is
// json.Valid's on every input.
func FuzzScanValidMatchesEncodingJSON(f *testing.F) {
	for _, tc := range validCases {
		if len(tc.in) < 1000 {
			f.Add([]byte(tc.in))
		}
	}
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Repeat("[", 70) + strings.Repeat("]", 70)))
	f.Fuzz(func(t *testing.T, b []byte) { checkValid(t, b) })
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

// Each interned method reads as itself, without allocating.
func TestInternedMethods(t *testing.T) {
	for _, m := range []string{
		"initialize", "notifications/initialized", "ping", "tools/call", "tools/list",
		"resources/list", "resources/read", "resources/templates/list", "resources/subscribe",
		"resources/unsubscribe", "prompts/list", "prompts/get", "completion/complete",
		"logging/setLevel", "notifications/cancelled", "notifications/progress",
		"notifications/roots/list_changed", "server/discover", "subscriptions/listen", "2.0",
	} {
		tok := []byte(`"` + m + `"`)
		var got string
		allocs := testing.AllocsPerRun(10, func() { got, _ = decodedString(tok, true) })
		if got != m || (allocs != 0 && !raceEnabled) {
			t.Errorf("%s reads as %q with %.0f allocations", m, got, allocs)
		}
	}
}
