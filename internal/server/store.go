package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// redisPingTimeout bounds the reachability check of Redis at start.
const redisPingTimeout = time.Second

// newStore builds the session store: the embedded memory store, or Redis
// (shared by every replica) behind a local cache. onChange hears of every
// session the store creates, moves, deletes or expires (see
// proxy.CountSessions).
//
// Both are bounded by MaxSessions and MaxSessionInitBytes: the memory
// store evicts the least recently used sessions (they are lost, and
// onChange is told), the cache its least recently used entries (they stay
// in Redis).
func newStore(cfg Config, log *slog.Logger, metrics *telemetry.Metrics, onChange func(session.Change)) (session.Store, error) {
	if cfg.Redis == nil {
		return session.NewMemory(session.MemoryOptions{
			TTL:          cfg.SessionTTL,
			MaxSessions:  cfg.MaxSessions,
			MaxInitBytes: cfg.MaxSessionInitBytes,
			OnChange:     onChange,
		}), nil
	}
	shared := session.NewRedis(session.RedisOptions{
		Client:  session.NewRedisTargetClient(cfg.Redis, cfg.RedisTimeout),
		Prefix:  cfg.RedisPrefix,
		TTL:     cfg.SessionTTL,
		MaxAge:  cfg.SessionMaxAge,
		Timeout: cfg.RedisTimeout,
		Observe: metrics.StoreOp,
		// Sentinel and Cluster: the primaries are followed for
		// tether_store_failovers_total and tether status.
		Sentinel:      cfg.Redis.Topology == session.RedisSentinel,
		WatchTopology: true,
	})
	// Redis being down at start is an outage like any other: tether starts
	// degraded rather than not at all.
	ctx, cancel := context.WithTimeout(context.Background(), redisPingTimeout)
	defer cancel()
	if err := shared.Ping(ctx); err != nil {
		log.Warn("Redis not reachable at start; starting degraded", "addr", cfg.Redis.Addr(), "err", err)
	}
	return session.NewCache(session.CacheOptions{
		Shared:       shared,
		Size:         cfg.MaxSessions,
		MaxInitBytes: cfg.MaxSessionInitBytes,
		TTL:          cfg.SessionTTL,
		Logger:       log,
		OnDegraded:   metrics.StoreDegraded,
		OnChange:     onChange,
	}), nil
}

// StoreStats is what the metrics scrape reports of a session store.
func StoreStats(store session.Store) telemetry.StoreStat {
	switch s := store.(type) {
	case *session.Memory:
		st := s.Stats()
		return telemetry.StoreStat{
			Sessions: st.Sessions, InitBytes: st.InitBytes,
			EvictedMaxSessions: st.EvictedMaxSessions, EvictedMaxInitBytes: st.EvictedMaxInitBytes,
			TaskRecords: st.Tasks, EvictedMaxTasks: st.EvictedMaxTasks,
		}
	case *session.Cache:
		st := s.Stats()
		top := s.Topology()
		return telemetry.StoreStat{
			Topology: string(top.Topology), Primaries: top.Primaries, Failovers: top.Failovers,
			CacheHits: st.Hits, CacheMisses: st.Misses, Pending: st.Pending, Unwritten: st.Unwritten,
			Sessions: st.Entries, InitBytes: st.InitBytes,
			EvictedMaxSessions: st.EvictedMaxSessions, EvictedMaxInitBytes: st.EvictedMaxInitBytes,
			SlowReplies: st.SlowReplies, Recoveries: st.Recoveries, WrittenBack: st.WrittenBack,
			Collisions: st.Collisions, UnflushedAtClose: st.UnflushedAtClose,
		}
	}
	return telemetry.StoreStat{}
}

// MinPrincipalKey is the shortest accepted key of the principal digests:
// HMAC-SHA256 wants a key as long as its output.
const MinPrincipalKey = 32

// principalKeyFromRedis is the principal key when none is configured and
// the sessions live in Redis: a key kept in Redis itself, created once by
// whichever replica comes first (SET NX). That default needs no setup but
// keeps the key beside the digests: whoever can read Redis can test guessed
// credentials against them offline (harmless for OAuth tokens, not for
// short passwords or API keys), so it is announced with a warning. If Redis
// cannot be reached at start, it returns nil (a random key of this
// process), with a warning: re-initializations across replicas are then
// refused (the client starts a new session), never granted to the wrong
// principal.
func principalKeyFromRedis(cfg Config, log *slog.Logger) []byte {
	key, err := sharedPrincipalKey(cfg)
	if err != nil {
		log.Warn("principal key: Redis not reachable at start; using a key of this process alone, so sessions "+
			"created here re-initialize only here, and others' not at all (set --principal-key-file)", "err", err)
		return nil
	}
	log.Warn("principal key kept in Redis beside the session records; set --principal-key-file (or TETHER_PRINCIPAL_KEY) " +
		"so that a reader of Redis cannot test guessed credentials against the stored digests")
	return key
}

// sharedPrincipalKey reads the fleet's principal key from Redis, creating
// it first if no replica has.
func sharedPrincipalKey(cfg Config) ([]byte, error) {
	client := session.NewRedisTargetClient(cfg.Redis, max(cfg.RedisTimeout, 250*time.Millisecond))
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	name := cfg.RedisPrefix + "principal-key"
	fresh := make([]byte, MinPrincipalKey)
	rand.Read(fresh)
	if err := client.SetNX(ctx, name, hex.EncodeToString(fresh), 0).Err(); err != nil {
		return nil, err
	}
	key, err := client.Get(ctx, name).Bytes()
	if err != nil {
		return nil, err
	}
	if len(key) < MinPrincipalKey {
		return nil, fmt.Errorf("Redis key %s holds %d bytes, want at least %d", name, len(key), MinPrincipalKey)
	}
	return key, nil
}
