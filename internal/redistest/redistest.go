// Package redistest starts real redis-server processes for tests, never a mock.
//
// Start runs one server on a free 127.0.0.1 port, without persistence, in a
// directory from t.TempDir, and waits until it answers PING; t.Cleanup stops it.
// Stop kills it (a crash) and Restart brings it back on the same address, so
// tests can check what happens while Redis is away and after it returns.
// StartCluster does the same for a three-master Redis Cluster. Client and
// Cluster.Client return go-redis clients with short timeouts that are closed by
// t.Cleanup before the servers stop, so goleak finds nothing left running.
//
//	func TestSomething(t *testing.T) {
//		srv := redistest.Start(t)
//		rdb := srv.Client(t)
//		require.NoError(t, rdb.Set(t.Context(), "k", "v", 0).Err())
//	}
//
// When redis-server (or redis-cli, for a cluster) is not in PATH the test is
// skipped, unless the environment says CI=true, where it fails instead.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	readyTimeout  = 10 * time.Second       // for a server to answer PING, or a cluster to be ok
	joinTimeout   = 30 * time.Second       // for redis-cli --cluster create: the nodes meet by gossip, which took over 10 s beside the race step's other packages
	stopGrace     = 5 * time.Second        // between SIGTERM and SIGKILL in cleanup
	startAttempts = 3                      // ports tried when redis-server fails to start
	pollInterval  = 5 * time.Millisecond   // between readiness probes
	probeTimeout  = 100 * time.Millisecond // for one probe: dial, write and read
	clientTimeout = time.Second            // go-redis dial, read and write timeouts
	clientPool    = 10                     // go-redis PoolSize, per node
	maxBusPort    = 65535 - 10000          // cluster ports must leave room for port+10000
	logTailBytes  = 2048                   // of the server log, quoted on failure
)

// Server is a redis-server process started for a test by Start. Addr does not
// change, even across Stop and Restart. Its methods are safe for concurrent
// use.
type Server struct {
	// Addr is the server's address, "127.0.0.1:port".
	Addr string

	bin   string   // path of redis-server
	dir   string   // working directory, holding redis.log
	extra []string // arguments after the common ones (cluster mode)

	mu     sync.Mutex
	proc   *process // guarded by mu; nil while stopped
	closed bool     // guarded by mu; set by the cleanup
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
}

// Start starts redis-server on a free 127.0.0.1 port with no persistence
// (--save "" --appendonly no), in a t.TempDir() working directory, and returns
// once it answers PING (within 10 s, else t.Fatal with the tail of its log,
// redis.log in that directory). If the server fails to start, another port is
// tried, three in all. t.Cleanup stops it: SIGTERM, then SIGKILL after 5 s,
// and waits for the process to exit. The server runs with --hz 100 so that it
// acts on SIGTERM within 10 ms rather than 100 ms.
//
// If redis-server is not in PATH, Start calls t.Skip, or t.Fatal when the
// environment variable CI is true.
func Start(t testing.TB) *Server {
	t.Helper()
	skipShort(t)
	bin := lookBinary(t, "redis-server", exec.LookPath, os.Getenv)
	return startServer(t, bin, freePort, nil)
}

// Stop kills the server now with SIGKILL, as in a crash, and waits until the
// process has exited. Nothing is saved. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Restart starts the server again on the same Addr, after killing it first if
// it is running, and returns once it answers PING. The data is gone: the
// server starts empty. On failure, or after the test's cleanup has stopped
// the server for good, it calls t.Fatal.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		t.Fatalf("redistest: restart of %s after its test's cleanup", s.Addr)
		return
	}
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
	p, err := s.launch()
	if err != nil {
		t.Fatalf("redistest: restart: %v", err)
		return
	}
	s.proc = p
}

// Client returns a go-redis client for the server with 1 s dial, read and
// write timeouts and ContextTimeoutEnabled. It keeps go-redis's 3 retries per
// command but with 1-10 ms backoffs and one dial attempt per connection, so a
// command fails within a few milliseconds while the server is stopped. After
// 10 failed dials (its PoolSize) go-redis stops dialing and redials once a
// second in the background, so after a Restart the client may take up to a
// second to reconnect: poll, as with require.Eventually.
//
// t.Cleanup closes the client, and if that background redialer may be running
// waits up to about a second for it to end, so goleak finds nothing. Clients
// made after Start are closed before the server stops.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	var d dialer
	c := redis.NewClient(&redis.Options{
		Addr:                     s.Addr,
		Dialer:                   d.dial,
		DialerRetries:            1,
		DialerRetryTimeout:       time.Millisecond,
		MinRetryBackoff:          time.Millisecond,
		MaxRetryBackoff:          10 * time.Millisecond,
		DialTimeout:              clientTimeout,
		ReadTimeout:              clientTimeout,
		WriteTimeout:             clientTimeout,
		ContextTimeoutEnabled:    true,
		PoolSize:                 clientPool,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() {
		_ = c.Close()
		d.waitRedialer()
	})
	return c
}

