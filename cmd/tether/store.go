package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/redis/go-redis/v9"
)

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
