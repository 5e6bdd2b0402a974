// Package session holds what tether knows of each MCP session and the stores
// that keep it: an in-memory store (the embedded default) and, behind the same
// interface, shared stores such as Redis.
//
// A session is keyed by the id the client uses. The record says which backend
// holds the session today and carries what is needed to rebuild it elsewhere
// (the original initialize request), so the routing layer can re-initialize a
// session transparently when its backend goes away
// (docs/design.md#transparent-re-initialization).
//
// Records are immutable once stored. Stores hand out shared *Record values;
// an update is a modified copy passed to Store.Swap, which is a
// compare-and-swap on Record.Version so that replicas sharing a store agree
// on a single winner when two of them re-initialize the same session.
//
// The package knows nothing of HTTP.
package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

var (
	// ErrNotFound reports a session the store does not hold, including one
	// that has been idle for longer than the store's TTL.
	ErrNotFound = errors.New("session: not found")
	// ErrConflict reports a lost compare-and-swap: the stored record's
	// Version is no longer the one the caller read.
	ErrConflict = errors.New("session: record changed concurrently")
	// ErrExists reports a Create for a client session id that a live record
	// already holds: two backends minted the same id (a counter, a weak
	// generator), and the second must not take the first one's session.
	ErrExists = errors.New("session: id already held by a live session")
)

// Record is what tether knows of one MCP session
// (docs/design.md#transparent-re-initialization).
//
// A stored Record is immutable: stores hand out pointers that are shared
// with other goroutines, so callers must not modify them. To update a
// session, Clone the record, change the copy and pass both to Store.Swap.
type Record struct {
	// ClientSID is the id the client uses: the first backend's id, passed
	// through unchanged for the life of the session.
	ClientSID string
	// BackendID is the identity of the endpoint holding the session
	// (discovery.Endpoint.ID), never just its URL: a reused address is not
	// the pod that created the session.
	BackendID string
	// BackendURL is for explain output and logs only; requests are sent to
	// the endpoint found by BackendID, never to an address from the record.
	BackendURL string
	// BackendSID is the id the current backend knows. It equals ClientSID
	// until the first re-initialization.
	BackendSID string
	// Init is the original initialize request body, replayed on
	// re-initialization. It is never modified, so copies may share it.
	Init []byte
	// ProtocolVersion is the MCP-Protocol-Version header of that initialize
	// request, if it had one.
	ProtocolVersion string
	// Host and Path are the Host header and URL path of the initialize that
	// created the session: where its MCP endpoint is. A re-initialization
	// made without a client request (a drain) replays the initialize there.
	// "" in records written before tether stored them. Each is at most
	// MaxAddressLen bytes: a store refuses a longer one (Create, Swap).
	Host, Path string
	// Principal is a keyed digest of the credential headers that reached
	// the backend with the initialize ("" when it carried none). A session
	// is re-initialized only for a request whose credentials give the same
	// digest; the credentials themselves are never stored.
	Principal string
	// Created is when the session was first recorded.
	Created time.Time
	// LastUsed is the last use the store accepted (Create, Swap, or a Touch).
	// Touch is rate-limited, so it may lag the real last use by up to a
	// tenth of the store's TTL.
	LastUsed time.Time
	// Reinits counts transparent re-initializations.
	Reinits uint32
	// Version is set by the store: 1 on Create, plus one on each Swap.
	// Swap succeeds only against the current Version.
	Version uint64
}

// MaxAddressLen bounds Record.Host and Record.Path. A host name is at most
// 253 bytes and MCP endpoint paths are tens; 8 KiB is what nginx allows a
// whole request line or header line by default, so a longer value is no
// address of an MCP server that clients reach through common proxies, and
// a store does not keep it (each one is held per session, see
// DefaultMaxInitBytes).
const MaxAddressLen = 8 << 10

// ErrAddressTooLong reports a record whose Host or Path is longer than
// MaxAddressLen; nothing is stored.
var ErrAddressTooLong = errors.New("session: initialize Host or Path longer than 8 KiB")

// checkAddress refuses a record whose Host or Path no store keeps.
func checkAddress(r *Record) error {
	if len(r.Host) > MaxAddressLen || len(r.Path) > MaxAddressLen {
		return ErrAddressTooLong
	}
	return nil
}

// Clone returns a shallow copy of r. The copy shares Init, which is never
// modified. Clone of nil is nil.
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// Store keeps session records. Implementations are safe for concurrent use.
//
// A record idle for longer than the store's TTL is gone: every method treats
// it as absent, whether or not it has been physically removed yet.
type Store interface {
	// Get returns the record for clientSID, or ErrNotFound if it is absent
	// or expired. The record is shared and must not be modified.
	Get(ctx context.Context, clientSID string) (*Record, error)
	// Reload is Get from the authoritative copy, bypassing any local cache:
	// a replica about to re-initialize a session first checks that no other
	// replica has already moved it.
	Reload(ctx context.Context, clientSID string) (*Record, error)
	// Create stores a copy of r with Version 1 and LastUsed set to the
	// store's clock; r itself is not modified and may be reused. If a live
	// record already holds r.ClientSID, Create stores nothing and returns
	// ErrExists: a session never changes hands because another backend
	// minted the same id. An expired record with the id is replaced.
	Create(ctx context.Context, r *Record) error
	// Swap replaces the stored record by a copy of next if and only if the
	// stored Version equals old.Version; the stored copy gets Version
	// old.Version+1 and is returned. next must keep old's ClientSID. If the
	// Version differs, Swap returns the current record and ErrConflict, so the
	// loser can adopt the winner's result; if the record is absent or
	// expired, it returns nil and ErrNotFound.
	Swap(ctx context.Context, old, next *Record) (*Record, error)
	// Touch refreshes the sliding idle TTL as of now. It is cheap and may be
	// rate-limited to one effective refresh per TTL/10; it returns
	// ErrNotFound if the record is absent or expired (a Touch never revives a
	// session).
	Touch(ctx context.Context, clientSID string, now time.Time) error
	// Delete removes the record and returns it, or returns ErrNotFound if it
	// is absent or expired.
	Delete(ctx context.Context, clientSID string) (*Record, error)
	// Close releases the store's resources and stops its background work.
	Close() error
}

// BackendLister is a store that can list the sessions recorded on one
// backend: a drain moves each of them.
type BackendLister interface {
	// SessionsOn returns the client sids of up to limit live sessions whose
	// record names backendID (any order; a record may have moved or expired
	// since: callers re-read each). A limit above MaxSessionsOn is taken as
	// MaxSessionsOn; a limit <= 0 lists nothing. Repeated calls need not
	// return the same sessions: which ones come first is the store's (see
	// each store's SessionsOn), and a caller that keeps finding sessions it
	// cannot move yet should expect them back.
	SessionsOn(ctx context.Context, backendID string, limit int) ([]string, error)
}

// MaxSessionsOn bounds one SessionsOn listing: a reply of that many ids is
// a few megabytes from Redis, far below the limits its replies are held to
// (see respguard.go), and more than any drain moves between two listings.
const MaxSessionsOn = 1 << 16

// HashID is how a session id appears in logs, traces and the admin
// endpoints: a session id is a bearer credential on many servers, so only
// a digest is shown.
func HashID(sid string) string {
	sum := sha256.Sum256([]byte(sid))
	return hex.EncodeToString(sum[:8])
}
