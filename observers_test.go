package egress

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestObserversCallsEachInTurn(t *testing.T) {
	var calls []string
	rec := func(name string) Observer {
		return Observer{
			OnWait:            func(key string, d time.Duration) { calls = append(calls, name+" wait "+key+" "+d.String()) },
			OnReject:          func(key string, err error) { calls = append(calls, name+" reject "+key+" "+err.Error()) },
			OnSent:            func(key string, a, s int, _ error) { calls = append(calls, name+" sent "+key) },
			OnRetry:           func(key string, a int, d time.Duration, s int, _ error) { calls = append(calls, name+" retry "+key) },
			OnCooldown:        func(key string, _ time.Time, _ error) { calls = append(calls, name+" cooldown "+key) },
			OnBudgetExhausted: func(key string) { calls = append(calls, name+" budget "+key) },
			OnRateChange:      func(key string, _, _ Rate, why string) { calls = append(calls, name+" rate "+key+" "+why) },
			OnShadow:          func(key string, d time.Duration, _ error) { calls = append(calls, name+" shadow "+key+" "+d.String()) },
			OnNearLimit:       func(key string, q Quota) { calls = append(calls, name+" near "+key) },
		}
	}
	o := Observers(rec("a"), Observer{}, rec("b"))
	o.OnWait("k", time.Second)
	o.OnReject("k", errors.New("no"))
	o.OnSent("k", 1, 200, nil)
	o.OnRetry("k", 2, time.Second, 429, nil)
	o.OnCooldown("k", time.Time{}, nil)
	o.OnBudgetExhausted("k")
	o.OnRateChange("k", PerSecond(2), PerSecond(1), "advertised")
	o.OnShadow("k", time.Second, nil)
	o.OnNearLimit("k", Quota{})
	assert.Equal(t, []string{
		"a wait k 1s", "b wait k 1s",
		"a reject k no", "b reject k no",
		"a sent k", "b sent k",
		"a retry k", "b retry k",
		"a cooldown k", "b cooldown k",
		"a budget k", "b budget k",
		"a rate k advertised", "b rate k advertised",
		"a shadow k 1s", "b shadow k 1s",
		"a near k", "b near k",
	}, calls)
}

func TestObserversKeepsNilAndSingleHooks(t *testing.T) {
	var n int
	wait := func(string, time.Duration) { n++ }
	o := Observers(Observer{}, Observer{OnWait: wait})
	assert.Nil(t, o.OnReject)
	assert.Nil(t, o.OnSent)
	assert.Nil(t, o.OnRateChange)
	assert.Equal(t, reflect.ValueOf(wait).Pointer(), reflect.ValueOf(o.OnWait).Pointer(), "a single hook is used as it is")
	assert.Equal(t, Observer{}, Observers())
}

func TestObserversAllocatesNothing(t *testing.T) {
	var n int
	one := Observer{
		OnSent:     func(string, int, int, error) { n++ },
		OnCooldown: func(string, time.Time, error) { n++ },
	}
	o := Observers(one, one, one)
	until := time.Now()
	allocs := testing.AllocsPerRun(100, func() {
		o.OnSent("k", 1, 429, nil)
		o.OnCooldown("k", until, nil)
	})
	assert.Zero(t, allocs)
	assert.Positive(t, n)
}
