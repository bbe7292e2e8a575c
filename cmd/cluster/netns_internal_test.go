package main

import "testing"

// TestOwnLinkTouchesOnlyTheLaunchersLinks: the cleanup deletes the links a
// run makes and none of the host's, whatever their names begin with.
func TestOwnLinkTouchesOnlyTheLaunchersLinks(t *testing.T) {
	for name, want := range map[string]bool{
		"sypart-back": true, "sypart-front": true, "sypart0b": true, "sypart12f": true,
		"sypart": false, "sypartb": false, "sypart1x": false, "sypart-x": false,
		"eth0": false, "docker0": false, "syparty0b": false,
	} {
		if got := ownLink("sypart", name); got != want {
			t.Errorf("ownLink(sypart, %q) = %v, want %v", name, got, want)
		}
	}
	for prefix, want := range map[string]bool{"sypart": true, "ab": true, "": false, "e": false, "Sy": false, "sy-x": false, "abcdefghi": false, "1ab": false} {
		if got := validPrefix(prefix); got != want {
			t.Errorf("validPrefix(%q) = %v, want %v", prefix, got, want)
		}
	}
}
