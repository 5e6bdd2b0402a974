package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tether-mcp/tether/internal/session"
)

// minPrincipalKey is the shortest accepted key of the principal digests:
// HMAC-SHA256 wants a key as long as its output.
const minPrincipalKey = 32

// principalKey returns the key of the session principal digests
// (proxy.Config.PrincipalKey), which every replica sharing a session store
// must share, or nil for a random key of this process.
//
// In order: TETHER_PRINCIPAL_KEY; --principal-key-file; without Redis, nil
// (the memory store is this process's alone); with Redis, a key kept in
// Redis itself, created once by whichever replica comes first (SET NX).
// That last default needs no setup but keeps the key beside the digests:
// whoever can read Redis can test guessed credentials against them offline
// (harmless for OAuth tokens, not for short passwords or API keys), so it
// is announced with a warning. If Redis cannot be reached at start, the
// process falls back to a random key, with a warning: re-initializations
// across replicas are then refused (the client starts a new session), never
// granted to the wrong principal.
func principalKey(cfg config, log *slog.Logger) ([]byte, error) {
	switch {
	case cfg.PrincipalKey != "":
		return []byte(cfg.PrincipalKey), nil
	case cfg.PrincipalKeyFile != "":
		key, err := os.ReadFile(cfg.PrincipalKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--principal-key-file: %v", err)
		}
		key = bytes.TrimRight(key, "\r\n")
		if len(key) < minPrincipalKey {
			return nil, fmt.Errorf("--principal-key-file %s: the key must be at least %d bytes, got %d", cfg.PrincipalKeyFile, minPrincipalKey, len(key))
		}
		return key, nil
	case cfg.RedisURL == "":
		return nil, nil
	}
	key, err := sharedPrincipalKey(cfg, log)
	if err != nil {
		log.Warn("principal key: Redis not reachable at start; using a key of this process alone, so sessions "+
			"created here re-initialize only here, and others' not at all (set --principal-key-file)", "err", err)
		return nil, nil
	}
	log.Warn("principal key kept in Redis beside the session records; set --principal-key-file (or TETHER_PRINCIPAL_KEY) " +
		"so that a reader of Redis cannot test guessed credentials against the stored digests")
	return key, nil
}

// sharedPrincipalKey reads the fleet's principal key from Redis, creating
// it first if no replica has.
func sharedPrincipalKey(cfg config, log *slog.Logger) ([]byte, error) {
	opt, err := redisOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	client := session.NewRedisClient(opt, max(cfg.RedisTimeout, 250*time.Millisecond))
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	name := cfg.RedisPrefix + "principal-key"
	fresh := make([]byte, minPrincipalKey)
	rand.Read(fresh)
	if err := client.SetNX(ctx, name, hex.EncodeToString(fresh), 0).Err(); err != nil {
		return nil, err
	}
	key, err := client.Get(ctx, name).Bytes()
	if err != nil {
		return nil, err
	}
	if len(key) < minPrincipalKey {
		return nil, fmt.Errorf("Redis key %s holds %d bytes, want at least %d", name, len(key), minPrincipalKey)
	}
	return key, nil
}
