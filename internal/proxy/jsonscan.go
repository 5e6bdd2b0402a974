package proxy

import (
	"encoding/binary"
	"encoding/json"
	"math/bits"
)

// The classifier reads a handful of top-level members of a JSON-RPC message
// on every POST. encoding/json would decode them with a dozen allocations a
// request, and json.Valid alone steps a state machine through every byte;
// this scanner checks the syntax and finds the members in one pass over the
// body instead. Its grammar is json.Valid's: RFC 8259, encoding/json's
// nesting limit (maxNestingDepth), and invalid UTF-8 accepted inside
// strings as json.Valid accepts it. Invalid JSON anywhere refuses the whole
// body, whatever the scan read before it. The rare spellings the scanner
// does not decode itself (a message with escaped or non-ASCII member names,
// an escaped or non-ASCII string value) are left to encoding/json, which is
// only ever handed bytes the scanner has already validated. Two
// differential fuzz tests pin it to encoding/json: the syntax to json.Valid
// (FuzzScanValidMatchesEncodingJSON), the results to json.Unmarshal's
// (FuzzScanMatchesEncodingJSON).
//
// skipString and skipValue, at the end of the file, re-read parts of a body
// the scanner has already validated (params, a result); they check nothing.

// maxNestingDepth is encoding/json's limit on nested arrays and objects
// (encoding/json/scanner.go): json.Valid refuses a value nested deeper, so
// the scanner does too.
const maxNestingDepth = 10000

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

// internedMethod returns the methods seen on nearly every request without
// allocating a string (a switch on string(raw) converts nothing, and costs
// a few comparisons of lengths where a map lookup would hash raw).
func internedMethod(raw []byte) (string, bool) {
	switch string(raw) {
	case "initialize":
		return "initialize", true
	case "notifications/initialized":
		return "notifications/initialized", true
	case "ping":
		return "ping", true
	case "tools/call":
		return "tools/call", true
	case "tools/list":
		return "tools/list", true
	case "resources/list":
		return "resources/list", true
	case "resources/read":
		return "resources/read", true
	case "resources/templates/list":
		return "resources/templates/list", true
	case "resources/subscribe":
		return "resources/subscribe", true
	case "resources/unsubscribe":
		return "resources/unsubscribe", true
	case "prompts/list":
		return "prompts/list", true
	case "prompts/get":
		return "prompts/get", true
	case "completion/complete":
		return "completion/complete", true
	case "logging/setLevel":
		return "logging/setLevel", true
	case "notifications/cancelled":
		return "notifications/cancelled", true
	case "notifications/progress":
		return "notifications/progress", true
	case "notifications/roots/list_changed":
		return "notifications/roots/list_changed", true
	case "server/discover":
		return "server/discover", true
	case "subscriptions/listen":
		return "subscriptions/listen", true
	case "2.0":
		return "2.0", true // the jsonrpc member's value
	}
	return "", false
}

// scanOutcome is what scanMessage made of a value.
type scanOutcome uint8

const (
	scanOK         scanOutcome = iota // well formed and read (null reads as an empty message)
	scanNotMessage                    // well formed, but not an object, or a member of the wrong type (encoding/json's type errors)
	scanFallback                      // well formed, but encoding/json has to decode it
	scanInvalid                       // not JSON
)

// scanMessage validates the value starting at b[i], inside depth open
// arrays, and reads it as a message into m (zero); end is the index after
// the value. Once the outcome is no longer scanOK the rest of the value is
// only validated: a type error or a fallback early in a body must not hide
// invalid JSON later in it.
func scanMessage(b []byte, i, depth int, m *wireMessage) (end int, res scanOutcome) {
	if i >= len(b) || b[i] != '{' {
		end, ok := scanValue(b, i, depth)
		switch {
		case !ok:
			return end, scanInvalid
		case string(b[i:end]) == "null":
			return end, scanOK // an empty message, rejected later
		}
		return end, scanNotMessage
	}
	depth++ // the message object
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, scanOK
	}
	for {
		nameEnd, valStart, plainName, ok := scanMemberName(b, i)
		if !ok {
			return valStart, scanInvalid
		}
		name := b[i+1 : nameEnd-1]
		plainVal := false
		if b[valStart] == '"' {
			i, plainVal, ok = scanString(b, valStart)
		} else {
			i, ok = scanValue(b, valStart, depth)
		}
		if !ok {
			return i, scanInvalid
		}
		if res == scanOK {
			if plainName {
				res = m.set(name, b[valStart:i], plainVal)
			} else {
				res = scanFallback
			}
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, scanInvalid
		}
		switch b[i] {
		case '}':
			return i + 1, res
		case ',':
			i = skipSpace(b, i+1)
		default:
			return i, scanInvalid
		}
	}
}

