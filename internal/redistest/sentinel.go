package redistest

// Deployments that survive the loss of their master, for failover tests:
// Redis Sentinel (a master, a replica and three sentinels) and a Redis
// Cluster of three masters with one replica each. Both run on loopback
// ports with timeouts short enough that a killed master is replaced within
// a few seconds.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// SentinelDownAfter is how long the sentinels wait for a silent master
	// before they call it down and start a failover.
	SentinelDownAfter = time.Second
	// ClusterNodeTimeout is the cluster-node-timeout of StartReplicatedCluster:
	// how long a silent master has before its replica may take over.
	ClusterNodeTimeout = time.Second

	sentinels       = 3                // sentinel processes
	sentinelQuorum  = 2                // sentinels that must agree the master is down
	deployTimeout   = 30 * time.Second // for a deployment to be ready
	failoverTimeout = 10 * time.Second // sentinel failover-timeout
)

// Sentinel is a Redis Sentinel deployment started by StartSentinel: a
// master, one replica of it and three sentinels that watch them under
// MasterName. Its methods are safe for concurrent use.
type Sentinel struct {
	// MasterName is the name the sentinels know the master by.
	MasterName string
	// SentinelAddrs are the sentinels' addresses, "127.0.0.1:port".
	SentinelAddrs []string

	nodes     []*Server // the master and the replica, as started
	sentinels []*sentinelProc
}

// sentinelProc is one redis-server --sentinel process.
type sentinelProc struct {
	addr string
	proc *process
}

// StartSentinel starts a master, a replica (--replicaof the master) and
// three sentinels (redis-server sentinel.conf --sentinel, quorum 2,
// down-after-milliseconds SentinelDownAfter) on free 127.0.0.1 ports, and
// returns once the replica is in sync and every sentinel reports the master
// as ok with one replica and two other sentinels (within 30 s, else
// t.Fatal). t.Cleanup stops every process as Start's cleanup does.
//
// If redis-server is not in PATH, StartSentinel calls t.Skip, or t.Fatal
// when the environment variable CI is true.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	skipShort(t)
	bin := lookBinary(t, "redis-server", exec.LookPath, os.Getenv)
	master := startServer(t, bin, freePort, nil)
	_, mport, _ := net.SplitHostPort(master.Addr)
	replica := startServer(t, bin, freePort, []string{"--replicaof", "127.0.0.1", mport})
	if err := waitInfo(replica.Addr, "replication", "master_link_status:up"); err != nil {
		t.Fatalf("redistest: replica %s: %v", replica.Addr, err)
		return nil
	}
	d := &Sentinel{MasterName: "egress-master", nodes: []*Server{master, replica}}
	for range sentinels {
		sp, err := startSentinelProc(t, bin, d.MasterName, master.Addr)
		if err != nil {
			t.Fatalf("redistest: %v", err)
			return nil
		}
		d.sentinels = append(d.sentinels, sp)
		d.SentinelAddrs = append(d.SentinelAddrs, sp.addr)
	}
	want := fmt.Sprintf("name=%s,status=ok,address=%s,slaves=1,sentinels=%d", d.MasterName, master.Addr, sentinels)
	for _, s := range d.SentinelAddrs {
		if err := waitInfo(s, "sentinel", "master0:"+want); err != nil {
			t.Fatalf("redistest: sentinel %s: %v", s, err)
			return nil
		}
	}
	return d
}

// startSentinelProc writes a sentinel.conf monitoring master as name and
// runs a sentinel on a free port, trying three ports in all.
func startSentinelProc(t testing.TB, bin, name, master string) (*sentinelProc, error) {
	mhost, mport, _ := net.SplitHostPort(master)
	var errs []string
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		dir := t.TempDir()
		conf := strings.Join([]string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"daemonize no",
			"dir " + dir,
			"sentinel resolve-hostnames no",
			fmt.Sprintf("sentinel monitor %s %s %s %d", name, mhost, mport, sentinelQuorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, SentinelDownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", name, failoverTimeout.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", name),
		}, "\n") + "\n"
		confPath := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p, err := launchProcess(bin, dir, addr, confPath, "--sentinel")
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		sp := &sentinelProc{addr: addr, proc: p}
		t.Cleanup(func() { p.terminate(stopGrace) })
		return sp, nil
	}
	return nil, fmt.Errorf("sentinel: %s", strings.Join(errs, "; "))
}

