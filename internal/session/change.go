package session

// ChangeKind says how the set of live sessions changed.
type ChangeKind uint8

const (
	// Created: a new session (Change.New).
	Created ChangeKind = iota + 1
	// Moved: a session's record was replaced by Swap (Change.Old by
	// Change.New), usually onto another backend by a re-initialization.
	Moved
	// Deleted: a session ended by Delete (Change.Old).
	Deleted
	// Expired: a session ended without a Delete (Change.Old): idle past
	// the TTL, evicted to respect a bound, or replaced by a Create of the
	// same id after its expiry.
	Expired
)

func (k ChangeKind) String() string {
	switch k {
	case Created:
		return "created"
	case Moved:
		return "moved"
	case Deleted:
		return "deleted"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Change is one change to the sessions a store holds, as its OnChange
// subscriber hears of it (MemoryOptions.OnChange, CacheOptions.OnChange).
// Every change is told exactly once, outside the store's locks, and after
// it took effect; changes of different sessions, or of one session by
// concurrent callers, may be told in any order. The records are the
// store's shared ones and must not be modified.
//
// A store tells the changes its own calls make, and the expiries it
// carries out itself. A shared store also changes through other replicas
// and through its own expiry (Redis's key TTL), which no replica hears
// of: a per-backend count kept from these events is exact for the memory
// store, and is re-based on the fleet-wide count for Redis (see
// Redis.BackendSessions).
type Change struct {
	Kind ChangeKind
	// Old is the record before the change (nil for Created); New the one
	// after it (nil for Deleted and Expired).
	Old, New *Record
}
