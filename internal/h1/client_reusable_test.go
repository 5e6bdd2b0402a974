package h1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Reusable is the one test a pooling client makes: each way an answer's
// end can be uncertain, or bytes follow it, makes it false.
func TestReusable(t *testing.T) {
	const chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedAbc
	for _, tt := range []struct {
		name string
		in   string
		// use reads the answer's body as the case says, before Reusable.
		use  func(a *Answer) error
		want bool
	}{
		{"read to its end", sdkCall, readAnswerToEnd, true},
		{"Content-Length, read to its end", sdkBadRequest, readAnswerToEnd, true},
		{"no body", sdkAccepted, nil, true},
		{"not read", sdkCall, nil, false},
		{"read in part", sdkBadRequest, readAnswerSome, false},
		{"closed before its end", sdkCall, closeAnswerBody, false},
		{"read to its end, then closed", sdkCall, func(a *Answer) error { readAnswerToEnd(a); return closeAnswerBody(a) }, true},
		{"chunk size refused in the body", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nx\r\n", readAnswerToEnd, false},
		{"cut short", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", readAnswerToEnd, false},
		{"to the close", "HTTP/1.1 200 OK\r\n\r\nabc", readAnswerToEnd, false},
		{"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc", readAnswerToEnd, false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", readAnswerToEnd, false},
		{"bytes after it", chunked + "x", readAnswerToEnd, false},
		{"1xx: the final answer is to come", "HTTP/1.1 103 Early Hints\r\n\r\n", nil, false},
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n", nil, false},
		{"wrapped body, read to its end", sdkCall, func(a *Answer) error {
			a.Body = io.NopCloser(a.Body) // as a proxy wraps it
			return readAnswerToEnd(a)
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tt.in))
			a, err := ReadAnswer(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.use != nil {
				tt.use(a)
			}
			if got := a.Reusable(br); got != tt.want {
				t.Errorf("Reusable %v, want %v", got, tt.want)
			}
		})
	}
	// An answer of another transport is never this connection's.
	if AnswerOf(&http.Response{StatusCode: 200, Body: http.NoBody}).Reusable(bufio.NewReader(strings.NewReader(""))) {
		t.Errorf("an answer of AnswerOf is reusable")
	}
}

func readAnswerToEnd(a *Answer) error {
	_, err := io.Copy(io.Discard, a.Body)
	return err
}

func readAnswerSome(a *Answer) error {
	_, err := a.Body.Read(make([]byte, 4))
	return err
}

func closeAnswerBody(a *Answer) error { return a.Body.Close() }

// A bad first chunk size that came with the head refuses the answer
// (issue 29 item 11: a proxy answers 502 instead of cutting the answer it
// began to relay); one that comes later fails the body, with an error
// that is not io.EOF and that says the framing was wrong.
func TestReadAnswerRefusesABadFirstChunk(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, chunk := range []string{"0x10\r\n", "-1\r\n", "ffffffffffffffff\r\n", "\r\n", " 3\r\n", "3\n", "3;=\r\n"} {
		_, err := ReadAnswer(bufio.NewReader(strings.NewReader(head+chunk+"abc")), nil)
		if !errors.Is(err, ErrMalformedAnswer) {
			t.Errorf("%q with the head: error %v, want ErrMalformedAnswer", chunk, err)
		}

		br := bufio.NewReader(io.MultiReader(strings.NewReader(head), strings.NewReader(chunk+"abc")))
		a, err := ReadAnswer(br, nil)
		if err != nil {
			t.Fatalf("%q after the head: %v, want the head read", chunk, err)
		}
		if _, err := io.ReadAll(a.Body); !errors.Is(err, ErrMalformedAnswer) {
			t.Errorf("%q after the head: body error %v, want ErrMalformedAnswer", chunk, err)
		}
		if _, err := a.Body.Read(make([]byte, 8)); !errors.Is(err, ErrMalformedAnswer) {
			t.Errorf("%q: a read after the failure returns %v, want the same failure", chunk, err)
		}
		if a.Reusable(br) {
			t.Errorf("%q: reusable after the failure", chunk)
		}
	}
}

// A status under 100 is no status (issue 29 item 6: the proxy's
// WriteHeader panicked on a backend's 000); nor is one of four digits.
func TestReadAnswerRefusesStatusOutOfRange(t *testing.T) {
	for _, status := range []string{"000", "099", "001", "+20", "1000", " 200", "20"} {
		in := "HTTP/1.1 " + status + " X\r\nContent-Length: 0\r\n\r\n"
		if a, err := ReadAnswer(bufio.NewReader(strings.NewReader(in)), nil); !errors.Is(err, ErrMalformedAnswer) {
			t.Errorf("status %q: %v, %v; want ErrMalformedAnswer", status, a, err)
		}
	}
	for _, status := range []string{"100", "200", "599", "999"} {
		in := "HTTP/1.1 " + status + " X\r\nContent-Length: 0\r\n\r\n"
		if _, err := ReadAnswer(bufio.NewReader(strings.NewReader(in)), nil); err != nil {
			t.Errorf("status %q: %v", status, err)
		}
	}
}

// A head longer than the reader's buffer is read, not handed elsewhere:
// with the same rules, and its read errors as they came.
func TestReadAnswerLongHead(t *testing.T) {
	long := "HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("x", 3000) + "\r\nX-Also: " + strings.Repeat("y", 3000) + "\r\nContent-Length: 3\r\n\r\nabc"
	br := bufio.NewReaderSize(strings.NewReader(long), 16)
	a, err := ReadAnswer(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(a.Body); string(body) != "abc" || err != nil || len(a.Header.Get("X-Also")) != 3000 {
		t.Fatalf("body %q, %v, X-Also of %d bytes", body, err, len(a.Header.Get("X-Also")))
	}
	if !a.Reusable(br) {
		t.Errorf("not reusable")
	}
	mine := errors.New("reset")
	br = bufio.NewReaderSize(io.MultiReader(strings.NewReader(long[:5000]), &failingReader{mine}), 16)
	if _, err := ReadAnswer(br, nil); err != mine {
		t.Errorf("error %v, want the reader's", err)
	}
	br = bufio.NewReaderSize(strings.NewReader(long[:5000]), 16)
	if _, err := ReadAnswer(br, nil); err != io.ErrUnexpectedEOF {
		t.Errorf("error %v, want io.ErrUnexpectedEOF", err)
	}
}

type failingReader struct{ err error }

func (f *failingReader) Read([]byte) (int, error) { return 0, f.err }
