package subjects_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

func TestParseDeadline(t *testing.T) {
	tests := []struct {
		v    string
		want time.Time // zero: no deadline, or refused
		bad  bool
	}{
		{"", time.Time{}, false},
		{"1", time.UnixMilli(1), false},
		{"1767225600000", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{strconv.Itoa(subjects.MaxDeadlineMillis), time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC), false},
		{strconv.Itoa(subjects.MaxDeadlineMillis + 1), time.Time{}, true},
		{"0", time.Time{}, true},
		{"-5", time.Time{}, true},
		{"9223372036854775807", time.Time{}, true},
		{"99999999999999999999", time.Time{}, true},
		{"1.5", time.Time{}, true},
		{" 1", time.Time{}, true},
		{"soon", time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.v, func(t *testing.T) {
			got, e := subjects.ParseDeadline(tt.v)
			if tt.bad {
				if e == nil || e.Status != 400 || e.Code != subjects.CodeInvalidRequest || !strings.Contains(e.Message, subjects.HdrDeadline) {
					t.Fatalf("ParseDeadline(%q) = %v, %v; want a 400 naming %s", tt.v, got, e, subjects.HdrDeadline)
				}
				return
			}
			if e != nil || !got.Equal(tt.want) {
				t.Fatalf("ParseDeadline(%q) = %v, %v; want %v", tt.v, got, e, tt.want)
			}
		})
	}
}
