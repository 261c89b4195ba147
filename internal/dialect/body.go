package dialect

import (
	"bytes"
	"io"
	"net/http"
	"strings"
)

// BodyPeekLimit is the most of a response body that PeekBody reads (the
// root's BodyPeekLimit).
const BodyPeekLimit = 4 << 10

// PeekBody returns the first bytes of resp's body, at most BodyPeekLimit,
// and leaves resp.Body whole for the caller: the root's PeekBody, whose
// doc says how.
func PeekBody(resp *http.Response) []byte {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	if p, ok := resp.Body.(*peekedBody); ok {
		return p.prefix
	}
	orig := resp.Body
	prefix, err := io.ReadAll(io.LimitReader(orig, BodyPeekLimit))
	p := &peekedBody{prefix: prefix, orig: orig}
	switch {
	case err != nil:
		p.r = io.MultiReader(bytes.NewReader(prefix), errReader{err})
	case len(prefix) < BodyPeekLimit:
		p.r = bytes.NewReader(prefix) // the body ended: the original has nothing more
	default:
		p.r = io.MultiReader(bytes.NewReader(prefix), orig)
	}
	resp.Body = p
	return prefix
}

// peekedBody is a response body whose first bytes PeekBody read.
type peekedBody struct {
	prefix []byte
	r      io.Reader // prefix, then the rest of orig
	orig   io.ReadCloser
}

func (b *peekedBody) Read(p []byte) (int, error) { return b.r.Read(p) }

// Close closes the original body.
func (b *peekedBody) Close() error { return b.orig.Close() }

// errReader returns its error on every Read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// jsonErrorPrefix returns the first bytes of a 429's body when the body may
// be JSON (its Content-Type says json, or there is none) and holds marker;
// otherwise nil, having read nothing when the status or type rule it out.
func jsonErrorPrefix(resp *http.Response, marker string) []byte {
	if resp.StatusCode != http.StatusTooManyRequests {
		return nil
	}
	if ct := resp.Header["Content-Type"]; len(ct) > 0 && !strings.Contains(strings.ToLower(ct[0]), "json") {
		return nil
	}
	b := PeekBody(resp)
	if !bytes.Contains(b, []byte(marker)) {
		return nil
	}
	return b
}
