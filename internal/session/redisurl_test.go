package session_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/session"
)

// The Sentinel and Cluster forms split their host lists (url.Parse takes
// them for one host), default their ports, and read the master name and
// database from the path.
func TestParseRedisURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		topology session.RedisTopology
		addrs    []string
		master   string
		db       int
		user     string
		pass     string
		tls      bool
	}{
		{"redis://127.0.0.1:6390/3", session.RedisSingle, []string{"127.0.0.1:6390"}, "", 3, "", "", false},
		{"redis+sentinel://u:p@10.0.0.1:26390,10.0.0.2,[::1]:26391/mymaster/2", session.RedisSentinel,
			[]string{"10.0.0.1:26390", "10.0.0.2:26379", "[::1]:26391"}, "mymaster", 2, "u", "p", false},
		{"rediss+sentinel://s1/m", session.RedisSentinel, []string{"s1:26379"}, "m", 0, "", "", true},
		{"redis+cluster://:p@n1:7000,n2,[::1]", session.RedisCluster, []string{"n1:7000", "n2:6379", "[::1]:6379"}, "", 0, "", "p", false},
		{"rediss+cluster://n1:7000/", session.RedisCluster, []string{"n1:7000"}, "", 0, "", "", true},
	} {
		target, err := session.ParseRedisURL(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		var addrs []string
		var master, user, pass string
		var db int
		switch target.Topology {
		case session.RedisSingle:
			o := target.Single
			addrs, db, user, pass = []string{o.Addr}, o.DB, o.Username, o.Password
		case session.RedisSentinel:
			o := target.Sentinel
			addrs, master, db, user, pass = o.SentinelAddrs, o.MasterName, o.DB, o.Username, o.Password
		case session.RedisCluster:
			o := target.Cluster
			addrs, user, pass = o.Addrs, o.Username, o.Password
		}
		got := []any{target.Topology, addrs, master, db, user, pass, target.HasTLS()}
		want := []any{tc.topology, tc.addrs, tc.master, tc.db, tc.user, tc.pass, tc.tls}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.url, diff)
		}
	}

	for _, bad := range []string{
		"redis+sentinel://h1:26379,h2:26379",
		"redis+sentinel://h1:26379/m/-1",
		"redis+sentinel://h1:26379/m/0/x",
		"redis+sentinel://h1:26379,,h2/m",
		"redis+sentinel://h1:65536/m",
		"redis+sentinel:///m",
		"redis+sentinel://h1/m?db=1",
		"redis+sentinel://h1/m#x",
		"redis+sentinel://h1:/m",
		"redis+cluster://h1:7000/0",
		"redis+cluster://h1:7000,h2:x",
		"redis+cluster://",
		"redis+cluster://h1,",
		"redis+cluster://::1",
		"http://h1",
	} {
		if target, err := session.ParseRedisURL(bad); err == nil {
			t.Errorf("%s: parsed as %+v, want an error", bad, target)
		}
	}
}
