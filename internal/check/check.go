// Package check range-checks configuration values. Every part's Config has a
// Validate method built from these checks; its errors name the command-line
// flag that sets the value, so `switchyard <cmd>` can report them as they are.
package check

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Error is a value out of range.
type Error struct {
	// Flag names the value as its command-line flag does, without dashes.
	Flag  string
	Value string
	Want  string
}

func (e *Error) Error() string { return fmt.Sprintf("--%s %s: %s", e.Flag, e.Value, e.Want) }

// NotNegative is the rule every numeric command-line flag follows: a
// negative count, size, rate or duration is refused, whatever the Config
// beneath makes of negative values.
func NotNegative(flag string, v any) error {
	neg := false
	switch n := v.(type) {
	case float64:
		if math.IsNaN(n) {
			return &Error{Flag: flag, Value: "NaN", Want: "want a number"}
		}
		neg = n < 0
	case int:
		neg = n < 0
	case int64:
		neg = n < 0
	case time.Duration:
		neg = n < 0
	}
	if neg {
		return &Error{Flag: flag, Value: fmt.Sprint(v), Want: "must not be negative"}
	}
	return nil
}

// Number is what Range checks.
type Number interface {
	~int | ~int32 | ~int64 | ~uint64 | ~float64
}

// Range requires lo <= v <= hi (and a float to be a number).
func Range[T Number](flag string, v, lo, hi T) error {
	return bounds(flag, v, lo, hi, func(n T) string { return fmt.Sprint(n) })
}

// Duration requires lo <= v <= hi.
func Duration(flag string, v, lo, hi time.Duration) error {
	return bounds(flag, v, lo, hi, time.Duration.String)
}

// Size requires lo <= v <= hi bytes.
func Size(flag string, v, lo, hi int64) error {
	return bounds(flag, v, lo, hi, FormatSize)
}

func bounds[T Number](flag string, v, lo, hi T, format func(T) string) error {
	switch f := float64(v); {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return &Error{Flag: flag, Value: format(v), Want: "want a number"}
	case v < lo:
		return &Error{Flag: flag, Value: format(v), Want: "want at least " + format(lo)}
	case v > hi:
		return &Error{Flag: flag, Value: format(v), Want: "want at most " + format(hi)}
	}
	return nil
}

// Required requires a value to be set.
func Required(flag, v string) error {
	if v == "" {
		return &Error{Flag: flag, Value: `""`, Want: "required"}
	}
	return nil
}

// Wrap names the flag of an error found by another check (a token's
// syntax, a URL's shape).
func Wrap(flag, value string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Flag: flag, Value: fmt.Sprintf("%q", value), Want: err.Error()}
}

// All joins the errors that are not nil (nil when there is none).
func All(errs ...error) error { return errors.Join(errs...) }

// FormatSize prints n bytes in the largest binary unit that divides it.
func FormatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}
