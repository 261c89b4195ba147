package egress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// RetryPolicy says which failed requests a Transport sends again, and how
// patiently. Set it with WithRetry; a Transport without one never retries
// (it still honours the pauses providers ask for). Every zero field means the
// default written beside it.
//
// What is retried, and why:
//   - 429, 503 and 529 (Anthropic's overloaded_error) mean the provider
//     did not process the request (RFC 9110: a 503 says the server is
//     unable to handle it): retried whatever the method, as the providers'
//     own SDKs retry them.
//   - A 529, or a 503 without Retry-After, is the provider's own overload,
//     not the caller's quota: its request waits at least a short fixed
//     pause (1 s) before it goes again, and the key is neither held nor
//     slowed.
//   - A network error, or another status of RetryableStatuses, may come after
//     the provider acted: retried only for idempotent methods (GET, HEAD,
//     OPTIONS, TRACE, PUT, DELETE) or requests with an Idempotency-Key header.
//   - A request with a body is sent again only through req.GetBody (which
//     http.NewRequest sets for in-memory bodies); without it the response is
//     returned as it is.
//   - Certificate errors and the context's own end are never retried.
//
// The wait before a retry is the longer of the response's Retry-After and a
// full-jitter backoff: random(0, min(MaxDelay, BaseDelay·2^n)). When that
// wait would outlast the context's deadline, MaxElapsed, or when Retry-After
// asks for more than MaxRetryAfter, the caller gets the response at once.
// Every retry passes the limiter again.
//
// A Transport with a RetryPolicy is the one layer that retries: see
// SDKRetries for how it keeps a provider's SDK above it from sending its
// calls again.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts in all, the first included.
	// Default 3; 1 disables retries (pauses are still honoured).
	MaxAttempts int
	// BaseDelay is the backoff ceiling of the first retry. Default 200ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling. Default 10s; at least BaseDelay.
	MaxDelay time.Duration
	// MaxElapsed bounds the time from the first attempt to the start of the
	// last: no retry starts later. Default 1m.
	MaxElapsed time.Duration
	// MaxRetryAfter is the longest Retry-After a retry waits for: a
	// response asking for more is returned at once. Default 1m. (How long a
	// response may hold its key is the Transport's WithMaxPause and
	// WithMaxQuotaHold.)
	MaxRetryAfter time.Duration
	// RetryableStatuses are the statuses worth another attempt.
	// Default 429, 502, 503, 504, 529.
	RetryableStatuses []int
	// Classify, when set, decides first: it sees each attempt's response or
	// error and returns RetryDefault to apply the rules above, RetryYes to
	// retry whatever the method, or RetryNo. A request whose body cannot be
	// sent again is never retried, whatever Classify says.
	Classify func(req *http.Request, resp *http.Response, err error) RetryDecision
	// BudgetRatio caps retries at this fraction of recent first attempts
	// (over the last 10 s, per Transport), so that an outage does not
	// multiply the traffic. Default 0.2. What it counts is what an outage
	// looks like: network errors, 5xx, overload, and throttles about the
	// quota. A throttle that the provider asks to be retried (a
	// Retry-After, or Stripe-Should-Retry/x-should-retry: true) and says
	// is not about the quota (Stripe's lock_timeout, Discord's shared
	// scope, or a count of requests with room left) is not an outage: its
	// retries draw on an allowance of their own, one retry per recent
	// first attempt (as AWS's retry quota charges a throttle and a timeout
	// differently), so a provider that asks for them never exhausts the
	// budget, and a hostile one cannot more than double the traffic.
	BudgetRatio float64
	// BudgetFloor is the number of retries allowed per 10 s however few the
	// first attempts, so a quiet service can still retry. It is a minimum,
	// not an addition: a busy Transport retries BudgetRatio of its first
	// attempts, and a fleet of N Transports does not add N floors to that.
	// Default 10.
	BudgetFloor int
	// ErrorOnExhausted, when true, turns the last response of a request that
	// ran out of attempts, time or budget into a *RetryError (its body is
	// drained and closed). By default the caller gets that response, as
	// http.Client would.
	ErrorOnExhausted bool
	// SDKRetries, when true, lets a layer above the Transport retry too: a
	// provider's SDK (openai-go, anthropic-sdk-go, stripe-go) that has the
	// Transport as its HTTP client sends again, by default, what egress
	// returns, and the two layers' attempts multiply (3 × 3 = 9 attempts
	// at the provider for one call). By default (false) the Transport is
	// the one layer that retries:
	//   - every response it returns with an error status carries
	//     X-Should-Retry: false and Stripe-Should-Retry: false, the words
	//     with which providers tell their SDKs not to retry; and
	//   - a call it ended with an error (a refusal, or a network error it
	//     would not retry), sent again within 10 s by an SDK (a request
	//     with X-Stainless-Retry-Count above 0 and the same body, or with
	//     the same Idempotency-Key and context deadline, to the same
	//     method, host and path), is not sent: the SDK gets the same error
	//     at once; and
	//   - a call with an Idempotency-Key that it ended with an error
	//     status (stripe-go sends a 429 lock_timeout again by its body,
	//     whatever the headers say), sent again within 10 s, is answered
	//     with a copy of that response (its body, up to 16 KiB, is read
	//     before the response is returned), again without being sent.
	// So a provider sees at most MaxAttempts attempts of a call, and a
	// call egress refuses is never sent.
	SDKRetries bool
}

