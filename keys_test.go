package egress

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyedRestAt is a state that comes to rest at a given time.
type keyedRestAt time.Time

func (r keyedRestAt) atRest(now time.Time) bool { return !now.Before(time.Time(r)) }

// keyedMapID identifies the map k holds, to tell when it was rebuilt.
func keyedMapID[T resting](k *keyed[T]) uintptr { return reflect.ValueOf(k.m).Pointer() }

func TestKeyedSweepCadence(t *testing.T) {
	at := func(d time.Duration) time.Time { return limiterEpoch.Add(d) }
	k := newKeyed[keyedRestAt]()
	require.Equal(t, sweepEvery, k.every)

	// The first get sweeps (there was never a sweep) and starts the cadence.
	_, ok := k.get("x", at(0))
	require.False(t, ok)
	assert.Equal(t, at(0), k.lastSweep)

	k.put("a", keyedRestAt(at(time.Second))) // at rest from 1s
	for i, s := range []struct {
		at        time.Duration
		wantSweep bool
		wantA     bool
	}{
		{at: time.Second, wantA: true},
		{at: sweepEvery - 1, wantA: true}, // due only a full interval after the last
		{at: sweepEvery, wantSweep: true, wantA: false},
		{at: sweepEvery + 1},
		{at: 2*sweepEvery - 1},
		{at: 2 * sweepEvery, wantSweep: true},
	} {
		before := k.lastSweep
		assert.Equal(t, s.wantSweep, k.sweepDue(at(s.at)), "step %d", i)
		_, gotA := k.get("a", at(s.at))
		assert.Equal(t, s.wantA, gotA, "step %d", i)
		if s.wantSweep {
			assert.Equal(t, at(s.at), k.lastSweep, "step %d", i)
		} else {
			assert.Equal(t, before, k.lastSweep, "step %d", i)
		}
	}
}

func TestKeyedSweepDropsOnlyStatesAtRest(t *testing.T) {
	at := func(d time.Duration) time.Time { return limiterEpoch.Add(d) }
	k := newKeyed[keyedRestAt]()
	k.get("", at(0))
	k.put("past", keyedRestAt(at(-time.Hour)))
	k.put("now", keyedRestAt(at(sweepEvery)))
	k.put("soon", keyedRestAt(at(sweepEvery+1)))
	k.put("later", keyedRestAt(at(time.Hour)))

	k.sweep(at(sweepEvery))
	assert.ElementsMatch(t, []string{"soon", "later"}, keyedKeysOf(k.m))
	assert.Equal(t, 2, k.len())

	k.sweep(at(time.Hour - 1))
	assert.ElementsMatch(t, []string{"later"}, keyedKeysOf(k.m))
	k.sweep(at(time.Hour))
	assert.Zero(t, k.len())
}

func keyedKeysOf[T any](m map[string]T) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

func TestKeyedRebuildsMapAfterSpike(t *testing.T) {
	now := limiterEpoch
	for _, tc := range []struct {
		name        string
		keys        int // how many keys the spike adds
		keep        int // how many of them are not at rest at the sweep
		wantRebuilt bool
	}{
		{"big spike, few left", 2000, 100, true},
		{"big spike, just under a quarter left", 2000, 499, true},
		{"big spike, a quarter left", 2000, 500, false},
		{"small spike, none left", 1024, 0, false},
		{"just over the floor, none left", 1025, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newKeyed[keyedRestAt]()
			k.get("", now)
			for i := range tc.keys {
				rest := now // at rest at the sweep
				if i < tc.keep {
					rest = now.Add(time.Hour)
				}
				k.put(strconv.Itoa(i), keyedRestAt(rest))
			}
			require.Equal(t, tc.keys, k.peak)
			id := keyedMapID(&k)

			k.sweep(now.Add(sweepEvery))
			assert.Equal(t, tc.keep, k.len())
			for i := range tc.keep {
				_, ok := k.m[strconv.Itoa(i)]
				require.True(t, ok, "key %d survives", i)
			}
			assert.Equal(t, tc.wantRebuilt, keyedMapID(&k) != id, "map rebuilt")
			if tc.wantRebuilt {
				assert.Equal(t, tc.keep, k.peak, "the peak restarts from the survivors")
			} else {
				assert.Equal(t, tc.keys, k.peak)
			}

			// The rebuilt map works as before.
			k.put("new", keyedRestAt(now))
			_, ok := k.get("new", now.Add(sweepEvery+1))
			assert.True(t, ok)
		})
	}
}
