package drain

import (
	"testing"
	"time"
)

func TestPollDelay(t *testing.T) {
	for _, tc := range []struct {
		age, poll, want time.Duration
	}{
		{0, 5 * time.Second, time.Second},                      // just started: kubectl's 1s
		{3 * time.Second, 5 * time.Second, time.Second},        // a quarter is under the floor
		{8 * time.Second, 5 * time.Second, 2 * time.Second},    // a quarter of its age
		{20 * time.Second, 5 * time.Second, 5 * time.Second},   // reaches poll_interval
		{10 * time.Minute, 5 * time.Second, 5 * time.Second},   // never beyond it
		{0, 500 * time.Millisecond, 500 * time.Millisecond},    // a poll_interval under 1s wins
		{-time.Second, 5 * time.Second, time.Second},           // a clock step back
		{40 * time.Second, 30 * time.Second, 10 * time.Second}, // a longer poll_interval
	} {
		if got := pollDelay(tc.age, tc.poll); got != tc.want {
			t.Errorf("pollDelay(%v, %v) = %v, want %v", tc.age, tc.poll, got, tc.want)
		}
	}
}
