package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable reports that the shared store could not be reached in
// time. Callers degrade (serve from what they know) instead of failing.
var ErrUnavailable = errors.New("session: store unavailable")

// Redis is the shared session store: every tether replica of a fleet reads
// and writes the same records, so a session initialized through one replica
// routes correctly through any other, and a re-initialization is decided
// once for all of them (compare-and-swap on the record's version).
//
// Layout, under the key prefix P (default "tether:"):
//
//	P s:<client sid>   hash: v (version), b (backend id), u (backend URL),
//	                   bs (backend sid), i (initialize body), pv (protocol
//	                   version), c, l, e (created, last used, expiry; Unix
//	                   milliseconds of the store's clock: Lua numbers are
//	                   doubles, exact only to 2^53), r (re-initializations)
//	P b:<backend id>   sorted set of client sids scored by expiry: the
//	                   fleet-wide live sessions of a backend
//	P invalidate       pub/sub channel: a client sid whose record changed
//
// Expiry is judged twice: logically from e against the store's clock (so
// every store agrees on what "expired" means, fake clocks in tests
// included), and physically by Redis (PEXPIRE with the remaining time) so
// that abandoned records do not pile up.
//
// Multi-key scripts touch the backend sets of both the old and the new
// backend, so a Redis Cluster is not supported; use one primary (with
// replicas or Sentinel for availability).
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	ttl     time.Duration
	maxAge  time.Duration
	timeout time.Duration
	now     func() time.Time
	observe func(op string, start time.Time, err *error)
}

var _ Store = (*Redis)(nil)

// RedisOptions configures a Redis store.
type RedisOptions struct {
	Client redis.UniversalClient // required; see NewRedisClient
	Prefix string                // key prefix, default "tether:"
	TTL    time.Duration         // sliding idle TTL, default 1h
	MaxAge time.Duration         // absolute cap on a session's life; 0 = none
	// Timeout is the budget of one store call (one round trip), default
	// 50ms. A store that cannot answer in time is treated as down.
	Timeout time.Duration
	Now     func() time.Time // nil = time.Now
	// Observe is told of every round trip: the operation, its duration, and
	// its failure (nil for success, not-found and lost compare-and-swap).
	Observe func(op string, d time.Duration, err error)
}

// NewRedis returns a store on an existing client.
func NewRedis(opts RedisOptions) *Redis {
	r := &Redis{client: opts.Client, prefix: opts.Prefix, ttl: opts.TTL, maxAge: opts.MaxAge, timeout: opts.Timeout, now: opts.Now}
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
			if errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
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
// short as the call budget.
func NewRedisClient(opt *redis.Options, budget time.Duration) *redis.Client {
	if budget <= 0 {
		budget = 50 * time.Millisecond
	}
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = 1
	opt.MinRetryBackoff = 2 * time.Millisecond
	opt.MaxRetryBackoff = 10 * time.Millisecond
	opt.DialTimeout = 4 * budget
	opt.ReadTimeout = 4 * budget // backstops; the per-call context is the budget
	opt.WriteTimeout = 4 * budget
	opt.PoolTimeout = budget
	opt.DisableIdentity = true // no CLIENT SETINFO round trip on every new connection
	return redis.NewClient(opt)
}

func (r *Redis) sessionKey(sid string) string { return r.prefix + "s:" + sid }
func (r *Redis) backendPrefix() string        { return r.prefix + "b:" }
func (r *Redis) channel() string              { return r.prefix + "invalidate" }

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

// call bounds one store operation by the budget and maps transport
// failures to ErrUnavailable.
func (r *Redis) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err) // the cause too: Cache tells a cancelled caller from an outage
}

