package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/tether-mcp/tether/internal/session"
)

// redisOptions parses --redis-url and applies the password from the
// environment (never needed on the command line) and --redis-ca.
func redisOptions(cfg config, log *slog.Logger) (*session.RedisTarget, error) {
	target, err := session.ParseRedisURL(cfg.RedisURL)
	if err != nil {
		return nil, urlError("--redis-url", cfg.RedisURL, err)
	}
	if target.Password() == "" && cfg.RedisPassword != "" {
		target.SetPassword(cfg.RedisPassword)
	}
	if cfg.RedisCA != "" {
		if !target.HasTLS() {
			return nil, errors.New("--redis-ca needs a rediss:// URL (or rediss+sentinel://, rediss+cluster://)")
		}
		pem, err := os.ReadFile(cfg.RedisCA)
		if err != nil {
			return nil, fmt.Errorf("--redis-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-ca %s: no PEM certificate in the file", cfg.RedisCA)
		}
		target.TLS().RootCAs = pool
	}
	if target.HasTLS() {
		target.TLS().MinVersion = tls.VersionTLS12
	}
	if target.Password() != "" && !target.HasTLS() && !target.IsUnixSocket() {
		log.Warn("the Redis password travels over plain TCP; use rediss:// to encrypt it", "addr", target.Addr())
	}
	return target, nil
}
