// Package testkit is what the tests of every package share: one poller, one
// leak-checking TestMain, a load loop and listeners handed over already
// bound. Tests start real parts; these are the few ways they wait on them.
package testkit

import (
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
// A package whose tests are still running a minute before go test's
// -timeout (a tenth of it, when that is less) is stopped there, after
// stuckTests names where each test's goroutines wait in a few
// lines, last in the output: go test's own timeout prints the same only at
// the head of a dump of every goroutine, which a log's tail does not show.
func Main(m *testing.M, opts ...goleak.Option) {
	flag.Parse()
	if timeout := testTimeout(); timeout > 0 {
		watchdog := time.AfterFunc(timeout-min(time.Minute, timeout/10), func() {
			stuckTests(os.Stderr, timeout)
			os.Exit(1)
		})
		defer watchdog.Stop()
	}
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testTimeout is go test's -timeout for this package's binary, 0 when it
// has none or when it runs benchmarks or fuzzing, which the timeout does
// not cover.
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

// stuckTests writes, for every goroutine running a test's code, the
// goroutine's state, the frame it waits in and the innermost frame of a
// _test.go file: where each test is stuck, a few lines each.
func stuckTests(w io.Writer, timeout time.Duration) {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	fmt.Fprintf(w, "testkit: tests still running near the %v timeout; where their goroutines wait:\n", timeout)
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(g, "\n")
		if len(lines) < 3 {
			continue
		}
		in := ""
		for i := 2; i < len(lines); i += 2 {
			if strings.Contains(lines[i], "_test.go:") {
				in = strings.TrimSpace(lines[i-1]) + " " + strings.TrimSpace(lines[i])
				break
			}
		}
		if in == "" || strings.Contains(in, ".TestMain(") {
			continue // no test's code, or the runner's own wait
		}
		fmt.Fprintf(w, "  %s\n    waits in %s\n    in %s\n", lines[0], strings.TrimSpace(lines[1]), in)
	}
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
