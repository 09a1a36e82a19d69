package egress

import (
	"bufio"
	"errors"
	"math"
	"net"
	"sync"
	"time"
)

// The client keeps its own HTTP/1.1 connections instead of using
// net/http.Transport. An attempt writes its request and reads the answer on
// the caller's goroutine: the transport's two goroutines per connection and
// the channel handoffs between them and the caller cost 15–25 µs of CPU per
// delivery in a burst, a sixth of all the platform spent on a run.
//
// What the transport did for free is done here:
//   - at most MaxConnsPerHost connections per destination, busy, idle or being
//     dialed; a caller beyond that waits in line for the next free one;
//   - keep-alive, with idle connections closed after idleTimeout;
//   - a connection the server closed while it was idle is found before it is
//     reused (peerClosed, on Linux), or when it is used, and then the request
//     is sent again once on a new connection (see Client.Post);
//   - 1xx answers before the final one are skipped; the response head is
//     bounded; a connection is reused only when its answer was read to the
//     end and nothing else came after it.

// idleTimeout is how long a connection may stay idle in the pool.
const idleTimeout = 90 * time.Second

// probeAfter is how long a connection must have been idle for its socket to
// be looked at before it is reused (see peerClosed). A connection busy a
// moment ago is not worth the system call.
const probeAfter = time.Second

// maxHeadBytes bounds the status line and header fields of one answer.
const maxHeadBytes = 64 << 10

// max1xx is how many interim (1xx) answers one request may get before the
// connection is counted as broken.
const max1xx = 5

// bufferSize is the size of each connection's read and write buffer.
const bufferSize = 4 << 10

var errHeadTooLarge = errors.New("egress: the response head exceeded 64 KiB")

// pconn is a pooled connection. Only the attempt holding it touches it.
type pconn struct {
	conn      net.Conn
	cr        connReader
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	reused    bool // it carried an earlier request
}

func newPconn(conn net.Conn) *pconn {
	pc := &pconn{conn: conn}
	pc.cr.conn = conn
	pc.cr.limit = math.MaxInt64
	pc.br = bufio.NewReaderSize(&pc.cr, bufferSize)
	pc.bw = bufio.NewWriterSize(conn, bufferSize)
	return pc
}

// connReader bounds what is read from the connection while a response head is
// read, and counts what an attempt got back.
type connReader struct {
	conn  net.Conn
	limit int64 // bytes that may still be read
	got   int64 // bytes read since the request was written
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.limit <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > r.limit {
		p = p[:r.limit]
	}
	n, err := r.conn.Read(p)
	r.limit -= int64(n)
	r.got += int64(n)
	return n, err
}

// hostPool holds the connections to one destination (HostKey).
type hostPool struct {
	c   *Client
	key string

	mu      sync.Mutex
	idle    []*pconn      // oldest first
	open    int           // connections busy, idle or being dialed
	waiters []chan *pconn // first come, first served; each has room for one
	sweep   *time.Timer   // closes expired idle connections; nil when none is idle
	dead    bool          // removed from Client.pools: get another
}

// pool returns the live pool of key, locked.
func (c *Client) pool(key string) *hostPool {
	for {
		v, ok := c.pools.Load(key)
		if !ok {
			v, _ = c.pools.LoadOrStore(key, &hostPool{c: c, key: key})
		}
		p := v.(*hostPool)
		p.mu.Lock()
		if !p.dead {
			return p
		}
		p.mu.Unlock()
	}
}

// take returns an idle connection of key; else it reserves a place for a new
// one (pc nil, wait nil), which the caller must dial or give back with
// p.put(nil); else, the pool being full, it queues the caller on wait, which
// will receive a connection or (nil) a place.
func (c *Client) take(key string) (p *hostPool, pc *pconn, wait chan *pconn) {
	p = c.pool(key)
	expired := p.expire(c.now())
	switch n := len(p.idle); {
	case n > 0: // the most recently used: the likeliest to be alive
		pc = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	case p.open < c.maxPerHost:
		p.open++
	default:
		wait = make(chan *pconn, 1)
		p.waiters = append(p.waiters, wait)
	}
	p.mu.Unlock()
	for _, old := range expired {
		old.conn.Close()
	}
	return p, pc, wait
}