// launchProcess runs bin with args in dir, its output in dir/redis.log, and
// waits until addr answers PING from that process.
func launchProcess(bin, dir, addr string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, "redis.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := waitReady(addr, p); err != nil {
		p.kill()
		return nil, fmt.Errorf("%s on %s: %w; log %s ends:\n%s", bin, addr, err, logPath, logTail(logPath))
	}
	return p, nil
}

// MasterAddr returns the master's address as the first sentinel that
// answers reports it.
func (d *Sentinel) MasterAddr() (string, error) {
	var last error
	for _, s := range d.SentinelAddrs {
		info, err := command(s, "INFO", "sentinel")
		if err != nil {
			last = err
			continue
		}
		if addr, ok := infoField(info, "master0", "address"); ok {
			return addr, nil
		}
		last = fmt.Errorf("sentinel %s: no master0 in INFO sentinel", s)
	}
	return "", last
}

// Node returns the master or the replica started at addr, or nil.
func (d *Sentinel) Node(addr string) *Server {
	for _, n := range d.nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// KillMaster kills the current master with SIGKILL, as in a crash, and
// returns its address.
func (d *Sentinel) KillMaster() (string, error) {
	addr, err := d.MasterAddr()
	if err != nil {
		return "", err
	}
	n := d.Node(addr)
	if n == nil {
		return "", fmt.Errorf("master %s is not a node of the deployment", addr)
	}
	n.Stop()
	return addr, nil
}

// WaitFailover waits until every sentinel names a master other than old and
// that master says it is one (role:master), and returns its address. It
// gives up after timeout.
func (d *Sentinel) WaitFailover(old string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		addr, err := d.agreedMaster()
		if err == nil && addr != old {
			info, err2 := command(addr, "INFO", "replication")
			if err2 == nil && hasLines(info, []string{"role:master"}) {
				return addr, nil
			}
			err = err2
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no failover from %s within %v (last: %q, %v)", old, timeout, addr, err)
		}
		time.Sleep(pollInterval)
	}
}

// agreedMaster returns the master every sentinel names, or an error when
// they disagree.
func (d *Sentinel) agreedMaster() (string, error) {
	seen := ""
	for _, s := range d.SentinelAddrs {
		info, err := command(s, "INFO", "sentinel")
		if err != nil {
			return "", err
		}
		addr, ok := infoField(info, "master0", "address")
		if !ok || (seen != "" && addr != seen) {
			return "", fmt.Errorf("sentinels disagree: %q, %q", seen, addr)
		}
		seen = addr
	}
	return seen, nil
}

// Client returns a go-redis failover client (redis.NewFailoverClient) for
// MasterName through the sentinels, with the timeouts of Server.Client.
// t.Cleanup closes it; clients made after StartSentinel are closed before
// the processes stop.
func (d *Sentinel) Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	dl := &dialer{}
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            d.MasterName,
		SentinelAddrs:         d.SentinelAddrs,
		Dialer:                dl.dial,
		DialerRetries:         1,
		DialerRetryTimeout:    time.Millisecond,
		MinRetryBackoff:       time.Millisecond,
		MaxRetryBackoff:       10 * time.Millisecond,
		DialTimeout:           clientTimeout,
		ReadTimeout:           clientTimeout,
		WriteTimeout:          clientTimeout,
		ContextTimeoutEnabled: true,
		PoolSize:              clientPool,
	})
	t.Cleanup(func() {
		_ = c.Close()
		dl.waitRedialer()
	})
	return c
}

// ReplicatedCluster is a Redis Cluster of three masters with one replica
// each, started by StartReplicatedCluster. Its methods are safe for
// concurrent use.
type ReplicatedCluster struct {
	// Addrs are every node's address, masters and replicas, as started.
	Addrs []string

	mu    sync.Mutex
	nodes []*Server
}

