package egress

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
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
		r, err := parseRoute(t)
		if err != nil {
			return nil, err
		}
		if seen[r.canon] {
			return nil, configError("RouteKeys: template", fmt.Sprintf("%q", t), "given twice")
		}
		seen[r.canon] = true
		rs.list = append(rs.list, r)
	}
	return rs.key, nil
}

type routes struct {
	list []route
	keys sync.Map // routeKey → string: host + template, built once
}

type route struct {
	template string   // as given, without a trailing slash
	canon    string   // with every parameter written {}
	segs     []string // literal segments; "" for a parameter
	rest     bool     // the last parameter takes the rest of the path
	literals int
}

type routeKey struct {
	host string
	i    int // the route; -1 for none
}

func parseRoute(t string) (route, error) {
	bad := func(why string) (route, error) {
		return route{}, configError("RouteKeys: template", fmt.Sprintf("%q", t), why)
	}
	if !strings.HasPrefix(t, "/") {
		return bad(`must begin with "/"`)
	}
	trimmed := strings.TrimSuffix(t, "/")
	r := route{template: trimmed}
	if trimmed == "" {
		r.template = "/"
		r.canon = "/"
		return r, nil
	}
	parts := strings.Split(trimmed[1:], "/")
	canon := make([]string, len(parts))
	for i, p := range parts {
		switch {
		case p == "":
			return bad("has an empty segment")
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "...}") && len(p) > 5:
			if i != len(parts)-1 {
				return bad("a {name...} parameter must be the last segment")
			}
			r.rest = true
			canon[i] = "{...}"
			r.segs = append(r.segs, "")
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") && len(p) > 2 && !strings.ContainsAny(p[1:len(p)-1], "{}"):
			canon[i] = "{}"
			r.segs = append(r.segs, "")
		case strings.ContainsAny(p, "{}"):
			return bad(fmt.Sprintf("segment %q is not a literal nor a {name} parameter", p))
		default:
			canon[i] = p
			r.segs = append(r.segs, p)
			r.literals++
		}
	}
	r.canon = "/" + strings.Join(canon, "/")
	return r, nil
}

// match reports whether path (without its leading "/" and any trailing
// one) matches r.
func (r *route) match(path string) bool {
	if len(r.segs) == 0 {
		return path == ""
	}
	for i, lit := range r.segs {
		if path == "" {
			return false
		}
		last := i == len(r.segs)-1
		if last && r.rest {
			return true
		}
		seg, tail, found := strings.Cut(path, "/")
		if seg == "" || (lit != "" && seg != lit) {
			return false
		}
		if last {
			return !found
		}
		path = tail
	}
	return false
}

func (rs *routes) key(req *http.Request) string {
	path := strings.TrimSuffix(strings.TrimPrefix(req.URL.EscapedPath(), "/"), "/")
	best := -1
	for i := range rs.list {
		r := &rs.list[i]
		if (best < 0 || r.literals > rs.list[best].literals) && r.match(path) {
			best = i
		}
	}
	host := req.URL.Host
	if best < 0 {
		return host
	}
	k := routeKey{host: host, i: best}
	if v, ok := rs.keys.Load(k); ok {
		return v.(string)
	}
	v, _ := rs.keys.LoadOrStore(k, host+rs.list[best].template)
	return v.(string)
}
