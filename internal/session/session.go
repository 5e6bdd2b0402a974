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

// HashID is how a session id appears in logs, traces and the admin
// endpoints: a session id is a bearer credential on many servers, so only
// a digest is shown.
func HashID(sid string) string {
	sum := sha256.Sum256([]byte(sid))
	return hex.EncodeToString(sum[:8])
}