// RetryDecision is what RetryPolicy.Classify says of an attempt.
type RetryDecision uint8

const (
	// RetryDefault applies the policy's own rules.
	RetryDefault RetryDecision = iota
	// RetryYes retries, whatever the method (the budget, attempts and the
	// body rule still apply).
	RetryYes
	// RetryNo returns the response or error as it is.
	RetryNo
)

// The defaults of RetryPolicy.
const (
	defaultMaxAttempts   = 3
	defaultBaseDelay     = 200 * time.Millisecond
	defaultMaxDelay      = 10 * time.Second
	defaultMaxElapsed    = time.Minute
	defaultMaxRetryAfter = time.Minute
	defaultBudgetRatio   = 0.2
	defaultBudgetFloor   = 10
	// overloadPause is the least a request answered 529, or 503 without
	// Retry-After, waits before it is sent again (see Signal.overloaded).
	overloadPause = time.Second
)

var defaultRetryableStatuses = []int{
	http.StatusTooManyRequests, http.StatusBadGateway,
	http.StatusServiceUnavailable, http.StatusGatewayTimeout,
	statusOverloaded,
}

// withDefaults returns p with its zero fields set, or an error naming the
// first invalid field.
func (p RetryPolicy) withDefaults() (RetryPolicy, error) {
	bad := func(field string, v any, why string) (RetryPolicy, error) {
		return p, configError("WithRetry: RetryPolicy."+field, v, why)
	}
	switch {
	case p.MaxAttempts < 0:
		return bad("MaxAttempts", p.MaxAttempts, "must not be negative")
	case p.BaseDelay < 0:
		return bad("BaseDelay", p.BaseDelay, "must not be negative")
	case p.MaxDelay < 0:
		return bad("MaxDelay", p.MaxDelay, "must not be negative")
	case p.MaxElapsed < 0:
		return bad("MaxElapsed", p.MaxElapsed, "must not be negative")
	case p.MaxRetryAfter < 0:
		return bad("MaxRetryAfter", p.MaxRetryAfter, "must not be negative")
	case p.BudgetRatio < 0 || p.BudgetRatio != p.BudgetRatio:
		return bad("BudgetRatio", p.BudgetRatio, "must not be negative")
	case p.BudgetFloor < 0:
		return bad("BudgetFloor", p.BudgetFloor, "must not be negative")
	}
	for _, s := range p.RetryableStatuses {
		if s < 100 || s > 599 {
			return bad("RetryableStatuses", s, "is not an HTTP status")
		}
	}
	set := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	set(&p.BaseDelay, defaultBaseDelay)
	set(&p.MaxDelay, max(defaultMaxDelay, p.BaseDelay))
	set(&p.MaxElapsed, defaultMaxElapsed)
	set(&p.MaxRetryAfter, defaultMaxRetryAfter)
	if p.MaxDelay < p.BaseDelay {
		return bad("MaxDelay", p.MaxDelay, fmt.Sprintf("must be at least BaseDelay (%v)", p.BaseDelay))
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = defaultMaxAttempts
	}
	if p.BudgetRatio == 0 {
		p.BudgetRatio = defaultBudgetRatio
	}
	if p.BudgetFloor == 0 {
		p.BudgetFloor = defaultBudgetFloor
	}
	if p.RetryableStatuses == nil {
		p.RetryableStatuses = defaultRetryableStatuses
	} else {
		p.RetryableStatuses = slices.Clone(p.RetryableStatuses)
	}
	return p, nil
}

