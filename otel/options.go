package egressotel

import (
	"errors"
	"fmt"
	"net/http"
)

// Option configures NewMetrics.
type Option interface {
	apply(*config)
}

// config gathers the options; the defaults are set in NewMetrics.
type config struct {
	allow   []string // nil: no allow-list
	maxKeys int
	// maxTenants caps the distinct tenants of the class metrics.
	maxTenants int
	keyFunc    func(*http.Request) string
	errs       []error
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// defaultMaxKeys is the cap on distinct keys of WithMaxKeys.
const defaultMaxKeys = 100

// WithKeys records only the keys given under their own name; every other
// key is recorded as OtherKey. Default: no allow-list, the first keys seen
// up to the cap (WithMaxKeys). With both, the cap still holds. An empty
// list is an error.
func WithKeys(keys ...string) Option {
	return optionFunc(func(c *config) {
		if len(keys) == 0 {
			c.errs = append(c.errs, errors.New("egressotel: WithKeys: the allow-list must not be empty"))
		}
		c.allow = append([]string{}, keys...)
	})
}

// WithMaxKeys caps the distinct keys recorded under their own name: the
// first n keys seen keep theirs for the Metrics' lifetime, and later ones
// are recorded as OtherKey. Default 100. It must be positive.
func WithMaxKeys(n int) Option {
	return optionFunc(func(c *config) {
		if n <= 0 {
			c.errs = append(c.errs, fmt.Errorf("egressotel: WithMaxKeys %d: must be positive", n))
		}
		c.maxKeys = n
	})
}

// WithMaxTenants caps the distinct tenants recorded under their own name
// in the class metrics (egress.priority.*): the first n tenants seen keep
// theirs, and later ones are recorded as OtherTenant. Default 20. It must
// be positive.
func WithMaxTenants(n int) Option {
	return optionFunc(func(c *config) {
		if n <= 0 {
			c.errs = append(c.errs, fmt.Errorf("egressotel: WithMaxTenants %d: must be positive", n))
		}
		c.maxTenants = n
	})
}

// WithKeyFunc sets how InFlight names a request's key: it must be the
// Transport's own (egress.WithKeyFunc). Default: the request's host, as the
// Transport's default. A nil function is an error.
func WithKeyFunc(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) {
		if f == nil {
			c.errs = append(c.errs, errors.New("egressotel: WithKeyFunc: the key function must not be nil"))
		}
		c.keyFunc = f
	})
}

func hostKey(req *http.Request) string { return req.URL.Host }
