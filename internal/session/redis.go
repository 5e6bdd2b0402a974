package session

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrUnavailable reports that the shared store could not be reached in
// time. Callers degrade (serve from what they know) instead of failing.
var ErrUnavailable = errors.New("session: store unavailable")

// errBadReply reports a reply from Redis that is not what tether's commands
// and scripts return (a wrong type, a short array, a non-numeric field): a
// tampered record, a proxy in front of Redis, or not Redis at all. It is an
// error for the one call, never a panic, and it does not count as an outage.
var errBadReply = errors.New("session: malformed reply from Redis")

// Redis is the shared session store: every tether replica of a fleet reads
// and writes the same records, so a session initialized through one replica
// routes correctly through any other, and a re-initialization is decided
// once for all of them (compare-and-swap on the record's version).
//
// Layout, under the key prefix P (default "tether:"):
//
//	P s:<client sid>   hash: v (version), b (backend id), u (backend URL),
//	                   bs (backend sid), i (initialize body), pv (protocol
//	                   version), p (principal digest), h, pa (Host and path
//	                   of the initialize; absent in records written before
//	                   tether stored them), c, l, e (created, last used,
//	                   expiry; Unix milliseconds of the store's clock: Lua
//	                   numbers are doubles, exact only to 2^53), r
//	                   (re-initializations); d alone: a tombstone
//	P b:<backend id>   sorted set of client sids scored by expiry: the
//	                   fleet-wide live sessions of a backend
//	P epoch            when this Redis's data began (Unix ms): a replica
//	                   that finds it missing knows Redis lost its data (see
//	                   Cache, recovery)
//	P invalidate       pub/sub channel: a client sid whose record changed, or
//	                   a control message (a leading space, which no session
//	                   id has: see Cache, recovery)
//
// Expiry is judged twice: logically from e against the store's clock (so
// every store agrees on what "expired" means, fake clocks in tests
// included), and physically by Redis (PEXPIRE with the remaining time) so
// that abandoned records do not pile up.
//
// Every call is bounded by the budget (Timeout), plus, for a call that
// carries or returns an initialize body, the time that body takes at a
// conservative throughput: a large value is slow, not an outage.
//
// On one server (or a Sentinel-managed primary) the scripts update the
// backend sets with the record, atomically. A Redis Cluster refuses a
// script that touches keys it did not declare, or keys of several hash
// slots: there the scripts touch the session key only, and the backend
// sets are updated after them, apart (see counts.go: countsApart).
type Redis struct {
	client redis.UniversalClient
	// countsApart: the backend sets are updated by separate commands after
	// each script (Redis Cluster), not inside it.
	countsApart bool
	repair      countRepair
	sentinel    bool // the client is a Sentinel failover client
	watch       topologyWatch
	prefix      string
	ttl         time.Duration
	maxAge      time.Duration
	timeout     time.Duration
	now         func() time.Time
	observe     func(op string, start time.Time, err *error)
}

var (
	_ Store         = (*Redis)(nil)
	_ BackendLister = (*Redis)(nil)
)

// RedisOptions configures a Redis store.
type RedisOptions struct {
	Client redis.UniversalClient // required; see NewRedisClient
	Prefix string                // key prefix, default "tether:"
	TTL    time.Duration         // sliding idle TTL, default 1h
	MaxAge time.Duration         // absolute cap on a session's life; 0 = none
	// Timeout is the budget of one store call (one round trip), default
	// 50ms, extended for large values (see Redis). A store that cannot
	// answer in time is treated as down.
	Timeout time.Duration
	Now     func() time.Time // nil = time.Now
	// Observe is told of every round trip: the operation, its duration, and
	// its failure (nil for success, not-found and lost compare-and-swap).
	Observe func(op string, d time.Duration, err error)
	// Sentinel tells that Client is a Sentinel failover client (go-redis
	// gives it the type of a one-server client); see NewRedisTargetClient.
	Sentinel bool
	// WatchTopology follows a Sentinel or Cluster deployment's primaries
	// until Close, for Topology (its failovers).
	WatchTopology bool
}

// NewRedis returns a store on an existing client.
func NewRedis(opts RedisOptions) *Redis {
	r := &Redis{client: opts.Client, prefix: opts.Prefix, ttl: opts.TTL, maxAge: opts.MaxAge, timeout: opts.Timeout, now: opts.Now}
	_, r.countsApart = opts.Client.(*redis.ClusterClient)
	r.sentinel = opts.Sentinel
	if opts.WatchTopology {
		r.watchTopology()
	}
	if r.prefix == "" {
		r.prefix = "tether:"
	}
	if r.ttl <= 0 {
		r.ttl = time.Hour
	}
	if r.timeout <= 0 {
		r.timeout = 50 * time.Millisecond
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.observe = func(string, time.Time, *error) {}
	if fn := opts.Observe; fn != nil {
		r.observe = func(op string, start time.Time, errp *error) {
			err := *errp
			if errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) || errors.Is(err, ErrExists) {
				err = nil
			}
			fn(op, time.Since(start), err)
		}
	}
	return r
}

