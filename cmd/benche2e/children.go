package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

// child is one role running in its own process, so that its garbage
// collector and scheduler are its own, as in a deployment, and its CPU time
// can be read from /proc.
type child struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	drained chan struct{} // closed when the child's stdout reaches EOF
	urls    []string
}

func startChild(ctx context.Context, exe, name string, args ...string) (*child, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, drained: make(chan struct{})}
	ready := make(chan error, 1)
	go func() { // ends at the child's EOF; stop waits for it
		defer close(c.drained)
		br := bufio.NewReader(stdout)
		line, err := br.ReadString('\n')
		f := strings.Fields(line)
		switch {
		case err != nil:
			ready <- fmt.Errorf("%s printed no READY line: %w", name, err)
		case len(f) < 2 || f[0] != "READY":
			ready <- fmt.Errorf("%s: unexpected first line %q", name, line)
		default:
			c.urls = f[1:]
			ready <- nil
		}
		_, _ = io.Copy(io.Discard, br)
	}()
	select {
	case err = <-ready:
	case <-time.After(60 * time.Second):
		err = fmt.Errorf("%s not ready after 60s", name)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = c.stop()
		return nil, err
	}
	return c, nil
}

// stop closes the child's stdin and sends SIGTERM; a child still running
// 15s later is killed.
func (c *child) stop() error {
	_ = c.stdin.Close()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.drained:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.drained
	}
	return c.cmd.Wait()
}

// cpuUse is CPU time used, in user and in system (kernel) mode.
type cpuUse struct {
	User loadgen.Dur `json:"user_ms"`
	Sys  loadgen.Dur `json:"sys_ms"`
}

func (c cpuUse) total() time.Duration { return c.User.D() + c.Sys.D() }

func (c cpuUse) minus(o cpuUse) cpuUse { return cpuUse{User: c.User - o.User, Sys: c.Sys - o.Sys} }

// cpuTime is the user and system CPU time the child has used.
func (c *child) cpuTime() (cpuUse, error) { return cpuTimeOf(c.cmd.Process.Pid) }

// cpuTimeOf reads /proc/<pid>/stat (clock ticks of 10ms, USER_HZ on Linux).
func cpuTimeOf(pid int) (cpuUse, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuUse{}, err
	}
	// The command name may hold spaces and parentheses; fields start after
	// the last ')'. utime and stime are fields 14 and 15 of the line.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return cpuUse{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return cpuUse{}, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	const tick = 10 * time.Millisecond
	return cpuUse{User: loadgen.Dur(time.Duration(ut) * tick), Sys: loadgen.Dur(time.Duration(st) * tick)}, nil
}
