package egress

import (
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func routeReq(t testing.TB, target string) *http.Request {
	u, err := url.Parse(target)
	require.NoError(t, err)
	return &http.Request{URL: u}
}

func TestRouteKeys(t *testing.T) {
	key, err := RouteKeys(
		"/v1/customers/{id}",
		"/v1/customers/search",
		"/v1/charges",
		"/repos/{owner}/{repo}/issues/",
		"/files/{path...}",
		"/",
	)
	require.NoError(t, err)
	for _, tc := range []struct{ target, want string }{
		{"https://api.stripe.com/v1/customers/cus_9s6XKzkNRiz8i3", "api.stripe.com/v1/customers/{id}"},
		{"https://api.stripe.com/v1/customers/cus_OTHER?expand=x", "api.stripe.com/v1/customers/{id}"},
		{"https://api.stripe.com/v1/customers/search", "api.stripe.com/v1/customers/search"}, // the literal wins
		{"https://api.stripe.com/v1/customers/", "api.stripe.com"},                           // a missing ID matches nothing
		{"https://api.stripe.com/v1/charges/", "api.stripe.com/v1/charges"},
		{"https://api.stripe.com/v1/charges/ch_1/refunds", "api.stripe.com"},
		{"https://api.github.com/repos/golang/go/issues", "api.github.com/repos/{owner}/{repo}/issues"},
		{"https://api.github.com/repos/golang/go/pulls", "api.github.com"},
		{"https://files.example/files/a/b/c.txt", "files.example/files/{path...}"},
		{"https://files.example/files", "files.example"},
		{"https://files.example/", "files.example/"},
		{"https://files.example", "files.example/"},
		{"https://api.stripe.com:8443/v1/charges", "api.stripe.com:8443/v1/charges"},
	} {
		assert.Equal(t, tc.want, key(routeReq(t, tc.target)), tc.target)
	}
	// A thousand IDs make one key.
	keys := map[string]bool{}
	for i := range 1000 {
		keys[key(routeReq(t, "https://api.stripe.com/v1/customers/cus_"+strings.Repeat("x", i%50)+string(rune('a'+i%26))))] = true
	}
	assert.Len(t, keys, 1)
}

func TestRouteKeysValidates(t *testing.T) {
	for _, tc := range []struct{ template, want string }{
		{"v1/charges", `must begin with "/"`},
		{"/v1//charges", "empty segment"},
		{"/v1/{id", "not a literal nor a {name} parameter"},
		{"/v1/{}", "not a literal nor a {name} parameter"},
		{"/v1/{a}{b}", "not a literal nor a {name} parameter"},
		{"/files/{path...}/x", "must be the last segment"},
	} {
		_, err := RouteKeys(tc.template)
		require.ErrorIs(t, err, ErrInvalidConfig, tc.template)
		assert.Contains(t, err.Error(), tc.want, tc.template)
		assert.Contains(t, err.Error(), tc.template)
	}
	_, err := RouteKeys("/v1/customers/{id}", "/v1/customers/{cus}/")
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "given twice")
}

func TestRouteKeysAllocatesNothingOnceSeen(t *testing.T) {
	key, err := RouteKeys("/v1/customers/{id}", "/v1/charges")
	require.NoError(t, err)
	req := routeReq(t, "https://api.stripe.com/v1/customers/cus_1")
	key(req)
	assert.Zero(t, testing.AllocsPerRun(100, func() { key(req) }))
}

// TestRouteKeysAreHostOrTemplate: a path's key is its host, or its host
// followed by the template, for templates and paths drawn from pieces that
// meet at slashes, braces and escapes. (internal/route's FuzzRoute fuzzes
// the templates and the matching.)
func TestRouteKeysAreHostOrTemplate(t *testing.T) {
	pieces := []string{"/", "a", "b", "{x}", "{y...}", "%2F", "", "{", "}", "//"}
	rng := rand.New(rand.NewPCG(1, 2))
	draw := func() string {
		var b strings.Builder
		for range rng.IntN(6) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return b.String()
	}
	for range 20_000 {
		template, path := "/"+draw(), draw()
		key, err := RouteKeys(template)
		if err != nil {
			continue
		}
		u := &url.URL{Scheme: "https", Host: "h.example", Path: path}
		got := key(&http.Request{URL: u})
		if got != "h.example" && got != "h.example"+strings.TrimSuffix(template, "/") && !(got == "h.example/" && strings.Trim(template, "/") == "") {
			t.Fatalf("template %q, path %q: key %q", template, path, got)
		}
	}
}
