package listen_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/listen"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

func TestMain(m *testing.M) {
	// The test binary run as a child: serve one connection on the
	// inherited socket, then exit.
	if addr := os.Getenv("LISTEN_TEST_CHILD"); addr != "" {
		os.Exit(child(addr))
	}
	testkit.Main(m)
}

// child accepts one connection on addr and writes its own pid and the
// listener's address to it.
func child(addr string) int {
	ln, err := listen.Listen(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer ln.Close()
	c, err := ln.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer c.Close()
	fmt.Fprintf(c, "%d %s\n", os.Getpid(), ln.Addr())
	return 0
}

// A socket bound by this process and handed to a child as fd 3 is served
// by the child: the connection reaches it at the address the parent bound.
func TestInheritedSocketIsServedByTheChild(t *testing.T) {
	ln := testkit.Listen(t)
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LISTEN_TEST_CHILD=fd:3")
	cmd.ExtraFiles = []*os.File{f} // the first extra file is fd 3
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// This process never accepts: only the child can answer.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		if err != nil {
			c.Close() // the child never answers: end the read
		}
		exited <- err
	}()
	line, readErr := bufio.NewReader(c).ReadString('\n')
	if err := <-exited; err != nil {
		t.Fatalf("child: %v", err)
	}
	if readErr != nil {
		t.Fatalf("reading the child's answer: %v", readErr)
	}
	want := fmt.Sprintf("%d %s\n", cmd.Process.Pid, ln.Addr())
	if line != want {
		t.Fatalf("child answered %q, want %q", line, want)
	}
}

// In-process, fd:N of a duplicate of a listening socket gives a listener
// on the same port.
func TestListenTakesOverADuplicate(t *testing.T) {
	ln := testkit.Listen(t)
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Listen takes the descriptor over and closes it: hand it one of its
	// own, not f's, which f closes.
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	got, err := listen.Listen(fmt.Sprintf("fd:%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if got.Addr().String() != ln.Addr().String() {
		t.Fatalf("listening on %s, want %s", got.Addr(), ln.Addr())
	}
}

func TestListenBindsAnAddress(t *testing.T) {
	ln, err := listen.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

func TestListenRefusesWhatIsNoListeningSocket(t *testing.T) {
	file, err := os.CreateTemp(t.TempDir(), "not-a-socket")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	conn, err := net.Dial("tcp", testkit.Listen(t).Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	connFile, err := conn.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer connFile.Close()
	for addr, want := range map[string]string{
		"fd:x":                              "want fd:N",
		"fd:-1":                             "want fd:N",
		"fd:":                               "want fd:N",
		"fd:99999":                          "no such file descriptor",
		fmt.Sprintf("fd:%d", file.Fd()):     "not a socket",
		fmt.Sprintf("fd:%d", connFile.Fd()): "not listening",
	} {
		ln, err := listen.Listen(addr)
		if err == nil {
			ln.Close()
			t.Errorf("Listen(%q) succeeded", addr)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), addr) {
			t.Errorf("Listen(%q) = %v, want an error naming it and saying %q", addr, err, want)
		}
	}
	// A refused descriptor is left open.
	if _, err := file.WriteString("still open"); err != nil {
		t.Errorf("the file refused as a listener was closed: %v", err)
	}
}
