// Package egressotel records what an egress.Transport does as OpenTelemetry
// metrics, modelled on the rate-limiting semantic conventions
// (aspnetcore.rate_limiting.*): requests by result, time spent waiting for
// capacity, requests waiting and in flight, retries by cause, pauses, each
// key's effective rate, a shared limiter's fallback, and the provider's last
// reported remaining quota.
//
// It lives in its own module so that egress itself does not depend on
// OpenTelemetry.
//
//	m, err := egressotel.NewMetrics(otel.GetMeterProvider(), egressotel.WithMaxKeys(50))
//	if err != nil { ... }
//	limiter, err := egress.NewTokenBucket(egress.PerSecond(25), 10)
//	if err != nil { ... }
//	if err := m.ObserveRates("payments", limiter); err != nil { ... }
//	tr, err := egress.New(m.InFlight(http.DefaultTransport),
//		egress.WithLimiter(m.Limiter(limiter)),
//		egress.WithObserver(m.Observer()))
//
// Observer alone gives the counters and the wait histogram; Limiter adds the
// requests waiting now and the provider's remaining quota, InFlight the
// requests in flight, ObserveRates and ObserveShared the gauges read from
// the limiters. The instruments, their units and attributes are listed in
// the module's README.
//
// The key attribute is guarded: a key outside the allow-list (WithKeys), or
// beyond the cap on distinct keys (WithMaxKeys, 100 by default), is recorded
// as "other", so that a request ID used as a key cannot create a series per
// request.
package egressotel
