// Package iproute runs iproute2's ip for the parts and tests that build
// Linux network namespaces (cmd/cluster -netns, the namespaced regions of
// the test package).
package iproute

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// Run runs ip with each argument list in turn, stopping at the first
// failure, whose error names the command and carries ip's own output.
func Run(cmds [][]string) error {
	for _, args := range cmds {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}
