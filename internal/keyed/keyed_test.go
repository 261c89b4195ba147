package keyed

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// epoch is the tests' start.
var epoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// keyedRestAt is a state that comes to rest at a given time.
type keyedRestAt time.Time

func (r keyedRestAt) AtRest(now time.Time) bool { return !now.Before(time.Time(r)) }

// keyedMapID identifies the map k holds, to tell when it was rebuilt.
func keyedMapID[T Resting](k *Map[T]) uintptr { return reflect.ValueOf(k.M).Pointer() }

func TestKeyedSweepCadence(t *testing.T) {
	at := func(d time.Duration) time.Time { return epoch.Add(d) }
	k := New[keyedRestAt]()
	require.Equal(t, SweepEvery, k.Every)

	// The first get sweeps (there was never a sweep) and starts the cadence.
	_, ok := k.Get("x", at(0))
	require.False(t, ok)
	assert.Equal(t, at(0), k.LastSweep)

	k.Put("a", keyedRestAt(at(time.Second))) // at rest from 1s
	for i, s := range []struct {
		at        time.Duration
		wantSweep bool
		wantA     bool
	}{
		{at: time.Second, wantA: true},
		{at: SweepEvery - 1, wantA: true}, // due only a full interval after the last
		{at: SweepEvery, wantSweep: true, wantA: false},
		{at: SweepEvery + 1},
		{at: 2*SweepEvery - 1},
		{at: 2 * SweepEvery, wantSweep: true},
	} {
		before := k.LastSweep
		assert.Equal(t, s.wantSweep, k.SweepDue(at(s.at)), "step %d", i)
		_, gotA := k.Get("a", at(s.at))
		assert.Equal(t, s.wantA, gotA, "step %d", i)
		if s.wantSweep {
			assert.Equal(t, at(s.at), k.LastSweep, "step %d", i)
		} else {
			assert.Equal(t, before, k.LastSweep, "step %d", i)
		}
	}
}

func TestKeyedSweepDropsOnlyStatesAtRest(t *testing.T) {
	at := func(d time.Duration) time.Time { return epoch.Add(d) }
	k := New[keyedRestAt]()
	k.Get("", at(0))
	k.Put("past", keyedRestAt(at(-time.Hour)))
	k.Put("now", keyedRestAt(at(SweepEvery)))
	k.Put("soon", keyedRestAt(at(SweepEvery+1)))
	k.Put("later", keyedRestAt(at(time.Hour)))

	k.Sweep(at(SweepEvery))
	assert.ElementsMatch(t, []string{"soon", "later"}, keyedKeysOf(k.M))
	assert.Equal(t, 2, k.Len())

	k.Sweep(at(time.Hour - 1))
	assert.ElementsMatch(t, []string{"later"}, keyedKeysOf(k.M))
	k.Sweep(at(time.Hour))
	assert.Zero(t, k.Len())
}

func keyedKeysOf[T any](m map[string]T) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

func TestKeyedRebuildsMapAfterSpike(t *testing.T) {
	now := epoch
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
			k := New[keyedRestAt]()
			k.Get("", now)
			for i := range tc.keys {
				rest := now // at rest at the sweep
				if i < tc.keep {
					rest = now.Add(time.Hour)
				}
				k.Put(strconv.Itoa(i), keyedRestAt(rest))
			}
			require.Equal(t, tc.keys, k.Peak)
			id := keyedMapID(&k)

			k.Sweep(now.Add(SweepEvery))
			assert.Equal(t, tc.keep, k.Len())
			for i := range tc.keep {
				_, ok := k.M[strconv.Itoa(i)]
				require.True(t, ok, "key %d survives", i)
			}
			assert.Equal(t, tc.wantRebuilt, keyedMapID(&k) != id, "map rebuilt")
			if tc.wantRebuilt {
				assert.Equal(t, tc.keep, k.Peak, "the peak restarts from the survivors")
			} else {
				assert.Equal(t, tc.keys, k.Peak)
			}

			// The rebuilt map works as before.
			k.Put("new", keyedRestAt(now))
			_, ok := k.Get("new", now.Add(SweepEvery+1))
			assert.True(t, ok)
		})
	}
}