// NewRedisClient tunes go-redis for a hot path: every call honours its
// context deadline (without ContextTimeoutEnabled a frozen server costs the
// 5 s ReadTimeout per call), one retry with a short backoff (default
// retries cost ~1.7 s per call against a refused port), and pool waits as
// short as the call budget. Every connection's replies are checked against
// tether's limits before go-redis reads them (see respguard.go).
func NewRedisClient(opt *redis.Options, budget time.Duration) *redis.Client {
	if budget <= 0 {
		budget = 50 * time.Millisecond
	}
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = 1
	opt.MinRetryBackoff = 2 * time.Millisecond
	opt.MaxRetryBackoff = 10 * time.Millisecond
	opt.DialTimeout = 4 * budget
	// Backstops; the per-call context is the budget. Large values get more
	// (see Redis.budget), up to the largest value the guard accepts.
	opt.ReadTimeout = 4*budget + bytesTime(maxReplyBulk)
	opt.WriteTimeout = opt.ReadTimeout
	opt.PoolTimeout = budget
	// Two dial attempts 10 ms apart by default (go-redis: 5, 100 ms apart),
	// so that a refused port fails within the budget.
	opt.DialerRetries = 2
	opt.DialerRetryTimeout = max(budget/5, time.Millisecond)
	opt.DisableIdentity = true // no CLIENT SETINFO round trip on every new connection
	// No CLIENT MAINT_NOTIFICATIONS round trip either, and no server-sent
	// "relaxed timeouts" (10 s) or endpoint moves overriding the budget
	// and the configured address.
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	dial := opt.Dialer
	if dial == nil {
		dial = redis.NewDialer(opt)
	}
	opt.Dialer = guardDialer(dial)
	return redis.NewClient(opt)
}

// minBytesPerSecond is the throughput a large value is assumed to move at,
// at worst, between tether and Redis (network, Redis's copy, Lua): 8 MiB/s,
// far below any network a sidecar and its Redis share. A 64 KiB initialize
// body adds 8 ms to the budget; a 4 MiB one half a second.
const minBytesPerSecond = 8 << 20

func bytesTime(n int) time.Duration {
	return time.Duration(int64(n) * int64(time.Second) / minBytesPerSecond)
}

// budget is the time allowed for a call moving about n bytes of values.
func (r *Redis) budget(n int) time.Duration { return r.timeout + bytesTime(n) }

// slowReadBudget is for reading a record of unknown size that did not
// arrive within the plain budget although Redis answers pings: enough for
// the largest body the proxy accepted by default (4 MiB).
func (r *Redis) slowReadBudget() time.Duration { return r.budget(4 << 20) }

func (r *Redis) sessionKey(sid string) string { return r.prefix + "s:" + sid }
func (r *Redis) backendPrefix() string        { return r.prefix + "b:" }
func (r *Redis) channel() string              { return r.prefix + "invalidate" }
func (r *Redis) markerKey() string            { return r.prefix + "epoch" }

// expiry is when a session last used at last, created at created, expires.
func (r *Redis) expiry(created, last time.Time) time.Time {
	exp := last.Add(r.ttl)
	if r.maxAge > 0 {
		if capAt := created.Add(r.maxAge); capAt.Before(exp) {
			exp = capAt
		}
	}
	return exp
}

// call bounds one store operation by d.
func (r *Redis) call(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

// unavailable maps transport failures (and errors Redis itself answered)
// to ErrUnavailable.
func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) || errors.Is(err, errBadReply) {
		return err
	}
	if errors.Is(err, redis.Nil) {
		// Real Redis never answers tether's commands with nil where tether
		// expects a value.
		return fmt.Errorf("%w: nil reply", errBadReply)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err) // the cause too: Cache tells a cancelled caller from an outage
}

func badReply(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadReply}, args...)...)
}

// Get reads a record in one round trip.
func (r *Redis) Get(ctx context.Context, clientSID string) (*Record, error) {
	return r.get(ctx, clientSID, r.timeout)
}

// get is Get within budget d (larger for a record known to be large).
func (r *Redis) get(ctx context.Context, clientSID string, d time.Duration) (_ *Record, err error) {
	defer r.observe("get", time.Now(), &err)
	ctx, cancel := r.call(ctx, d)
	defer cancel()
	fields, err := r.client.HGetAll(ctx, r.sessionKey(clientSID)).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	return r.decode(clientSID, fields)
}

// Reload is Get: Redis is the authority.
func (r *Redis) Reload(ctx context.Context, clientSID string) (*Record, error) {
	return r.Get(ctx, clientSID)
}

