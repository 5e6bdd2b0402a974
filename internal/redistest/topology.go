package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/testkit"
)

// Failure detection of the Sentinel and Cluster test deployments: 1 s, so
// that a failover takes a few seconds (2-3 s measured with Redis 7.0).
const (
	downAfter = time.Second
	// setupTimeout bounds the wait for a deployment to be ready: sentinels
	// discover each other through the primary's hello channel every 2 s.
	setupTimeout = 30 * time.Second
)

// SentinelMaster is the master name of StartSentinel's deployment.
const SentinelMaster = "tether"

// Sentinel is a primary, one replica and three sentinels (quorum 2), all
// owned by a test. Primary and Replica are the servers as started: after
// a failover, ask CurrentPrimary.
type Sentinel struct {
	tb        testing.TB
	Primary   *Server
	Replica   *Server
	Sentinels []*Server
}

// StartSentinel starts the deployment and waits until the replica is in
// sync and every sentinel knows the replica and the two other sentinels,
// so that a test may kill the primary at once. The sentinels run as
// `redis-server CONFIG --sentinel` (no redis-sentinel binary needed).
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	d := &Sentinel{tb: tb}
	d.Primary = Start(tb)
	d.Replica = Start(tb, "--replicaof", "127.0.0.1", strconv.Itoa(d.Primary.Port))
	for range 3 {
		d.Sentinels = append(d.Sentinels, startWith(tb, func() int { return testkit.FreePort(tb) }, func(port int, dir string) []string {
			conf := filepath.Join(dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nloglevel warning\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %[3]s %[5]d\n"+
				"sentinel failover-timeout %[3]s 10000\n",
				port, dir, SentinelMaster, d.Primary.Port, downAfter.Milliseconds())
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				tb.Fatal(err)
			}
			return []string{conf, "--sentinel"}
		}))
	}
	testkit.EventuallyNoError(tb, setupTimeout, func() error { return replicaInSync(d.Replica.Addr()) }, "the replica in sync")
	testkit.EventuallyNoError(tb, setupTimeout, d.sentinelsReady, "sentinels knowing each other and the replica")
	return d
}

