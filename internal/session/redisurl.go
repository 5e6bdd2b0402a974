package session

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisTopology is how the Redis behind the store is deployed.
type RedisTopology string

const (
	// RedisSingle is one server (redis://, rediss://, unix://).
	RedisSingle RedisTopology = "single"
	// RedisSentinel is a primary with replicas, found through Sentinel
	// (redis+sentinel://, rediss+sentinel://).
	RedisSentinel RedisTopology = "sentinel"
	// RedisCluster is a Redis Cluster (redis+cluster://, rediss+cluster://).
	RedisCluster RedisTopology = "cluster"
)

// RedisTarget is where the store's Redis is and how to reach it: a parsed
// Redis URL. Exactly one of Single, Sentinel and Cluster is set, the one
// Topology names. Callers may set credentials and TLS roots on it before
// building clients (see RedisTarget.Password, RedisTarget.TLS).
type RedisTarget struct {
	Topology RedisTopology
	Single   *redis.Options
	Sentinel *redis.FailoverOptions
	Cluster  *redis.ClusterOptions
}

// Defaults of the Sentinel and Cluster URL forms.
const (
	defaultSentinelPort = "26379"
	defaultRedisPort    = "6379"
)

// ParseRedisURL parses a store URL:
//
//	redis://[user:pass@]host[:port][/db]          one server (go-redis's form,
//	rediss://...                                  query options included)
//	redis+sentinel://[user:pass@]h1[:26379],h2[:26379],.../master[/db]
//	rediss+sentinel://...                         the same over TLS
//	redis+cluster://[user:pass@]h1[:6379],h2[:6379],...
//	rediss+cluster://...                          the same over TLS
//
// With Sentinel, the hosts are the sentinels and user:pass the primary's
// and replicas' credentials (sentinels without a password); with Cluster,
// the hosts are seed nodes (any subset of the cluster) and there is no
// database number. TLS (rediss+) covers every connection: sentinels,
// primary, replicas and cluster nodes, each verified against the host it
// is dialled at. The Sentinel and Cluster forms' errors never quote the
// URL (it may hold a password); go-redis's for redis:// do (see
// cmd/tether's urlError).
func ParseRedisURL(raw string) (*RedisTarget, error) {
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		scheme = ""
	}
	switch scheme {
	case "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster":
	default:
		opt, err := redis.ParseURL(raw)
		if err != nil {
			return nil, err
		}
		return &RedisTarget{Topology: RedisSingle, Single: opt}, nil
	}
	// url.Parse refuses or misreads a host list ("h1:1,[::1]:2"): parse
	// the URL with one placeholder host, and split the list by hand.
	rest := raw[len(scheme)+len("://"):]
	hostStart := strings.LastIndex(rest, "@") + 1
	hostEnd := len(rest)
	if i := strings.IndexAny(rest[hostStart:], "/?#"); i >= 0 {
		hostEnd = hostStart + i
	}
	hosts := rest[hostStart:hostEnd]
	u, err := url.Parse(scheme + "://" + rest[:hostStart] + "placeholder" + rest[hostEnd:])
	if err != nil {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err // without the URL it quotes, password included
		}
		return nil, err
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%s:// takes no query or fragment", scheme)
	}
	user, pass := "", ""
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	var tlsConfig *tls.Config
	if strings.HasPrefix(scheme, "rediss") {
		// No ServerName: each node is verified against its own host.
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if strings.HasSuffix(scheme, "+sentinel") {
		addrs, err := hostList(hosts, defaultSentinelPort)
		if err != nil {
			return nil, err
		}
		master, db, err := sentinelPath(u.Path)
		if err != nil {
			return nil, err
		}
		return &RedisTarget{Topology: RedisSentinel, Sentinel: &redis.FailoverOptions{
			MasterName: master, SentinelAddrs: addrs, DB: db,
			Username: user, Password: pass, TLSConfig: tlsConfig,
		}}, nil
	}
	addrs, err := hostList(hosts, defaultRedisPort)
	if err != nil {
		return nil, err
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		return nil, fmt.Errorf("a Redis Cluster has no database number or path, got %q", u.Path)
	}
	return &RedisTarget{Topology: RedisCluster, Cluster: &redis.ClusterOptions{
		Addrs: addrs, Username: user, Password: pass, TLSConfig: tlsConfig,
	}}, nil
}