// Get reads a record in one round trip.
func (r *Redis) Get(ctx context.Context, clientSID string) (_ *Record, err error) {
	defer r.observe("get", time.Now(), &err)
	ctx, cancel := r.call(ctx)
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

func (r *Redis) decode(sid string, f map[string]string) (*Record, error) {
	if len(f) == 0 {
		return nil, ErrNotFound
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(f[k], 10, 64); return n }
	if e := num("e"); e != 0 && r.now().UnixMilli() >= e {
		return nil, ErrNotFound
	}
	v := num("v")
	if v <= 0 || f["b"] == "" {
		return nil, fmt.Errorf("session %q: malformed record in Redis", sid)
	}
	return &Record{
		ClientSID:       sid,
		BackendID:       f["b"],
		BackendURL:      f["u"],
		BackendSID:      f["bs"],
		Init:            []byte(f["i"]),
		ProtocolVersion: f["pv"],
		Created:         time.UnixMilli(num("c")).UTC(),
		LastUsed:        time.UnixMilli(num("l")).UTC(),
		Reinits:         uint32(num("r")),
		Version:         uint64(v),
	}, nil
}

// createScript replaces any record with the same id (removing it from its
// old backend's set) and writes version 1.
// KEYS[1] session key. ARGV: backend prefix, sid, ttl ms, then the fields.
var createScript = redis.NewScript(`
local old = redis.call('HGET', KEYS[1], 'b')
if old then redis.call('ZREM', ARGV[1] .. old, ARGV[2]) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', ARGV[13], 'b', ARGV[4], 'u', ARGV[5], 'bs', ARGV[6], 'i', ARGV[7],
  'pv', ARGV[8], 'c', ARGV[9], 'l', ARGV[10], 'e', ARGV[11], 'r', ARGV[12])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', ARGV[1] .. ARGV[4], ARGV[11], ARGV[2])
return 1
`)

// Create writes r as version 1, replacing any record with its id.
func (r *Redis) Create(ctx context.Context, rec *Record) error {
	if rec.ClientSID == "" {
		return errors.New("session: empty ClientSID")
	}
	now := r.now()
	created := rec.Created
	if created.IsZero() {
		created = now
	}
	return r.write(ctx, "create", createScript, rec, created, now, 1)
}

func (r *Redis) write(ctx context.Context, op string, script *redis.Script, rec *Record, created, last time.Time, version uint64) (err error) {
	defer r.observe(op, time.Now(), &err)
	exp := r.expiry(created, last)
	ttl := exp.Sub(r.now())
	if ttl <= 0 {
		ttl = time.Millisecond
	}
	ctx, cancel := r.call(ctx)
	defer cancel()
	err = script.Run(ctx, r.client, []string{r.sessionKey(rec.ClientSID)},
		r.backendPrefix(), rec.ClientSID, ttl.Milliseconds(),
		rec.BackendID, rec.BackendURL, rec.BackendSID, rec.Init, rec.ProtocolVersion,
		created.UnixMilli(), last.UnixMilli(), exp.UnixMilli(), rec.Reinits, version).Err()
	return unavailable(err)
}

// restoreScript writes a record kept locally while Redis was unreachable,
// unless Redis already has that session (another replica's view then wins,
// and only the expiry is refreshed).
// Same KEYS and ARGV as createScript, ARGV[13] being the version.
var restoreScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  local b = redis.call('HGET', KEYS[1], 'b')
  redis.call('HSET', KEYS[1], 'l', ARGV[10], 'e', ARGV[11])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', ARGV[1] .. b, ARGV[11], ARGV[2])
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[13], 'b', ARGV[4], 'u', ARGV[5], 'bs', ARGV[6], 'i', ARGV[7],
  'pv', ARGV[8], 'c', ARGV[9], 'l', ARGV[10], 'e', ARGV[11], 'r', ARGV[12])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', ARGV[1] .. ARGV[4], ARGV[11], ARGV[2])
