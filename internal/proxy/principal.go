package proxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/textproto"
	"slices"

	"github.com/tether-mcp/tether/internal/h1"
)

// DefaultPrincipalHeaders are the credential headers that bind a session to
// its creator by default. MCP clients authenticate with Authorization (OAuth
// bearer tokens, MCP's authorization spec). Cookie is not among them: a
// browser or a gateway in front adds and rotates cookies that say nothing of
// the user (affinity, CSRF, analytics), so a digest over them changes
// between requests of the same user and would refuse the creator's own
// re-initialization. Deployments whose gateway authenticates by a cookie or
// a header of its own (X-Auth-Request-User, ...) add that one.
var DefaultPrincipalHeaders = []string{"Authorization"}

// principalDigester computes the keyed digest of a request's credential
// headers that session.Record.Principal holds: HMAC-SHA256, so that a reader
// of the session store learns nothing of the credentials and cannot forge a
// digest for a credential of their own.
type principalDigester struct {
	key     []byte
	headers []string // canonical header names
}

func newPrincipalDigester(key []byte, headers []string) principalDigester {
	if len(key) == 0 {
		// A key of this process alone: digests made here match only here.
		// Replicas sharing a store need a shared key (cmd/tether provides one).
		key = make([]byte, 32)
		rand.Read(key) // never fails (crypto/rand panics rather than return an error)
	}
	if headers == nil {
		headers = DefaultPrincipalHeaders
	}
	d := principalDigester{key: key}
	for _, h := range headers {
		d.headers = append(d.headers, textproto.CanonicalMIMEHeaderKey(h))
	}
	return d
}

// digest returns the hex HMAC of the credential fields in h, or "" when h
// carries none of them (a session anyone holding its id may use).
func (d principalDigester) digest(h h1.Fields) string {
	var mac hash.Hash
	for _, name := range d.headers {
		if slices.ContainsFunc(h, func(f h1.Field) bool { return f.Name == name }) {
			mac = hmac.New(sha256.New, d.key)
			break
		}
	}
	if mac == nil {
		return ""
	}
	// Length-prefixed, so that no two different header sets encode alike:
	// each name, the number of its fields, and their values in order.
	var n [4]byte
	write := func(s string) {
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		mac.Write(n[:])
		mac.Write([]byte(s))
	}
	for _, name := range d.headers {
		write(name)
		count := 0
		for _, f := range h {
			if f.Name == name {
				count++
			}
		}
		binary.BigEndian.PutUint32(n[:], uint32(count))
		mac.Write(n[:])
		for _, f := range h {
			if f.Name == name {
				write(f.Value)
			}
		}
	}
	return hex.EncodeToString(mac.Sum(nil))
}

// matches reports, in constant time, whether h carries the credentials whose
// digest is stored. A record without a digest matches only a request without
// credentials.
func (d principalDigester) matches(stored string, h h1.Fields) bool {
	return subtle.ConstantTimeCompare([]byte(stored), []byte(d.digest(h))) == 1
}
