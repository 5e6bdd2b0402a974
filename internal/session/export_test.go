package session

import (
	"context"
)

// The external tests (package session_test) reach these unexported parts
// through the names below, which exist only in test builds: the Cache is
// the Redis store's only production caller of them.

var (
	ErrInitTooLarge = errInitTooLarge
	ErrBadReply     = errBadReply
	ErrDeleted      = errDeleted
)

// AddressBytes are the bytes of the distinct Hosts and Paths held.
func (m *Memory) AddressBytes() int64 { return m.tab.addrs.total.Load() }

// AddressBytes are the bytes of the distinct Hosts and Paths cached.
func (c *Cache) AddressBytes() int64 { return c.tab.addrs.total.Load() }

func (r *Redis) Restore(ctx context.Context, rec *Record) error { return r.restore(ctx, rec) }

func (r *Redis) EnsureMarker(ctx context.Context) (ms int64, created bool, err error) {
	return r.ensureMarker(ctx)
}

func (r *Redis) Invalidations(ctx context.Context, fn func(clientSID string), resubscribed func(), control func(msg string)) {
	r.invalidations(ctx, fn, resubscribed, control)
}

func (r *Redis) RepairCounts(ctx context.Context, backendIDs []string) (removed, moved int, err error) {
	return r.repairCounts(ctx, backendIDs)
}