// ErrRetriesExhausted matches a *RetryError: the request failed on every
// attempt it was allowed.
var ErrRetriesExhausted = errors.New("egress: retries exhausted")

// RetryError is returned, when RetryPolicy.ErrorOnExhausted is set, for a
// request that failed on its last allowed attempt. It matches
// ErrRetriesExhausted, and unwraps to the last attempt's error, if any.
type RetryError struct {
	Key      string // the request's limiter key
	Attempts int    // attempts made
	Status   int    // the last response's status; 0 when it was an error
	// RetryAfter is the wait the last response asked for (Retry-After and
	// its kin), also when it is longer than the pause cap (WithMaxPause)
	// or MaxRetryAfter and the request was given up for it; 0 when it
	// asked for none.
	RetryAfter time.Duration
	Err        error // the last attempt's error; nil when there was a response
}

// Error describes the failure.
func (e *RetryError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("egress: key %q: gave up after %d attempts: %v", e.Key, e.Attempts, e.Err)
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("egress: key %q: gave up after %d attempts: status %d, asked to wait %v", e.Key, e.Attempts, e.Status, e.RetryAfter)
	}
	return fmt.Sprintf("egress: key %q: gave up after %d attempts: status %d", e.Key, e.Attempts, e.Status)
}

// Unwrap links the error to ErrRetriesExhausted and to the last error.
func (e *RetryError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrRetriesExhausted, e.Err}
	}
	return []error{ErrRetriesExhausted}
}

// worthRetry applies the rules of RetryPolicy to one attempt, before
// attempts, time and budget are counted. hasRetryAfter says whether the
// response carried a usable Retry-After.
func (p *RetryPolicy) worthRetry(req *http.Request, resp *http.Response, err error, s *Signal) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // it cannot be sent again
	}
	switch p.decide(req, resp, err) {
	case RetryNo:
		return false
	case RetryYes:
		return true
	}
	// The provider's own word (x-should-retry, Stripe-Should-Retry, a
	// billing error) comes next.
	switch {
	case s.Scope == ScopeBilling || s.Retry == RetryNo:
		return false
	case s.Retry == RetryYes && (err == nil && (s.throttled() || idempotent(req))):
		return true
	}
	switch {
	case err != nil:
		return transient(req, err) && idempotent(req)
	case !slices.Contains(p.RetryableStatuses, resp.StatusCode):
		return false
	case resp.StatusCode == http.StatusTooManyRequests,
		resp.StatusCode == http.StatusServiceUnavailable,
		resp.StatusCode == statusOverloaded:
		return true // not processed: safe for any method
	}
	return idempotent(req)
}

func (p *RetryPolicy) decide(req *http.Request, resp *http.Response, err error) RetryDecision {
	if p.Classify == nil {
		return RetryDefault
	}
	return p.Classify(req, resp, err)
}

// idempotent reports whether sending req twice is as good as once: its
// method is idempotent (RFC 9110) or it carries an Idempotency-Key.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get("Idempotency-Key") != ""
}

// transient reports whether a transport error may go away on another
// attempt: not the end of the request's context, not a certificate that
// failed verification.
func transient(req *http.Request, err error) bool {
	if req.Context().Err() != nil {
		return false
	}
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
	)
	return !errors.As(err, &verr) && !errors.As(err, &uerr) && !errors.As(err, &herr) && !errors.As(err, &cerr)
}

