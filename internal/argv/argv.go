// Package argv encodes a script's arguments. A script's ARGV is a struct
// type of its caller's, one field an argument, in the script's order, each
// tagged with its index in the script's header (`argv:"3"`, or an
// expression such as `argv:"o+2i"` for a group repeated per limit); an
// embedded struct or a slice of structs stands for its fields in place.
// Append encodes them, a duration in Micros and a flag by Flag; the
// root's TestScriptArgsMatchHeaders holds each type's tags to its
// script's header.
//
// It knows nothing of Redis or of any script: only the encoding.
package argv

import (
	"reflect"
	"time"
)

// Append appends the fields of v, a pointer to a struct of arguments, to
// args, in order (embedded structs in place, a slice element by element).
// A field of a kind other than float64, int, int64, string, struct or
// slice is a programming error: Append panics.
func Append(args []any, v any) []any {
	return appendFields(args, reflect.ValueOf(v).Elem())
}

func appendFields(args []any, v reflect.Value) []any {
	for i := range v.NumField() {
		args = appendValue(args, v.Field(i))
	}
	return args
}

// appendValue appends f to args: a struct's fields, a slice's elements,
// or f itself.
func appendValue(args []any, f reflect.Value) []any {
	switch f.Kind() {
	case reflect.Struct:
		return appendFields(args, f)
	case reflect.Slice:
		for j := range f.Len() {
			args = appendValue(args, f.Index(j))
		}
		return args
	case reflect.Float64:
		return append(args, f.Float())
	case reflect.Int, reflect.Int64:
		return append(args, f.Int())
	case reflect.String:
		return append(args, f.String())
	default:
		panic("egress: a script argument of kind " + f.Kind().String())
	}
}

// Micros is a duration as the scripts read one: whole microseconds.
func Micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// Flag is a flag as the scripts read one: 1 for true, 0 for false.
func Flag(b bool) int {
	if b {
		return 1
	}
	return 0
}
