// Package testkit is what the tests of every package share: one poller, one
// leak-checking TestMain, a load loop and listeners handed over already
// bound. Tests start real parts; these are the few ways they wait on them.
package testkit

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// CheckFor calls f every `every` until it returns nil, and returns how long
// that took; after total it fails the test with f's last error. Like
// nats-server's checkFor: a test waits on a condition, never on a fixed
// sleep. total is an upper bound for a loaded machine running -race, not a
// speed target: pick it generous.
func CheckFor(t testing.TB, total, every time.Duration, f func() error) time.Duration {
	t.Helper()
	took, err := Poll(total, every, f)
	if err != nil {
		t.Fatalf("not within %v: %v", total, err)
	}
	return took
}

// Poll is CheckFor for a test that measures the wait and carries on when it
// runs out: it calls f every `every` until f returns nil or total has
// passed, and returns how long it waited and f's last error (nil when f
// succeeded).
func Poll(total, every time.Duration, f func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > total {
			return time.Since(start), err
		}
		time.Sleep(every)
	}
}

// Main is the TestMain of packages whose parts start goroutines: it runs the
// tests, then fails the package when a goroutine outlives them. The idle
// keep-alive connections of the tests' own default HTTP client are not
// leaks, so they are closed first.
//
// A package whose tests are still running shortly before go test's
// -timeout (watchdogMargin) is stopped there, after stuckTests names the
// stuck tests in its last line: go test's own timeout names them only at
// the head of a dump of every goroutine, which a log's tail does not show.
func Main(m *testing.M, opts ...goleak.Option) {
	flag.Parse()
	var watchdog *time.Timer
	if timeout := testTimeout(); timeout > 0 {
		stderr := os.Stderr // m.Run points os.Stderr elsewhere under -json
		watchdog = time.AfterFunc(timeout-min(watchdogMargin, timeout/10), func() {
			stuckTests(stderr, timeout)
			os.Exit(1)
		})
	}
	code := m.Run()
	if watchdog != nil && !watchdog.Stop() {
		select {} // the watchdog is writing its report; it exits
	}
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// watchdogMargin is how long before go test's -timeout Main's watchdog
// stops a package (at most a tenth of the timeout): the few milliseconds
// its report takes, with room for a starved machine.
const watchdogMargin = 5 * time.Second

// testTimeout is go test's -timeout for this package's binary, 0 when it
// has none, and 0 when the binary also runs benchmarks or fuzzing: those
// run after the tests, outside the timeout, and the watchdog cannot tell
// when the tests ended.
func testTimeout() time.Duration {
	for _, name := range []string{"test.bench", "test.fuzz"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return 0
		}
	}
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	d, _ := f.Value.(flag.Getter).Get().(time.Duration)
	return d
}

// stuckTests writes, in one write, where the goroutines running a test's
// code wait: for each, its state, the frame it waits in and the innermost
// frame in a _test.go file, the goroutines of test functions (called by
// testing.tRunner) last; then one line naming those functions.
func stuckTests(w io.Writer, timeout time.Duration) {
	buf := make([]byte, 64<<20)
	n := runtime.Stack(buf, true)
	var helpers, runners bytes.Buffer
	var tests []string
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		lines := strings.Split(g, "\n")
		var top, in, test, caller string
		main := false
		// A frame is a function line and a tab-indented file line; a
		// deep stack has a line of elided frames between two of them.
		for i := 1; i < len(lines); i++ {
			fn, file := lines[i-1], lines[i]
			if !strings.HasPrefix(file, "\t") || strings.HasPrefix(fn, "created by ") {
				continue
			}
			if top == "" {
				top = fn
			}
			if in == "" && strings.Contains(file, "_test.go:") {
				in = fn + " " + strings.TrimSpace(file)
			}
			switch {
			case strings.HasPrefix(fn, "testing.tRunner("):
				test = caller
			case strings.HasPrefix(fn, "testing.(*M).Run("):
				main = true
			}
			caller = funcName(fn)
		}
		if in == "" || main {
			continue // no test's code, or the runner's own wait
		}
		to := &helpers
		if test != "" {
			to, tests = &runners, append(tests, test)
		}
		fmt.Fprintf(to, "  %s\n    waits in %s\n    in %s\n", lines[0], top, in)
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "testkit: tests still running near the %v timeout; where their goroutines wait:\n", timeout)
	out.Write(helpers.Bytes())
	out.Write(runners.Bytes())
	if n == len(buf) {
		out.WriteString("  (the goroutines' stacks were cut at 64 MiB)\n")
	}
	fmt.Fprintf(&out, "testkit: stuck near the %v timeout: %s\n", timeout, strings.Join(tests, ", "))
	_, _ = w.Write(out.Bytes())
}

