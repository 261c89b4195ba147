package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestServerSetGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	begin := time.Now()
	srv := Start(t)
	t.Logf("server ready on %s in %v", srv.Addr, time.Since(begin))

	rdb := srv.Client(t)
	require.NoError(t, rdb.Set(ctx, "greeting", "hello", 0).Err())
	got, err := rdb.Get(ctx, "greeting").Result()
	require.NoError(t, err)
	assert.Equal(t, "hello", got)

	save, err := rdb.ConfigGet(ctx, "save").Result()
	require.NoError(t, err)
	assert.Equal(t, "", save["save"], "persistence is off")
}

func TestServerStopAndRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := Start(t)
	addr := srv.Addr
	rdb := srv.Client(t)
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())

	srv.Stop()
	srv.Stop() // does nothing
	// Enough failed dials to start go-redis's redialer.
	for range 2 * clientPool {
		assert.Error(t, rdb.Get(ctx, "k").Err(), "server is stopped")
	}

	begin := time.Now()
	srv.Restart(t)
	t.Logf("server restarted in %v", time.Since(begin))
	assert.Equal(t, addr, srv.Addr)
	// go-redis may hold back new dials for up to a second after many failures.
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 3*time.Second, 10*time.Millisecond)
	assert.ErrorIs(t, rdb.Get(ctx, "k").Err(), redis.Nil, "data does not survive a crash")
	require.NoError(t, rdb.Set(ctx, "k", "again", 0).Err())
	assert.Equal(t, "again", rdb.Get(ctx, "k").Val())

	srv.Restart(t) // restarting a running server kills it first
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 3*time.Second, 10*time.Millisecond)
}

func TestClientClosedWhileServerIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := Start(t)
	rdb := srv.Client(t)
	require.NoError(t, rdb.Ping(ctx).Err())
	srv.Stop()
	for range 2 * clientPool { // enough failed dials to start go-redis's redialer
		assert.Error(t, rdb.Ping(ctx).Err(), "server is stopped")
	}
	// Cleanup closes rdb and outwaits the redialer, or goleak complains.
}

func TestRestartAfterCleanupFails(t *testing.T) {
	t.Parallel()
	var srv *Server
	t.Run("owner", func(t *testing.T) { srv = Start(t) })
	if srv == nil {
		t.Skip("no server")
	}
	r := &recordingTB{TB: t}
	srv.Restart(r)
	assert.Contains(t, r.fatal, "after its test's cleanup")
	srv.Stop() // does nothing
}

func TestManyServersInParallel(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb := Start(t).Client(t)
			require.NoError(t, rdb.Set(ctx, "i", i, 0).Err())
			got, err := rdb.Get(ctx, "i").Int()
			require.NoError(t, err)
			assert.Equal(t, i, got)
		})
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	begin := time.Now()
	c := StartCluster(t)
	t.Logf("cluster ready on %v in %v", c.Addrs, time.Since(begin))
	require.Len(t, c.Addrs, 3)

	cc := c.Client(t)
	info, err := cc.ClusterInfo(ctx).Result()
	require.NoError(t, err)
	assert.Contains(t, info, "cluster_size:3")
	assert.Contains(t, info, "cluster_state:ok")

	// redis-cli gives each master a third of the slots; pick a key for each.
	keys := keysInEachThird(t, cc)
	for _, k := range keys {
		require.NoError(t, cc.Set(ctx, k, "v-"+k, 0).Err())
	}
	for _, k := range keys {
		assert.Equal(t, "v-"+k, cc.Get(ctx, k).Val())
	}

	// Each key lives on exactly one node; the others answer MOVED.
	owners := map[string]bool{}
	for _, n := range c.nodes {
		rdb := n.Client(t)
		for _, k := range keys {
			v, err := rdb.Get(ctx, k).Result()
			if err == nil {
				assert.Equal(t, "v-"+k, v)
				owners[n.Addr+" "+k] = true
				continue
			}
			assert.True(t, strings.HasPrefix(err.Error(), "MOVED"), "%s on %s: %v", k, n.Addr, err)
		}
	}
	assert.Len(t, owners, len(keys), "every key on one node: %v", owners)
	for _, n := range c.nodes {
		assert.Condition(t, func() bool {
			for o := range owners {
				if strings.HasPrefix(o, n.Addr+" ") {
					return true
				}
			}
			return false
		}, "node %s owns one of the keys", n.Addr)
	}
}

