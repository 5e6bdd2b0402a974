package proxy

import (
	"bytes"
	"encoding/json"
)

// The classifier reads a handful of top-level members of a JSON-RPC message
// on every POST. encoding/json would decode them with a dozen allocations a
// request; this scanner finds them in place instead. json.Valid checks the
// syntax first, so the scanner only walks well-formed JSON, and it falls
// back to encoding/json for the rare spellings it does not handle itself
// (escaped or non-ASCII member names). Its results are pinned to
// encoding/json's by a differential fuzz test (FuzzScanMatchesEncodingJSON).

// wireMessage holds the members of a JSON-RPC 2.0 message that routing
// reads. Params, result and error bodies are skipped, not decoded; ID,
// Result and Error are raw tokens inside the body.
type wireMessage struct {
	JSONRPC   string
	Method    string
	HasMethod bool // a method member holding a string (null counts as absent)
	ID        json.RawMessage
	Result    json.RawMessage
	Error     json.RawMessage
	Params    json.RawMessage
}

// interned are the methods seen on nearly every request, returned without
// allocating a string.
var interned = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{
		"initialize", "notifications/initialized", "ping", "tools/call", "tools/list",
		"resources/list", "resources/read", "resources/templates/list", "resources/subscribe",
		"resources/unsubscribe", "prompts/list", "prompts/get", "completion/complete",
		"logging/setLevel", "notifications/cancelled", "notifications/progress",
		"notifications/roots/list_changed", "server/discover", "subscriptions/listen",
	} {
		m[s] = s
	}
	return m
}()

// scanMessage reads one message object. ok is false when the value is not
// an object or a member has the wrong type (encoding/json's type errors).
// It reports fallback when the object needs encoding/json.
func scanMessage(b []byte) (m wireMessage, ok, fallback bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		// Valid JSON that is not an object: null decodes to an empty
		// message (rejected later), anything else is a type error.
		return m, bytes.Equal(bytes.TrimSpace(b), []byte("null")), false
	}
	i++
	for {
		i = skipSpace(b, i)
		if b[i] == '}' {
			return m, true, false
		}
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
		keyEnd := skipString(b, i)
		key := b[i+1 : keyEnd-1]
		if needsDecoding(key) {
			return m, false, true
		}
		i = skipSpace(b, keyEnd)
		i = skipSpace(b, i+1) // ':'
		valEnd := skipValue(b, i)
		val := b[i:valEnd]
		i = valEnd
		switch {
		case bytes.EqualFold(key, []byte("jsonrpc")):
			if val[0] == 'n' {
				continue // null into a string leaves it as it was
			}
			s, ok := stringValue(val)
			if !ok {
				return m, false, false
			}
			m.JSONRPC = s
		case bytes.EqualFold(key, []byte("method")):
			if val[0] == 'n' {
				m.Method, m.HasMethod = "", false
				continue
			}
			s, ok := stringValue(val)
			if !ok {
				return m, false, false
			}
			m.Method, m.HasMethod = s, true
		case bytes.EqualFold(key, []byte("id")):
			m.ID = val
		case bytes.EqualFold(key, []byte("result")):
			m.Result = val
		case bytes.EqualFold(key, []byte("error")):
			m.Error = val
		case bytes.EqualFold(key, []byte("params")):
			m.Params = val
		}
	}
}

// stringValue returns a JSON string token's value; ok is false when the
// token is not a string. Tokens with escapes or non-ASCII bytes are decoded
// by encoding/json (which also replaces invalid UTF-8, as the reference
// decoding does).
func stringValue(tok []byte) (string, bool) {
	if tok[0] != '"' {
		return "", false
	}
	raw := tok[1 : len(tok)-1]
	if needsDecoding(raw) {
		var s string
		if err := json.Unmarshal(tok, &s); err != nil {
			return "", false
		}
		return s, true
	}
	if s, ok := interned[string(raw)]; ok { // no allocation: map lookup by []byte
		return s, true
	}
	if string(raw) == "2.0" {
		return "2.0", true
	}
	return string(raw), true
}

func needsDecoding(s []byte) bool {
	for _, c := range s {
		if c == '\\' || c >= 0x80 {
			return true
		}
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipString returns the index after the string token starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // number, true, false, null
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
			i++
		}
		return i
	}
}

// scanArray calls fn with each element of a JSON array. It reports false
// when b is not an array.
func scanArray(b []byte, fn func(elem []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] != ']' {
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
		end := skipValue(b, i)
		if !fn(b[i:end]) {
			return true
		}
		i = skipSpace(b, end)
	}
	return true
}
