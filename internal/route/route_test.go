package route

import (
	"strings"
	"testing"
)

// FuzzRoute: no template or path panics; a path made of a template, its
// parameters filled, matches it; a path the template matches has its
// literal segments, in place.
func FuzzRoute(f *testing.F) {
	for _, s := range [][2]string{
		{"/v1/customers/{id}", "v1/customers/cus_1"},
		{"/repos/{owner}/{repo}/issues", "repos/a/b/issues"},
		{"/files/{path...}", "files/a/b"},
		{"/", ""},
		{"/a/{b}/c", "/a//"},
		{"/x/{y...}", "x/%2F/%00"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, template, path string) {
		tpl, why := Parse(template)
		if why != "" {
			return
		}
		own := strings.TrimPrefix(tpl.Path, "/")
		for _, seg := range strings.Split(own, "/") {
			if strings.HasPrefix(seg, "{") {
				own = strings.Replace(own, seg, "x", 1)
			}
		}
		if !tpl.Match(own) || Best([]Template{tpl}, own) != 0 {
			t.Fatalf("template %q does not match %q, its own path", template, own)
		}
		if !tpl.Match(path) {
			return
		}
		segs := strings.Split(path, "/")
		for i, lit := range tpl.segs {
			if lit != "" && (i >= len(segs) || segs[i] != lit) {
				t.Fatalf("template %q matches %q, without its segment %q", template, path, lit)
			}
		}
	})
}
