package fleet

import (
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// requestIDHeader carries a call's identity, the same on each of its
// attempts, so that the provider can tell a request sent again from a new
// one.
const requestIDHeader = "X-Request-Id"

// requestLog is what the provider saw of each request identity: every
// arrival and its answer. Safe for concurrent use.
type requestLog struct {
	mu   sync.Mutex
	byID map[string][]exchange // guarded by mu
}

// exchange is one arrival of a request at the provider and its answer.
type exchange struct {
	arrived, answered time.Time
	status            int           // 0: the caller left before the answer
	retryAfter        time.Duration // the answer's Retry-After, whole seconds
}

// handler records each request that api answers.
func (l *requestLog) handler(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ex := exchange{arrived: time.Now()}
		api.ServeHTTP(&answerWriter{ResponseWriter: w, ex: &ex}, r)
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.byID == nil {
			l.byID = map[string][]exchange{}
		}
		id := r.Header.Get(requestIDHeader)
		l.byID[id] = append(l.byID[id], ex)
	})
}

// answerWriter notes the status, the time and the Retry-After of the answer.
type answerWriter struct {
	http.ResponseWriter
	ex *exchange
}

func (w *answerWriter) WriteHeader(status int) {
	w.ex.status, w.ex.answered = status, time.Now()
	if s, err := strconv.Atoi(w.Header().Get("Retry-After")); err == nil {
		w.ex.retryAfter = time.Duration(s) * time.Second
	}
	w.ResponseWriter.WriteHeader(status)
}

// resends is what the provider saw of requests sent again after a 429.
type resends struct {
	after429 int           // arrivals that followed a 429 of the same request
	early    int           // of them, arrivals before that 429's Retry-After had passed
	minGap   time.Duration // the shortest time from a 429's answer to the same request's next arrival
	minSlack time.Duration // the least of gap − Retry-After; negative when a request came early
}

// resends measures, per request identity, the time from each 429 to the
// next arrival of the same request.
func (l *requestLog) resends() resends {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r resends
	first := true
	for _, exs := range l.byID {
		exs = slices.Clone(exs)
		slices.SortFunc(exs, func(a, b exchange) int { return a.arrived.Compare(b.arrived) })
		for i := 0; i+1 < len(exs); i++ {
			if exs[i].status != http.StatusTooManyRequests {
				continue
			}
			gap := exs[i+1].arrived.Sub(exs[i].answered)
			slack := gap - exs[i].retryAfter
			r.after429++
			if slack < 0 {
				r.early++
			}
			if first || gap < r.minGap {
				r.minGap = gap
			}
			if first || slack < r.minSlack {
				r.minSlack = slack
			}
			first = false
		}
	}
	return r
}
