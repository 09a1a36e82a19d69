package egress

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// scriptConn is a connection whose server side is a fixed byte string; what
// the client writes is discarded.
type scriptConn struct {
	r    *bytes.Reader
	read int
}

func (c *scriptConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzExchange feeds exchange whatever a server could send back. It must
// never panic, keep a connection it did not read to a clean end, keep more
// than SnippetSize bytes, or read without bound.
func FuzzExchange(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nrest",
		"HTTP/1.0 429 Too Many\r\nRetry-After: 30\r\n\r\nslow down",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"HTTP/1.1 2000 OK\r\n\r\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	c, err := NewClient(Config{})
	if err != nil {
		f.Fatal(err)
	}
	t0, err := c.target("https://example.test/hook")
	if err != nil {
		f.Fatal(err)
	}
	header := http.Header{"Content-Type": {"application/json"}}
	f.Fuzz(func(t *testing.T, answer []byte) {
		conn := &scriptConn{r: bytes.NewReader(answer)}
		pc := newPconn(conn)
		res, keep, err := c.exchange(context.Background(), pc, t0, header, []byte("{}"), time.Now().Add(time.Minute))
		if len(res.Snippet) > SnippetSize {
			t.Errorf("kept %d bytes", len(res.Snippet))
		}
		if err != nil {
			if keep || res.StatusCode != 0 {
				t.Errorf("failed (%v) with status %d, keep %v", err, res.StatusCode, keep)
			}
		} else {
			if res.ErrorCode != statusCode(res.StatusCode) || (res.ErrorCode == "") != (res.Err == nil) {
				t.Errorf("status %d classified %q, err %v", res.StatusCode, res.ErrorCode, res.Err)
			}
			if keep && (res.StatusCode < 200 || pc.br.Buffered() != 0) {
				t.Errorf("kept a connection after status %d with %d bytes unread", res.StatusCode, pc.br.Buffered())
			}
		}
		// Six heads at most, 4 KiB of body, what the chunked reader allows
		// around it, and one buffer read ahead.
		if limit := (max1xx+1)*maxHeadBytes + MaxResponseRead + 32<<10 + bufferSize; conn.read > limit {
			t.Errorf("read %d bytes, more than %d", conn.read, limit)
		}
	})
}
