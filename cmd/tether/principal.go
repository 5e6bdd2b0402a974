package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/tether-mcp/tether/internal/server"
)

// minPrincipalKey is the shortest accepted key of the principal digests.
const minPrincipalKey = server.MinPrincipalKey

// principalKey returns the configured key of the session principal
// digests (proxy.Config.PrincipalKey), which every replica sharing a
// session store must share: TETHER_PRINCIPAL_KEY, else
// --principal-key-file, else nil (without Redis a random key of this
// process, the memory store being this process's alone; with Redis a key
// kept in Redis, see server.Config.PrincipalKey).
func principalKey(cfg config) ([]byte, error) {
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
	}
	return nil, nil
}
