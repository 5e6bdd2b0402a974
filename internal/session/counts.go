package session

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The per-backend live-session counts (the sets P b:<backend>) in a Redis
// Cluster ("counts apart").
//
// A cluster runs a script only if every key it touches is declared and in
// one hash slot. The session record's scripts stay single-key there: they
// leave the backend sets alone (and, where the count needs it, return the
// record's backend), and the store updates the sets with separate commands
// right after. The record stays exact and atomic; the counts may drift:
//
//   - an update lost between the script and its count command (tether
//     killed, Redis failing over, the count's budget exceeded): a missing
//     member until the session's next touch re-adds it, or a member left
//     in another backend's set;
//   - two replicas' updates of one session applied out of order (two
//     re-initializations, or a touch and a delete, racing).
//
// A repair pass bounds both: at most every countRepairInterval, the first
// BackendSessions call of a process starts it in the background; it reads
// the record of every member of the counted backends and removes members
// whose record is gone, expired or on another backend, and moves scores
// behind their record's expiry. Counting (ZCOUNT of unexpired scores) does
// not delete: the pass does.
//
// On one server and with Sentinel the scripts update the sets themselves,
// atomically, as before.

// countedScript is one script in its two forms: with the backend set
// updates inline, and without them (counts apart). In the source, a line
// starting "--inline " belongs to the first form only and one starting
// "--apart " to the second (the markers are Lua comments).
type countedScript struct{ inline, apart *redis.Script }

func newCountedScript(src string) countedScript {
	form := func(keep, drop string) *redis.Script {
		var b strings.Builder
		for line := range strings.SplitSeq(src, "\n") {
			switch {
			case strings.HasPrefix(line, drop):
				continue
			case strings.HasPrefix(line, keep):
				line = strings.TrimPrefix(line, keep)
			}
			b.WriteString(line)
			b.WriteByte('\n')
		}
		return redis.NewScript(b.String())
	}
	return countedScript{inline: form("--inline ", "--apart "), apart: form("--apart ", "--inline ")}
}

// script is s in the form this store runs.
func (r *Redis) script(s countedScript) *redis.Script {
	if r.countsApart {
		return s.apart
	}
	return s.inline
}

// countCall bounds one count update by the plain budget, whatever is left
// of the caller's: the record is written, its count should follow.
func (r *Redis) countCall(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
}

// countAdded puts a new record in its backend's set.
func (r *Redis) countAdded(ctx context.Context, backend, sid string, exp time.Time) {
	if !r.countsApart {
		return
	}
	r.countMoved(ctx, "", backend, sid, exp)
}

// countMoved moves a record from backend from (none if "") to backend to.
func (r *Redis) countMoved(ctx context.Context, from, to, sid string, exp time.Time) {
	if !r.countsApart {
		return
	}
	var err error
	defer r.observe("counts", time.Now(), &err)
	ctx, cancel := r.countCall(ctx)
	defer cancel()
	pipe := r.client.Pipeline()
	if from != "" && from != to {
		pipe.ZRem(ctx, r.backendPrefix()+from, sid)
	}
	pipe.ZAdd(ctx, r.backendPrefix()+to, redis.Z{Score: float64(exp.UnixMilli()), Member: sid})
	_, err = pipe.Exec(ctx)
	err = unavailable(err)
}

// countRemoved takes a deleted record out of its backend's set.
func (r *Redis) countRemoved(ctx context.Context, backend, sid string) {
	if !r.countsApart || backend == "" {
		return
	}
	var err error
	defer r.observe("counts", time.Now(), &err)
	ctx, cancel := r.countCall(ctx)
	defer cancel()
	err = unavailable(r.client.ZRem(ctx, r.backendPrefix()+backend, sid).Err())
}

// countRestored puts written-back records in their backends' sets.
func (r *Redis) countRestored(ctx context.Context, recs []*Record) {
	if !r.countsApart || len(recs) == 0 {
		return
	}
	var err error
	defer r.observe("counts", time.Now(), &err)
	ctx, cancel := r.countCall(ctx)
	defer cancel()
	pipe := r.client.Pipeline()
	for _, rec := range recs {
		exp := r.expiry(rec.Created, rec.LastUsed)
		pipe.ZAdd(ctx, r.backendPrefix()+rec.BackendID, redis.Z{Score: float64(exp.UnixMilli()), Member: rec.ClientSID})
	}
	_, err = pipe.Exec(ctx)
	err = unavailable(err)
}

// touchedApart reads the counts-apart touch script's reply ({1, backend,
// expiry}, or 0 when absent) and moves the member's score.
func (r *Redis) touchedApart(ctx context.Context, sid string, cmd *redis.Cmd) error {
	if n, err := cmd.Int64(); err == nil {
		if n == 0 {
			return ErrNotFound
		}
		return badReply("touch script returned %d", n)
	}
	res, err := cmd.Slice()
	if err != nil || len(res) != 3 {
		return badReply("touch script: %v (%d elements)", err, len(res))
	}
	backend, ok1 := res[1].(string)
	exp, ok2 := res[2].(int64)
	if code, _ := res[0].(int64); code != 1 || !ok1 || !ok2 || backend == "" || exp < 0 || exp > maxMillis {
		return badReply("touch script returned %v", res)
	}
	r.countMoved(ctx, "", backend, sid, time.UnixMilli(exp))
	return nil
}

// countRepairInterval is how often a process repairs the counts (counts
// apart): the bound of a drift's life, besides the session's next touch.
const countRepairInterval = 10 * time.Second