// cancelWait takes wait out of the line. If a connection or a place was
// already handed to it, that is passed on.
func (p *hostPool) cancelWait(wait chan *pconn) {
	p.mu.Lock()
	for i, w := range p.waiters {
		if w == wait {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			p.mu.Unlock()
			return
		}
	}
	p.mu.Unlock()
	if pc := <-wait; pc != nil {
		p.put(pc, true)
	} else {
		p.put(nil, false)
	}
}

// put gives back pc: to the pool when keep is set, else it is closed. A nil
// pc gives back a place reserved by take. The first waiter, if any, gets the
// connection, or the place to dial one.
func (p *hostPool) put(pc *pconn, keep bool) {
	p.mu.Lock()
	if keep {
		pc.reused = true
		pc.idleSince = p.c.now()
		if len(p.waiters) > 0 {
			w := p.popWaiter()
			p.mu.Unlock()
			w <- pc
			return
		}
		p.idle = append(p.idle, pc)
		if p.sweep == nil {
			p.sweep = time.AfterFunc(idleTimeout, p.sweepIdle)
		}
		p.mu.Unlock()
		return
	}
	if len(p.waiters) > 0 {
		w := p.popWaiter()
		p.mu.Unlock()
		w <- nil
	} else {
		p.open--
		p.retireIfEmpty()
		p.mu.Unlock()
	}
	if pc != nil {
		pc.conn.Close()
	}
}

func (p *hostPool) popWaiter() chan *pconn {
	w := p.waiters[0]
	p.waiters[0] = nil
	p.waiters = p.waiters[1:]
	return w
}

// retireIfEmpty removes a pool with no connection and no waiter from the
// client, so destinations no longer called cost nothing. Called under p.mu.
func (p *hostPool) retireIfEmpty() {
	if p.open == 0 && len(p.waiters) == 0 {
		p.dead = true
		if p.sweep != nil {
			p.sweep.Stop()
			p.sweep = nil
		}
		p.c.pools.CompareAndDelete(p.key, p)
	}
}

// sweepIdle closes the connections idle for idleTimeout or more, and comes
// back when the next one expires.
func (p *hostPool) sweepIdle() {
	p.mu.Lock()
	p.sweep = nil
	closing := p.expire(p.c.now())
	if len(p.idle) > 0 {
		p.sweep = time.AfterFunc(idleTimeout-p.c.now().Sub(p.idle[0].idleSince), p.sweepIdle)
	} else {
		p.retireIfEmpty()
	}
	p.mu.Unlock()
	for _, pc := range closing {
		pc.conn.Close()
	}
}

// expire takes the idle connections idle since before now-idleTimeout out of
// the pool and returns them. Called under p.mu.
func (p *hostPool) expire(now time.Time) []*pconn {
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleSince) >= idleTimeout {
		n++
	}
	if n == 0 {
		return nil // the common case, on every take
	}
	closing := append([]*pconn(nil), p.idle[:n]...)
	kept := copy(p.idle, p.idle[n:])
	clear(p.idle[kept:]) // no stale pointers past the end
	p.idle = p.idle[:kept]
	p.open -= n
	return closing
}

// CloseIdleConnections closes the pooled connections not in use. Connections
// in use are kept, and pooled again when their attempt ends.
func (c *Client) CloseIdleConnections() {
	c.pools.Range(func(_, v any) bool {
		p := v.(*hostPool)
		p.mu.Lock()
		closing := p.idle
		p.idle = nil
		p.open -= len(closing)
		p.retireIfEmpty()
		p.mu.Unlock()
		for _, pc := range closing {
			pc.conn.Close()
		}
		return true
	})
}
