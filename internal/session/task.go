package session

import (
	"context"
	"errors"
	"math"
	"strings"
	"time"
)

// Task records: where a task of the MCP tasks extension
// (io.modelcontextprotocol/tasks, SEP-2663) lives. A task is created by a
// backend in answer to a tools/call and is then polled and cancelled by its
// id (tasks/get, tasks/update, tasks/cancel, each carrying the id in the
// Mcp-Name header); only the backend that created it holds its state, so
// every replica must send those requests there, and a task whose backend is
// gone is lost (it cannot be replayed elsewhere).
//
// A task record, unlike a session record, never changes: a task never moves
// between backends and its TTL runs from its creation, not from its last
// use. It ends when its TTL elapses or when it is deleted.

// Task lifetimes (docs/design.md#task-records).
const (
	// DefaultTaskTTL is how long a task is routed when its creation result
	// gives no ttlMs (the field is required by SEP-2663, so only a
	// non-conforming server omits it).
	DefaultTaskTTL = time.Hour
	// MaxTaskTTL caps every task's lifetime, including the ones whose
	// ttlMs is null ("unlimited"): a task's record costs memory (or a Redis
	// key) until it expires, and tether never learns that a client stopped
	// polling. A server that keeps a task longer still has it, but tether
	// no longer knows where.
	MaxTaskTTL = 24 * time.Hour
	// TaskTTLUnlimited is TaskRecord.TTL for a task whose ttlMs is null.
	TaskTTLUnlimited time.Duration = -1
	// defaultMaxTasks bounds the task records one process holds (memory
	// store). A record costs about 250 bytes besides its id, so the bound
	// is about 25 MiB.
	defaultMaxTasks = 100_000
)

var errEmptyTaskID = errors.New("session: empty task id")

// TaskRecord is where a task lives.
type TaskRecord struct {
	// TaskID is the id the backend gave the task (CreateTaskResult.taskId).
	TaskID string
	// BackendID is the identity of the endpoint holding the task
	// (discovery.Endpoint.ID): requests go to the endpoint found by it,
	// never to an address from the record.
	BackendID string
	// BackendURL is for explain output and logs only.
	BackendURL string
	// Principal is the keyed digest of the credentials of the request that
	// created the task ("" when it carried none), as for sessions: a task
	// is routed only for requests whose credentials give the same digest.
	Principal string
	// Created is when the record was stored (the store's clock when zero).
	Created time.Time
	// TTL is how long the task is routed from Created. As given to PutTask:
	// the task's ttlMs; 0 when the result had none (DefaultTaskTTL is
	// used), TaskTTLUnlimited when it was null (MaxTaskTTL is used). Stored
	// records carry the effective TTL, never more than MaxTaskTTL.
	TTL time.Duration
}

// Expires is when the record stops routing.
func (t TaskRecord) Expires() time.Time { return t.Created.Add(t.TTL) }

// effectiveTaskTTL is the lifetime a store gives a task whose creation
// result said ttl (see TaskRecord.TTL).
func effectiveTaskTTL(ttl time.Duration) time.Duration {
	switch {
	case ttl == 0:
		return DefaultTaskTTL
	case ttl < 0 || ttl > MaxTaskTTL:
		return MaxTaskTTL
	}
	return ttl
}

// TaskStore keeps task records. *Memory, *Redis and *Cache implement it,
// each safe for concurrent use.
type TaskStore interface {
	// PutTask stores t with its effective TTL (effectiveTaskTTL) from
	// t.Created (the store's clock when zero). If a live record holds the
	// id for another backend or another principal, nothing is stored and
	// ErrExists is returned: a task never changes hands because two
	// backends minted the same id. A live record of the same backend and
	// principal is replaced (a refreshed TTL).
	PutTask(ctx context.Context, t TaskRecord) error
	// GetTask returns the record of id, or ErrNotFound if it is absent or
	// expired.
	GetTask(ctx context.Context, id string) (TaskRecord, error)
	// DeleteTask removes the record of id, or returns ErrNotFound if it is
	// absent or expired.
	DeleteTask(ctx context.Context, id string) error
}