// set records the member name: val if routing reads it. plainVal reports a
// string value with neither escapes nor non-ASCII bytes. The outcome is
// scanNotMessage when val has a type encoding/json would refuse.
func (m *wireMessage) set(name, val []byte, plainVal bool) scanOutcome {
	switch {
	case nameIs(name, "jsonrpc"):
		if val[0] == 'n' {
			return scanOK // null into a string leaves it as it was
		}
		s, ok := decodedString(val, plainVal)
		if !ok {
			return scanNotMessage
		}
		m.JSONRPC = s
	case nameIs(name, "method"):
		if val[0] == 'n' {
			m.Method, m.HasMethod = "", false
			return scanOK
		}
		s, ok := decodedString(val, plainVal)
		if !ok {
			return scanNotMessage
		}
		m.Method, m.HasMethod = s, true
	case nameIs(name, "id"):
		m.ID = val
	case nameIs(name, "result"):
		m.Result = val
	case nameIs(name, "error"):
		m.Error = val
	case nameIs(name, "params"):
		m.Params = val
	}
	return scanOK
}

// nameIs reports whether the ASCII member name matches lower, a word of
// lower-case letters, in any case, as encoding/json matches an ASCII name
// to a field (bytes.EqualFold would also fold Unicode, which plain names
// do not hold).
func nameIs(name []byte, lower string) bool {
	if len(name) != len(lower) {
		return false
	}
	for i := range len(lower) {
		if name[i]|0x20 != lower[i] { // 'A'..'Z' | 0x20 is 'a'..'z'; no other byte becomes a letter
			return false
		}
	}
	return true
}

// stringValue returns a JSON string token's value (well formed); ok is
// false when the token is not a string.
func stringValue(tok []byte) (string, bool) {
	return decodedString(tok, tok[0] == '"' && !needsDecoding(tok[1:len(tok)-1]))
}

// decodedString returns a JSON string token's value (well formed); ok is
// false when the token is not a string. plain reports a token without
// escapes or non-ASCII bytes; the others are decoded by encoding/json
// (which also replaces invalid UTF-8, as the reference decoding does).
func decodedString(tok []byte, plain bool) (string, bool) {
	if tok[0] != '"' {
		return "", false
	}
	raw := tok[1 : len(tok)-1]
	if !plain {
		var s string
		if err := json.Unmarshal(tok, &s); err != nil {
			return "", false
		}
		return s, true
	}
	if s, ok := internedMethod(raw); ok {
		return s, true
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
	// b[i] <= ' ' first: most calls find no space at all.
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// scanMemberName validates an object's member name at b[i] and the colon
// after it. nameEnd is the index after the name's closing quote, valStart
// that of the value's first byte (ok guarantees there is one, or the index
// of the error). plain reports a name with neither escapes nor non-ASCII
// bytes.
func scanMemberName(b []byte, i int) (nameEnd, valStart int, plain, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return i, i, false, false
	}
	nameEnd, plain, ok = scanString(b, i)
	if !ok {
		return nameEnd, nameEnd, false, false
	}
	i = skipSpace(b, nameEnd)
	if i >= len(b) || b[i] != ':' {
		return nameEnd, i, false, false
	}
	i = skipSpace(b, i+1)
	return nameEnd, i, plain, i < len(b)
}

// stringByte classifies the bytes of a string's contents: 0 for a byte that
// stands for itself (the common case), otherwise what to check.
var stringByte = func() (t [256]uint8) {
	for c := range 0x20 {
		t[c] = strControl
	}
	t['"'], t['\\'] = strQuote, strEscape
	for c := 0x80; c < 0x100; c++ {
		t[c] = strNonASCII
	}
	return t
}()

const (
	strControl  = 1 + iota // a control character, refused raw
	strQuote               // the end of the string
	strEscape              // a backslash
	strNonASCII            // UTF-8, valid or not, accepted as json.Valid accepts it
)

// scanString validates the string token at b[i] (a quote) and returns the
// index after it (or of the error). plain reports contents with neither
// escapes nor non-ASCII bytes, which read as they are.
func scanString(b []byte, i int) (end int, plain, ok bool) {
	plain = true
	for i++; i < len(b); {
		if i+8 <= len(b) {
			// Eight bytes at a time up to the first that needs a look.
			m := stringBytesToCheck(binary.LittleEndian.Uint64(b[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) / 8
		}
		switch stringByte[b[i]] {
		case 0:
			i++
		case strQuote:
			return i + 1, plain, true
		case strNonASCII:
			plain = false
			i++
		case strEscape:
			plain = false
			if i+1 >= len(b) {
				return i, false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				// Any four hex digits, lone surrogates included: json.Valid
				// checks the syntax, not the code point.
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, false, false
				}
				i += 6
			default:
				return i, false, false
			}
		default: // strControl
			return i, false, false
		}
	}
	return i, false, false
}

const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// stringBytesToCheck returns w (eight bytes of a string's contents, the
// first lowest) with the high bit set in every byte stringByte does not map
// to 0, and perhaps in bytes after the first such: a borrow from a byte
// below 0x20 can carry into its neighbours, never into earlier ones.
func stringBytesToCheck(w uint64) uint64 {
	quote, backslash := w^(lowBits*'"'), w^(lowBits*'\\')
	return ((w-lowBits*0x20)&^w | (quote-lowBits)&^quote | (backslash-lowBits)&^backslash | w) & highBits
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// scanValue validates the value starting at b[i], inside depth open arrays
// and objects, and returns the index after it (or of the error).
func scanValue(b []byte, i, depth int) (int, bool) {
	if i < len(b) && (b[i] == '{' || b[i] == '[') {
		return scanNested(b, i, depth)
	}
	return scanScalar(b, i)
}

// scanScalar validates the string, number, true, false or null starting at
// b[i] and returns the index after it (or of the error). What follows is
// the caller's to check: "01" is the number 0 followed by a stray 1.
func scanScalar(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		end, _, ok := scanString(b, i)
		return end, ok
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || isDigit(c):
		return scanNumber(b, i)
	}
	return i, false
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), true
	}
	return i, false
}

