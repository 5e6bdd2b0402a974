package session

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Task records in Redis: one key per task, under the store's prefix P,
//
//	P t:<task id>   hash: b (backend id), u (backend URL), p (principal
//	                digest), c, e (created, expiry: Unix ms of the store's
//	                clock)
//
// with PEXPIRE set to the time left, so Redis drops the record when the
// task's TTL elapses. Every operation reads or writes that one key (a
// single-key script at most), so the layout works unchanged on a Redis
// Cluster. Expiry is judged, as for sessions, logically from e against the
// store's clock and physically by Redis.

func (r *Redis) taskKey(id string) string { return r.prefix + "t:" + id }

// putTaskScript stores a task record unless a live record of another
// backend or principal holds the id (then it returns 0).
// KEYS[1] task key. ARGV: 1 now ms, 2 backend, 3 url, 4 principal,
// 5 created ms, 6 expiry ms, 7 time to live ms.
var putTaskScript = redis.NewScript(`
local f = redis.call('HMGET', KEYS[1], 'b', 'p', 'e')
local e = tonumber(f[3])
if f[1] and e and e > tonumber(ARGV[1]) and (f[1] ~= ARGV[2] or (f[2] or '') ~= ARGV[4]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'b', ARGV[2], 'u', ARGV[3], 'p', ARGV[4], 'c', ARGV[5], 'e', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
`)

// PutTask stores t in one round trip (see TaskStore.PutTask).
func (r *Redis) PutTask(ctx context.Context, t TaskRecord) (err error) {
	if t.TaskID == "" {
		return errEmptyTaskID
	}
	defer r.observe("task_put", time.Now(), &err)
	now := r.now()
	if t.Created.IsZero() {
		t.Created = now
	}
	created := t.Created.Truncate(time.Millisecond)
	exp := created.Add(effectiveTaskTTL(t.TTL))
	left := max(exp.Sub(now), time.Millisecond)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	cmd := putTaskScript.Run(ctx, r.client, []string{r.taskKey(t.TaskID)},
		now.UnixMilli(), t.BackendID, t.BackendURL, t.Principal, created.UnixMilli(), exp.UnixMilli(), left.Milliseconds())
	if err := cmd.Err(); err != nil {
		return unavailable(err)
	}
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return badReply("task put script: %v", err)
	case n == 0:
		return ErrExists
	case n == 1:
		return nil
	}
	return badReply("task put script returned %d", n)
}

// GetTask reads a task record in one round trip (see TaskStore.GetTask).
func (r *Redis) GetTask(ctx context.Context, id string) (_ TaskRecord, err error) {
	defer r.observe("task_get", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	fields, err := r.client.HGetAll(ctx, r.taskKey(id)).Result()
	if err != nil {
		return TaskRecord{}, unavailable(err)
	}
	return r.decodeTask(id, fields)
}

// decodeTask builds a task record from its hash, checking every field.
func (r *Redis) decodeTask(id string, f map[string]string) (TaskRecord, error) {
	if len(f) == 0 {
		return TaskRecord{}, ErrNotFound
	}
	var bad string
	num := func(k string) int64 {
		n, err := strconv.ParseInt(f[k], 10, 64)
		if (err != nil || n < 0 || n > maxMillis) && bad == "" {
			bad = k
		}
		return n
	}
	c, e := num("c"), num("e")
	if bad != "" {
		return TaskRecord{}, badReply("task record field %s = %.40q", bad, f[bad])
	}
	if f["b"] == "" || e < c {
		return TaskRecord{}, badReply("task record without backend, or expiring before its creation")
	}
	if r.now().UnixMilli() >= e {
		return TaskRecord{}, ErrNotFound
	}
	return TaskRecord{
		TaskID:     id,
		BackendID:  f["b"],
		BackendURL: f["u"],
		Principal:  f["p"],
		Created:    time.UnixMilli(c).UTC(),
		TTL:        time.Duration(e-c) * time.Millisecond,
	}, nil
}

// deleteTaskScript removes a live task record (1), or returns 0 when it
// is absent or logically expired. KEYS[1] task key; ARGV[1] now ms.
var deleteTaskScript = redis.NewScript(`
local e = tonumber(redis.call('HGET', KEYS[1], 'e'))
if not e or e <= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// DeleteTask removes a task record in one round trip (see
// TaskStore.DeleteTask).
func (r *Redis) DeleteTask(ctx context.Context, id string) (err error) {
	defer r.observe("task_delete", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	cmd := deleteTaskScript.Run(ctx, r.client, []string{r.taskKey(id)}, r.now().UnixMilli())
	if err := cmd.Err(); err != nil {
		return unavailable(err)
	}
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return badReply("task delete script: %v", err)
	case n == 0:
		return ErrNotFound
	case n == 1:
		return nil
	}
	return badReply("task delete script returned %d", n)
}

// The cache passes task records through to Redis: a task is read once per
// poll (its pollIntervalMs, seconds), so a local copy would save one Redis
// round trip per poll and nothing more, while needing its own invalidation
// (a deleted or expired task) and outage story. While Redis is unreachable
// the calls fail with ErrUnavailable, and the caller answers a retryable
// error: the task is not lost, only its route unknown for now.

// PutTask stores t in Redis (see Redis.PutTask).
func (c *Cache) PutTask(ctx context.Context, t TaskRecord) error {
	return c.shared.PutTask(ctx, t)
}

// GetTask reads the record of id from Redis (see Redis.GetTask).
func (c *Cache) GetTask(ctx context.Context, id string) (TaskRecord, error) {
	return c.shared.GetTask(ctx, id)
}

// DeleteTask removes the record of id from Redis (see Redis.DeleteTask).
func (c *Cache) DeleteTask(ctx context.Context, id string) error {
	return c.shared.DeleteTask(ctx, id)
}
