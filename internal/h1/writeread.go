package h1

import "net"

// WriteThenRead writes w to c, then reads into p what c answers: a client's
// request and the start of its answer. On a connection of RawIO's it is one
// wait of the runtime's poller, with no read tried before the answer can
// have come (see rawConn.WriteThenRead); on any other, Write then Read.
// written is how much of w reached c; err is the write's when written <
// len(w), the read's otherwise.
func WriteThenRead(c net.Conn, w, p []byte) (written, n int, err error) {
	if wr, ok := c.(interface {
		WriteThenRead(w, p []byte) (int, int, error)
	}); ok && len(w) > 0 && len(p) > 0 {
		return wr.WriteThenRead(w, p)
	}
	if written, err = c.Write(w); err != nil {
		return written, 0, err
	}
	n, err = c.Read(p)
	return written, n, err
}
