package main

import (
	"context"
	"errors"
	"io"
)

func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("demo: not written yet")
}