// keysInEachThird returns a key whose slot is in each third of the slot range.
func keysInEachThird(t *testing.T, cc *redis.ClusterClient) []string {
	t.Helper()
	ctx := context.Background()
	found := make([]string, 3)
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("key-%d", i)
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		if third := slot * 3 / 16384; found[third] == "" {
			found[third] = k
		}
		if found[0] != "" && found[1] != "" && found[2] != "" {
			return found
		}
	}
	t.Fatalf("no keys in every third of the slots: %v", found)
	return nil
}

// recordingTB is a testing.TB whose Skip and Fatal record the message and
// return instead of ending the test.
type recordingTB struct {
	testing.TB
	skipped, fatal string
}

func (r *recordingTB) Helper()           {}
func (r *recordingTB) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recordingTB) Fatal(args ...any) { r.fatal = fmt.Sprint(args...) }
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
}

func TestLookBinary(t *testing.T) {
	t.Parallel()
	missing := func(string) (string, error) {
		return "", errors.New(`exec: "redis-server": executable file not found in $PATH`)
	}
	found := func(name string) (string, error) { return "/usr/bin/" + name, nil }
	env := func(ci string) func(string) string {
		return func(k string) string {
			if k == "CI" {
				return ci
			}
			return ""
		}
	}
	tests := []struct {
		name        string
		look        func(string) (string, error)
		ci          string
		wantPath    string
		wantSkipped bool
		wantFatal   bool
	}{
		{name: "found", look: found, ci: "true", wantPath: "/usr/bin/redis-server"},
		{name: "missing skips", look: missing, ci: "", wantSkipped: true},
		{name: "missing skips when CI is false", look: missing, ci: "false", wantSkipped: true},
		{name: "missing fails in CI", look: missing, ci: "true", wantFatal: true},
		{name: "missing fails in CI=1", look: missing, ci: "1", wantFatal: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &recordingTB{TB: t}
			path := lookBinary(r, "redis-server", tt.look, env(tt.ci))
			assert.Equal(t, tt.wantPath, path)
			assert.Equal(t, tt.wantSkipped, r.skipped != "", "skipped: %q", r.skipped)
			assert.Equal(t, tt.wantFatal, r.fatal != "", "fatal: %q", r.fatal)
			for _, msg := range []string{r.skipped, r.fatal} {
				if msg != "" {
					assert.Contains(t, msg, "redis-server not found")
					assert.NotContains(t, msg, "\n", "one line")
				}
			}
		})
	}
}

func TestStartFailureQuotesTheLog(t *testing.T) {
	t.Parallel()
	bin := lookBinary(t, "redis-server", exec.LookPath, os.Getenv)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	picks := 0
	pick := func() (int, error) { picks++; return port, nil }

	r := &recordingTB{TB: t}
	srv := startServer(r, bin, pick, nil)
	assert.Nil(t, srv)
	assert.Equal(t, startAttempts, picks, "a port is tried per attempt")
	assert.Contains(t, r.fatal, "exited before answering PING")
	assert.Contains(t, r.fatal, "redis.log ends:")
	assert.Contains(t, r.fatal, "Address already in use", "the log's tail is quoted")
}

func TestStartDoesNotAdoptAnotherServer(t *testing.T) {
	t.Parallel()
	other := Start(t)
	_, port, err := net.SplitHostPort(other.Addr)
	require.NoError(t, err)
	pick := func() (int, error) { return strconv.Atoi(port) }

	r := &recordingTB{TB: t}
	assert.Nil(t, startServer(r, other.bin, pick, nil))
	// Ours either exits on the busy port or is caught by its process ID.
	assert.Contains(t, r.fatal, other.Addr)
	require.NoError(t, other.Client(t).Ping(context.Background()).Err())
}

func TestReadReply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "+PONG\r\n", want: "PONG"},
		{in: ":42\r\n", want: "42"},
		{in: "$5\r\nhello\r\n", want: "hello"},
		{in: "$0\r\n\r\n", want: ""},
		{in: "-ERR nope\r\n", wantErr: "redis error: ERR nope"},
		{in: "$-1\r\n", wantErr: "unexpected bulk reply"},
		{in: "*1\r\n", wantErr: "unexpected reply"},
		{in: "$5\r\nhel", wantErr: "EOF"},
		{in: "\r\n", wantErr: "empty reply"},
		{in: "", wantErr: "EOF"},
	}
	for _, tt := range tests {
		got, err := readReply(bufio.NewReader(strings.NewReader(tt.in)))
		if tt.wantErr != "" {
			assert.ErrorContains(t, err, tt.wantErr, "%q", tt.in)
			continue
		}
		assert.NoError(t, err, "%q", tt.in)
		assert.Equal(t, tt.want, got, "%q", tt.in)
	}
}
