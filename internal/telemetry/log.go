package telemetry

import (
	"fmt"
	"io"
	"log/slog"
)

// ParseLevel parses a log level: debug, info, warn or error. Its error
// starts with the quoted value, so that a caller can put the setting's
// name before it.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("%q: want debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger builds the process logger: text or JSON lines on w. At info,
// tether logs events (re-initializations, endpoint changes, store state
// transitions), never individual requests.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}
