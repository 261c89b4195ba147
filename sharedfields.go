package egress

// The names of the fields of the fleet's Redis hashes, which the scripts
// (internal/lua) read and write: each written once, here, and generated
// into internal/lua/fields.lua as field.<name> (TestScriptTune; go
// generate ./...), whose constant is field<Name>. A name is stored in
// Redis: a running fleet's state is read by it, so it never changes.
// Times are microseconds of the Redis server's clock, rates units per
// second. (The tenants' shares, a hash of their own, are named by
// internal/fair's Shares and its Lua twin, shares.lua: "v<level>",
// "f<level>:<tenant>", "u<level>:<tenant>".)

// A key's learnt state, the hash redisKeys names "rate" (rate.lua's
// header; internal/control's State, field for field): the advertised
// limit and discovery's climb back after a decrease.
const (
	fieldAdv   = "adv"   // the advertised limit
	fieldAdvu  = "advu"  // until when the advertised limit is believed
	fieldWmax  = "wmax"  // the rate the climb back aims at
	fieldW0    = "w0"    // the rate right after the last decrease
	fieldClimb = "climb" // when the climb starts: the decrease, or the end of the hold it came with
	fieldPl    = "pl"    // the seconds the climb stays at its aim before it grows beyond (internal/control's plateauFor; absent: none)
	fieldDec   = "dec"   // when the last decrease was decided (or the last turn given before it)
	fieldGd    = "gd"    // a rate the fleet was accepted at for a second before a throttle without counts (good)
	fieldBk    = "bk"    // when the fleet tries gd again (back)
	fieldBn    = "bn"    // the tries of gd refused since (backN)
)

// A key's learnt state: what its reset means (its shape), and what tells
// it (internal/control's learnShape and bucketHold).
const (
	fieldShape = "shape" // what the key's reset means: 0 unknown, 1 a window, 2 a bucket
	fieldZat   = "zat"   // when a "remaining 0" was last seen
	fieldZun   = "zun"   // the reset it came with
	fieldZunit = "zunit" // its reset over its limit: the longest a bucket takes to refill a unit (0: unknown)
	fieldZres  = "zres"  // its reset's resolution: an acceptance read later than zun less it tells no shape
	fieldSag   = "sag"   // the acceptances after the zero, read within its resolution, that said none was left
	fieldSar   = "sar"   // 1 when one of them, or another, said some was left, short of the whole limit
	fieldAmb   = "amb"   // the acceptances after the zero in a row that had the whole limit back (ambiguous)
	fieldBwt   = "bwt"   // the end of the latest Retry-After a refusal from a bucket stated (bucketWait)
)

// A key's learnt state: storms, and the probes after a hold that a
// throttle without counts set (internal/control's Storm; control.lua sets
// them, reserve.lua grants the probes).
const (
	fieldStorm = "storm" // until when throttles without counts are believed not to be about the quota
	fieldParm  = "parm"  // until when a sign of a storm arms the probes of every hold
	fieldPh    = "ph"    // the end of the hold the probes follow
	fieldPk    = "pk"    // how many probes follow it
	fieldPg    = "pg"    // the gap between two probes
	fieldPc    = "pc"    // how many of them were granted
	fieldPn    = "pn"    // the earliest turn of the next probe
)

// A key's learnt state: the budget a report of a window's quota leaves
// the fleet (internal/control's State.report and Spend), and the rings
// that count the fleet's turns and refusals (rate.lua's tally).
const (
	fieldBud    = "bud"    // the units the fleet may still be granted before budu
	fieldBudu   = "budu"   // until when the budget holds: the report's reset
	fieldBudn   = "budn"   // the report's reset over its limit (0: none)
	fieldBudr   = "budr"   // the provider's remaining that the report stated
	fieldBudres = "budres" // the resolution the report's reset was read to
	fieldHist   = "hist"   // since when the ring of grants records them (the key's first grant)
	fieldHend   = "hend"   // the latest turn given in the key's first second before any refusal (see internal/control's collides)
	fieldG      = "g"      // the ring of grants: g0, g1, ... (ringSize slots of ringSlot), "<slot>:<units>"
	fieldF      = "f"      // the ring of refusals, by send time: f0 .. f3 (a meterSlot each), "<slot>:<count>"
	fieldRts    = "rts"    // how many changes of the rate have moved the turns given (retime)
)

// A key's learnt state: what a bucket's counts show (rate.lua's drain;
// internal/control's roomy and DrainMark).
const (
	fieldRoom  = "room"  // when a bucket's count last showed room
	fieldRoomr = "roomr" // the rate then
	fieldDra   = "dra"   // the first count of a bucket's stretch below full: when its request was sent
	fieldDrr   = "drr"   // that count's remaining
	fieldDrf   = "drf"   // the refusals to requests sent since dra: turns the bucket did not take
)

// A key's place in the fleet's priority order (fairstate.lua): fields of
// its learnt state for the shared buckets, of the hash redisKeys names
// "order" for a SharedLimits. Doubles at full precision.
const (
	fieldO0c = "o0c" // the credit of level 0 (low), us of work
	fieldO1c = "o1c" // the credit of level 1 (normal), us of work
	fieldO0u = "o0u" // until when level 0 has a request held back
	fieldO1u = "o1u" // until when level 1 has a request held back
)

// A limit's state in a SharedLimits (limits.lua), the hash redisKeys
// names after the limit's index.
const (
	fieldA = "a" // a bucket's tat; a window's sum of the costs it holds
	fieldB = "b" // a bucket's last turn given; a window's count of its grants, which names a charge or a cap
)
