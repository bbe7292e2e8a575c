package testkit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartNATSServer runs the nats-server binary bin as a process of its own
// on a loopback port chosen by the server, with args added (e.g. "-js",
// "-sd", dir), and returns the process and its client URL once its ports
// file says it listens. The test's end resumes a stopped server and stops
// it.
func StartNATSServer(t testing.TB, bin string, args ...string) (*os.Process, string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", dir}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	var ports struct {
		Nats []string `json:"nats"`
	}
	CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("nats-server_%d.ports", cmd.Process.Pid)))
		if err != nil {
			return fmt.Errorf("nats-server wrote no ports file: %w", err)
		}
		if json.Unmarshal(b, &ports) != nil || len(ports.Nats) == 0 {
			return fmt.Errorf("nats-server's ports file holds no client URL: %s", b)
		}
		return nil
	})
	return cmd.Process, ports.Nats[0]
}

// SyncBuffer is a log sink many goroutines may write to.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
