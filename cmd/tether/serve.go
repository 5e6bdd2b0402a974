package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// newLogger builds the process logger from validated settings.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	log, err := telemetry.NewLogger(w, format, level)
	if err != nil { // validated with the config; keep a usable logger anyway
		return slog.New(slog.NewTextHandler(w, nil))
	}
	return log
}

// newServer builds the tether the flags describe (see server.New).
func newServer(cfg config, log *slog.Logger) (*server.Server, error) {
	sc, err := serverConfig(cfg, log)
	if err != nil {
		return nil, err
	}
	return listen(sc)
}

// serverConfig turns the flags into the server's configuration: the
// discovery source, the Redis options and the principal key are read here,
// and errors name the flags they come from.
func serverConfig(cfg config, log *slog.Logger) (server.Config, error) {
	if cfg.cacheSizeAlias != 0 {
		log.Warn("--session-cache-size is deprecated: use --max-sessions", "max_sessions", cfg.MaxSessions)
	}
	source, err := newSource(cfg, log)
	if err != nil {
		return server.Config{}, err
	}
	sc := server.Config{
		Listen:      cfg.Listen,
		AdminListen: cfg.AdminListen,
		Source:      source,
		Balancer:    cfg.Balancer,
		Logger:      log,
		Version:     version,

		RedisPrefix:         cfg.RedisPrefix,
		RedisTimeout:        cfg.RedisTimeout,
		SessionTTL:          cfg.SessionTTL,
		SessionMaxAge:       cfg.SessionMaxAge,
		MaxSessions:         cfg.MaxSessions,
		MaxSessionInitBytes: cfg.MaxSessionInitBytes,

		MaxBody:              cfg.MaxBody,
		MaxInitBody:          cfg.MaxInitBody,
		PrincipalHeaders:     cfg.PrincipalHeaders,
		MaxInflightBodyBytes: cfg.MaxInflightBodyBytes,
		BodyTimeout:          cfg.BodyTimeout,
		MaxStreams:           cfg.MaxStreams,

		HTTP2MaxConcurrentStreams: cfg.HTTP2MaxConcurrentStreams,
		ClientSendTimeout:         cfg.ClientSendTimeout,
		AffinityHeader:            cfg.AffinityHeader,
		AffinityEpsilon:           cfg.AffinityEpsilon,
		AffinityArgument:          cfg.AffinityArgument,
		ListenStreamWeight:        cfg.ListenStreamWeight,
		Drain:                     drainMode(cfg.Drain),
		DrainRate:                 cfg.DrainRate,
		BackendH2C:                cfg.BackendH2C,
		ShutdownGrace:             cfg.ShutdownGrace,
		Getenv:                    cfg.getenv,
	}
	if cfg.TraceStdout {
		sc.TraceStdout = os.Stdout
	}
	if cfg.RedisURL != "" {
		if sc.Redis, err = redisOptions(cfg, log); err != nil {
			return server.Config{}, err
		}
	}
	if sc.PrincipalKey, err = principalKey(cfg); err != nil {
		return server.Config{}, err
	}
	if cfg.PodDeletionCost {
		if sc.PodDeletionCost, err = podCostOptions(cfg); err != nil {
			return server.Config{}, err
		}
	}
	return sc, nil
}

// listen is server.New, with a listener's error naming its flag.
func listen(sc server.Config) (*server.Server, error) {
	s, err := server.New(sc)
	var listenErr *server.ListenError
	if errors.As(err, &listenErr) {
		flag := "--listen"
		if listenErr.Admin {
			flag = "--admin-listen"
		}
		return nil, fmt.Errorf("%s: %w", flag, listenErr.Err)
	}
	return s, err
}

// drainMode is --drain, checked by validate.
func drainMode(s string) proxy.DrainMode {
	m, _ := proxy.ParseDrainMode(s)
	return m
}