// ShardSubscribers returns how many clients rdb's server has subscribed to
// the shard channel channel (PUBSUB SHARDNUMSUB), or -1 after reporting an
// error with t.Errorf: it is safe in a condition that require.Eventually
// runs on a goroutine of its own, where t.Fatalf is not.
func ShardSubscribers(t testing.TB, rdb *redis.Client, channel string) int64 {
	t.Helper()
	n, err := rdb.PubSubShardNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Errorf("PUBSUB SHARDNUMSUB %s: %v", channel, err)
		return -1
	}
	return n[channel]
}

// startServer starts redis-server with the common arguments and extra, on a
// port from pick, trying another port if the server fails to start, and
// registers its stop with t.Cleanup.
func startServer(t testing.TB, bin string, pick func() (int, error), extra []string) *Server {
	t.Helper()
	var errs []error
	for range startAttempts {
		port, err := pick()
		if err != nil {
			t.Fatalf("redistest: %v", err)
			return nil
		}
		s := &Server{
			Addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:   bin,
			dir:   t.TempDir(),
			extra: extra,
		}
		p, err := s.launch()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.proc = p
		t.Cleanup(s.shutdown)
		return s
	}
	t.Fatalf("redistest: %v", errors.Join(errs...))
	return nil
}

// launch starts redis-server on s.Addr and waits until it answers PING. On
// failure the process is killed and the error quotes the end of its log.
func (s *Server) launch() (*process, error) {
	_, port, _ := net.SplitHostPort(s.Addr)
	logPath := filepath.Join(s.dir, "redis.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy

	args := []string{
		"--port", port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--hz", "100",
	}
	cmd := exec.Command(s.bin, append(args, s.extra...)...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	if err := waitReady(s.Addr, p); err != nil {
		p.kill()
		return nil, fmt.Errorf("redis-server on %s: %w; log %s ends:\n%s", s.Addr, err, logPath, logTail(logPath))
	}
	return p, nil
}

// shutdown stops the server gracefully, for t.Cleanup.
func (s *Server) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.proc != nil {
		s.proc.terminate(stopGrace)
		s.proc = nil
	}
}

// waitReady polls addr with PING until it answers PONG, the process exits or
// readyTimeout passes. A PONG from a process other than p, one that took the
// port first, is an error.
func waitReady(addr string, p *process) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		reply, err := command(addr, "PING")
		if err == nil && reply == "PONG" {
			return checkPID(addr, p.cmd.Process.Pid)
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited before answering PING: %v", p.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v (last reply %q, error %v)", readyTimeout, reply, err)
		}
		time.Sleep(pollInterval)
	}
}

// checkPID returns an error unless the server at addr has process ID pid.
func checkPID(addr string, pid int) error {
	info, err := command(addr, "INFO", "server")
	if err != nil {
		return err
	}
	if !hasLines(info, []string{fmt.Sprintf("process_id:%d", pid)}) {
		return fmt.Errorf("another process answers on the port, not process %d", pid)
	}
	return nil
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	_ = p.cmd.Process.Kill() // fails only if it has exited already
	<-p.done
}

// terminate sends SIGTERM, then SIGKILL if the process is still running after
// grace, and waits for it to exit.
func (p *process) terminate(grace time.Duration) {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.kill()
		return
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		p.kill()
	}
}

// lookBinary returns the path of the program name, found by look. When it is
// missing the test is skipped, or fails if getenv("CI") is true; with a t
// whose Skip and Fatal return, lookBinary returns "".
// skipShort skips t under -short: the fast step (make fast) runs no Redis.
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("redistest: -short runs no Redis (make fast)")
	}
}

func lookBinary(t testing.TB, name string, look func(string) (string, error), getenv func(string) string) string {
	t.Helper()
	path, err := look(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("redistest: %s not found (install the Debian package redis-server): %v", name, err)
	if ci, _ := strconv.ParseBool(getenv("CI")); ci {
		t.Fatal(msg)
	} else {
		t.Skip(msg)
	}
	return ""
}

// freePort returns a 127.0.0.1 TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freeClusterPort returns a free port below maxBusPort whose cluster bus port,
// port+10000, is free as well.
func freeClusterPort() (int, error) {
	for range 100 {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		if port >= maxBusPort {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, errors.New("find a free port: none below 55535 with port+10000 free")
}

// command sends one command to addr on a new connection and returns the reply:
// the text of a status, integer or bulk-string reply, or an error for an error
// reply, a nil or anything else.
func command(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads a RESP2 status, error, integer or bulk-string reply.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis error: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("unexpected bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return "", fmt.Errorf("unexpected reply %q", line)
	}
}

// logTail returns the last logTailBytes of the file at path.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if len(data) > logTailBytes {
		data = data[len(data)-logTailBytes:]
	}
	return string(data)
}

// dialer dials for go-redis and remembers failed dials, so that cleanup can
// outwait the redial goroutine go-redis starts after PoolSize failures: it
// dials once a second and notices only after its sleep that the client has
// been closed. Safe for concurrent use.
type dialer struct {
	mu       sync.Mutex
	failures map[string]int // guarded by mu; failed dials per address since its last success
	last     time.Time      // guarded by mu; time of the last failed dial
}

func (d *dialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{Timeout: clientTimeout}).DialContext(ctx, network, addr)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failures == nil {
		d.failures = make(map[string]int)
	}
	if err != nil {
		d.failures[addr]++
		d.last = time.Now()
	} else {
		d.failures[addr] = 0
	}
	return conn, err
}

