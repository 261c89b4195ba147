package egress

import (
	"net/http"

	"github.com/egress-go/egress/internal/dialect"
)

// BodyPeekLimit is the most of a response body that PeekBody reads: 4 KiB,
// enough for the JSON error of a 429, small enough to cost nothing worth
// counting.
const BodyPeekLimit = 4 << 10

// PeekBody returns the first bytes of resp's body, at most BodyPeekLimit,
// for a SignalReader that reads a provider's error body (a billing error, a
// retry delay). It leaves resp.Body whole for the caller: a reader that
// returns those bytes, then the rest of the original body, and whose Close
// closes the original. Called again on the same response, it returns the
// same bytes without reading more. A read error ends the prefix early and
// is returned, in its place, by the body's Read. A nil body or http.NoBody
// gives nil.
//
// PeekBody blocks until it has read BodyPeekLimit bytes or the body ends,
// so a reader should call it only for the statuses whose body it reads.
func PeekBody(resp *http.Response) []byte { return dialect.PeekBody(resp) }
