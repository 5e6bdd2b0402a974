package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// drainCommand is `tether drain BACKEND [--undo]`: it asks a running
// tether (its admin listener, POST or DELETE /drain) to drain a backend:
// no new sessions go to it, and its sessions move to the others, each at
// its first quiet moment. Every replica of a fleet must be asked: a drain
// is each replica's own.
func drainCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tether drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", defaultAdmin(getenv), "admin address of the tether to ask (URL or host:port; env TETHER_ADMIN_LISTEN)")
	undo := fs.Bool("undo", false, "stop draining: the backend takes new sessions again")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("drain: want one BACKEND (its URL or endpoint id, as `tether status` shows them)")
	}
	base, err := adminURL(*admin)
	if err != nil {
		return err
	}
	method := http.MethodPost
	if *undo {
		method = http.MethodDelete
	}
	var v drainView
	if err := callAdmin(ctx, method, base, "/drain?backend="+url.QueryEscape(pos[0]), &v); err != nil {
		return err
	}
	if v.Draining {
		fmt.Fprintf(stdout, "draining %s: %d sessions to move (follow with tether status)\n", v.Backend, v.Sessions)
	} else {
		fmt.Fprintf(stdout, "%s takes new sessions again (%d sessions on it)\n", v.Backend, v.Sessions)
	}
	return nil
}
