package lease

import (
	"fmt"
	"time"

	"github.com/egress-go/egress/internal/argv"
)

// slots.lua's ARGV, a type an operation: its ARGV[1] (Op), then the
// operation's own arguments. The root's TestScriptArgsMatchHeaders holds
// each type to the script's header.

// Op is slots.lua's ARGV[1]: acquire, adopt, renew or release.
type Op struct {
	op string `argv:"1"`
}

// Acquiring is slots.lua's ARGV after "acquire": take a lease if fewer
// than most are live.
type Acquiring struct {
	lease string `argv:"2"`
	most  int    `argv:"3"`
	life  int64  `argv:"4"` // us
}

// Lease is a lease of slots.lua's "adopt" and "renew", one a lease: its
// id, and the life it is given in Redis from now.
type Lease struct {
	ID   string `argv:"2"`
	Life int64  `argv:"3"` // us
}

// Releasing is slots.lua's ARGV after "release", before the lease ids
// (Released).
type Releasing struct {
	channel string `argv:"2"`
	payload string `argv:"3"`
}

// Released is a lease id of slots.lua's "release", one a lease.
type Released struct {
	lease string `argv:"4"`
}

// AcquireArgs returns slots.lua's arguments to take lease, for life, when
// fewer than most are live.
func AcquireArgs(lease string, most int, life time.Duration) []any {
	return argv.Append(argv.Append(make([]any, 0, 5), &Op{"acquire"}), &Acquiring{lease: lease, most: most, life: argv.Micros(life)})
}

// LeasesArgs returns slots.lua's arguments to adopt or renew leases.
func LeasesArgs(op string, leases []Lease) []any {
	args := argv.Append(make([]any, 0, 2+2*len(leases)), &Op{op})
	for i := range leases {
		args = argv.Append(args, &leases[i])
	}
	return args
}

// ReleaseArgs returns slots.lua's arguments to remove leases, each one
// removed announced on channel with payload.
func ReleaseArgs(channel, payload string, leases []string) []any {
	args := argv.Append(make([]any, 0, 4+len(leases)), &Op{"release"})
	args = argv.Append(args, &Releasing{channel: channel, payload: payload})
	for _, l := range leases {
		args = argv.Append(args, &Released{lease: l})
	}
	return args
}

// Reply is slots.lua's reply: how many leases were taken (1 or 0),
// added, renewed or removed, and, for an acquire that took none, the time
// until the earliest lease expires.
type Reply struct {
	N    int64
	Wait time.Duration
}

// ParseReply checks and reads slots.lua's reply: two values, neither
// negative. A malformed reply is an error, never a panic.
func ParseReply(reply []int64) (Reply, error) {
	if len(reply) != 2 || reply[0] < 0 || reply[1] < 0 {
		return Reply{}, fmt.Errorf("malformed reply %v", reply)
	}
	return Reply{N: reply[0], Wait: time.Duration(reply[1]) * time.Microsecond}, nil
}
