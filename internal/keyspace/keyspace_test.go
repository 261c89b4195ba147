package keyspace

import (
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// hashTag is the part of a Redis key that decides its Cluster slot: the
// text between its first '{' and the '}' after it, when not empty.
func hashTag(k string) string {
	i := strings.IndexByte(k, '{')
	if i < 0 {
		return k
	}
	j := strings.IndexByte(k[i+1:], '}')
	if j <= 0 {
		return k
	}
	return k[i+1 : i+1+j]
}

// TestNames: a key's parts share its hash tag, another key's differ, the
// limiter's own keys are apart from its keys', and the pattern matches
// every key's channel.
func TestNames(t *testing.T) {
	a, b := ID("api.example.com"), ID("api.example.org")
	assert.Len(t, a, 32)
	assert.Equal(t, a, ID("api.example.com"), "the same key, the same id")
	assert.NotEqual(t, a, b)
	assert.Equal(t, hashTag(Tag("n", a)+"tb"), hashTag(Tag("n", a)+"pause"))
	assert.NotEqual(t, hashTag(Tag("n", a)+"tb"), hashTag(Tag("n", b)+"tb"))
	assert.NotEqual(t, hashTag(Tag("n", a)+"tb"), hashTag(Own("n")+"members"))
	assert.NotEqual(t, hashTag(Tag("n", a)+"tb"), hashTag(Tag("m", a)+"tb"), "another limiter's")
	ok, err := path.Match(strings.ReplaceAll(Pattern("n", "pauses"), "{", "\\{"), Tag("n", a)+"pauses")
	assert.NoError(t, err)
	assert.True(t, ok)
}
