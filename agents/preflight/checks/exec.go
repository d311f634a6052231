package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/internal/groupcmd"
)

// errNotFound marks a tool that is not installed: a configuration error.
var errNotFound = errors.New("executable not found")

// output is what a child process printed and how it ended.
type output struct {
	Text     string
	ExitCode int // -1 when killed (timeout)
}

// syncWriter lets stdout and stderr share one buffer in order.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// run starts a tool, tees its combined output to echo (the container log),
// and kills its whole process group when ctx ends.
func run(ctx context.Context, echo io.Writer, env []string, name string, args ...string) (output, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return output{}, fmt.Errorf("%s: %w", name, errNotFound)
	}
	cmd := groupcmd.Command(ctx, 5*time.Second, path, args...)
	cmd.Env = env
	var buf bytes.Buffer
	w := &syncWriter{w: io.MultiWriter(&buf, echo)}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Run()
	out := output{Text: buf.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		out.ExitCode = -1
		return out, ctx.Err()
	case errors.As(err, &ee):
		out.ExitCode = ee.ExitCode()
	default:
		return out, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// gpuUUIDs runs `nvidia-smi --query-gpu=uuid --format=csv,noheader`: the
// GPUs allocated to this container. Its warning exit (14, infoROM
// corrupted: topology.SMIWarningExit) comes after the full list and is
// no error when it listed GPUs.
func gpuUUIDs(ctx context.Context, echo io.Writer, env []string, nvidiaSMI string) ([]string, error) {
	out, err := run(ctx, echo, env, nvidiaSMI, "--query-gpu=uuid", "--format=csv,noheader")
	if err != nil {
		return nil, err
	}
	if out.ExitCode != 0 && !topology.SMIWarningExit(out.ExitCode) {
		return nil, fmt.Errorf("nvidia-smi exited %d: %s", out.ExitCode, firstLine(out.Text))
	}
	var uuids []string
	for _, l := range strings.Split(out.Text, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "GPU-") || strings.HasPrefix(l, "MIG-") {
			uuids = append(uuids, l)
		}
	}
	if len(uuids) == 0 && out.ExitCode != 0 {
		return nil, fmt.Errorf("nvidia-smi exited %d and listed no GPU: %s", out.ExitCode, firstLine(out.Text))
	}
	if len(uuids) == 0 {
		return nil, fmt.Errorf("nvidia-smi listed no GPU: %s", firstLine(out.Text))
	}
	return uuids, nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