// sentinelsReady checks that every sentinel sees the two others and one
// replica: only then can they agree on a failover.
func (d *Sentinel) sentinelsReady() error {
	for _, s := range d.Sentinels {
		err := withClient(s.Addr(), func(ctx context.Context, c *redis.Client) error {
			peers, err := c.Do(ctx, "SENTINEL", "SENTINELS", SentinelMaster).Slice()
			if err != nil {
				return err
			}
			replicas, err := c.Do(ctx, "SENTINEL", "REPLICAS", SentinelMaster).Slice()
			if err != nil {
				return err
			}
			if len(peers) != len(d.Sentinels)-1 || len(replicas) != 1 {
				return fmt.Errorf("sentinel %s sees %d sentinels, %d replicas", s.Addr(), len(peers), len(replicas))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// URL is the store URL of the deployment: redis+sentinel://s1,s2,s3/tether.
func (d *Sentinel) URL() string {
	addrs := make([]string, len(d.Sentinels))
	for i, s := range d.Sentinels {
		addrs[i] = s.Addr()
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + SentinelMaster
}

// CurrentPrimary is the server the first answering sentinel names as
// primary.
func (d *Sentinel) CurrentPrimary() *Server {
	d.tb.Helper()
	addr, err := d.primaryAddr()
	if err != nil {
		d.tb.Fatal(err)
	}
	for _, s := range []*Server{d.Primary, d.Replica} {
		if s.Addr() == addr {
			return s
		}
	}
	d.tb.Fatalf("sentinels name %s, not a server of the test", addr)
	return nil
}

// PrimaryAddr is the primary's address as the first answering sentinel
// names it.
func (d *Sentinel) PrimaryAddr() (string, error) { return d.primaryAddr() }

func (d *Sentinel) primaryAddr() (string, error) {
	var last error
	for _, s := range d.Sentinels {
		var addr []string
		last = withClient(s.Addr(), func(ctx context.Context, c *redis.Client) (err error) {
			addr, err = c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
			return err
		})
		if last == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1]), nil
		}
	}
	return "", fmt.Errorf("no sentinel names a primary: %v", last)
}

// WaitFailover waits until every sentinel names a primary other than old,
// and returns it.
func (d *Sentinel) WaitFailover(old *Server) *Server {
	d.tb.Helper()
	testkit.EventuallyNoError(d.tb, setupTimeout, func() error {
		for _, s := range d.Sentinels {
			if s.cmd == nil {
				continue
			}
			var addr []string
			err := withClient(s.Addr(), func(ctx context.Context, c *redis.Client) (err error) {
				addr, err = c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
				return err
			})
			if err != nil {
				return err
			}
			if len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == old.Addr() {
				return fmt.Errorf("sentinel %s still names %s", s.Addr(), old.Addr())
			}
		}
		return nil
	}, "a failover away from %s", old.Addr())
	return d.CurrentPrimary()
}

// Cluster is a Redis Cluster of three primaries with one replica each,
// owned by a test.
type Cluster struct {
	tb    testing.TB
	Nodes []*Server
}

// StartCluster starts six cluster nodes on random loopback ports (each
// also needs its port + 10000 for the cluster bus), joins them with
// `redis-cli --cluster create`, and waits until every node reports the
// cluster ok with all six nodes and every replica in sync. Slots stay
// served when another primary is down (cluster-require-full-coverage no).
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	cli := RequireCLI(tb)
	c := &Cluster{tb: tb}
	for range 6 {
		c.Nodes = append(c.Nodes, startWith(tb, func() int { return clusterPort(tb) }, func(port int, dir string) []string {
			return append(serverArgs(port, dir), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", strconv.FormatInt(downAfter.Milliseconds(), 10),
				"--cluster-require-full-coverage", "no")
		}))
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	testkit.EventuallyNoError(tb, setupTimeout, c.ready, "the cluster ready")
	return c
}

// RequireToolsEnv is the environment variable that turns a missing
// redis-cli from a skip into a failure; make test (and so CI) sets it.
const RequireToolsEnv = "TETHER_REQUIRE_REDIS_TOOLS"

// RequireCLI returns the path of redis-cli, which creates and reshards a
// cluster. When it is missing it skips tb, or fails it when
// $TETHER_REQUIRE_REDIS_TOOLS is set, so that CI never passes by skipping.
func RequireCLI(tb testing.TB) string {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err == nil {
		return cli
	}
	if os.Getenv(RequireToolsEnv) != "" {
		tb.Fatalf("redis-cli not found on PATH (apt-get install redis-tools), and %s is set", RequireToolsEnv)
	}
	tb.Skipf("redis-cli not found on PATH (apt-get install redis-tools; set %s=1 to fail instead)", RequireToolsEnv)
	return ""
}

// clusterPort is a free port whose cluster bus port (+10000) is free too.
func clusterPort(tb testing.TB) int {
	for range 100 {
		p := testkit.FreePort(tb)
		if p+10000 > 65535 {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		ln.Close()
		return p
	}
	tb.Fatal("no free port pair for a cluster node")
	return 0
}

// ready checks every running node: cluster state ok, all nodes known and
// connected, replicas in sync.
func (c *Cluster) ready() error {
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		err := withClient(n.Addr(), func(ctx context.Context, cl *redis.Client) error {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:6\r") {
				return fmt.Errorf("node %s: %s", n.Addr(), strings.Fields(info)[:3])
			}
			nodes, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			if strings.Contains(nodes, "disconnected") || strings.Contains(nodes, "fail") || strings.Contains(nodes, "handshake") {
				return fmt.Errorf("node %s sees:\n%s", n.Addr(), nodes)
			}
			role, err := cl.Do(ctx, "ROLE").Slice()
			if err != nil {
				return err
			}
			if len(role) > 0 && role[0] == "slave" {
				return replicaInSync(n.Addr())
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// WaitReady waits until the cluster is ready again (after a failover and a
// restart).
func (c *Cluster) WaitReady() {
	c.tb.Helper()
	testkit.EventuallyNoError(c.tb, setupTimeout, c.ready, "the cluster ready")
}

// URL is the store URL of the cluster, with every node as a seed.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// PrimaryFor is the node that serves key, as a running node tells.
func (c *Cluster) PrimaryFor(key string) *Server {
	c.tb.Helper()
	addr, err := c.PrimaryAddrFor(key)
	if err != nil {
		c.tb.Fatal(err)
	}
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			return s
		}
	}
	c.tb.Fatalf("%s serves %q, not a node of the test", addr, key)
	return nil
}

// PrimaryAddrFor is the address of the node that serves key, as the first
// answering node tells.
func (c *Cluster) PrimaryAddrFor(key string) (string, error) {
	var last error = errors.New("no node running")
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		var addr string
		last = withClient(n.Addr(), func(ctx context.Context, cl *redis.Client) error {
			slot, err := cl.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				return err
			}
			slots, err := cl.ClusterSlots(ctx).Result()
			if err != nil {
				return err
			}
			for _, s := range slots {
				if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
					addr = s.Nodes[0].Addr
				}
			}
			if addr == "" {
				return fmt.Errorf("node %s: no node serves slot %d", n.Addr(), slot)
			}
			return nil
		})
		if last == nil {
			return addr, nil
		}
	}
	return "", last
}

// WaitFailover waits until the running nodes name a primary other than old
// for key's slot, and returns it.
func (c *Cluster) WaitFailover(old *Server, key string) *Server {
	c.tb.Helper()
	var now *Server
	testkit.Eventually(c.tb, setupTimeout, func() bool {
		now = c.PrimaryFor(key)
		return now != old
	}, "a failover away from %s", old.Addr())
	return now
}

// replicaInSync checks that the server at addr is a replica whose link to
// its primary is up and not syncing.
func replicaInSync(addr string) error {
	return withClient(addr, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") || strings.Contains(info, "master_sync_in_progress:1") {
			return fmt.Errorf("replica %s not in sync", addr)
		}
		return nil
	})
}