var (
	_ TaskStore = (*Memory)(nil)
	_ TaskStore = (*Redis)(nil)
	_ TaskStore = (*Cache)(nil)
)

// taskEntry is a table entry of the memory store's tasks.
type taskEntry struct{ rec TaskRecord }

// newTaskTable is the memory store's bounded table of tasks: maxLen
// records, least recently used evicted first (expired ones before any).
// Tasks hold no initialize body, so the byte bound never applies.
func newTaskTable(maxLen int64) *table[taskEntry] {
	return newTable(maxLen, math.MaxInt64,
		func(e *taskEntry, now int64) bool { return now >= e.rec.Expires().UnixNano() },
		func(e *taskEntry) string { return e.rec.TaskID },
		func(*taskEntry) []byte { return nil }, nil)
}

// PutTask stores t (see TaskStore.PutTask). Past MaxTasks, the least
// recently used task records are evicted (OnTaskEvict hears of each).
func (m *Memory) PutTask(_ context.Context, t TaskRecord) error {
	if t.TaskID == "" {
		return errEmptyTaskID
	}
	now := m.now()
	if t.Created.IsZero() {
		t.Created = now
	}
	t.TTL = effectiveTaskTTL(t.TTL)
	// The id and principal may be slices of a large response body: copied
	// so that they do not pin it.
	t.TaskID, t.Principal = strings.Clone(t.TaskID), strings.Clone(t.Principal)
	n := &node[taskEntry]{val: taskEntry{rec: t}}

	s := m.tasks.shard(t.TaskID)
	s.mu.Lock()
	if old := s.m[t.TaskID]; old != nil {
		cur := old.val.rec
		if now.Before(cur.Expires()) && (cur.BackendID != t.BackendID || cur.Principal != t.Principal) {
			s.mu.Unlock()
			return ErrExists
		}
		m.tasks.removeLocked(s, old)
	}
	m.tasks.insertLocked(s, n)
	var gone []evicted[taskEntry]
	if _, over := m.tasks.over(); over {
		gone = m.tasks.evictLocked(s, n, now.UnixNano(), nil)
	}
	s.mu.Unlock()
	if _, over := m.tasks.over(); over {
		gone = m.tasks.evictElsewhere(s, now.UnixNano(), gone)
	}
	if m.onTaskEvict != nil {
		for _, e := range gone {
			if !e.expired {
				m.onTaskEvict()
			}
		}
	}
	return nil
}

// GetTask returns the record of id (see TaskStore.GetTask). It does not
// allocate.
func (m *Memory) GetTask(_ context.Context, id string) (TaskRecord, error) {
	n := m.tasks.get(id)
	if n == nil {
		return TaskRecord{}, ErrNotFound
	}
	// The entry's record is never modified after insertion (a Put inserts
	// a new node), so it is read without the lock.
	t := n.val.rec
	if !m.now().Before(t.Expires()) {
		return TaskRecord{}, ErrNotFound
	}
	return t, nil
}

// DeleteTask removes the record of id (see TaskStore.DeleteTask). An
// expired record is left to the sweeper.
func (m *Memory) DeleteTask(_ context.Context, id string) error {
	now := m.now()
	s := m.tasks.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.m[id]
	if n == nil || !now.Before(n.val.rec.Expires()) {
		return ErrNotFound
	}
	m.tasks.removeLocked(s, n)
	return nil
}

// SweepTasks removes the task records expired at now and returns how many
// it removed. The sweeper calls it with Sweep; tests call it with a fake
// clock.
func (m *Memory) SweepTasks(now time.Time) int {
	n := 0
	for i := range m.tasks.shards {
		s := &m.tasks.shards[i]
		// Look under the read lock first: most sweeps find nothing, and then
		// they never block GetTask.
		if !anyTaskExpired(s, now) {
			continue
		}
		s.mu.Lock()
		for _, e := range s.m {
			if !now.Before(e.val.rec.Expires()) {
				m.tasks.removeLocked(s, e)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

func anyTaskExpired(s *tableShard[taskEntry], now time.Time) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.m {
		if !now.Before(e.val.rec.Expires()) {
			return true
		}
	}
	return false
}
