package argv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

type inner struct {
	c string `argv:"3"`
}

type each struct {
	e int64 `argv:"4+i"`
}

type args struct {
	a float64 `argv:"1"`
	b int     `argv:"2"`
	inner
	es []each
}

// TestAppend: fields in order, unexported ones too, an embedded struct in
// place and a slice element by element, after what args held.
func TestAppend(t *testing.T) {
	got := Append([]any{"x"}, &args{a: 1.5, b: 2, inner: inner{c: "c"}, es: []each{{7}, {8}}})
	assert.Equal(t, []any{"x", 1.5, int64(2), "c", int64(7), int64(8)}, got)
	assert.Panics(t, func() { Append(nil, &struct{ b bool }{}) }, "a kind it does not encode")
	assert.Equal(t, int64(1500), Micros(1500*time.Microsecond+999))
	assert.Equal(t, []int{1, 0}, []int{Flag(true), Flag(false)})
}
