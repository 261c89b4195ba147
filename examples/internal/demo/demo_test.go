package demo

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBar(t *testing.T) {
	assert.Equal(t, 41, len([]rune(Bar(0, 10))))
	assert.Equal(t, "███│", strings.TrimRight(Bar(3, 3), " "))
	assert.Equal(t, "██████", strings.TrimRight(Bar(6, 3), " "), "a bar past the mark covers it")
}