// retryBudget caps the retries of a Transport at ratio × the first attempts
// of the last 10 seconds, or at floor when that is more. The floor is a
// minimum (Envoy's min_retry_concurrency; Gateway API GEP-3388: "the budget
// for retries never goes below this minimum value"), not a reserve added to
// the ratio as in Finagle's RetryBudget: added, every instance of a fleet
// adds its floor, and the fleet retries more, the more instances share its
// traffic. It counts in one-second slots.
//
// The first attempts, counted on every request, are counted without the
// lock (firsts: the lock, taken and given back, was about 15 ns of the
// allowed path), the retries under it. A slot of either holds one second, and is
// emptied when a count of another second comes to it; a second counts
// while it is one of the last 10, so the two need not be emptied together.
type retryBudget struct {
	ratio float64
	floor int

	firsts [budgetSlots]atomic.Uint64 // second s's first attempts in firsts[budgetIndex(s)] (see firstsOf)

	mu    sync.Mutex
	slots [budgetSlots]budgetSlot // guarded by mu; slot budgetIndex(s) holds second s
}

// budgetSeconds is the seconds a retry budget counts; budgetSlots the
// slots that hold them, a power of two no fewer, so that a second's slot
// is its low bits (two divisions by 10 were 7 ns of the allowed path).
const budgetSeconds, budgetSlots = 10, 16

type budgetSlot struct {
	sec     int64
	retries int
	asked   int // retries of throttles the provider asked for (see RetryPolicy.BudgetRatio)
}

// budgetIndex returns the slot of second sec (a time before 1970 too:
// its low bits are in range as well).
func budgetIndex(sec int64) int64 { return sec & (budgetSlots - 1) }

// slot returns the slot of now's second, emptied if it held an older one.
// The caller holds mu.
func (b *retryBudget) slot(now time.Time) *budgetSlot {
	sec := now.Unix()
	s := &b.slots[budgetIndex(sec)]
	if s.sec != sec {
		*s = budgetSlot{sec: sec}
	}
	return s
}

// deposit records a first attempt: one more in its second's slot, which
// it empties first when it held another second. A slot packs the low 32
// bits of its second above its count (see firstsOf), so that one
// compare-and-swap moves both.
func (b *retryBudget) deposit(now time.Time) {
	sec := now.Unix()
	w := &b.firsts[budgetIndex(sec)]
	for {
		old := w.Load()
		next := uint64(uint32(sec))<<32 | 1
		if uint32(old>>32) == uint32(sec) {
			next = old + 1
		}
		if w.CompareAndSwap(old, next) {
			return
		}
	}
}

// firstsOf returns the first attempts of the seconds from oldest on, now's
// second being sec.
func (b *retryBudget) firstsOf(sec, oldest int64) int {
	n := 0
	for i := range b.firsts {
		v := b.firsts[i].Load()
		// The slot's second, from its low 32 bits: within 68 years of now.
		at := sec + int64(int32(uint32(v>>32)-uint32(sec)))
		if at >= oldest {
			n += int(uint32(v))
		}
	}
	return n
}

// withdraw takes one retry from the budget, or reports that there is none.
// asked says the retry is of a throttle the provider asked to be retried
// and said is not about the quota: it draws on its own allowance, one
// retry per first attempt (or the floor), not on the budget.
func (b *retryBudget) withdraw(now time.Time, asked bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.slot(now)
	oldest := now.Unix() - budgetSeconds + 1
	firsts, retries, askedFor := b.firstsOf(now.Unix(), oldest), 0, 0
	for _, s := range b.slots {
		if s.sec >= oldest {
			retries += s.retries
			askedFor += s.asked
		}
	}
	if asked {
		if askedFor+1 > max(firsts, b.floor) {
			return false
		}
		cur.asked++
		return true
	}
	if float64(retries+1) > max(b.ratio*float64(firsts), float64(b.floor)) {
		return false
	}
	cur.retries++
	return true
}

// askedRetry reports whether s is a throttle that the provider asks to be
// retried (a Retry-After, or its own word) and says is not about the
// caller's quota: a retry of it does not count against the retry budget.
func askedRetry(s *Signal) bool {
	if !(s.HasRetryAfter || s.Retry == RetryYes) {
		return false
	}
	q, _, ok := s.requestQuota()
	return s.notAboutQuota(q, ok)
}