// maxMillis bounds the timestamps accepted from Redis: Lua numbers are
// exact only to 2^53.
const maxMillis = 1 << 53

// decode builds a record from its hash, checking every field it uses.
func (r *Redis) decode(sid string, f map[string]string) (*Record, error) {
	if len(f) == 0 || f["d"] != "" {
		return nil, ErrNotFound // absent, or a tombstone (see tombstoneTTL)
	}
	var bad string
	num := func(k string, limit int64) int64 {
		n, err := strconv.ParseInt(f[k], 10, 64)
		if (err != nil || n < 0 || n > limit) && bad == "" {
			bad = k
		}
		return n
	}
	v := num("v", maxMillis)
	c, l, e := num("c", maxMillis), num("l", maxMillis), num("e", maxMillis)
	reinits := num("r", math.MaxUint32)
	if bad != "" {
		return nil, badReply("record field %s = %.40q", bad, f[bad])
	}
	if r.now().UnixMilli() >= e {
		return nil, ErrNotFound
	}
	if v == 0 || f["b"] == "" {
		return nil, badReply("record without version or backend")
	}
	for _, k := range []string{"h", "pa"} {
		if n := len(f[k]); n > MaxAddressLen {
			return nil, badReply("record field %s of %d bytes", k, n)
		}
	}
	return &Record{
		ClientSID:       sid,
		BackendID:       f["b"],
		BackendURL:      f["u"],
		BackendSID:      f["bs"],
		Init:            []byte(f["i"]),
		ProtocolVersion: f["pv"],
		Principal:       f["p"],
		Host:            f["h"],
		Path:            f["pa"],
		Created:         time.UnixMilli(c).UTC(),
		LastUsed:        time.UnixMilli(l).UTC(),
		Reinits:         uint32(reinits),
		Version:         uint64(v),
	}, nil
}

// createScript writes version 1 unless a live record holds the id (then it
// writes nothing and returns 0); an expired record is replaced (and removed
// from its old backend's set).
// KEYS[1] session key. ARGV: 1 backend prefix, 2 sid, 3 ttl ms, 4 backend,
// 5 url, 6 backend sid, 7 init, 8 protocol version, 9 created ms, 10 last
// used ms, 11 expiry ms, 12 reinits, 13 version, 14 now ms, 15 principal,
// 16 host, 17 path.
// (With countsApart the backend set lines are left out: see counts.go.)
var createScript = newCountedScript(`
local f = redis.call('HMGET', KEYS[1], 'b', 'e')
local e = tonumber(f[2])
if f[1] and e and e > tonumber(ARGV[14]) then return 0 end
--inline if f[1] then redis.call('ZREM', ARGV[1] .. f[1], ARGV[2]) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', ARGV[13], 'b', ARGV[4], 'u', ARGV[5], 'bs', ARGV[6], 'i', ARGV[7],
  'pv', ARGV[8], 'c', ARGV[9], 'l', ARGV[10], 'e', ARGV[11], 'r', ARGV[12], 'p', ARGV[15],
  'h', ARGV[16], 'pa', ARGV[17])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
--inline redis.call('ZADD', ARGV[1] .. ARGV[4], ARGV[11], ARGV[2])
return 1
`)

// Create writes r as version 1; if a live record holds its id it writes
// nothing and returns ErrExists.
func (r *Redis) Create(ctx context.Context, rec *Record) error {
	if rec.ClientSID == "" {
		return errors.New("session: empty ClientSID")
	}
	if err := checkAddress(rec); err != nil {
		return err
	}
	now := r.now()
	created := rec.Created
	if created.IsZero() {
		created = now
	}
	n, err := r.write(ctx, "create", createScript, rec, created, now, 1)
	switch {
	case err != nil:
		return err
	case n == 0:
		return ErrExists
	case n == 1:
		r.countAdded(ctx, rec.BackendID, rec.ClientSID, r.expiry(created, now))
		return nil
	}
	return badReply("create script returned %d", n)
}

func (r *Redis) write(ctx context.Context, op string, script countedScript, rec *Record, created, last time.Time, version uint64) (_ int64, err error) {
	defer r.observe(op, time.Now(), &err)
	now := r.now()
	exp := r.expiry(created, last)
	ttl := exp.Sub(now)
	if ttl <= 0 {
		ttl = time.Millisecond
	}
	ctx, cancel := r.call(ctx, r.budget(int(recordBytes(rec))))
	defer cancel()
	cmd := r.script(script).Run(ctx, r.client, []string{r.sessionKey(rec.ClientSID)}, r.writeArgs(rec, created, last, exp, ttl, version, now)...)
	if err := cmd.Err(); err != nil {
		return 0, unavailable(err)
	}
	n, err := cmd.Int64()
	if err != nil {
		return 0, badReply("%s script: %v", op, err)
	}
	return n, nil
}