// StartReplicatedCluster starts six cluster-enabled redis-server nodes
// (cluster-node-timeout ClusterNodeTimeout) on free 127.0.0.1 ports below
// 55535, joins them with redis-cli --cluster create --cluster-replicas 1,
// and returns once every node reports cluster_state:ok with all slots
// assigned and six known nodes, and every replica is in sync (within 30 s,
// else t.Fatal). t.Cleanup stops every node as Start's cleanup does.
//
// If redis-server or redis-cli is not in PATH, it calls t.Skip, or t.Fatal
// when the environment variable CI is true.
func StartReplicatedCluster(t testing.TB) *ReplicatedCluster {
	t.Helper()
	skipShort(t)
	bin := lookBinary(t, "redis-server", exec.LookPath, os.Getenv)
	cli := lookBinary(t, "redis-cli", exec.LookPath, os.Getenv)
	extra := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(ClusterNodeTimeout.Milliseconds(), 10),
		// A master stopped by the cleanup does not wait for its replica.
		"--shutdown-timeout", "0",
	}
	c := &ReplicatedCluster{}
	for range 6 {
		n := startServer(t, bin, freeClusterPort, extra)
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deployTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: %s %s: %v\n%s", cli, strings.Join(args, " "), err, out)
		return nil
	}
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_slots_ok:16384",
		"cluster_known_nodes:6",
		"cluster_size:3",
	}
	for _, addr := range c.Addrs {
		if err := waitInfoLines(addr, []string{"CLUSTER", "INFO"}, want); err != nil {
			t.Fatalf("redistest: node %s: %v", addr, err)
			return nil
		}
	}
	for _, addr := range c.Addrs {
		info, err := command(addr, "INFO", "replication")
		if err == nil && hasLines(info, []string{"role:slave"}) {
			err = waitInfo(addr, "replication", "master_link_status:up")
		}
		if err != nil {
			t.Fatalf("redistest: node %s: %v", addr, err)
			return nil
		}
	}
	return c
}

// Masters returns the addresses of the nodes that say they are masters now
// (role:master), leaving out the ones that do not answer.
func (c *ReplicatedCluster) Masters() []string {
	var out []string
	for _, addr := range c.Addrs {
		info, err := command(addr, "INFO", "replication")
		if err == nil && hasLines(info, []string{"role:master"}) {
			out = append(out, addr)
		}
	}
	return out
}

// Kill kills the node at addr with SIGKILL, as in a crash.
func (c *ReplicatedCluster) Kill(addr string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Addr == addr {
			n.Stop()
			return nil
		}
	}
	return fmt.Errorf("%s is not a node of the cluster", addr)
}

// WaitHealed waits until three nodes answer as masters, none of them in
// dead (killed nodes, which do not answer anyway), and every node but the
// ones in dead reports cluster_state:ok with all slots ok; it gives up
// after timeout.
func (c *ReplicatedCluster) WaitHealed(timeout time.Duration, dead ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healed(dead)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not healed within %v: %w", timeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// healed returns nil when the cluster is whole again without dead.
func (c *ReplicatedCluster) healed(dead []string) error {
	if m := c.Masters(); len(m) != 3 {
		return fmt.Errorf("masters %v", m)
	}
	for _, addr := range c.Addrs {
		if slices.Contains(dead, addr) {
			continue
		}
		info, err := command(addr, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("node %s: %w", addr, err)
		}
		if !hasLines(info, []string{"cluster_state:ok", "cluster_slots_ok:16384", "cluster_size:3"}) {
			return fmt.Errorf("node %s: CLUSTER INFO:\n%s", addr, info)
		}
	}
	return nil
}

// Client returns a go-redis cluster client seeded with every node, with the
// timeouts of Server.Client. t.Cleanup closes it; clients made after
// StartReplicatedCluster are closed before the nodes stop.
func (c *ReplicatedCluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	return clusterClient(t, c.Addrs)
}

// waitInfo polls INFO section on addr until it has the line want.
func waitInfo(addr, section, want string) error {
	return waitInfoLines(addr, []string{"INFO", section}, []string{want})
}

// waitInfoLines polls the command args on addr until its reply has every
// line of want, for up to deployTimeout.
func waitInfoLines(addr string, args, want []string) error {
	deadline := time.Now().Add(deployTimeout)
	for {
		reply, err := command(addr, args...)
		if err == nil && hasLines(reply, want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %q within %v: error %v, reply:\n%s", strings.Join(args, " "), want, deployTimeout, err, reply)
		}
		time.Sleep(pollInterval)
	}
}

// infoField reads field of the INFO line named line, such as address in
// "master0:name=m,status=ok,address=127.0.0.1:6379,...".
func infoField(info, line, field string) (string, bool) {
	for _, l := range strings.Split(strings.ReplaceAll(info, "\r\n", "\n"), "\n") {
		rest, ok := strings.CutPrefix(l, line+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}