// withClient runs fn with a short-lived plain client of one server.
func withClient(addr string, fn func(ctx context.Context, c *redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DisableIdentity: true,
		Protocol: 2})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return fn(ctx, c)
}

// WaitReplicated waits until the replica has every write its primary
// acknowledged (replication offsets equal): a write before this call
// survives the primary's death. Writes must have stopped.
func (d *Sentinel) WaitReplicated() {
	d.tb.Helper()
	testkit.EventuallyNoError(d.tb, setupTimeout, func() error { return caughtUp(d.Replica.Addr()) }, "the replica caught up")
}

// WaitReplicated is Sentinel.WaitReplicated for every replica of the
// cluster.
func (c *Cluster) WaitReplicated() {
	c.tb.Helper()
	testkit.EventuallyNoError(c.tb, setupTimeout, func() error {
		for _, n := range c.Nodes {
			if n.cmd == nil {
				continue
			}
			if err := caughtUp(n.Addr()); err != nil {
				return err
			}
		}
		return nil
	}, "the replicas caught up")
}

// caughtUp checks that the server at addr, if a replica, has its
// primary's replication offset.
func caughtUp(addr string) error {
	field := func(info, name string) string {
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				return v
			}
		}
		return ""
	}
	var info string
	if err := withClient(addr, func(ctx context.Context, c *redis.Client) (err error) {
		info, err = c.Info(ctx, "replication").Result()
		return err
	}); err != nil {
		return err
	}
	if field(info, "role") != "slave" {
		return nil
	}
	primary := net.JoinHostPort(field(info, "master_host"), field(info, "master_port"))
	var pinfo string
	if err := withClient(primary, func(ctx context.Context, c *redis.Client) (err error) {
		pinfo, err = c.Info(ctx, "replication").Result()
		return err
	}); err != nil {
		return err
	}
	if got, want := field(info, "slave_repl_offset"), field(pinfo, "master_repl_offset"); got != want {
		return fmt.Errorf("replica %s at offset %s, primary %s at %s", addr, got, primary, want)
	}
	return nil
}

// Reshard moves slots slots from the primary serving key to another
// primary (`redis-cli --cluster reshard`), keys included: during the move
// clients get MOVED and ASK redirections. It returns an error rather than
// failing the test, so that it may run beside the test's traffic.
func (c *Cluster) Reshard(ctx context.Context, key string, slots int) error {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return err
	}
	from, err := c.PrimaryAddrFor(key)
	if err != nil {
		return err
	}
	var fromID, toID string
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		var id string
		var role []any
		if err := withClient(n.Addr(), func(ctx context.Context, cl *redis.Client) (err error) {
			if id, err = cl.Do(ctx, "CLUSTER", "MYID").Text(); err != nil {
				return err
			}
			role, err = cl.Do(ctx, "ROLE").Slice()
			return err
		}); err != nil {
			return err
		}
		switch {
		case n.Addr() == from:
			fromID = id
		case toID == "" && len(role) > 0 && role[0] == "master":
			toID = id
		}
	}
	if fromID == "" || toID == "" {
		return fmt.Errorf("no source (%q) or destination (%q) primary", fromID, toID)
	}
	out, err := exec.CommandContext(ctx, cli, "--cluster", "reshard", from,
		"--cluster-from", fromID, "--cluster-to", toID, "--cluster-slots", strconv.Itoa(slots),
		"--cluster-yes", "--cluster-pipeline", "10").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
	return nil
}

// processes are every process of the deployment, sentinels included.
func (d *Sentinel) processes() []*Server {
	return append([]*Server{d.Primary, d.Replica}, d.Sentinels...)
}

// Freeze stops every process of the deployment (SIGSTOP), sentinels
// included: nothing answers, and no failover can start. (A thawed
// sentinel finds its clock jumped and stays in TILT mode for 30 s,
// taking no action.)
func (d *Sentinel) Freeze() {
	for _, s := range d.processes() {
		s.Freeze()
	}
}

// Thaw resumes every process (SIGCONT).
func (d *Sentinel) Thaw() {
	for _, s := range d.processes() {
		s.Thaw()
	}
}

// FlushAll empties the primary (FLUSHALL, replicated): the deployment
// lost its data.
func (d *Sentinel) FlushAll() error {
	addr, err := d.primaryAddr()
	if err != nil {
		return err
	}
	return withClient(addr, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() })
}

// Freeze stops every node of the cluster (SIGSTOP).
func (c *Cluster) Freeze() {
	for _, n := range c.Nodes {
		n.Freeze()
	}
}

// Thaw resumes every node (SIGCONT).
func (c *Cluster) Thaw() {
	for _, n := range c.Nodes {
		n.Thaw()
	}
}

// FlushAll empties every primary of the cluster (FLUSHALL, replicated):
// the cluster lost its data, as one restarted without persistence.
func (c *Cluster) FlushAll() error {
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		if err := withClient(n.Addr(), func(ctx context.Context, cl *redis.Client) error {
			role, err := cl.Do(ctx, "ROLE").Slice()
			if err != nil {
				return err
			}
			if len(role) > 0 && role[0] == "master" {
				return cl.FlushAll(ctx).Err()
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}