// waitRedialer returns once a redial goroutine, if one may be running, has had
// time to notice that the client is closed: a second after the last failed
// dial, plus a margin.
func (d *dialer) waitRedialer() {
	const margin = 100 * time.Millisecond
	for {
		d.mu.Lock()
		redialing := false
		for _, n := range d.failures {
			redialing = redialing || n >= clientPool
		}
		wake := d.last.Add(time.Second + margin)
		d.mu.Unlock()
		if !redialing || !time.Now().Before(wake) {
			return
		}
		time.Sleep(time.Until(wake))
	}
}

// Cluster is a Redis Cluster of three masters and no replicas started for a
// test by StartCluster. Its methods are safe for concurrent use.
type Cluster struct {
	// Addrs are the masters' addresses, "127.0.0.1:port".
	Addrs []string

	nodes []*Server
}

// StartCluster starts three cluster-enabled redis-server nodes on free
// 127.0.0.1 ports below 55535 (each with port+10000 free for the cluster bus),
// joins them with redis-cli --cluster create, and returns once every node
// reports cluster_state:ok with all 16384 slots assigned (within 10 s, else
// t.Fatal). t.Cleanup stops every node as Start's cleanup does.
//
// If redis-server or redis-cli is not in PATH, StartCluster calls t.Skip, or
// t.Fatal when the environment variable CI is true.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	skipShort(t)
	bin := lookBinary(t, "redis-server", exec.LookPath, os.Getenv)
	cli := lookBinary(t, "redis-cli", exec.LookPath, os.Getenv)
	extra := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "5000",
	}
	c := &Cluster{}
	for range 3 {
		n := startServer(t, bin, freeClusterPort, extra)
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	if err := createCluster(cli, c.Addrs); err != nil {
		t.Fatalf("redistest: %v", err)
		return nil
	}
	if err := waitClusterOK(c.Addrs); err != nil {
		t.Fatalf("redistest: %v", err)
		return nil
	}
	return c
}

// Client returns a go-redis cluster client seeded with every node, with the
// same timeouts as Server.Client. t.Cleanup closes it; clients made after
// StartCluster are closed before the nodes stop.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	return clusterClient(t, c.Addrs)
}

// clusterClient returns a go-redis cluster client seeded with addrs, with
// the timeouts of Server.Client, that t.Cleanup closes.
func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	var d dialer
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                    addrs,
		Dialer:                   d.dial,
		DialerRetries:            1,
		DialerRetryTimeout:       time.Millisecond,
		MinRetryBackoff:          time.Millisecond,
		MaxRetryBackoff:          10 * time.Millisecond,
		DialTimeout:              clientTimeout,
		ReadTimeout:              clientTimeout,
		WriteTimeout:             clientTimeout,
		ContextTimeoutEnabled:    true,
		PoolSize:                 clientPool,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() {
		_ = cc.Close()
		d.waitRedialer()
	})
	return cc
}

// createCluster runs redis-cli --cluster create for the nodes at addrs.
func createCluster(cli string, addrs []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", cli, strings.Join(args, " "), err, out)
	}
	return nil
}

// waitClusterOK polls CLUSTER INFO on every node until each says the cluster
// is ok, all slots are assigned and ok, and it knows all the masters.
func waitClusterOK(addrs []string) error {
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_slots_ok:16384",
		fmt.Sprintf("cluster_known_nodes:%d", len(addrs)),
		fmt.Sprintf("cluster_size:%d", len(addrs)),
	}
	deadline := time.Now().Add(readyTimeout)
	for _, addr := range addrs {
		for {
			info, err := command(addr, "CLUSTER", "INFO")
			if err == nil && hasLines(info, want) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster not ok on %s within %v: error %v, CLUSTER INFO:\n%s", addr, readyTimeout, err, info)
			}
			time.Sleep(pollInterval)
		}
	}
	return nil
}

// hasLines reports whether every one of want is a line of text.
func hasLines(text string, want []string) bool {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	for _, w := range want {
		found := false
		for _, l := range lines {
			found = found || l == w
		}
		if !found {
			return false
		}
	}
	return true
}
