package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// stopTimeout is how long a part may take to stop after SIGTERM before it is
// killed; adapters drain their requests within it.
const stopTimeout = 20 * time.Second

// procs are the child processes of one run. Each runs in its own process
// group, so a Ctrl-C reaches only this launcher, which stops them in the
// reverse order of their start: gateways first, NATS last, as in a rolling
// shutdown. Every pid is written to the pids file.
type procs struct {
	logDir, pidFile string
	exited          chan error // the first child that exits on its own
	stopping        atomic.Bool
	// faults: a part that exits is expected (the fault tests kill them),
	// not the end of the run.
	faults atomic.Bool

	mu      sync.Mutex
	list    []*proc
	sockets []*os.File // the listening sockets handed to parts, closed by stopAll
}

type proc struct {
	name  string
	dir   string
	env   []string
	files []*os.File // handed over as fd 3, 4, …; the same ones on a restart
	exe   string
	args  []string
	tier  int // started in ascending tiers, stopped in descending ones
	cmd   *exec.Cmd
	done  chan struct{}
}

func newProcs(logDir, pidFile string) *procs {
	return &procs{logDir: logDir, pidFile: pidFile, exited: make(chan error, 1)}
}

// tier groups the processes started together; start uses the current one.
func (ps *procs) nextTier() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.list = append(ps.list, nil) // a marker: tiers are counted by markers
}

// listen binds a loopback port for a part and returns the listening socket,
// to hand to the part as one of start's files (it then listens on fd:N),
// and its address. The socket stays open here until stopAll: a part killed
// and started again serves on the same one, so no one else can take its
// port in between, and connections made meanwhile wait in its queue.
func (ps *procs) listen() (*os.File, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	defer ln.Close() // f is a duplicate of the socket
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return nil, "", err
	}
	ps.mu.Lock()
	ps.sockets = append(ps.sockets, f)
	ps.mu.Unlock()
	return f, ln.Addr().String(), nil
}

// start runs exe as the part name, handing it files as fd 3, 4, and so on.
func (ps *procs) start(name, dir string, env []string, files []*os.File, exe string, args ...string) error {
	log, err := os.OpenFile(filepath.Join(ps.logDir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child holds its own descriptor
	cmd := exec.Command(exe, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, dir: dir, env: env, files: files, exe: exe, args: args, cmd: cmd, done: make(chan struct{})}
	ps.mu.Lock()
	if old := ps.find(name); old != nil { // a restart keeps the part's place
		p.tier = old.tier
		*old = *p
		p = old
	} else {
		for _, q := range ps.list {
			if q == nil {
				p.tier++
			}
		}
		ps.list = append(ps.list, p)
	}
	ps.mu.Unlock()
	if f, err := os.OpenFile(ps.pidFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintf(f, "%d %s\n", cmd.Process.Pid, name)
		_ = f.Close()
	}
	go func() { // ends when the child does; stopAll waits on done
		err := cmd.Wait()
		close(p.done)
		if !ps.stopping.Load() && !ps.faults.Load() {
			select {
			case ps.exited <- fmt.Errorf("%s exited (%v); see %s", name, err, log.Name()):
			default:
			}
		}
	}()
	return nil
}

// Lock should be held.
func (ps *procs) find(name string) *proc {
	for _, p := range ps.list {
		if p != nil && p.name == name {
			return p
		}
	}
	return nil
}

// part is the part name as last started.
func (ps *procs) part(name string) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.find(name); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("no part %q", name)
}

// signal sends sig to the running part name.
func (ps *procs) signal(name string, sig syscall.Signal) error {
	p, err := ps.part(name)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s is not running", name)
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// restart starts the part name again, as it was first started, once it has
// exited (waiting up to stopTimeout for that); its log is appended to.
func (ps *procs) restart(name string) error {
	p, err := ps.part(name)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		return fmt.Errorf("%s is still running", name)
	}
	return ps.start(name, p.dir, p.env, p.files, p.exe, p.args...)
}

// pid is the process id of the part name as last started, or 0.
func (ps *procs) pid(name string) int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.find(name); p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// stopAll sends SIGTERM tier by tier, the last started first, and waits for
// each tier to exit; a process still running after stopTimeout is killed.
func (ps *procs) stopAll() error {
	ps.stopping.Store(true)
	ps.mu.Lock()
	tiers := map[int][]*proc{}
	for _, p := range ps.list {
		if p != nil {
			tiers[p.tier] = append(tiers[p.tier], p)
		}
	}
	ps.mu.Unlock()
	var errs []error
	keys := make([]int, 0, len(tiers))
	for k := range tiers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range slices.Backward(keys) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, p := range tiers[k] {
			wg.Go(func() {
				if err := p.stop(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	ps.mu.Lock()
	for _, f := range ps.sockets {
		_ = f.Close()
	}
	ps.sockets = nil
	ps.mu.Unlock()
	return errors.Join(errs...)
}

func (p *proc) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", p.name, stopTimeout)
	}
}
