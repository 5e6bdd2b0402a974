package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// newStore builds the session store: the embedded memory store, or Redis
// (shared by every replica) behind a local cache. onExpire is the memory
// store's expiry callback; with Redis, fleet-wide counts replace it.
//
// Both are bounded by --max-sessions and --max-session-init-bytes: the
// memory store evicts the least recently used sessions (they are lost, and
// onExpire is told), the cache its least recently used entries (they stay
// in Redis).
func newStore(cfg config, log *slog.Logger, metrics *telemetry.Metrics, onExpire func(*session.Record)) (session.Store, error) {
	if cfg.cacheSizeAlias != 0 {
		log.Warn("--session-cache-size is deprecated: use --max-sessions", "max_sessions", cfg.MaxSessions)
	}
	if cfg.RedisURL == "" {
		return session.NewMemory(session.MemoryOptions{
			TTL:          cfg.SessionTTL,
			MaxSessions:  cfg.MaxSessions,
			MaxInitBytes: cfg.MaxSessionInitBytes,
			OnExpire:     onExpire,
		}), nil
	}
	opt, err := redisOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	shared := session.NewRedis(session.RedisOptions{
		Client:  session.NewRedisClient(opt, cfg.RedisTimeout),
		Prefix:  cfg.RedisPrefix,
		TTL:     cfg.SessionTTL,
		MaxAge:  cfg.SessionMaxAge,
		Timeout: cfg.RedisTimeout,
		Observe: metrics.StoreOp,
	})
	// Redis being down at start is an outage like any other: tether starts
	// degraded rather than not at all.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := shared.Ping(ctx); err != nil {
		log.Warn("Redis not reachable at start; starting degraded", "addr", opt.Addr, "err", err)
	}
	return session.NewCache(session.CacheOptions{
		Shared:       shared,
		Size:         cfg.MaxSessions,
		MaxInitBytes: cfg.MaxSessionInitBytes,
		TTL:          cfg.SessionTTL,
		Logger:       log,
		OnDegraded:   metrics.StoreDegraded,
	}), nil
}

// storeStat is what the metrics scrape reports of the session store.
func storeStat(store session.Store) telemetry.StoreStat {
	switch s := store.(type) {
	case *session.Memory:
		st := s.Stats()
		return telemetry.StoreStat{
			Sessions: st.Sessions, InitBytes: st.InitBytes,
			EvictedMaxSessions: st.EvictedMaxSessions, EvictedMaxInitBytes: st.EvictedMaxInitBytes,
		}
	case *session.Cache:
		st := s.Stats()
		return telemetry.StoreStat{
			CacheHits: st.Hits, CacheMisses: st.Misses, Pending: st.Pending, Unwritten: st.Unwritten,
			Sessions: st.Entries, InitBytes: st.InitBytes,
			EvictedMaxSessions: st.EvictedMaxSessions, EvictedMaxInitBytes: st.EvictedMaxInitBytes,
			SlowReplies: st.SlowReplies, Recoveries: st.Recoveries, WrittenBack: st.WrittenBack,
			Collisions: st.Collisions, UnflushedAtClose: st.UnflushedAtClose,
		}
	}
	return telemetry.StoreStat{}
}

// redisOptions parses --redis-url and applies the password from the
// environment (never needed on the command line) and --redis-ca.
func redisOptions(cfg config, log *slog.Logger) (*redis.Options, error) {
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, urlError("--redis-url", cfg.RedisURL, err)
	}
	if opt.Password == "" && cfg.RedisPassword != "" {
		opt.Password = cfg.RedisPassword
	}
	if cfg.RedisCA != "" {
		if opt.TLSConfig == nil {
			return nil, errors.New("--redis-ca needs a rediss:// URL")
		}
		pem, err := os.ReadFile(cfg.RedisCA)
		if err != nil {
			return nil, fmt.Errorf("--redis-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-ca %s: no PEM certificate in the file", cfg.RedisCA)
		}
		opt.TLSConfig.RootCAs = pool
	}
	if opt.TLSConfig != nil {
		opt.TLSConfig.MinVersion = tls.VersionTLS12
	}
	if opt.Password != "" && opt.TLSConfig == nil && opt.Network != "unix" {
		log.Warn("the Redis password travels over plain TCP; use rediss:// to encrypt it", "addr", opt.Addr)
	}
	return opt, nil
}
