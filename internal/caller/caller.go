// Package caller owns how egress calls Redis, and not what it asks: a
// script run with the time as its last argument (Run, Now), a command
// waited for as long as the round trips seen call for (Caller: RFC 6298's
// estimate, patience while Redis is known to answer, never past
// MaxCommandWait), and a process short of cores told apart from a Redis
// that answers nobody (WithPatience). It knows nothing of keys, rates or
// limits: the shared limiters decide what a failed call means (their
// fallback).
package caller

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/egress-go/egress/internal/clock"
)

// Caller calls Redis for one limiter: each command is waited for
// CommandTimeout, and its answer noted. Set Timeout before use; a Caller
// must not be copied after. Safe for concurrent use.
type Caller struct {
	Timeout  time.Duration // the configured command timeout
	answered atomic.Int64  // unix ns of Redis's last reply to this caller; 0 for none yet
	rtt      rttEstimate   // of the commands Redis answered
}

// Answered returns when Redis last answered this caller; zero for never.
func (c *Caller) Answered() time.Time {
	if ns := c.answered.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Do runs f with the command timeout, or patience times it (see
// commandTimeout), and notes a reply. It returns when the time passes
// even if f does not (a client without ContextTimeoutEnabled may block
// until its own read timeout): the limiter must not hang with Redis.
func (c *Caller) Do(ctx context.Context, f func(context.Context) error) error {
	return c.DoWithin(ctx, c.CommandTimeout(time.Now()), f)
}

// DoWithin is Do with the time d: and for as long again, up to
// maxCommandWait in all, while Redis keeps answering the process's other
// commands (see withPatience).
func (c *Caller) DoWithin(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	sent := time.Now()
	err := WithPatience(ctx, d, max(d, MaxCommandWait), &processAnswered, f)
	var rerr redis.Error
	if err == nil || errors.As(err, &rerr) {
		now := time.Now()
		c.answered.Store(now.UnixNano())
		processAnswered.Store(now.UnixNano())
		c.rtt.observe(now.Sub(sent))
	}
	return err
}

// processAnswered is when (unix ns) the latest reply to any shared limiter
// of the process came: while replies keep coming, a command that overruns
// its timeout is the process's scheduler's delay, not Redis's silence
// (see WithPatience). A fleet of one limiter per process sees its own.
var processAnswered atomic.Int64

// rttEstimate is the smoothed round trip of the limiter's commands and its
// variation, as TCP keeps them (RFC 6298): on a machine where the
// instances' goroutines wait for a core, the round trips seen from the
// process are the scheduler's delay as much as Redis's, and a timeout
// below them takes a busy machine for a Redis that is down. Safe for
// concurrent use.
type rttEstimate struct {
	mu           sync.Mutex
	srtt, rttvar time.Duration // guarded by mu; zero before the first sample
}

func (e *rttEstimate) observe(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srtt == 0 {
		e.srtt, e.rttvar = d, d/2
		return
	}
	diff := e.srtt - d
	if diff < 0 {
		diff = -diff
	}
	e.rttvar = (3*e.rttvar + diff) / 4
	e.srtt = (7*e.srtt + d) / 8
}

// timeout returns srtt + 4·rttvar, 0 before the first sample.
func (e *rttEstimate) timeout() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srtt + 4*e.rttvar
}

// Patience is how many times the command timeout a command is waited for
// while Redis is known to answer: it answered this limiter within
// AnsweredRecently, or has not been asked yet (the first commands of a
// client dial, say hello and load the scripts). A machine busy with
// hundreds of instances (the fleet benchmark's 256 in one process on two
// cores) answers in 50 to 150 ms at times; each answer taken for an outage
// sent a request to the fallback, whose turn the fleet's bucket had also
// given, and the first second of 64 instances met 30 to 60 refusals
// that taught the fleet a lower limit. A Redis that stops answering is
// still given up after the command timeout once it has been silent for
// AnsweredRecently, and after Patience times it before.
//
// The timeout is also never below the round trips seen lately (see
// rttEstimate), up to MaxCommandWait: with 256 instances starting on two
// cores, commands took 150 ms and more for a second, and the patience
// alone still sent 159 requests to the fallback.
const (
	Patience         = 3
	AnsweredRecently = time.Second
	MaxCommandWait   = time.Second
)

// CommandTimeout returns the time a command sent at now (the wall clock's)
// is waited for.
func (c *Caller) CommandTimeout(now time.Time) time.Duration {
	d := max(c.Timeout, min(c.rtt.timeout(), MaxCommandWait))
	last := c.answered.Load()
	if last == 0 || now.Sub(time.Unix(0, last)) <= AnsweredRecently {
		d = max(Patience*c.Timeout, min(Patience*d, MaxCommandWait))
	}
	return d
}

// WithPatience runs f with a context that ends after most, and returns
// when f does, or when d passes with no answer to any other command
// (answered, unix ns of the latest, moved on since f was sent or since d
// last passed): a Redis that answers nobody is given up after d, as before,
// while one that answers others, slowly, is waited for. On a
// machine short of cores (256 instances in one process on two), a burst of
// commands waits for the scheduler rather than for Redis: every one of them
// overran three times its timeout at the same instant, and 20 to 96 of the
// instances fell back, each with its own bucket and controller, and the
// fleet went over its bound or down to half its rate.
func WithPatience(ctx context.Context, d, most time.Duration, answered *atomic.Int64, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, most)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- f(ctx) }()
	t := time.NewTimer(d)
	defer t.Stop()
	armed := time.Now()
	mark := armed.UnixNano()
	for {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			// (A timer heard late by half its time or more says the
			// process was kept from running, not that Redis was silent.)
			if answered.Load() <= mark && time.Since(armed) < d+d/2 {
				return context.DeadlineExceeded
			}
			armed = time.Now()
			mark = armed.UnixNano()
			t.Reset(d)
		}
	}
}

// WithTimeout runs f with a context that ends after d, and returns when it
// does even if f does not.
func WithTimeout(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- f(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run runs one of the scripts of internal/lua with the time as its last
// argument (see Now).
func Run(ctx context.Context, c redis.Scripter, clk clock.Clock, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	return script.Run(ctx, c, keys, append(args, Now(clk))...)
}

// Now is the time argument of a script (internal/lua's now.lua): the Redis
// server's clock, unless clk is a clock of a test's own (a fake one), whose
// time the script then takes as its now: the test runs the script and its
// Go twin on the same instants. A nil clk is the server's.
func Now(clk clock.Clock) string {
	if _, real := clk.(clock.Real); real || clk == nil {
		return "@"
	}
	return "@" + strconv.FormatInt(clk.Now().UnixMicro(), 10)
}
