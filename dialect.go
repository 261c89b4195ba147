package egress

// signalConfig is how a Transport reads responses: the readers and the
// per-host overrides. Its zero value reads the built-in dialects.
type signalConfig struct{}
