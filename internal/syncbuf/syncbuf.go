// Package syncbuf is a buffer that a logger or a child process writes to
// while a test reads it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent Write and String. Max, when
// above zero, bounds what it keeps: what comes after is dropped, so a
// chatty process cannot fill the test's memory.
type Buffer struct {
	Max int
	mu  sync.Mutex
	b   bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Max > 0 && s.b.Len() > s.Max {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
