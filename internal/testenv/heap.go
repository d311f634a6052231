package testenv

import (
	"runtime"
	"testing"
	"time"
)

// HeldHeap measures for a benchmark what a structure keeps on the Go heap
// per item: the heap in use after a GC before start, and after a GC once
// ready (polled for a minute) reports true, divided by items. Then it
// calls stop and waits until the goroutines start left have ended, so the
// next measurement does not count this one's objects. What it skips: the
// transient heap on the way (a peak, not kept) and the GC headroom (RSS ≈
// 2× the live heap at GOGC=100).
func HeldHeap(tb testing.TB, items int, start func() (ready func() bool, stop func())) float64 {
	tb.Helper()
	g0 := runtime.NumGoroutine()
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	ready, stop := start()
	wait(tb, ready, "ready")
	runtime.GC()
	runtime.ReadMemStats(&m1)
	stop()
	wait(tb, func() bool { return runtime.NumGoroutine() <= g0 }, "its goroutines ended")
	return float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / float64(items)
}

func wait(tb testing.TB, cond func() bool, what string) {
	tb.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("testenv.HeldHeap: not %s within a minute", what)
		}
	}
}
