package session

import (
	"errors"
	"strings"
	"testing"
)

// The guard accepts every reply shape Redis sends (RESP2 and RESP3), fed
// whole or split anywhere, and follows the stream exactly: after each
// reply it expects the next reply's type byte.
func TestRespScannerAcceptsRedisReplies(t *testing.T) {
	replies := []string{
		"+OK\r\n", "-ERR wrong type\r\n", ":42\r\n", ":-1\r\n", "$5\r\nhello\r\n", "$0\r\n\r\n", "$-1\r\n", "*-1\r\n",
		"*0\r\n", "*2\r\n$1\r\nv\r\n:3\r\n", "*3\r\n:1\r\n*2\r\n+a\r\n+b\r\n$1\r\nx\r\n",
		"$4\r\n\r\n\r\n\r\n", // CRLF inside bulk data
		"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n:2\r\n", "~2\r\n:1\r\n:2\r\n", "_\r\n", ",3.14\r\n", "#t\r\n", "(12345678901234567890\r\n",
		"=15\r\ntxt:Some string\r\n", "!10\r\nSYNTAX err\r\n", ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nsid\r\n",
		"|1\r\n+ttl\r\n:3600\r\n:7\r\n",        // an attribute, then the value it describes
		"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n", // an attribute inside an array takes no slot
		"%0\r\n", "|0\r\n:5\r\n",
		strings.Repeat("*1\r\n", maxReplyDepth) + ":1\r\n",
	}
	stream := strings.Join(replies, "")
	for _, chunk := range []int{len(stream), 1, 2, 3, 7} {
		var s respScanner
		for i := 0; i < len(stream); i += chunk {
			if err := s.feed([]byte(stream[i:min(i+chunk, len(stream))])); err != nil {
				t.Fatalf("chunks of %d: %v at offset %d", chunk, err, i)
			}
		}
		if s.state != scanType || len(s.open) != 0 {
			t.Errorf("chunks of %d: after the stream, state %d with %d open aggregates; want a clean boundary", chunk, s.state, len(s.open))
		}
	}
}

// Lengths and shapes beyond the limits break the stream before go-redis
// sees them, whatever the chunking.
func TestRespScannerRefusesHostileReplies(t *testing.T) {
	tests := map[string]string{
		"array out of range":   "*99999999999999\r\n",
		"array over the limit": "*1048577\r\n",
		"map over the limit":   "%524289\r\n",
		"bulk over the limit":  "$67108865\r\n",
		"bulk overflowing":     "$9223372036854775807\r\n",
		"negative length":      "$-2\r\n",
		"minus zero":           "*-0\r\n",
		"empty length":         "$\r\n",
		"length with garbage":  "*1x\r\n",
		"length without LF":    "$1\rx",
		"nesting":              strings.Repeat("*1\r\n", maxReplyDepth+1),
		"attribute nesting":    strings.Repeat("|1\r\n", maxReplyDepth+1),
		"endless line":         "+" + strings.Repeat("a", maxReplyLine+1),
		"unknown type":         "@1\r\n",
		"streamed string":      "$?\r\n",
		"after a valid reply":  ":1\r\n*99999999999999\r\n",
	}
	for name, stream := range tests {
		for _, chunk := range []int{len(stream), 1} {
			var s respScanner
			var err error
			for i := 0; i < len(stream) && err == nil; i += chunk {
				err = s.feed([]byte(stream[i:min(i+chunk, len(stream))]))
			}
			if !errors.Is(err, errHostileReply) {
				t.Errorf("%s (chunks of %d): %v, want errHostileReply", name, chunk, err)
			}
		}
	}
}

// Whatever arrives, the guard never panics and never tracks more than its
// depth limit.
func FuzzRespScanner(f *testing.F) {
	for _, seed := range []string{"*2\r\n$1\r\nv\r\n:3\r\n", "|1\r\n+a\r\n+b\r\n:1\r\n", "*99999999999999\r\n", "$-1\r\n%1\r\n_\r\n,1\r\n"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var s respScanner
		for len(p) > 0 {
			n := min(len(p), 5)
			if s.feed(p[:n]) != nil {
				return
			}
			if len(s.open) > maxReplyDepth {
				t.Fatalf("%d open aggregates", len(s.open))
			}
			p = p[n:]
		}
	})
}
