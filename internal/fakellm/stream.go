package fakellm

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"
)

// stream answers a completion as Server-Sent Events: after Latency, the
// headers and the dialect's opening events; then the content in chunks,
// each after ChunkDelay + PerToken × its tokens; then the settlement of the
// actual charge; then the closing events, which carry the usage. A caller
// who leaves early is still charged the whole output.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, d dialect, req request, t *ticket) {
	settled := false
	defer func() {
		if !settled {
			s.settle(req, t)
		}
	}()
	if !s.pause(ctx, s.cfg.Latency) {
		return
	}
	h := w.Header()
	if !s.cfg.OmitLimitHeaders {
		d.writeLimits(h, t.now, t.readings)
	}
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	out := &sse{w: w, rc: http.NewResponseController(w)}
	c := s.completion(req, t)
	out.send(d.streamStart(c))
	first := 0
	for _, n := range chunkSizes(t.output, s.cfg.Chunks) {
		if out.err != nil || !s.pause(ctx, s.cfg.ChunkDelay+time.Duration(n)*s.cfg.PerToken) {
			return
		}
		out.send(d.streamDelta(c, completionText(first, first+n)))
		first += n
	}
	s.settle(req, t)
	settled = true
	out.send(d.streamEnd(c))
}

// sse writes events and flushes each batch; it keeps the first error and
// writes nothing after it.
type sse struct {
	w   io.Writer
	rc  *http.ResponseController
	err error
}

func (o *sse) send(events []string) {
	for _, e := range events {
		if o.err == nil {
			_, o.err = io.WriteString(o.w, e)
		}
	}
	if o.err == nil {
		o.err = o.rc.Flush()
	}
}

// chunkSizes splits output tokens into chunks content chunks (one per
// token when chunks is 0 or above output), the first ones a token larger
// when they do not divide evenly.
func chunkSizes(output, chunks int) []int {
	if chunks <= 0 || chunks > output {
		chunks = output
	}
	sizes := make([]int, chunks)
	for i := range sizes {
		sizes[i] = output / chunks
		if i < output%chunks {
			sizes[i]++
		}
	}
	return sizes
}

// words are the completion's tokens, BytesPerToken bytes each, so that the
// text of n tokens counts n tokens by TextTokens.
const words = "the fox ran far and saw two owl nap all day now "

// completionText is the text of the output tokens [from, to).
func completionText(from, to int) string {
	const n = len(words) / BytesPerToken
	var b strings.Builder
	b.Grow((to - from) * BytesPerToken)
	for i := from; i < to; i++ {
		k := i % n * BytesPerToken
		b.WriteString(words[k : k+BytesPerToken])
	}
	return b.String()
}
