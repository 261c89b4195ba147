package fair

import (
	_ "embed"
	"strconv"
	"strings"
)

// Shares is the fleet's side of the tenants' fair shares within each level
// of one key: what a shared limiter's script keeps in Redis so that the
// tenants of a level share the limit max-min fairly across instances, as a
// Queue shares it within one.
//
// It is start-time fair queuing without a queue: each tenant has a tag,
// the work it has been served (over its weight), and each level a virtual
// time, the tag of the last turn given. A tenant that comes to the level
// after a pause starts level with the virtual time (a pause is not
// banked). A tenant with a request held back (by the level's horizon, see
// Order, or by Shares itself) is waiting, and its tag stays where it
// was; a request of a tenant whose tag is more than a quantum ahead of a
// waiting tenant's is held back too, so that the waiting one takes the
// turns that come. A light tenant's requests thus go as they come, and
// the heavy ones share what is left.
//
// The state is a flat map of fields, as the script keeps it in a Redis
// hash: "v<level>" the level's virtual time, "f<level>:<tenant>" a
// tenant's tag and "u<level>:<tenant>" until when it is waiting (absent:
// not waiting). Fields are kept while they matter: a tenant neither
// waiting nor ahead of the virtual time is dropped (it would start level
// with it anyway). Work and times are microseconds, as float64: the
// script restates these functions in Lua (shares.lua, embedded as
// SharesLua) on the same doubles, and the two are held to agree exactly.
type Shares map[string]float64

// SharesLua is shares.lua: Shares's functions in Lua, for the shared
// limiters' scripts.
//
//go:embed shares.lua
var SharesLua string

func tagField(lv int, tenant string) string  { return "f" + strconv.Itoa(lv) + ":" + tenant }
func waitField(lv int, tenant string) string { return "u" + strconv.Itoa(lv) + ":" + tenant }
func vField(lv int) string                   { return "v" + strconv.Itoa(lv) }

// Arrive notes a request of tenant at level lv at now: a tenant not
// waiting starts no lower than the level's virtual time.
func (s Shares) Arrive(lv int, tenant string, now float64) {
	if s[waitField(lv, tenant)] <= now {
		delete(s, waitField(lv, tenant))
		s[tagField(lv, tenant)] = max(s[tagField(lv, tenant)], s[vField(lv)])
	}
}

// Behind reports whether another tenant of level lv is waiting at now
// with a tag more than quantum behind tenant's: tenant's request is then
// held back.
func (s Shares) Behind(lv int, tenant string, now, quantum float64) bool {
	mine := s[tagField(lv, tenant)]
	prefix := waitField(lv, "")
	for f, until := range s {
		if !strings.HasPrefix(f, prefix) || until <= now {
			continue
		}
		other := f[len(prefix):]
		if other != tenant && s[tagField(lv, other)]+quantum < mine {
			return true
		}
	}
	return false
}

// Wait marks tenant waiting at level lv until until.
func (s Shares) Wait(lv int, tenant string, until float64) {
	s[waitField(lv, tenant)] = max(s[waitField(lv, tenant)], until)
}

// Grant accounts a turn of work given to tenant at level lv, of weight
// weight: the level's virtual time moves to the tenant's tag, which moves
// on by the work over the weight. The tenant's mark stays until it ends:
// its other requests held back, in other instances, come back within it.
// (Cleared at a grant, a tenant of many instances counted as not
// waiting between two of its returns, and one of two instances took two
// thirds of the turns.)
func (s Shares) Grant(lv int, tenant string, weight, work float64) {
	tag := s[tagField(lv, tenant)]
	s[vField(lv)] = max(s[vField(lv)], tag)
	s[tagField(lv, tenant)] = tag + work/weight
}

// Prune drops the marks of the tenants, of any level, that are not
// waiting at now, and those tenants when they are not ahead of their
// level's virtual time.
func (s Shares) Prune(now float64) {
	for f, tag := range s {
		if f[0] != 'f' {
			continue
		}
		lv, tenant, _ := strings.Cut(f[1:], ":")
		if s["u"+lv+":"+tenant] > now {
			continue
		}
		delete(s, "u"+lv+":"+tenant)
		if tag <= s["v"+lv] {
			delete(s, f)
		}
	}
}

// Ask decides a request's turn in the fleet: of tenant at level lv, of
// work, whose turn would come at at, at now, given the horizon and the
// share of a level held back (0: no order, no shares; every request
// goes). A request is held back for a horizon, o untouched, when another
// tenant of its level waits more than a horizon's work behind its own;
// else Order.Decide on o says. A request it holds back marks its tenant
// waiting until a horizon past its come-back, and one it lets go until a
// horizon past its turn (a tenant's requests come one after another: in
// the turns between, one that came back after a grant within the horizon
// was lifted to the virtual time, and lost what it was owed). A light
// tenant's requests, lifted on arrival, are not behind, and hold nobody
// back. A request that goes is granted by the caller (Shares.Grant), once
// its turn is final.
func Ask(o *Order, s Shares, lv int, tenant string, work, at, now, horizon, share float64) (Verdict, float64) {
	if share <= 0 {
		return o.Decide(lv, work, at, now, horizon, share)
	}
	s.Arrive(lv, tenant, now)
	if s.Behind(lv, tenant, now, horizon) {
		s.Wait(lv, tenant, now+2*horizon)
		return Later, now + horizon
	}
	v, back := o.Decide(lv, work, at, now, horizon, share)
	if v == Later {
		s.Wait(lv, tenant, back+horizon)
	} else {
		// Its next request, if it has one, comes once this one is
		// sent: till then it waits, as one held back does.
		s.Wait(lv, tenant, at+horizon)
	}
	return v, back
}
