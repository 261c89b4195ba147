// Package route matches a request path against route templates such as
// "/v1/customers/{id}": the arithmetic of egress.RouteKeys, which names a
// request by the template its path matches.
//
// It owns the grammar of a template and the matching, and nothing more:
// what a match is keyed as, and how a bad template is reported, is
// egress's. It imports only the standard library, and no package of
// egress (so that its fuzz target runs in a binary of the standard library
// alone: see internal/field).
package route

import (
	"fmt"
	"strings"
)

// Template is a parsed route template.
type Template struct {
	Path     string   // as given, without a trailing slash ("/" for the root)
	Canon    string   // with every parameter written {} ({...} for the rest): two templates of one Canon are one route
	Literals int      // its literal segments
	segs     []string // literal segments; "" for a parameter
	rest     bool     // the last parameter takes the rest of the path
}

// Parse reads a template: a path whose segments are literal or a parameter
// in braces ("{id}"), the last one maybe "{name...}", which takes the rest
// of the path. why says what is wrong with t, or is "" when nothing is.
func Parse(t string) (tpl Template, why string) {
	if !strings.HasPrefix(t, "/") {
		return Template{}, `must begin with "/"`
	}
	trimmed := strings.TrimSuffix(t, "/")
	if trimmed == "" {
		return Template{Path: "/", Canon: "/"}, ""
	}
	tpl.Path = trimmed
	parts := strings.Split(trimmed[1:], "/")
	canon := make([]string, len(parts))
	for i, p := range parts {
		switch {
		case p == "":
			return Template{}, "has an empty segment"
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "...}") && len(p) > 5:
			if i != len(parts)-1 {
				return Template{}, "a {name...} parameter must be the last segment"
			}
			tpl.rest = true
			canon[i] = "{...}"
			tpl.segs = append(tpl.segs, "")
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") && len(p) > 2 && !strings.ContainsAny(p[1:len(p)-1], "{}"):
			canon[i] = "{}"
			tpl.segs = append(tpl.segs, "")
		case strings.ContainsAny(p, "{}"):
			return Template{}, fmt.Sprintf("segment %q is not a literal nor a {name} parameter", p)
		default:
			canon[i] = p
			tpl.segs = append(tpl.segs, p)
			tpl.Literals++
		}
	}
	tpl.Canon = "/" + strings.Join(canon, "/")
	return tpl, ""
}

// Match reports whether path (escaped, without its leading "/" and any
// trailing one) matches r: as many segments (a parameter matches any one
// non-empty segment; a rest parameter one segment or more), and every
// literal segment equal.
func (r *Template) Match(path string) bool {
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

// Best returns the index of the template in list that path (as Match
// takes it) matches with the most literal segments, the first given among
// equals, or -1 when none matches.
func Best(list []Template, path string) int {
	best := -1
	for i := range list {
		r := &list[i]
		if (best < 0 || r.Literals > list[best].Literals) && r.Match(path) {
			best = i
		}
	}
	return best
}
