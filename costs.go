package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	scan usageScan
}

func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.done.Load() {
		b.mu.Lock()
		b.scan.feed(p[:n])
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
	complete := eof || b.scan.state == scanKey && (b.sse && b.scan.ended || !b.sse)
	actual, ok := b.scan.actual(b.grant.Cost)
	b.mu.Unlock()
	if ok && complete {
		b.lim.Settle(b.grant, actual)
	}
}

// The keys the scan looks for: a usage object (OpenAI, Anthropic),
// Shopify GraphQL's actual query cost (extensions.cost.actualQueryCost, a
// number), and the end of a stream (OpenAI's "[DONE]", Anthropic's
// message_stop).
var scanKeys = [...][]byte{[]byte(`"usage"`), []byte(`"actualQueryCost"`), []byte(`[DONE]`), []byte(`"message_stop"`)}

const (
	keyUsage = iota
	keyQueryCost
	keyDone
	keyMessageStop
	maxKeyLen = len(`"actualQueryCost"`)
)

// maxUsageObject caps the bytes kept of one usage object; a longer one is
// not read.
const maxUsageObject = 2048

// usageScan finds the "usage" objects of a JSON or server-sent-events
// body, and Shopify's actualQueryCost, whatever the chunks it comes in,
// and keeps the largest count of each field it saw: a stream repeats its
// usage (Anthropic's message_start and message_delta; OpenAI's last chunk
// after "usage": null ones), and its counts only grow.
type usageScan struct {
	carry [maxKeyLen - 1]byte // the end of the last chunk, which may hold the start of a key
	nc    int                 // bytes in carry
	key   int                 // the key last found
	obj   []byte              // the usage object (from its '{') or the number being read
	state uint8               // scanKey, scanColon, scanObject, scanNumber
	depth int
	str   bool // in a string of the object
	esc   bool // after a backslash in that string
	u     usage
	found bool
	ended bool // a stream's end was read
}

// maxNumberLen is the longest number a cost is read from.
const maxNumberLen = 32

const (
	scanKey uint8 = iota
	scanColon
	scanObject
	scanNumber
)