return 1
`)

// Restore writes a record that was kept locally during an outage (see
// Cache); an existing record in Redis is kept and only refreshed.
func (r *Redis) Restore(ctx context.Context, rec *Record) error {
	version := max(rec.Version, 1)
	return r.write(ctx, "restore", restoreScript, rec, rec.Created, rec.LastUsed, version)
}

// swapScript is the compare-and-swap of a re-initialization.
// KEYS[1] session key. ARGV: expected version, backend prefix, sid, ttl ms,
// now ms (logical expiry check), new backend, url, backend sid, last ms,
// exp ms, reinits, channel.
// Returns {0} absent, {1, fields...} conflict, {2, version} swapped.
var swapScript = redis.NewScript(`
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
redis.call('HSET', KEYS[1], 'v', v, 'b', ARGV[6], 'u', ARGV[7], 'bs', ARGV[8], 'l', ARGV[9], 'e', ARGV[10], 'r', ARGV[11])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('ZREM', ARGV[2] .. oldb, ARGV[3])
redis.call('ZADD', ARGV[2] .. ARGV[6], ARGV[10], ARGV[3])
redis.call('PUBLISH', ARGV[12], ARGV[3])
return {2, v}
`)

// Swap is the compare-and-swap on Version that lets replicas agree on one
// re-initialization: the loser gets the winner's record and ErrConflict.
func (r *Redis) Swap(ctx context.Context, old, next *Record) (_ *Record, err error) {
	defer r.observe("swap", time.Now(), &err)
	if next.ClientSID != old.ClientSID {
		return nil, errors.New("session: Swap must keep the ClientSID")
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
	ctx, cancel := r.call(ctx)
	defer cancel()
	res, err := swapScript.Run(ctx, r.client, []string{r.sessionKey(old.ClientSID)},
		old.Version, r.backendPrefix(), old.ClientSID, ttl.Milliseconds(), now.UnixMilli(),
		next.BackendID, next.BackendURL, next.BackendSID, last.UnixMilli(), exp.UnixMilli(), next.Reinits,
		r.channel()).Slice()
	if err != nil {
		return nil, unavailable(err)
	}
	switch res[0].(int64) {
	case 0:
		return nil, ErrNotFound
	case 1:
		cur, err := r.decode(old.ClientSID, pairs(res[1:]))
		if err != nil {
			return nil, err
		}
		return cur, ErrConflict
	}
	stored := next.Clone()
	stored.Init, stored.ProtocolVersion, stored.Created = old.Init, old.ProtocolVersion, old.Created
	stored.LastUsed = last.UTC()
	stored.Version = uint64(res[1].(int64))
	return stored, nil
}

func pairs(flat []any) map[string]string {
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		m[k] = v
	}
	return m
}

// touchScript refreshes the sliding expiry, never reviving an expired
// record. KEYS[1] session key. ARGV: backend prefix, sid, now ms, ttl ms,
// max age ms (0 = none).
var touchScript = redis.NewScript(`
local f = redis.call('HMGET', KEYS[1], 'b', 'c', 'e')
if not f[1] then return 0 end
local now = tonumber(ARGV[3])
if tonumber(f[3]) <= now then return 0 end
local exp = now + tonumber(ARGV[4])
local maxage = tonumber(ARGV[5])
if maxage > 0 and tonumber(f[2]) + maxage < exp then exp = tonumber(f[2]) + maxage end
redis.call('HSET', KEYS[1], 'l', ARGV[3], 'e', exp)
redis.call('PEXPIRE', KEYS[1], math.max(1, exp - now))
redis.call('ZADD', ARGV[1] .. f[1], exp, ARGV[2])
return 1
`)

// Touch refreshes the idle TTL in one round trip. Rate limiting is the
// caller's (see Cache): Redis is written at most once per TTL/10.
func (r *Redis) Touch(ctx context.Context, clientSID string, now time.Time) (err error) {
	defer r.observe("touch", time.Now(), &err)
	ctx, cancel := r.call(ctx)
	defer cancel()
	n, err := touchScript.Run(ctx, r.client, []string{r.sessionKey(clientSID)},
		r.backendPrefix(), clientSID, now.UnixMilli(), r.ttl.Milliseconds(), r.maxAge.Milliseconds()).Int64()
	if err != nil {
		return unavailable(err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// deleteScript returns the removed record's fields ({} when absent).
// KEYS[1] session key. ARGV: backend prefix, sid, channel.
var deleteScript = redis.NewScript(`
local all = redis.call('HGETALL', KEYS[1])
if #all == 0 then return all end
local b = redis.call('HGET', KEYS[1], 'b')
redis.call('DEL', KEYS[1])
redis.call('ZREM', ARGV[1] .. b, ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return all
`)

// Delete removes a record and returns it.
func (r *Redis) Delete(ctx context.Context, clientSID string) (_ *Record, err error) {
	defer r.observe("delete", time.Now(), &err)
	ctx, cancel := r.call(ctx)
	defer cancel()
	res, err := deleteScript.Run(ctx, r.client, []string{r.sessionKey(clientSID)},
		r.backendPrefix(), clientSID, r.channel()).Slice()
	if err != nil {
		return nil, unavailable(err)
	}
	return r.decode(clientSID, pairs(res))
}

// BackendSessions counts the live sessions of each backend across the
// fleet, dropping expired members as it goes, in one round trip.
func (r *Redis) BackendSessions(ctx context.Context, backendIDs []string) (_ map[string]int64, err error) {
	defer r.observe("backend_sessions", time.Now(), &err)
	ctx, cancel := r.call(ctx)
	defer cancel()
	now := strconv.FormatInt(r.now().UnixMilli(), 10)
	pipe := r.client.Pipeline()
	counts := make([]*redis.IntCmd, len(backendIDs))
	for i, id := range backendIDs {
		key := r.backendPrefix() + id
		pipe.ZRemRangeByScore(ctx, key, "-inf", now)
		counts[i] = pipe.ZCard(ctx, key)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, unavailable(err)
	}
	out := make(map[string]int64, len(backendIDs))
	for i, id := range backendIDs {
		out[id] = counts[i].Val()
	}
	return out, nil
}

// Ping checks that Redis answers within the budget.
func (r *Redis) Ping(ctx context.Context) (err error) {
	defer r.observe("ping", time.Now(), &err)
	ctx, cancel := r.call(ctx)
	defer cancel()
	return unavailable(r.client.Ping(ctx).Err())
}

// Invalidations calls fn with the id of every record another replica
// changed (re-initialized or deleted), until ctx ends. go-redis resubscribes
// after a disconnect; messages sent meanwhile are lost, so resubscribed is
// called after every subscription but the first, for the caller to distrust
// what it cached.
func (r *Redis) Invalidations(ctx context.Context, fn func(clientSID string), resubscribed func()) {
	ps := r.client.Subscribe(ctx, r.channel())
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions()
	subscriptions := 0
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			switch m := msg.(type) {
			case *redis.Message:
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
}

// Close closes the client.
func (r *Redis) Close() error { return r.client.Close() }
