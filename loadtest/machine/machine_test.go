package machine

import (
	"os"
	"regexp"
	"testing"
)

func TestDescribe(t *testing.T) {
	d := Describe()
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, \d+ cores, load [0-9.]+ [0-9.]+ [0-9.]+$`).MatchString(d) {
		t.Fatalf("Describe() = %q", d)
	}
	if s := Stamp("x %d/s", 5); !regexp.MustCompile(`^\[.*\] x 5/s$`).MatchString(s) {
		t.Fatalf("Stamp = %q", s)
	}
}

func TestCPUSeconds(t *testing.T) {
	x := 0
	for i := range 300_000_000 {
		x += i
	}
	_ = x
	if CPUSeconds(os.Getpid()) <= 0 {
		t.Fatal("no CPU time for this process")
	}
	if CPUSeconds(0) != 0 || CPUSeconds(1<<30) != 0 {
		t.Fatal("unknown pid must read 0")
	}
}
