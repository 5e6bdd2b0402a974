//go:build !linux

package poll

import "syscall"

// sys is empty: there is no Wait to make without epoll.
type sys struct{}

func newWait(source, watch syscall.Conn, fire func(Event)) (*Wait, error) {
	return nil, ErrUnsupported
}

func (w *Wait) arm() error { return ErrUnsupported }

func (w *Wait) setWatch(syscall.Conn) error { return ErrUnsupported }
func (w *Wait) wake() bool                  { return false }
func (w *Wait) close()                      {}
func (w *Wait) setInline()                  {}
func (w *Wait) handoff()                    {}
