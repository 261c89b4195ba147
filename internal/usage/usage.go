// Package usage counts what a call to an LLM (or GraphQL) provider uses:
// an estimate of a request's tokens from its body, before it is sent
// (Estimate), and the counts a response's usage object tells, read as the
// body streams past (Scan).
//
// It owns the reading of those bodies and nothing more: what a count is
// charged as, and when, is egress's (LLMCost, WithCosts). It imports only
// the standard library, and no package of egress.
//
// (The package is its own so that its fuzz targets run in a binary of the
// standard library alone: see internal/field.)
package usage

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

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

// MaxObject caps the bytes kept of one usage object; a longer one is
// not read.
const MaxObject = 2048

// Scan finds the "usage" objects of a JSON or server-sent-events
// body, and Shopify's actualQueryCost, whatever the chunks it comes in,
// and keeps the largest count of each field it saw: a stream repeats its
// usage (Anthropic's message_start and message_delta; OpenAI's last chunk
// after "usage": null ones), and its counts only grow.
type Scan struct {
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

// Feed reads the next bytes of the body.
func (s *Scan) Feed(p []byte) {
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
func (s *Scan) findKey(p []byte) (int, bool) {
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
func (s *Scan) object(p []byte) int {
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
			if len(s.obj)+i+1 <= MaxObject {
				s.obj = append(s.obj, p[:i+1]...)
				s.merge(s.obj)
			}
			s.state, s.obj = scanKey, s.obj[:0]
			return i + 1
		}
	}
	if len(s.obj)+len(p) <= MaxObject {
		s.obj = append(s.obj, p...)
	} else {
		s.obj = s.obj[:0] // too long to be a usage object: read past it
	}
	return -1
}

// merge keeps the largest of each count in obj and what was seen before.
func (s *Scan) merge(obj []byte) {
	var u usage
	if len(obj) > MaxObject || json.Unmarshal(obj, &u) != nil {
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

// Counts is what a usage object told, in the providers' terms made one:
// Input is OpenAI's prompt_tokens, or Anthropic's input_tokens plus its
// cache writes (cache_creation_input_tokens count toward Anthropic's
// input-tokens limit; its cache reads, for most models, do not); Output is
// completion_tokens or output_tokens; Total is total_tokens; Points is
// Shopify GraphQL's actualQueryCost. A count the body did not tell has its
// Has field false.
type Counts struct {
	Input, Output, Total, Points             int
	HasInput, HasOutput, HasTotal, HasPoints bool
}

// Counts returns what the body read so far told, and false when it told
// no usage.
func (s *Scan) Counts() (Counts, bool) {
	if s.state == scanNumber { // the body ended in the number
		s.Feed([]byte{' '})
	}
	if !s.found {
		return Counts{}, false
	}
	var c Counts
	u := &s.u
	switch {
	case u.PromptTokens != nil:
		c.Input, c.HasInput = *u.PromptTokens, true
	case u.InputTokens != nil:
		c.Input, c.HasInput = *u.InputTokens, true
		if u.CacheCreationTokens != nil {
			c.Input += *u.CacheCreationTokens
		}
	}
	switch {
	case u.CompletionTokens != nil:
		c.Output, c.HasOutput = *u.CompletionTokens, true
	case u.OutputTokens != nil:
		c.Output, c.HasOutput = *u.OutputTokens, true
	}
	if u.TotalTokens != nil {
		c.Total, c.HasTotal = *u.TotalTokens, true
	}
	if u.QueryCost != nil {
		c.Points, c.HasPoints = *u.QueryCost, true
	}
	return c, true
}

// Complete reports whether the body's usage is whole: a JSON body's usage
// object was read to its end; a stream's end (OpenAI's "[DONE]",
// Anthropic's message_stop) was read too.
func (s *Scan) Complete(stream bool) bool {
	return s.state == scanKey && (s.ended || !stream)
}

// Estimate estimates the tokens of a request body b: input is its size
// over 4 (about 4 bytes a token for English text, which the JSON around the
// prompt only raises: an over-estimate, refunded when the response tells
// the usage), except that an inline image (base64 data of at least 1 KiB in
// a data URL or after an "image/..." media type, as OpenAI's and
// Anthropic's bodies carry them) counts as ImageTokens, not by its size;
// output is the body's max_tokens, max_completion_tokens or
// max_output_tokens (OpenAI's and Anthropic's names), which is what OpenAI
// reserves at admission, or 0 when it sets none.
func Estimate(b []byte) (input, output int) {
	var caps struct {
		MaxTokens           *int `json:"max_tokens"`
		MaxCompletionTokens *int `json:"max_completion_tokens"`
		MaxOutputTokens     *int `json:"max_output_tokens"`
	}
	_ = json.Unmarshal(b, &caps) // a body that is not JSON has no maximum
	for _, n := range []*int{caps.MaxCompletionTokens, caps.MaxTokens, caps.MaxOutputTokens} {
		if n != nil && *n > 0 {
			output = *n
			break
		}
	}
	return inputTokens(b), output
}

// ImageTokens is what Estimate counts for one inline image: about the most
// one image costs, whatever its size in bytes, since the providers scale
// images before they count them. OpenAI charges 85 + 170 per 512-pixel
// tile of the scaled image, at most 8 tiles (1,445 tokens;
// platform.openai.com/docs/guides/vision, "Calculating costs"); Anthropic
// charges about width × height / 750 of the scaled image, about 1,600
// (docs.anthropic.com, "Vision", "Calculate image costs").
const ImageTokens = 1600

// MinInlineData is the shortest run of base64 characters that Estimate
// reads as inline data rather than text.
const MinInlineData = 1024

// inputTokens estimates the input tokens of a request body b: its size
// over 4, with each inline image's base64 data counted as ImageTokens.
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
		if j-i >= MinInlineData && isImageData(b[max(0, i-200):i]) {
			n -= j - i
			images++
		}
		i = j
	}
	return (n+3)/4 + images*ImageTokens
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
