package main

import (
	"log/slog"
	"runtime"
	"testing"
)

func TestSetProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	log := slog.New(slog.DiscardHandler)

	runtime.GOMAXPROCS(2)
	setProcs(log, func(k string) string {
		if k == "GOMAXPROCS" {
			return "2"
		}
		return ""
	})
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Errorf("with GOMAXPROCS set: %d Ps, want the environment's 2", got)
	}

	setProcs(log, func(string) string { return "" })
	if got := runtime.GOMAXPROCS(0); got != sidecarProcs {
		t.Errorf("without GOMAXPROCS: %d Ps, want %d", got, sidecarProcs)
	}
}