// writeArgs are createScript's and restoreScript's ARGV.
func (r *Redis) writeArgs(rec *Record, created, last, exp time.Time, ttl time.Duration, version uint64, now time.Time) []any {
	return []any{r.backendPrefix(), rec.ClientSID, ttl.Milliseconds(),
		rec.BackendID, rec.BackendURL, rec.BackendSID, rec.Init, rec.ProtocolVersion,
		created.UnixMilli(), last.UnixMilli(), exp.UnixMilli(), rec.Reinits, version,
		now.UnixMilli(), rec.Principal, rec.Host, rec.Path}
}

// restoreScript writes a record kept locally while Redis was unreachable
// (or lost), unless Redis already has a live record with that id: if it is
// the same session (same creation time, initialize body and principal:
// what no re-initialization changes), only its expiry is moved to the
// later of the two and 0 is returned; if it is another session (another
// backend minted the same id meanwhile), nothing is written and 2 is
// returned. It returns 1 when it wrote the record.
// Same KEYS and ARGV as createScript.
// With countsApart, the refreshed expiry of a record already there is not
// written to its backend set (the repair pass of counts.go moves it).
var restoreScript = newCountedScript(`
if redis.call('HEXISTS', KEYS[1], 'd') == 1 then return 3 end
local f = redis.call('HMGET', KEYS[1], 'b', 'e', 'c', 'i', 'p')
local e = tonumber(f[2])
if f[1] and e and e > tonumber(ARGV[14]) then
  if (f[3] or '') ~= ARGV[9] or (f[4] or '') ~= ARGV[7] or (f[5] or '') ~= ARGV[15] then return 2 end
  if tonumber(ARGV[11]) > e then
    redis.call('HSET', KEYS[1], 'l', ARGV[10], 'e', ARGV[11])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
--inline     redis.call('ZADD', ARGV[1] .. f[1], ARGV[11], ARGV[2])
  end
  return 0
end
--inline if f[1] then redis.call('ZREM', ARGV[1] .. f[1], ARGV[2]) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', ARGV[13], 'b', ARGV[4], 'u', ARGV[5], 'bs', ARGV[6], 'i', ARGV[7],
  'pv', ARGV[8], 'c', ARGV[9], 'l', ARGV[10], 'e', ARGV[11], 'r', ARGV[12], 'p', ARGV[15],
  'h', ARGV[16], 'pa', ARGV[17])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
--inline redis.call('ZADD', ARGV[1] .. ARGV[4], ARGV[11], ARGV[2])
return 1
`)

// restore writes a record that was kept locally during an outage, or that
// Redis lost (see Cache). The same session already in Redis is kept and
// only its expiry refreshed; another live session holding the id is kept
// and ErrExists returned.
func (r *Redis) restore(ctx context.Context, rec *Record) error {
	version := max(rec.Version, 1)
	n, err := r.write(ctx, "restore", restoreScript, rec, rec.Created, rec.LastUsed, version)
	if err == nil && n == 1 {
		r.countAdded(ctx, rec.BackendID, rec.ClientSID, r.expiry(rec.Created, rec.LastUsed))
	}
	return restoreResult(n, err)
}

func restoreResult(n int64, err error) error {
	switch {
	case err != nil:
		return err
	case n == 0 || n == 1:
		return nil
	case n == 2:
		return ErrExists
	case n == 3:
		return errDeleted
	}
	return badReply("restore script returned %d", n)
}

// restoreAll restores recs (as restore) in pipelined batches of
// restoreBatch records, each batch within the budget for its bytes. It
// returns each record's result; it stops at the first batch that fails as
// a whole (Redis unreachable), leaving the rest with that error.
func (r *Redis) restoreAll(ctx context.Context, recs []*Record) []error {
	out := make([]error, len(recs))
	for start := 0; start < len(recs); start += restoreBatch {
		batch := recs[start:min(start+restoreBatch, len(recs))]
		if err := r.restoreBatch(ctx, batch, out[start:]); err != nil {
			for i := start; i < len(recs); i++ {
				if out[i] == nil {
					out[i] = err
				}
			}
			break
		}
	}
	return out
}

// restoreBatch is how many records one pipelined write-back carries: large
// enough to amortize the round trip, small enough that one batch of
// ordinary records fits the plain budget.
const restoreBatch = 128

