//go:build race

package lab_test

// raceEnabled: the race detector slows the simulator about tenfold, so the
// experiment tests run in a separate step without it (make test-lab).
const raceEnabled = true