// scanNumber validates the number at b[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b) || !isDigit(b[i]):
		return i, false
	case b[i] == '0':
		i++
	default:
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, false
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, false
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	return i, true
}

// scanNested validates the array or object at b[i], inside depth open
// arrays and objects, and returns the index after it (or of the error).
// It loops rather than recurses, keeping which containers are open in a
// bitset (1 for an object): a word on the stack for the first 64 levels,
// which is all real messages use; scanDeep takes over below that.
func scanNested(b []byte, i, depth int) (int, bool) {
	var shallow [1]uint64
	end, open, ok := walkNested(b, i, depth, 0, shallow[:])
	if ok && open > 0 {
		return scanDeep(b, end, depth, open, shallow[0])
	}
	return end, ok
}

// scanDeep continues scanNested's walk at b[i] with a bitset large enough
// for maxNestingDepth levels. It is kept out of line so that scanNested's
// frame does not carry (and zero) the large bitset on every call.
//
//go:noinline
func scanDeep(b []byte, i, depth, open int, shallow uint64) (int, bool) {
	var deep [(maxNestingDepth + 63) / 64]uint64
	deep[0] = shallow
	end, _, ok := walkNested(b, i, depth, open, deep[:])
	return end, ok
}

// walkNested validates the value starting at b[i] with open arrays and
// objects already entered (their kinds in the bitset objects), inside depth
// more. It returns the index after the value and open 0, the index of the
// error and ok false, or, when objects has no room for another level, the
// index of the '[' or '{' that did not fit, the levels open, and ok true.
func walkNested(b []byte, i, depth, open int, objects []uint64) (end, stillOpen int, ok bool) {
	for {
		// A value starts at b[i].
		if i < len(b) && (b[i] == '{' || b[i] == '[') {
			if depth+open >= maxNestingDepth {
				return i, 0, false
			}
			if open == 64*len(objects) {
				return i, open, true
			}
			word, bit := open/64, uint64(1)<<(open%64)
			isObject := b[i] == '{'
			if isObject {
				objects[word] |= bit
			} else {
				objects[word] &^= bit
			}
			open++
			i = skipSpace(b, i+1)
			switch {
			case i >= len(b):
				return i, 0, false
			case isObject && b[i] == '}', !isObject && b[i] == ']':
				open--
				i++
			case isObject:
				_, valStart, _, ok := scanMemberName(b, i)
				if !ok {
					return valStart, 0, false
				}
				i = valStart
				continue
			default:
				continue
			}
		} else if i, ok = scanScalar(b, i); !ok {
			return i, 0, false
		}

		// A value ended before b[i]: close the containers it completes,
		// up to a comma or the end of the outermost one.
	next:
		for {
			if open == 0 {
				return i, 0, true
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return i, 0, false
			}
			inObject := objects[(open-1)/64]&(1<<((open-1)%64)) != 0
			switch c := b[i]; {
			case c == ',' && inObject:
				_, valStart, _, ok := scanMemberName(b, skipSpace(b, i+1))
				if !ok {
					return valStart, 0, false
				}
				i = valStart
				break next
			case c == ',':
				i = skipSpace(b, i+1)
				break next
			case c == '}' && inObject, c == ']' && !inObject:
				open--
				i++
			default:
				return i, 0, false
			}
		}
	}
}

// skipString returns the index after the string token starting at b[i]
// (well formed).
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

// skipValue returns the index after the value starting at b[i] (well
// formed).
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