func (r *Redis) restoreBatch(ctx context.Context, batch []*Record, out []error) (err error) {
	defer r.observe("restore_batch", time.Now(), &err)
	size := 0
	for _, rec := range batch {
		size += int(recordBytes(rec))
	}
	ctx, cancel := r.call(ctx, r.budget(size))
	defer cancel()
	now := r.now()
	pipe := r.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	var added []*Record // written: their backend sets want them (countsApart)
	for i, rec := range batch {
		exp := r.expiry(rec.Created, rec.LastUsed)
		ttl := max(exp.Sub(now), time.Millisecond)
		// EVAL, not EVALSHA: a Redis that just restarted has no scripts, and
		// a pipeline cannot fall back per command.
		cmds[i] = r.script(restoreScript).Eval(ctx, pipe, []string{r.sessionKey(rec.ClientSID)},
			r.writeArgs(rec, rec.Created, rec.LastUsed, exp, ttl, max(rec.Version, 1), now)...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isReplyError(err) {
		return unavailable(err)
	}
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			out[i] = unavailable(err)
			continue
		}
		n, err := cmd.Int64()
		if err != nil {
			out[i] = badReply("restore script: %v", err)
			continue
		}
		out[i] = restoreResult(n, nil)
		if n == 1 {
			added = append(added, batch[i])
		}
	}
	r.countRestored(ctx, added)
	return nil
}

// isReplyError reports an error Redis answered (as opposed to a transport
// failure): in a pipeline, one command's error is also Exec's.
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// swapScript is the compare-and-swap of a re-initialization. It leaves the
// session's initialize body, protocol version, principal and creation time
// as they are; it writes next's Host and path (where the session's endpoint
// is now).
// KEYS[1] session key. ARGV: expected version, backend prefix, sid, ttl ms,
// now ms (logical expiry check), new backend, url, backend sid, last ms,
// exp ms, reinits, channel, host, path.
// Returns {0} absent, {1, fields...} conflict, {2, version} swapped.
var swapScript = newCountedScript(`
local cur = redis.call('HGET', KEYS[1], 'v')
if not cur then return {0} end
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) <= tonumber(ARGV[5]) then return {0} end
if cur ~= ARGV[1] then
  local all = redis.call('HGETALL', KEYS[1])
  table.insert(all, 1, 1)
  return all
end
local oldb = redis.call('HGET', KEYS[1], 'b')
local v = tonumber(cur) + 1
redis.call('HSET', KEYS[1], 'v', v, 'b', ARGV[6], 'u', ARGV[7], 'bs', ARGV[8], 'l', ARGV[9], 'e', ARGV[10], 'r', ARGV[11],
  'h', ARGV[13], 'pa', ARGV[14])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
--inline if oldb then redis.call('ZREM', ARGV[2] .. oldb, ARGV[3]) end
--inline redis.call('ZADD', ARGV[2] .. ARGV[6], ARGV[10], ARGV[3])
redis.call('PUBLISH', ARGV[12], ARGV[3])
--inline return {2, v}
--apart return {2, v, oldb}
`)

// Swap is the compare-and-swap on Version that lets replicas agree on one
// re-initialization: the loser gets the winner's record and ErrConflict.
// The stored record keeps old's Init, ProtocolVersion, Principal and
// Created, and takes next's Host and Path.
func (r *Redis) Swap(ctx context.Context, old, next *Record) (_ *Record, err error) {
	defer r.observe("swap", time.Now(), &err)
	if next.ClientSID != old.ClientSID {
		return nil, errors.New("session: Swap must keep the ClientSID")
	}
	if err := checkAddress(next); err != nil {
		return nil, err
	}
	now := r.now()
	last := next.LastUsed
	if last.Before(old.LastUsed) || last.IsZero() {
		last = now
	}
	if now.After(last) {
		last = now
	}
	last = last.Truncate(time.Millisecond)
	exp := r.expiry(old.Created, last)
	ttl := exp.Sub(now)
	if ttl <= 0 {
		return nil, ErrNotFound
	}
	// A conflict returns the current record, body included; next's Host
	// and Path go with the call.
	ctx, cancel := r.call(ctx, r.budget(int(recordBytes(old))+len(next.Host)+len(next.Path)))
	defer cancel()
	cmd := r.script(swapScript).Run(ctx, r.client, []string{r.sessionKey(old.ClientSID)},
		old.Version, r.backendPrefix(), old.ClientSID, ttl.Milliseconds(), now.UnixMilli(),
		next.BackendID, next.BackendURL, next.BackendSID, last.UnixMilli(), exp.UnixMilli(), next.Reinits,
		r.channel(), next.Host, next.Path)
	if err := cmd.Err(); err != nil {
		return nil, unavailable(err)
	}
	res, err := cmd.Slice()
	if err != nil {
		return nil, badReply("swap script: %v", err)
	}
	if len(res) == 0 {
		return nil, badReply("swap script returned an empty array")
	}
	code, ok := res[0].(int64)
	if !ok {
		return nil, badReply("swap script returned %T first", res[0])
	}
	switch code {
	case 0:
		return nil, ErrNotFound
	case 1:
		fields, err := pairs(res[1:])
		if err != nil {
			return nil, err
		}
		cur, err := r.decode(old.ClientSID, fields)
		if errors.Is(err, ErrNotFound) {
			// The script saw it live a moment ago: an empty or expired
			// record here is not what the script returns.
			return nil, badReply("swap conflict without a live record")
		}
		if err != nil {
			return nil, err
		}
		return cur, ErrConflict
	case 2:
		oldBackend := ""
		if r.countsApart && len(res) == 3 {
			oldBackend, _ = res[2].(string)
			res = res[:2]
		}
		if len(res) != 2 {
			return nil, badReply("swap script returned %d elements for a swap", len(res))
		}
		v, ok := res[1].(int64)
		if !ok || v < 0 || uint64(v) != old.Version+1 {
			return nil, badReply("swap script returned version %v after %d", res[1], old.Version)
		}
		stored := next.Clone()
		stored.Init, stored.ProtocolVersion, stored.Created, stored.Principal = old.Init, old.ProtocolVersion, old.Created, old.Principal
		stored.LastUsed = last.UTC()
		stored.Version = uint64(v)
		r.countMoved(ctx, oldBackend, stored.BackendID, stored.ClientSID, exp)
		return stored, nil
	}
	return nil, badReply("swap script returned code %d", code)
}