// hostList splits a comma-separated host[:port] list (url.Parse takes it
// for one host).
func hostList(hosts, defaultPort string) ([]string, error) {
	if hosts == "" {
		return nil, errors.New("no host")
	}
	var addrs []string
	for h := range strings.SplitSeq(hosts, ",") {
		if h == "" {
			return nil, errors.New("empty host in the host list")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port (or a bracketed IPv6 address without one).
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defaultPort
			if strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && !strings.HasPrefix(h, "[")) {
				return nil, fmt.Errorf("bad host %q", h)
			}
		}
		if host == "" {
			return nil, fmt.Errorf("bad host %q", h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("bad port %q", port)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, nil
}

// sentinelPath reads "/master[/db]".
func sentinelPath(path string) (master string, db int, err error) {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(parts) > 2 || parts[0] == "" {
		return "", 0, errors.New("want /MASTERNAME or /MASTERNAME/DB after the sentinels")
	}
	master = parts[0]
	if len(parts) == 2 {
		if db, err = strconv.Atoi(parts[1]); err != nil || db < 0 {
			return "", 0, fmt.Errorf("bad database number %q", parts[1])
		}
	}
	return master, db, nil
}

// Addr is what a log line shows of the target: the server, the sentinels
// and master name, or the seed nodes. It holds no secret.
func (t *RedisTarget) Addr() string {
	switch t.Topology {
	case RedisSentinel:
		return t.Sentinel.MasterName + "@" + strings.Join(t.Sentinel.SentinelAddrs, ",")
	case RedisCluster:
		return strings.Join(t.Cluster.Addrs, ",")
	}
	return t.Single.Addr
}

// HasTLS reports whether connections are encrypted.
func (t *RedisTarget) HasTLS() bool { return t.tlsConfig() != nil }

func (t *RedisTarget) tlsConfig() *tls.Config {
	switch t.Topology {
	case RedisSentinel:
		return t.Sentinel.TLSConfig
	case RedisCluster:
		return t.Cluster.TLSConfig
	}
	return t.Single.TLSConfig
}

// IsUnixSocket reports a single server reached over a Unix socket.
func (t *RedisTarget) IsUnixSocket() bool {
	return t.Topology == RedisSingle && t.Single.Network == "unix"
}

// Password returns the data nodes' password, "" if none.
func (t *RedisTarget) Password() string {
	switch t.Topology {
	case RedisSentinel:
		return t.Sentinel.Password
	case RedisCluster:
		return t.Cluster.Password
	}
	return t.Single.Password
}

// SetPassword sets the data nodes' password.
func (t *RedisTarget) SetPassword(p string) {
	switch t.Topology {
	case RedisSentinel:
		t.Sentinel.Password = p
	case RedisCluster:
		t.Cluster.Password = p
	default:
		t.Single.Password = p
	}
}

// TLS returns the TLS configuration connections use (nil: plain TCP), for
// the caller to set its roots.
func (t *RedisTarget) TLS() *tls.Config { return t.tlsConfig() }

// clone copies the target's options (not the TLS configuration, which is
// only read): each client tunes its own copy.
func (t *RedisTarget) clone() *RedisTarget {
	c := &RedisTarget{Topology: t.Topology}
	switch t.Topology {
	case RedisSentinel:
		o := *t.Sentinel
		o.SentinelAddrs = append([]string(nil), o.SentinelAddrs...)
		c.Sentinel = &o
	case RedisCluster:
		o := *t.Cluster
		o.Addrs = append([]string(nil), o.Addrs...)
		c.Cluster = &o
	default:
		o := *t.Single
		c.Single = &o
	}
	return c
}

// clusterStateReload is how often a cluster client re-reads the slot map
// although no MOVED told it to: a dead primary only refuses connections,
// and go-redis would otherwise keep sending its slots there for 60 s.
const clusterStateReload = time.Second

// NewRedisTargetClient is NewRedisClient for any topology: the same
// budgets, retries and reply guard, on a client for one server, a
// Sentinel-managed primary or a cluster. The target is not modified.
func NewRedisTargetClient(t *RedisTarget, budget time.Duration) redis.UniversalClient {
	if budget <= 0 {
		budget = 50 * time.Millisecond
	}
	t = t.clone()
	readTimeout := 4*budget + bytesTime(maxReplyBulk)
	switch t.Topology {
	case RedisSentinel:
		o := t.Sentinel
		o.ContextTimeoutEnabled = true
		o.MaxRetries = 1
		o.MinRetryBackoff, o.MaxRetryBackoff = 2*time.Millisecond, 10*time.Millisecond
		o.DialTimeout = 4 * budget
		o.ReadTimeout, o.WriteTimeout = readTimeout, readTimeout
		o.PoolTimeout = budget
		o.DialerRetries = 2
		o.DialerRetryTimeout = max(budget/5, time.Millisecond)
		o.DisableIdentity = true
		o.Dialer = guardDialer(sentinelDialer(o))
		return redis.NewFailoverClient(o)
	case RedisCluster:
		o := t.Cluster
		o.ContextTimeoutEnabled = true
		// MOVED and ASK redirections are not retries: go-redis follows
		// them up to MaxRedirects. MaxRetries bounds the rest.
		o.MaxRetries = 1
		o.MinRetryBackoff, o.MaxRetryBackoff = 2*time.Millisecond, 10*time.Millisecond
		o.DialTimeout = 4 * budget
		o.ReadTimeout, o.WriteTimeout = readTimeout, readTimeout
		o.PoolTimeout = budget
		o.DialerRetries = 2
		o.DialerRetryTimeout = max(budget/5, time.Millisecond)
		o.DisableIdentity = true
		o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		o.ClusterStateReloadInterval = clusterStateReload
		o.Dialer = guardDialer(clusterDialer(o))
		return redis.NewClusterClient(o)
	}
	return NewRedisClient(t.Single, budget)
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// sentinelDialer and clusterDialer are go-redis's default dialers for those
// options (TLS included), which guardDialer wraps.
func sentinelDialer(o *redis.FailoverOptions) dialFunc {
	if o.Dialer != nil {
		return o.Dialer
	}
	return redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})
}

func clusterDialer(o *redis.ClusterOptions) dialFunc {
	if o.Dialer != nil {
		return o.Dialer
	}
	return redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})
}