// usage is the fields of the providers' usage objects (OpenAI's chat and
// responses APIs, Anthropic's messages API), and Shopify's query cost; a
// field not sent is nil.
type usage struct {
	PromptTokens        *int `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	TotalTokens         *int `json:"total_tokens"`
	InputTokens         *int `json:"input_tokens"`
	OutputTokens        *int `json:"output_tokens"`
	CacheCreationTokens *int `json:"cache_creation_input_tokens"`
	QueryCost           *int `json:"-"`
}

func (s *usageScan) feed(p []byte) {
	for len(p) > 0 {
		switch s.state {
		case scanKey:
			i, ok := s.findKey(p)
			if !ok {
				return
			}
			p = p[i:]
			if s.key == keyDone || s.key == keyMessageStop {
				s.ended = true
				continue
			}
			s.state = scanColon
		case scanColon:
			i := 0
			for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r' || p[i] == ':') {
				i++
			}
			if i == len(p) {
				return
			}
			p, s.obj = p[i:], s.obj[:0]
			switch {
			case s.key == keyUsage && p[0] == '{':
				s.state, s.depth, s.str, s.esc = scanObject, 0, false, false
			case s.key == keyQueryCost && '0' <= p[0] && p[0] <= '9':
				s.state = scanNumber
			default: // null, or the key as a value: nothing to read
				s.state = scanKey
			}
		case scanObject:
			i := s.object(p)
			if i < 0 {
				return
			}
			p = p[i:]
		case scanNumber:
			i := 0
			for i < len(p) && ('0' <= p[i] && p[i] <= '9' || p[i] == '.') {
				i++
			}
			// (At most one byte past maxNumberLen is kept: a number that
			// long is no cost, whether it came in one piece or several.)
			if n := min(i, maxNumberLen+1-len(s.obj)); n > 0 {
				s.obj = append(s.obj, p[:n]...)
			}
			if i == len(p) {
				return
			}
			if f, err := strconv.ParseFloat(string(s.obj), 64); err == nil && len(s.obj) <= maxNumberLen && f <= math.MaxInt32 {
				if n := int(math.Ceil(f)); s.u.QueryCost == nil || *s.u.QueryCost < n {
					s.u.QueryCost, s.found = &n, true
				}
			}
			p, s.state = p[i:], scanKey
		}
	}
}

// findKey looks for a key in p, or across the end of the last chunk and
// p's start; it returns the index in p after the key, or false when p
// holds none (and keeps p's end, which may start one).
func (s *usageScan) findKey(p []byte) (int, bool) {
	if s.nc > 0 {
		var tmp [2 * maxKeyLen]byte
		n := copy(tmp[:], s.carry[:s.nc])
		m := copy(tmp[n:], p[:min(len(p), maxKeyLen-1)])
		if i, k := indexKey(tmp[:n+m]); i >= 0 && i < n {
			s.nc, s.key = 0, k
			return i + len(scanKeys[k]) - n, true
		}
		if m == len(p) { // p is short: the carry is the end of carry and p
			if i, k := indexKey(p); i >= 0 {
				s.nc, s.key = 0, k
				return i + len(scanKeys[k]), true
			}
			s.nc = copy(s.carry[:], tmp[max(0, n+m-len(s.carry)):n+m])
			return 0, false
		}
	}
	if i, k := indexKey(p); i >= 0 {
		s.nc, s.key = 0, k
		return i + len(scanKeys[k]), true
	}
	s.nc = copy(s.carry[:], p[max(0, len(p)-len(s.carry)):])
	return 0, false
}

// indexKey returns the index of the first key in b and which key it is,
// or -1.
func indexKey(b []byte) (int, int) {
	at, key := -1, 0
	for k, kb := range scanKeys {
		if i := bytes.Index(b, kb); i >= 0 && (at < 0 || i < at) {
			at, key = i, k
		}
	}
	return at, key
}

// object reads p into the usage object; it returns the index after the
// object's end, or -1 when p ended first.
func (s *usageScan) object(p []byte) int {
	for i, c := range p {
		switch {
		case s.esc:
			s.esc = false
		case s.str:
			s.esc = c == '\\'
			s.str = c != '"'
		case c == '"':
			s.str = true
		case c == '{':
			s.depth++
		case c == '}':
			s.depth--
		}
		if s.depth == 0 {
			if len(s.obj)+i+1 <= maxUsageObject {
				s.obj = append(s.obj, p[:i+1]...)
				s.merge(s.obj)
			}
			s.state, s.obj = scanKey, s.obj[:0]
			return i + 1
		}
	}
	if len(s.obj)+len(p) <= maxUsageObject {
		s.obj = append(s.obj, p...)
	} else {
		s.obj = s.obj[:0] // too long to be a usage object: read past it
	}
	return -1
}

// merge keeps the largest of each count in obj and what was seen before.
func (s *usageScan) merge(obj []byte) {
	var u usage
	if len(obj) > maxUsageObject || json.Unmarshal(obj, &u) != nil {
		return
	}
	for _, f := range []struct{ dst, src **int }{
		{&s.u.PromptTokens, &u.PromptTokens},
		{&s.u.CompletionTokens, &u.CompletionTokens},
		{&s.u.TotalTokens, &u.TotalTokens},
		{&s.u.InputTokens, &u.InputTokens},
		{&s.u.OutputTokens, &u.OutputTokens},
		{&s.u.CacheCreationTokens, &u.CacheCreationTokens},
	} {
		if v := *f.src; v != nil && *v >= 0 && (*f.dst == nil || **f.dst < *v) {
			*f.dst = v
			s.found = true
		}
	}
}

// actual returns est with the dimensions the usage told replaced by their
// counts, and false when no usage was read. Input tokens are OpenAI's
// prompt_tokens, or Anthropic's input_tokens plus its cache writes
// (cache_creation_input_tokens count toward Anthropic's input-tokens limit;
// its cache reads, for most models, do not); output tokens are
// completion_tokens or output_tokens; tokens are total_tokens, or input
// plus output; points are Shopify GraphQL's actualQueryCost.
func (s *usageScan) actual(est Cost) (Cost, bool) {
	if s.state == scanNumber { // the body ended in the number
		s.feed([]byte{' '})
	}
	if !s.found {
		return est, false
	}
	in, hasIn := s.u.PromptTokens, s.u.PromptTokens != nil
	if !hasIn && s.u.InputTokens != nil {
		n := *s.u.InputTokens
		if s.u.CacheCreationTokens != nil {
			n += *s.u.CacheCreationTokens
		}
		in, hasIn = &n, true
	}
	out := s.u.CompletionTokens
	if out == nil {
		out = s.u.OutputTokens
	}
	c := est
	if hasIn {
		c.InputTokens = *in
	}
	if out != nil {
		c.OutputTokens = *out
	}
	switch {
	case s.u.TotalTokens != nil:
		c.Tokens = *s.u.TotalTokens
	case hasIn && out != nil:
		c.Tokens = *in + *out
	}
	if s.u.QueryCost != nil {
		c.Points = *s.u.QueryCost
	}
	return c, true
}

// maxCostBody caps the bytes of a request body LLMCost reads.
const maxCostBody = 4 << 20

// LLMCost estimates the cost of an LLM API call from its request, for
// WithCosts: 1 request, and tokens of input and output. The input is the
// body's size over 4 (about 4 bytes a token for English text, which the
// JSON around the prompt only raises: an over-estimate, refunded when the
// response tells the usage), except that an inline image (base64 data of
// at least 1 KiB in a data URL or after an "image/..." media type, as
// OpenAI's and Anthropic's bodies carry them) counts as imageTokens, not
// by its size; the output is the body's max_tokens,
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
	var caps struct {
		MaxTokens           *int `json:"max_tokens"`
		MaxCompletionTokens *int `json:"max_completion_tokens"`
		MaxOutputTokens     *int `json:"max_output_tokens"`
	}
	_ = json.Unmarshal(b, &caps) // a body that is not JSON has no maximum
	for _, n := range []*int{caps.MaxCompletionTokens, caps.MaxTokens, caps.MaxOutputTokens} {
		if n != nil && *n > 0 {
			c.OutputTokens = *n
			break
		}
	}
	c.InputTokens = inputTokens(b)
	c.Tokens = c.InputTokens + c.OutputTokens
	return c
}

// imageTokens is what LLMCost counts for one inline image: about the most
// one image costs, whatever its size in bytes, since the providers scale
// images before they count them. OpenAI charges 85 + 170 per 512-pixel
// tile of the scaled image, at most 8 tiles (1,445 tokens;
// platform.openai.com/docs/guides/vision, "Calculating costs"); Anthropic
// charges about width × height / 750 of the scaled image, about 1,600
// (docs.anthropic.com, "Vision", "Calculate image costs").
const imageTokens = 1600

// minInlineData is the shortest run of base64 characters that LLMCost
// reads as inline data rather than text.
const minInlineData = 1024

// inputTokens estimates the input tokens of a request body b: its size
// over 4, with each inline image's base64 data counted as imageTokens.
func inputTokens(b []byte) int {
	n, images := len(b), 0
	for i := 0; i < len(b); {
		if !isBase64(b[i]) {
			i++
			continue
		}
		j := i
		for j < len(b) && isBase64(b[j]) {
			j++
		}
		if j-i >= minInlineData && isImageData(b[max(0, i-200):i]) {
			n -= j - i
			images++
		}
		i = j
	}
	return (n+3)/4 + images*imageTokens
}

// isImageData reports whether the bytes before a run of base64 say it is
// an image: a data URL ("data:image/png;base64,") or a media type
// ("media_type":"image/jpeg", then "data":").
func isImageData(before []byte) bool {
	return bytes.Contains(before, []byte("image/"))
}

func isBase64(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '='
}
