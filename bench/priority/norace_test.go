//go:build !race

package priority

const raceEnabled = false