// funcName is a stack's function line without its arguments or package
// path: "test.TestX.func1" of ".../switchyard/test.TestX.func1(0xc0...)".
func funcName(line string) string {
	if i := strings.LastIndexByte(line, '('); i > 0 {
		line = line[:i]
	}
	return line[strings.LastIndexByte(line, '/')+1:]
}

// IgnoreZMQPub is the goleak option for the goroutine zmq4 (v0.17.0) leaks
// with every PUB socket: the socket's Close never stops its writer, which
// then waits on a condition nothing signals. Packages whose tests publish
// KV-cache events pass it to Main.
func IgnoreZMQPub() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")
}

// IgnoreObjectPutRace is the goleak option for the goroutine nats.go's
// object store (v1.55.0) can strand on a Put: Put publishes its chunks
// through a JetStream context of its own and removes that context's
// status listener when it returns, and when that is before the context's
// reconnect watcher has read the listener's channel, the watcher reads nil
// and waits on it for ever. Packages whose tests put objects pass it to
// Main.
func IgnoreObjectPutRace() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")
}

// IgnoreSourceCleanup is the goleak option for the goroutine nats-server
// (v2.15.2) starts when a mirror or source stream is deleted: it asks the
// origin to delete the stream's consumer there and waits up to 10 s for an
// answer, whatever the server's shutdown. Packages whose tests delete a
// mirror pass it to Main.
func IgnoreSourceCleanup() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).tryDeleteSourcingConsumer.func1")
}

// IgnoreMirrorSetup is the goleak option for the goroutine nats-server
// (v2.15.2) starts when a mirror asks its origin for a consumer: it waits
// for the answer (up to about 10 s) whatever the server's shutdown, and a
// mirror whose origin is out of reach (a region cut off) leaves one behind.
// Packages whose tests run a region's copy of the table pass it to Main.
func IgnoreMirrorSetup() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).setupMirrorConsumer.func3")
}

// NoGoroutinesLeft fails t at cleanup when a goroutine started after the
// call is still running: the parts the test started and stopped left
// nothing behind. Cleanups run last-registered first, so where it is called
// decides what it checks: first in the test, after every other cleanup;
// after the test's fixtures, before they are torn down.
func NoGoroutinesLeft(t testing.TB) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// Load runs f in a loop on each of workers goroutines (f gets the worker's
// number and its iteration) until the returned stop is called; stop waits
// for every loop to finish its iteration, and runs at cleanup if the test
// ends first. f reports failures with t.Error, never t.Fatal.
func Load(t testing.TB, workers int, f func(worker, i int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				f(w, i)
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// Listen binds a loopback TCP port chosen by the kernel and hands the
// listener over: whoever uses it serves on it, so no port is guessed and
// none is released before use. It is closed at cleanup (closing twice is
// harmless).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Cond is CheckFor's f for a condition that is only true or false: its
// error names what is awaited.
func Cond(what string, ok func() bool) func() error {
	return func() error {
		if ok() {
			return nil
		}
		return errors.New("still waiting for " + what)
	}
}

// SelfSigned makes a self-signed certificate for 127.0.0.1, valid for an
// hour around now, and returns it and its key in PEM and a pool trusting it.
func SelfSigned(t testing.TB) (certPEM, keyPEM []byte, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "switchyard-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), pool
}