// pairs turns a flat field/value array (as HGETALL inside a script returns
// it) into a map, refusing anything but an even number of strings.
func pairs(flat []any) (map[string]string, error) {
	if len(flat)%2 != 0 {
		return nil, badReply("%d elements where field/value pairs were expected", len(flat))
	}
	m := make(map[string]string, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		k, ok1 := flat[i].(string)
		v, ok2 := flat[i+1].(string)
		if !ok1 || !ok2 {
			return nil, badReply("field/value pair of %T, %T", flat[i], flat[i+1])
		}
		m[k] = v
	}
	return m, nil
}

// touchScript refreshes the sliding expiry, never reviving an expired
// record. KEYS[1] session key. ARGV: backend prefix, sid, now ms, ttl ms,
// max age ms (0 = none).
var touchScript = newCountedScript(`
local f = redis.call('HMGET', KEYS[1], 'b', 'c', 'e')
if not f[1] then return 0 end
local now = tonumber(ARGV[3])
local e, c = tonumber(f[3]), tonumber(f[2])
if not e or not c or e <= now then return 0 end
local exp = now + tonumber(ARGV[4])
local maxage = tonumber(ARGV[5])
if maxage > 0 and c + maxage < exp then exp = c + maxage end
redis.call('HSET', KEYS[1], 'l', ARGV[3], 'e', exp)
redis.call('PEXPIRE', KEYS[1], math.max(1, exp - now))
--inline redis.call('ZADD', ARGV[1] .. f[1], exp, ARGV[2])
--inline return 1
--apart return {1, f[1], exp}
`)

// Touch refreshes the idle TTL in one round trip. Rate limiting is the
// caller's (see Cache): Redis is written at most once per TTL/10.
func (r *Redis) Touch(ctx context.Context, clientSID string, now time.Time) (err error) {
	defer r.observe("touch", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	cmd := r.script(touchScript).Run(ctx, r.client, []string{r.sessionKey(clientSID)},
		r.backendPrefix(), clientSID, now.UnixMilli(), r.ttl.Milliseconds(), r.maxAge.Milliseconds())
	if err := cmd.Err(); err != nil {
		return unavailable(err)
	}
	if r.countsApart {
		return r.touchedApart(ctx, clientSID, cmd)
	}
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return badReply("touch script: %v", err)
	case n == 0:
		return ErrNotFound
	case n == 1:
		return nil
	}
	return badReply("touch script returned %d", n)
}

// deleteScript returns the removed record's fields ({} when absent).
// KEYS[1] session key. ARGV: backend prefix, sid, channel.
var deleteScript = newCountedScript(`
local all = redis.call('HGETALL', KEYS[1])
if #all == 0 then return all end
local b = redis.call('HGET', KEYS[1], 'b')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'd', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
--inline if b then redis.call('ZREM', ARGV[1] .. b, ARGV[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[2])
return all
`)

// errDeleted reports a write-back (restore) of a session that was deleted
// meanwhile: the record is not written, and the caller drops its copy.
var errDeleted = errors.New("session: deleted meanwhile")

// tombstoneTTL is how long a deleted session's key keeps a tombstone (the
// field d) instead of vanishing: long enough that no write-back of a copy
// cached elsewhere (after Redis lost its data, or an outage) can bring the
// session back. A Create with the same id replaces it.
const tombstoneTTL = time.Minute

// Delete removes a record and returns it. Its key is left as a tombstone
// for tombstoneTTL.
func (r *Redis) Delete(ctx context.Context, clientSID string) (*Record, error) {
	return r.del(ctx, clientSID, r.timeout)
}

