package egress

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egress-go/egress/internal/usage"
)

// CostLimiter is a Limiter that counts a request's cost in several
// dimensions (requests, tokens) and settles it once the response tells the
// actual cost. Limits implements it. A Transport made WithCosts asks its
// limiter for a Cost instead of an int.
type CostLimiter interface {
	Limiter
	// WaitCost is Limiter.Wait for a cost in dimensions: it grants every
	// dimension's cost at one turn, or none.
	WaitCost(ctx context.Context, key string, cost Cost, maxWait time.Duration) (Grant, error)
	// Settle charges or refunds the difference between what g was
	// granted and actual. It must be quick and safe for concurrent use.
	Settle(g Grant, actual Cost)
}

// checkCosts validates WithCosts against the other options.
func (c *config) checkCosts() {
	if c.costs == nil {
		return
	}
	if c.costFuncSet {
		c.errs = append(c.errs, configError("WithCosts", "with WithCostFunc", "give one cost function: WithCosts for costs in dimensions, WithCostFunc for requests only"))
	}
	if _, ok := c.limiter.(CostLimiter); !ok {
		c.errs = append(c.errs, configError("WithCosts: limiter", fmt.Sprintf("%T", c.limiter), "must count costs in dimensions (a CostLimiter, such as Limits)"))
	}
}

// costOf returns the cost of req: in dimensions with WithCosts, else in
// requests.
func (t *Transport) costOf(req *http.Request, key string) (Cost, error) {
	if t.costs == nil {
		if t.costFunc == nil {
			return Cost{Requests: 1}, nil // no WithCostFunc: a request costs one
		}
		n := t.costFunc(req)
		if n < 0 {
			return Cost{}, fmt.Errorf("egress: CostFunc returned %d for key %q: a cost must not be negative", n, key)
		}
		return Cost{Requests: n}, nil
	}
	c := t.costs(req)
	if d, neg := c.negative(); neg {
		return Cost{}, fmt.Errorf("egress: WithCosts returned %d %s for key %q: a cost must not be negative", c.Of(d), d, key)
	}
	return c, nil
}

// settleThrottled settles a throttled attempt granted g at no tokens (the
// provider ran nothing), before the counts its response carries teach the
// limiter: the room they leave is the provider's, with this attempt's
// estimate already given back.
func (t *Transport) settleThrottled(g *Grant, s *Signal) {
	if t.costLimiter == nil || g.At.IsZero() || !s.throttled() {
		return
	}
	t.costLimiter.Settle(*g, Cost{Requests: g.Cost.Requests})
	*g = Grant{} // settled
}

// settle settles the attempt granted g once its response tells its cost,
// at the end of the body (see usageBody). It returns the response to hand
// on.
func (t *Transport) settle(g *Grant, resp *http.Response, err error) *http.Response {
	if t.costLimiter == nil || g.At.IsZero() || err != nil || resp == nil {
		return resp
	}
	if resp.Body == nil || resp.Body == http.NoBody || resp.StatusCode == http.StatusSwitchingProtocols {
		return resp
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	resp.Body = &usageBody{ReadCloser: resp.Body, grant: *g, lim: t.costLimiter, sse: sse}
	return resp
}

// usageBody reads the usage objects of a body as the caller reads it, and
// settles its grant at the body's end: when a read returns io.EOF, or when
// the caller closes it after the usage is complete (a JSON body whose usage
// object was read whole; a stream after its end, OpenAI's "[DONE]" or
// Anthropic's message_stop, as the SDKs stop reading there). A body closed
// before then keeps its estimate: a stream cut short tells only part of its
// usage. The caller's bytes pass unchanged.
type usageBody struct {
	io.ReadCloser
	grant Grant
	lim   CostLimiter
	sse   bool // a server-sent-event stream
	done  atomic.Bool

	mu   sync.Mutex // guards scan against a Close during a Read
	scan usage.Scan
}

func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.done.Load() {
		b.mu.Lock()
		b.scan.Feed(p[:n])
		b.mu.Unlock()
	}
	if err == io.EOF {
		b.settle(true)
	}
	return n, err
}

// Close closes the body, and settles it when its usage is complete.
func (b *usageBody) Close() error {
	b.settle(false)
	return b.ReadCloser.Close()
}

// settle settles the grant once, at the body's end (eof) or at its close.
func (b *usageBody) settle(eof bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	b.mu.Lock()
	complete := eof || b.scan.Complete(b.sse)
	actual, ok := scanCost(&b.scan, b.grant.Cost)
	b.mu.Unlock()
	if ok && complete {
		b.lim.Settle(b.grant, actual)
	}
}

// scanCost returns est with the dimensions the usage s read told replaced
// by its counts (tokens being total_tokens, or input plus output), and
// false when s read no usage.
func scanCost(s *usage.Scan, est Cost) (Cost, bool) {
	u, ok := s.Counts()
	if !ok {
		return est, false
	}
	c := est
	if u.HasInput {
		c.InputTokens = u.Input
	}
	if u.HasOutput {
		c.OutputTokens = u.Output
	}
	switch {
	case u.HasTotal:
		c.Tokens = u.Total
	case u.HasInput && u.HasOutput:
		c.Tokens = u.Input + u.Output
	}
	if u.HasPoints {
		c.Points = u.Points
	}
	return c, true
}

// maxCostBody caps the bytes of a request body LLMCost reads.
const maxCostBody = 4 << 20

// LLMCost estimates the cost of an LLM API call from its request, for
// WithCosts: 1 request, and tokens of input and output. The input is the
// body's size over 4 (about 4 bytes a token for English text, which the
// JSON around the prompt only raises: an over-estimate, refunded when the
// response tells the usage), except that an inline image (base64 data of at
// least 1 KiB in a data URL or after an "image/..." media type, as OpenAI's
// and Anthropic's bodies carry them) counts as 1,600 tokens, about the most
// one image costs, not by its size; the output is the body's max_tokens,
// max_completion_tokens or max_output_tokens (OpenAI's and Anthropic's
// names), which is what OpenAI reserves at admission, or 0 when it sets
// none (the output is then charged when the response tells it). It reads a
// copy of the body through GetBody (set by http.NewRequest for in-memory
// bodies), at most 4 MiB; without GetBody it counts the request only.
func LLMCost(req *http.Request) Cost {
	c := Cost{Requests: 1}
	if req.GetBody == nil || req.Body == nil || req.Body == http.NoBody {
		return c
	}
	rc, err := req.GetBody()
	if err != nil {
		return c
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxCostBody))
	if err != nil {
		return c
	}
	c.InputTokens, c.OutputTokens = usage.Estimate(b)
	c.Tokens = c.InputTokens + c.OutputTokens
	return c
}
