//go:build race

package priority

// raceEnabled: the test runs under -race. failsafe-go v0.9.8's UsageTracker
// reads a user's usage window outside its lock (priority/usage.go, GetLevel
// after RUnlock) while RecordUsage writes it under the lock, which the race
// detector reports: the failsafe-go rows with tenants skip under -race.
const raceEnabled = true