// countRepairBatch is how many members one round trip of the pass checks.
const countRepairBatch = 256

// countRepairTimeout bounds a whole pass.
const countRepairTimeout = 10 * time.Second

// countRepair runs at most one repair pass at a time.
type countRepair struct {
	mu      sync.Mutex
	last    time.Time
	active  bool
	running sync.WaitGroup
}

func (c *countRepair) wait() { c.running.Wait() }

// maybeRepair starts a repair pass of backendIDs' sets in the background if
// none ran in the last countRepairInterval.
func (r *Redis) maybeRepair(backendIDs []string) {
	if !r.countsApart {
		return
	}
	c := &r.repair
	c.mu.Lock()
	if c.active || (!c.last.IsZero() && time.Since(c.last) < countRepairInterval) {
		c.mu.Unlock()
		return
	}
	c.active, c.last = true, time.Now()
	c.running.Add(1)
	c.mu.Unlock()
	ids := slices.Clone(backendIDs)
	go func() {
		defer c.running.Done()
		ctx, cancel := context.WithTimeout(context.Background(), countRepairTimeout)
		defer cancel()
		r.repairCounts(ctx, ids)
		c.mu.Lock()
		c.active = false
		c.mu.Unlock()
	}()
}

// repairCounts checks every member of the backends' sets against its
// record: it removes members whose record is absent, deleted, expired or
// on another backend, and moves a member's score to its record's expiry.
// It returns how many members it removed and moved.
func (r *Redis) repairCounts(ctx context.Context, backendIDs []string) (removed, moved int, err error) {
	defer r.observe("count_repair", time.Now(), &err)
	for _, id := range backendIDs {
		key := r.backendPrefix() + id
		var cursor uint64
		for {
			cctx, cancel := r.call(ctx, r.timeout)
			flat, next, err := r.client.ZScan(cctx, key, cursor, "", countRepairBatch).Result()
			cancel()
			if err != nil {
				return removed, moved, unavailable(err)
			}
			rm, mv, _, err := r.repairBatch(ctx, id, key, flat)
			removed, moved = removed+rm, moved+mv
			if err != nil {
				return removed, moved, err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return removed, moved, nil
}

// repairBatch is repairCounts for the members (member, score pairs, as
// ZSCAN returns them) of one backend's set. live are the members whose
// record is live on the backend.
func (r *Redis) repairBatch(ctx context.Context, id, key string, flat []string) (removed, moved int, live []string, err error) {
	if len(flat) < 2 {
		return 0, 0, nil, nil
	}
	ctx, cancel := r.call(ctx, r.timeout)
	defer cancel()
	pipe := r.client.Pipeline()
	reads := make([]*redis.SliceCmd, 0, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		reads = append(reads, pipe.HMGet(ctx, r.sessionKey(flat[i]), "b", "e", "d"))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, nil, unavailable(err)
	}
	now := r.now().UnixMilli()
	fix := r.client.Pipeline()
	for i, read := range reads {
		sid, score := flat[2*i], flat[2*i+1]
		f := read.Val()
		if len(f) != 3 {
			return 0, 0, nil, badReply("HMGET of 3 fields answered %d", len(f))
		}
		b, _ := f[0].(string)
		es, _ := f[1].(string)
		deleted, _ := f[2].(string)
		e, perr := strconv.ParseInt(es, 10, 64)
		switch {
		case b != id || deleted != "" || perr != nil || e <= now:
			fix.ZRem(ctx, key, sid)
			removed++
		case score != strconv.FormatInt(e, 10):
			fix.ZAdd(ctx, key, redis.Z{Score: float64(e), Member: sid})
			moved++
			live = append(live, sid)
		default:
			live = append(live, sid)
		}
	}
	if removed+moved == 0 {
		return 0, 0, live, nil
	}
	if _, err := fix.Exec(ctx); err != nil {
		return 0, 0, nil, unavailable(err)
	}
	return removed, moved, live, nil
}

// sessionsOnMaxRounds bounds the round trips of one listing in a cluster
// (each reads about countRepairBatch members): a set that large is
// listed over several calls.
const sessionsOnMaxRounds = 1024

// sessionsOnApart is SessionsOn in a cluster (counts apart), where the set
// is not exact: it scans the set (ZSCAN, in no particular order) and
// checks each member against its record, as the repair pass does, with
// the same effect (a member whose record is gone, expired or on another
// backend is removed, a lagging score is moved), and lists the members
// whose record is live on the backend. So a listing neither names a
// session that has moved (as of the check: callers re-read anyway) nor
// misses one whose count update was lost, and stale members cannot fill
// listing after listing. Each round trip is within the plain budget.
func (r *Redis) sessionsOnApart(ctx context.Context, id, key string, limit int) ([]string, error) {
	var out []string
	seen := map[string]bool{} // ZSCAN may return a member twice
	var cursor uint64
	for range sessionsOnMaxRounds {
		cctx, cancel := r.call(ctx, r.timeout)
		flat, next, err := r.client.ZScan(cctx, key, cursor, "", countRepairBatch).Result()
		cancel()
		if err != nil {
			return nil, unavailable(err)
		}
		_, _, live, err := r.repairBatch(ctx, id, key, flat)
		if err != nil {
			return nil, err
		}
		for _, sid := range live {
			if sid == "" || seen[sid] {
				continue
			}
			seen[sid] = true
			if out = append(out, sid); len(out) == limit {
				return out, nil
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	return out, nil
}
