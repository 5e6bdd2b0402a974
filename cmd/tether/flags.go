package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// The subcommands' flag sets share one environment convention and one
// error style; these are its only implementation.

// envName maps a flag name to its environment variable: max-body →
// TETHER_MAX_BODY.
func envName(flagName string) string {
	return "TETHER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// envDefaults sets every flag of fs that has a TETHER_<UPPER_SNAKE>
// variable, before the command line is parsed (which then wins).
func envDefaults(fs *flag.FlagSet, getenv func(string) string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		if v := getenv(name); v != "" && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}

// newFlagSet returns a flag set whose errors are one line (parseFlags
// prints the usage for -h only).
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args; for -h it prints synopsis and the flags.
func parseFlags(fs *flag.FlagSet, args []string, synopsis string, stderr io.Writer) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, synopsis)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return err
}
