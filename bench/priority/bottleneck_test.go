package priority

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// prioQueue is a bottleneck-style priority queue over an x/time/rate
// limiter (Bottleneck, the Node.js library, orders its jobs this way): the
// waiters in a heap by priority, then arrival; one dispatcher takes the
// head, reserves its units from the limiter, sleeps until they are due and
// lets it go. A waiter whose context ends leaves the heap, or, when the
// dispatcher holds it, has its reservation cancelled. It knows no tenants
// and keeps no share for the lower priorities.
type prioQueue struct {
	lim  *rate.Limiter
	wake chan struct{} // a waiter arrived
	done chan struct{} // closed by close
	wg   sync.WaitGroup

	mu  sync.Mutex
	h   waiterHeap // guarded by mu
	seq uint64     // guarded by mu
}

type waiter struct {
	ctx   context.Context
	prio  int
	seq   uint64
	n     int
	idx   int           // in the heap; -1 once taken out
	ready chan struct{} // closed when granted
	err   error         // set before ready is closed: the units can never be granted
}

func newPrioQueue(lim *rate.Limiter) *prioQueue {
	q := &prioQueue{lim: lim, wake: make(chan struct{}, 1), done: make(chan struct{})}
	q.wg.Add(1)
	go q.dispatch()
	return q
}

// wait returns once n units are granted to a waiter of priority prio, or
// ctx's error.
func (q *prioQueue) wait(ctx context.Context, prio, n int) error {
	w := &waiter{ctx: ctx, prio: prio, n: n, ready: make(chan struct{})}
	q.mu.Lock()
	q.seq++
	w.seq = q.seq
	heap.Push(&q.h, w)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	select {
	case <-w.ready:
		return w.err
	case <-ctx.Done():
		q.mu.Lock()
		if w.idx >= 0 {
			heap.Remove(&q.h, w.idx)
		}
		q.mu.Unlock()
		return ctx.Err() // taken by the dispatcher: it cancels the reservation
	}
}

func (q *prioQueue) dispatch() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		for q.h.Len() == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
			case <-q.done:
				return
			}
			q.mu.Lock()
		}
		w := heap.Pop(&q.h).(*waiter)
		q.mu.Unlock()
		r := q.lim.ReserveN(time.Now(), w.n)
		if !r.OK() {
			w.err = fmt.Errorf("prioQueue: %d units exceed the burst %d", w.n, q.lim.Burst())
			close(w.ready)
			continue
		}
		tm := time.NewTimer(r.Delay())
		select {
		case <-tm.C:
			close(w.ready)
		case <-w.ctx.Done():
			tm.Stop()
			r.Cancel()
		case <-q.done:
			tm.Stop()
			return
		}
	}
}

func (q *prioQueue) close() { close(q.done); q.wg.Wait() }

// waiterHeap orders waiters by priority, highest first, then arrival.
type waiterHeap []*waiter

func (h waiterHeap) Len() int { return len(h) }
func (h waiterHeap) Less(i, j int) bool {
	if h[i].prio != h[j].prio {
		return h[i].prio > h[j].prio
	}
	return h[i].seq < h[j].seq
}
func (h waiterHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *waiterHeap) Push(x any)   { w := x.(*waiter); w.idx = len(*h); *h = append(*h, w) }
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.idx = -1
	return w
}
