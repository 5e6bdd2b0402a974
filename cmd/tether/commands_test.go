package main

import (
	"bytes"
	"strings"
	"testing"
)

// Under either build (go test, go test -tags tether_sidecar): `tether help`
// lists exactly the commands this binary has, and a full-build command
// missing from the sidecar build says so instead of being unknown.
func TestCommandsOfThisBuild(t *testing.T) {
	var help bytes.Buffer
	if code := run([]string{"help"}, func(string) string { return "" }, &help, &help); code != 0 {
		t.Fatalf("help: exit %d", code)
	}
	for _, name := range fullOnly {
		_, built := fullCommands[name]
		if listed := strings.Contains(help.String(), "tether "+name+" "); listed != built {
			t.Errorf("%s: built %v, listed by help %v", name, built, listed)
		}
		if built {
			continue
		}
		var out, errb bytes.Buffer
		if code := run([]string{name}, func(string) string { return "" }, &out, &errb); code != 1 || !strings.Contains(errb.String(), "not in this build") {
			t.Errorf("tether %s in the sidecar build: exit %d, %q; want 1 and a message saying it is not in this build", name, code, errb.String())
		}
	}
	for name := range fullCommands {
		if !strings.Contains(strings.Join(fullOnly, " "), name) {
			t.Errorf("%s is registered but not in fullOnly", name)
		}
	}
}
