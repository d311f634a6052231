// Package groupcmd builds commands that run in a process group of their
// own, so that a context's end kills the command and every child it
// started (a wrapper's nvidia-smi, an nsenter'd tool), and whose output
// is waited for at most a bounded time after that (a child that escaped
// the group and holds the output open does not hold the caller).
package groupcmd

import (
	"context"
	"os/exec"
	"syscall"
	"time"
)

// Command is exec.CommandContext(ctx, name, args...) run in its own
// process group: at ctx's end the whole group gets SIGKILL, and Wait
// returns at most waitDelay later (exec.Cmd.WaitDelay).
func Command(ctx context.Context, waitDelay time.Duration, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	return cmd
}
