package egress

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/egress-go/egress/internal/route"
)

// RouteKeys returns a key function (for WithKeyFunc) that names a request by
// its host and the route template its path matches, such as
// "api.stripe.com/v1/customers/{id}": one key per endpoint, never one per
// object. Providers limit per route as well as per account (Stripe's
// per-endpoint limits, Discord's per-route buckets), and an ID in a path
// must not create a key.
//
// A template is a path whose segments are literal or a parameter in braces:
// "/v1/customers/{id}", "/repos/{owner}/{repo}/issues". A parameter matches
// any one non-empty segment; a last segment "{rest...}" matches the rest of
// the path, one segment or more. A path matches a template with as many
// segments (a trailing slash is ignored); when several match, the one with
// the most literal segments first wins, then the first given. A path that
// matches none is keyed by its host alone, so that an unlisted route shares
// the host's key rather than making one of its own.
//
// It fails, naming the template, when a template does not begin with "/",
// has an empty segment or a malformed parameter, or is given twice. Keys are
// built once per host and template: calling the function allocates nothing
// once a key has been seen.
func RouteKeys(templates ...string) (func(*http.Request) string, error) {
	rs := &routes{}
	seen := map[string]bool{}
	for _, t := range templates {
		r, why := route.Parse(t)
		if why == "" && seen[r.Canon] {
			why = "given twice"
		}
		if why != "" {
			return nil, configError("RouteKeys: template", fmt.Sprintf("%q", t), why)
		}
		seen[r.Canon] = true
		rs.list = append(rs.list, r)
	}
	return rs.key, nil
}

// routes is a RouteKeys function's templates (internal/route matches a
// path against them), and the keys it has built.
type routes struct {
	list []route.Template
	keys sync.Map // routeKey → string: host + template, built once
}

type routeKey struct {
	host string
	i    int // the route; -1 for none
}

func (rs *routes) key(req *http.Request) string {
	best := route.Best(rs.list, strings.TrimSuffix(strings.TrimPrefix(req.URL.EscapedPath(), "/"), "/"))
	host := req.URL.Host
	if best < 0 {
		return host
	}
	k := routeKey{host: host, i: best}
	if v, ok := rs.keys.Load(k); ok {
		return v.(string)
	}
	v, _ := rs.keys.LoadOrStore(k, host+rs.list[best].Path)
	return v.(string)
}
