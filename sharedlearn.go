package egress

import (
	"context"
	"fmt"
	"time"
)

// The shared limiters keep a key's learnt limit in Redis beside its bucket
// (see adaptive.go and internal/lua/rate.lua): the reservation script reads
// it on every decision, so one instance's lesson holds for the fleet at
// once.

// learntRate is what this instance last saw of a key's rate.
type learntRate struct {
	rate       float64   // units per second, from the last script reply
	seen       time.Time // when
	advertised float64   // the advertised limit this instance last wrote
	wrote      time.Time // when
}

func (l *learntRate) atRest(now time.Time) bool { return now.Sub(l.seen) > advertisedTTL }

// Rate returns the configured rate.
func (s *shared) Rate() Rate { return s.rate }

// EffectiveRate returns the rate key was held to in this instance's last
// decision on it (no Redis round trip): the configured rate, or lower when
// the provider advertised a lower limit or, in adaptive mode, throttled the
// key — anywhere in the fleet.
func (s *shared) EffectiveRate(key string) Rate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.learnt.m[keyID(key)]; ok && l.rate < s.rate.PerSecond()*(1-1e-12) {
		return PerSecond(l.rate)
	}
	return s.rate
}

func (s *shared) setAdaptive(p AdaptivePolicy) { s.policy.Store(&p) }

// adaptiveArgs appends the scripts' adaptive-mode arguments: beta, C and
// floor, or zeros when adaptive mode is off.
func (s *shared) adaptiveArgs(args []any) []any {
	if p := s.policy.Load(); p != nil {
		return append(args, p.Beta, p.C, p.Floor.PerSecond())
	}
	return append(args, 0, 0, 0)
}

// seen records the rate a script reply gave for key id.
func (s *shared) seen(id string, rate float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	l, ok := s.learnt.get(id, now)
	if !ok {
		if rate >= s.rate.PerSecond() {
			return // nothing learnt: nothing to remember
		}
		l = &learntRate{}
		s.learnt.put(id, l)
	}
	l.rate, l.seen = rate, now
}

// learn writes what a response taught about key's limit to Redis, for the
// fleet. An advertised limit this instance wrote lately is not written
// again: providers repeat it on every response.
func (s *shared) learn(ctx context.Context, key string, ls lesson) (old, new float64, err error) {
	id := keyID(key)
	now := s.clock.Now()
	if !ls.throttled && s.wroteLately(id, ls.advertised, now) {
		r := s.EffectiveRate(key).PerSecond()
		return r, r, nil
	}
	age := int64(0)
	if !ls.sentAt.IsZero() {
		age = micros(now.Sub(ls.sentAt))
	}
	throttled := 0
	if ls.throttled {
		throttled = 1
	}
	args := s.adaptiveArgs([]any{s.rate.PerSecond()})
	args = append(args, ls.advertised, micros(advertisedTTL), throttled, age, max(micros(ls.resume.Sub(now)), 0))
	var reply []any
	err = s.do(ctx, func(ctx context.Context) error {
		var err error
		reply, err = s.learnScript.Run(ctx, s.rdb, s.redisKeys(id)[2:], args...).Slice()
		return err
	})
	if err == nil {
		var ok1, ok2 bool
		if len(reply) == 2 {
			old, ok1 = parseRate(reply[0])
			new, ok2 = parseRate(reply[1])
		}
		if !ok1 || !ok2 {
			err = fmt.Errorf("malformed reply %v", reply)
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("egress: shared limiter %s: learn: %w", s.name, err)
	}
	s.seen(id, new)
	if ls.advertised > 0 {
		s.mu.Lock()
		if l, ok := s.learnt.m[id]; ok {
			l.advertised, l.wrote = ls.advertised, now
		}
		s.mu.Unlock()
	}
	return old, new, nil
}

// wroteLately reports whether this instance wrote the advertised limit adv
// for key id in the last half of advertisedTTL.
func (s *shared) wroteLately(id string, adv float64, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.learnt.m[id]
	return ok && l.advertised == adv && now.Sub(l.wrote) < advertisedTTL/2
}