// del is Delete within budget d (the record is returned, body included).
func (r *Redis) del(ctx context.Context, clientSID string, d time.Duration) (_ *Record, err error) {
	defer r.observe("delete", time.Now(), &err)
	ctx, cancel := r.call(ctx, d)
	defer cancel()
	cmd := r.script(deleteScript).Run(ctx, r.client, []string{r.sessionKey(clientSID)},
		r.backendPrefix(), clientSID, r.channel(), tombstoneTTL.Milliseconds())
	if err := cmd.Err(); err != nil {
		return nil, unavailable(err)
	}
	res, err := cmd.Slice()
	if err != nil {
		return nil, badReply("delete script: %v", err)
	}
	fields, err := pairs(res)
	if err != nil {
		return nil, err
	}
	r.countRemoved(ctx, fields["b"], clientSID)
	return r.decode(clientSID, fields)
}

// BackendSessions counts the live sessions of each backend across the
// fleet, dropping expired members as it goes, in one round trip.
func (r *Redis) BackendSessions(ctx context.Context, backendIDs []string) (_ map[string]int64, err error) {
	defer r.observe("backend_sessions", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	now := strconv.FormatInt(r.now().UnixMilli(), 10)
	pipe := r.client.Pipeline()
	counts := make([]*redis.IntCmd, len(backendIDs))
	for i, id := range backendIDs {
		key := r.backendPrefix() + id
		if r.countsApart {
			// Members whose score is behind their record's expiry are
			// not dropped here but moved by the repair pass.
			counts[i] = pipe.ZCount(ctx, key, "("+now, "+inf")
			continue
		}
		pipe.ZRemRangeByScore(ctx, key, "-inf", now)
		counts[i] = pipe.ZCard(ctx, key)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, unavailable(err)
	}
	out := make(map[string]int64, len(backendIDs))
	for i, id := range backendIDs {
		n := counts[i].Val()
		if n < 0 {
			return nil, badReply("ZCARD answered %d", n)
		}
		out[id] = n
	}
	r.maybeRepair(backendIDs)
	return out, nil
}

// SessionsOn lists up to limit live sessions of backendID from its set
// (P b:<backend>; see BackendLister). On one server and with Sentinel the
// set is exact (the scripts update it with the records): one ZRANGEBYSCORE
// of the unexpired members, the soonest to expire first, which are the
// sessions idle longest, the likeliest to be quiet for a drain. In a
// cluster the set may hold members whose record has moved or is gone, and
// a live member's score may lag behind its record (see counts.go): there
// each member read is checked against its record (see sessionsOnApart).
//
// ZRANGEBYSCORE rather than ZRANGE … BYSCORE: the same reply, and every
// Redis version has it.
func (r *Redis) SessionsOn(ctx context.Context, backendID string, limit int) (_ []string, err error) {
	defer r.observe("sessions_on", time.Now(), &err)
	limit = min(limit, MaxSessionsOn)
	if limit <= 0 {
		return nil, nil
	}
	key := r.backendPrefix() + backendID
	if r.countsApart {
		return r.sessionsOnApart(ctx, backendID, key, limit)
	}
	// The reply carries up to limit ids: time for them at the plain
	// budget's pace, as for a large value.
	cctx, cancel := r.call(ctx, r.budget(limit*listedIDBytes))
	defer cancel()
	sids, err := r.client.ZRangeByScore(cctx, key, &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(r.now().UnixMilli(), 10), Max: "+inf", Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if len(sids) > limit {
		return nil, badReply("ZRANGEBYSCORE LIMIT %d answered %d members", limit, len(sids))
	}
	if slices.Contains(sids, "") {
		return nil, badReply("ZRANGEBYSCORE answered an empty session id")
	}
	return sids, nil
}

// listedIDBytes is what one listed session id is assumed to cost a
// reply, for its budget: a 36-byte UUID and its framing, with room.
const listedIDBytes = 64

// Ping checks that Redis answers within the budget.
func (r *Redis) Ping(ctx context.Context) (err error) {
	defer r.observe("ping", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	return unavailable(r.client.Ping(ctx).Err())
}

// probe asks whether Redis is down: a PING allowed four budgets (what a
// connection is allowed to take to dial, see NewRedisClient). Redis down
// (refused, reset) answers at once; frozen, unreachable or overloaded, it
// takes the whole time; a single slow reply does not delay a PING sent
// after it that much.
func (r *Redis) probe(ctx context.Context) (err error) {
	defer r.observe("probe", time.Now(), &err)
	ctx, cancel := r.call(ctx, 4*r.timeout)
	defer cancel()
	return unavailable(r.client.Ping(ctx).Err())
}

// Marker reads the epoch marker: when this Redis's data began (Unix ms of
// the store's clock), or ok false if it is missing (Redis lost its data, or
// never had tether's). It also serves as the cache's health probe.
func (r *Redis) Marker(ctx context.Context) (ms int64, ok bool, err error) {
	defer r.observe("marker", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	s, err := r.client.Get(ctx, r.markerKey()).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, unavailable(err)
	}
	ms, err = strconv.ParseInt(s, 10, 64)
	if err != nil || ms < 0 || ms > maxMillis {
		return 0, false, badReply("epoch marker %.40q", s)
	}
	return ms, true, nil
}

// markerScript sets the epoch marker unless it exists; it returns
// {1, value} when it set it, {0, value} otherwise. KEYS[1] marker key;
// ARGV[1] now ms.
var markerScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return {0, v} end
redis.call('SET', KEYS[1], ARGV[1])
return {1, ARGV[1]}
`)

// ensureMarker sets the epoch marker to now unless it exists, and returns
// its value and whether this call set it.
func (r *Redis) ensureMarker(ctx context.Context) (ms int64, created bool, err error) {
	defer r.observe("marker", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	cmd := markerScript.Run(ctx, r.client, []string{r.markerKey()}, r.now().UnixMilli())
	if err := cmd.Err(); err != nil {
		return 0, false, unavailable(err)
	}
	res, err := cmd.Slice()
	if err != nil || len(res) != 2 {
		return 0, false, badReply("marker script: %v (%d elements)", err, len(res))
	}
	set, ok1 := res[0].(int64)
	s, ok2 := res[1].(string)
	ms, perr := strconv.ParseInt(s, 10, 64)
	if !ok1 || !ok2 || perr != nil || ms < 0 || ms > maxMillis || (set != 0 && set != 1) {
		return 0, false, badReply("marker script returned %v, %.40q", res[0], s)
	}
	return ms, set == 1, nil
}

// Control messages on the invalidation channel start with a space, which
// no session id contains (MCP session ids are visible ASCII).
const (
	// ctlRecovering: Redis lost its data; every replica writes back the
	// records it caches. Followed by the epoch marker's new value.
	ctlRecovering = " recovering "
	// ctlRestored: a replica finished writing back; waiting misses re-read.
	ctlRestored = " restored"
)

// announce publishes a control message to every replica.
func (r *Redis) announce(ctx context.Context, msg string) (err error) {
	defer r.observe("announce", time.Now(), &err)
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	return unavailable(r.client.Publish(ctx, r.channel(), msg).Err())
}

// invalidations calls fn with the id of every record another replica
// changed (re-initialized or deleted), and control with every control
// message (see announce), until ctx ends. go-redis resubscribes after a
// disconnect; messages sent meanwhile are lost, so resubscribed is called
// after every subscription but the first, for the caller to distrust what
// it cached.
//
// Messages are received here rather than through go-redis's Channel: its
// receiving goroutine turns a malformed pub/sub message into a panic that
// nothing can recover (unchecked type assertions on the reply), while here
// it is one skipped message.
func (r *Redis) invalidations(ctx context.Context, fn func(clientSID string), resubscribed func(), control func(msg string)) {
	ps := r.client.Subscribe(ctx, r.channel())
	defer ps.Close()
	stop := context.AfterFunc(ctx, func() { ps.Close() }) // unblocks Receive
	defer stop()
	subscriptions, failures := 0, 0
	for ctx.Err() == nil {
		msg, err := receive(ctx, ps)
		if err != nil {
			var ne net.Error
			switch {
			case ctx.Err() != nil || errors.Is(err, redis.ErrClosed):
				return
			case errors.As(err, &ne) && ne.Timeout():
				// A quiet channel: check the connection (the pong, or the
				// failure and the reconnection, shows on the next Receive).
				ps.Ping(ctx)
			case errors.Is(err, errBadReply):
			default:
				if failures++; failures > 1 { // Redis is down: do not spin
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
			continue
		}
		failures = 0
		switch m := msg.(type) {
		case *redis.Message:
			if strings.HasPrefix(m.Payload, " ") {
				if control != nil {
					control(m.Payload)
				}
				continue
			}
			fn(m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				if subscriptions++; subscriptions > 1 {
					resubscribed()
				}
			}
		}
	}
}

// pubsubIdle is how long a quiet subscription waits before checking its
// connection with a PING (go-redis's Channel does the same every 30 s).
const pubsubIdle = 30 * time.Second

// receive is one Receive, with go-redis's panics on malformed messages
// (see invalidations) turned into errBadReply. The message was read whole
// before go-redis looked into it, so the connection stays usable.
func receive(ctx context.Context, ps *redis.PubSub) (msg any, err error) {
	defer func() {
		if p := recover(); p != nil {
			msg, err = nil, badReply("pub/sub message: %v", p)
		}
	}()
	return ps.ReceiveTimeout(ctx, pubsubIdle)
}

// Close closes the client (after the repair pass running, if any).
func (r *Redis) Close() error {
	r.repair.wait()
	r.stopWatch()
	return r.client.Close()
}
