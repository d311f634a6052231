package fabric

import "github.com/faultline/faultline/agents/logtail"

// tailer reads the FM (or NVLSM) log incrementally (logtail: rotation
// followed, reads bounded) into LogLines.
type tailer struct {
	logtail.Follower
	reader *LogReader
}

const (
	// replayBytes of a log present when the agent starts are read (FM's
	// log may hold up to LOG_FILE_MAX_SIZE, a gigabyte by default: read
	// whole, it was held in memory and replayed as one poll — 256 MB took
	// 800 MB, the agent's limit is 128 MiB).
	replayBytes = 1 << 20
	// chunkBytes at most are read a poll (about 30,000 lines, 40 MB of
	// heap with their events); the rest waits for the next poll.
	chunkBytes = 4 << 20
)

func (t *tailer) read(path string, r *LogReader) ([]LogLine, error) {
	first := t.reader == nil
	if first {
		t.reader, t.Replay = r, replayBytes
	}
	var out []LogLine
	err := t.Read(path, chunkBytes, func(line string) bool {
		out = append(out, t.reader.Feed(line)...)
		return true
	})
	// A message may still receive continuation lines; it is reported
	// with the next read, unless the file is idle: flush what waits.
	out = append(out, t.reader.Flush()...)
	for i := range out {
		out[i].Replayed = first
	}
	return out, err
}
