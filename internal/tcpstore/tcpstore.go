// Package tcpstore serves torch's TCPStore protocol: the key-value store behind
// torch.distributed's env:// rendezvous (init_process_group reads MASTER_ADDR and
// MASTER_PORT and connects to it). torchrun 2.x's agent on node rank 0 serves one and
// tells its workers so with TORCHELASTIC_USE_AGENT_STORE=True, so that every worker,
// rank 0's included, is a client of it; gangrun does the same with this server.
//
// The protocol is torch's (torch/csrc/distributed/c10d/TCPStore.cpp and
// TCPStoreLibUvBackend.cpp): each request is a command byte followed by its arguments,
// strings and byte vectors as a little-endian uint64 length and the bytes, numbers as
// little-endian int64 (uint64 for counts); replies likewise. Two dialects exist and a
// connection's first request tells which:
//
//   - torch ≥ 2.x sends VALIDATE (0) and the magic number 0x3C85F7CE first, then PING;
//     its commands are numbered VALIDATE 0, SET 1, COMPARE_SET 2, GET 3, ADD 4, CHECK 5,
//     WAIT 6, GETNUMKEYS 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10, MULTI_SET 11,
//     CANCEL_WAIT 12, PING 13, QUEUE_PUSH 14, QUEUE_POP 15, QUEUE_LEN 16;
//   - torch 1.13 sends no magic; its commands are SET 0, COMPARE_SET 1, GET 2, ADD 3,
//     CHECK 4, WAIT 5, GETNUMKEYS 6, WATCH_KEY 7, DELETE_KEY 8.
//
// Both were read from the wire of torch 1.13 (Debian) and 2.15 (PyPI) clients; the
// tests run both against this server. WATCH_KEY (torch 1.13's callback API, which
// init_process_group does not use) is not served: a connection sending it is closed.
//
// One Server is one store, in this process and nowhere else: never replicated. gangrun
// starts one per attempt on node rank 0, so each attempt's workers find it empty.
package tcpstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// Limits on what one request may carry (torch's libuv server has the same key and
// count limits, TCPStoreLibUvBackend.cpp: MAX_STRING_LEN, MAX_KEY_COUNT; its 8 MiB
// payload limit is raised here, as torch 1.13's server has none). A request over them
// closes its connection.
const (
	// MaxKeyBytes is the longest key: 8 KiB.
	MaxKeyBytes = 8 << 10
	// MaxValueBytes is the largest value: 64 MiB.
	MaxValueBytes = 64 << 20
	// MaxKeys is the most keys one CHECK, WAIT, MULTI_GET or MULTI_SET names.
	MaxKeys = 128 << 10
)

// validationMagic is what torch 2.x's client sends after VALIDATE.
const validationMagic = 0x3C85F7CE

// op is a command, in torch 2.x's numbering; torch 1.13's are mapped onto it.
type op uint8

// torch 2.x's commands (TCPStoreBackend.hpp, QueryType).
const (
	opValidate op = iota
	opSet
	opCompareSet
	opGet
	opAdd
	opCheck
	opWait
	opGetNumKeys
	opDeleteKey
	opAppend
	opMultiGet
	opMultiSet
	opCancelWait
	opPing
	opQueuePush
	opQueuePop
	opQueueLen
	opCount
)

// v1Ops maps torch 1.13's command numbers onto op (255: not served).
var v1Ops = [...]op{opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opGetNumKeys, 255, opDeleteKey}

// Replies to CHECK and WAIT (CheckResponseType, WaitResponseType).
const (
	checkReady     = 0
	checkNotReady  = 1
	waitStop       = 0
	waitCanceled   = 1
	queuePopPrefix = 8 // bytes of QUEUE_POP's length reply
)

// Server is a TCPStore server. Its methods are safe for concurrent use.
type Server struct {
	ln net.Listener

	mu      sync.Mutex
	keys    map[string][]byte
	queues  map[string][][]byte
	waiting map[string][]*conn // key → connections waiting for it, in arrival order
	conns   map[*conn]bool
	closed  bool

	wg sync.WaitGroup
}

// conn is one client connection. Its replies go out in the order they are queued, by
// one writer: a WAIT's reply is queued by the request that sets its last key, from
// another connection's goroutine, and must not overtake or follow a CANCEL_WAIT's.
type conn struct {
	c net.Conn
	// awaited counts the keys a pending WAIT still needs; 0 when none is pending.
	// Guarded by the server's mu.
	awaited int

	qm     sync.Mutex
	queue  [][]byte
	more   *sync.Cond
	closed bool
}

func newConn(c net.Conn) *conn {
	cn := &conn{c: c}
	cn.more = sync.NewCond(&cn.qm)
	return cn
}

// reply queues b to be written to the client as one write; it never blocks. The
// error is always nil (a failed write closes the connection, whose reads then end).
func (c *conn) reply(b []byte) error {
	c.qm.Lock()
	c.queue = append(c.queue, b)
	c.qm.Unlock()
	c.more.Signal()
	return nil
}

// write writes the queued replies in order until the connection ends.
func (c *conn) write() {
	for {
		c.qm.Lock()
		for len(c.queue) == 0 && !c.closed {
			c.more.Wait()
		}
		if c.closed {
			c.qm.Unlock()
			return
		}
		b := c.queue[0]
		c.queue = c.queue[1:]
		c.qm.Unlock()
		if _, err := c.c.Write(b); err != nil {
			c.c.Close()
			return
		}
	}
}

// stop ends the writer (replies still queued are dropped: the client is gone).
func (c *conn) stop() {
	c.qm.Lock()
	c.closed = true
	c.qm.Unlock()
	c.more.Broadcast()
}

// Listen starts a store on addr ("HOST:PORT"; ":PORT" is every interface, as torch's
// server binds) and serves it until Close. Errors are net.Listen's, naming addr.
func Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TCPStore on %s: %w", addr, err)
	}
	return Serve(ln), nil
}

// Serve serves a store on ln until Close, which closes ln.
func Serve(ln net.Listener) *Server {
	s := &Server{ln: ln, keys: map[string][]byte{}, queues: map[string][][]byte{},
		waiting: map[string][]*conn{}, conns: map[*conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Addr is the address the store listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Port is the TCP port the store listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Close stops the store: it closes the listener and every client connection (a client
// then fails with torch's "Connection reset by peer" or "Broken pipe") and waits for
// its goroutines. It may be called more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		c := newConn(nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			c.write()
		}()
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

// serve reads c's requests until it closes or sends something this server does not
// take, then forgets it.
func (s *Server) serve(c *conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.clearWait(c)
		s.mu.Unlock()
		c.stop()
		c.c.Close()
	}()
	r := bufio.NewReaderSize(c.c, 64<<10)
	head, err := r.Peek(5)
	v2 := err == nil && head[0] == byte(opValidate) && binary.LittleEndian.Uint32(head[1:]) == validationMagic
	for {
		b, err := r.ReadByte()
		if err != nil {
			return
		}
		o := op(b)
		if !v2 {
			if int(b) >= len(v1Ops) || v1Ops[b] == 255 {
				return
			}
			o = v1Ops[b]
		}
		if err := s.handle(c, r, o); err != nil {
			return
		}
	}
}

// A handler serves one request of its command, whose arguments follow in r; an error
// closes the connection.
type handler func(s *Server, c *conn, r *bufio.Reader) error

// handlers holds each served command's handler, by op.
var handlers = [opCount]handler{
	opValidate:   (*Server).serveValidate,
	opPing:       (*Server).servePing,
	opSet:        (*Server).serveSet,
	opCompareSet: (*Server).serveCompareSet,
	opGet:        (*Server).serveGet,
	opAdd:        (*Server).serveAdd,
	opCheck:      (*Server).serveCheck,
	opWait:       (*Server).serveWait,
	opCancelWait: (*Server).serveCancelWait,
	opGetNumKeys: (*Server).serveGetNumKeys,
	opDeleteKey:  (*Server).serveDeleteKey,
	opAppend:     (*Server).serveAppend,
	opMultiGet:   (*Server).serveMultiGet,
	opMultiSet:   (*Server).serveMultiSet,
	opQueuePush:  (*Server).serveQueuePush,
	opQueuePop:   (*Server).serveQueuePop,
	opQueueLen:   (*Server).serveQueueLen,
}

// handle serves one request of command o whose arguments follow in r, through o's
// handler.
func (s *Server) handle(c *conn, r *bufio.Reader, o op) error {
	if o < opCount && handlers[o] != nil {
		return handlers[o](s, c, r)
	}
	return fmt.Errorf("command %d not served", o)
}

// serveValidate checks VALIDATE's magic number.
func (s *Server) serveValidate(c *conn, r *bufio.Reader) error {
	m, err := readU32(r)
	if err != nil || m != validationMagic {
		return errors.New("bad validation")
	}
	return nil
}

// servePing answers PING with its nonce.
func (s *Server) servePing(c *conn, r *bufio.Reader) error {
	nonce, err := readU32(r)
	if err != nil {
		return err
	}
	return c.reply(binary.LittleEndian.AppendUint32(nil, nonce))
}

// serveSet sets a key and wakes its waiters; SET has no reply.
func (s *Server) serveSet(c *conn, r *bufio.Reader) error {
	k, v, err := readKeyValue(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.keys[k] = v
	s.wake(k)
	s.mu.Unlock()
	return nil
}

// serveCompareSet answers COMPARE_SET (key, expected value, new value) with the key's
// value after it (compareSet).
func (s *Server) serveCompareSet(c *conn, r *bufio.Reader) error {
	k, err := readKey(r)
	if err != nil {
		return err
	}
	want, err := readValue(r)
	if err != nil {
		return err
	}
	v, err := readValue(r)
	if err != nil {
		return err
	}
	return c.reply(appendBytes(nil, s.compareSet(k, want, v)))
}

// serveGet answers GET with the key's value (empty when missing).
func (s *Server) serveGet(c *conn, r *bufio.Reader) error {
	k, err := readKey(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	v := s.keys[k]
	s.mu.Unlock()
	return c.reply(appendBytes(nil, v))
}

// serveAdd answers ADD (key, int64 increment) with the counter's new value.
func (s *Server) serveAdd(c *conn, r *bufio.Reader) error {
	k, err := readKey(r)
	if err != nil {
		return err
	}
	d, err := readI64(r)
	if err != nil {
		return err
	}
	n, err := s.add(k, d)
	if err != nil {
		return err
	}
	return c.reply(binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// serveCheck answers CHECK with whether all its keys are set.
func (s *Server) serveCheck(c *conn, r *bufio.Reader) error {
	keys, err := readKeys(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	ok := s.present(keys)
	s.mu.Unlock()
	if ok {
		return c.reply([]byte{checkReady})
	}
	return c.reply([]byte{checkNotReady})
}

// serveWait answers WAIT at once when all its keys are set; otherwise it records c as
// waiting on each missing key, and the last one's wake answers.
func (s *Server) serveWait(c *conn, r *bufio.Reader) error {
	keys, err := readKeys(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	done := s.present(keys)
	if !done {
		for _, k := range keys {
			if _, ok := s.keys[k]; !ok {
				s.waiting[k] = append(s.waiting[k], c)
				c.awaited++
			}
		}
	}
	s.mu.Unlock()
	if done {
		return c.reply([]byte{waitStop})
	}
	return nil
}

// serveCancelWait forgets c's waits and answers CANCEL_WAIT.
func (s *Server) serveCancelWait(c *conn, r *bufio.Reader) error {
	s.mu.Lock()
	s.clearWait(c)
	s.mu.Unlock()
	return c.reply([]byte{waitCanceled})
}

// serveGetNumKeys answers GETNUMKEYS with the number of keys set.
func (s *Server) serveGetNumKeys(c *conn, r *bufio.Reader) error {
	s.mu.Lock()
	n := len(s.keys)
	s.mu.Unlock()
	return c.reply(binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// serveDeleteKey deletes a key and answers DELETE_KEY with the number deleted (0 or 1).
func (s *Server) serveDeleteKey(c *conn, r *bufio.Reader) error {
	k, err := readKey(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	_, ok := s.keys[k]
	delete(s.keys, k)
	s.mu.Unlock()
	n := uint64(0)
	if ok {
		n = 1
	}
	return c.reply(binary.LittleEndian.AppendUint64(nil, n))
}

// serveAppend appends to a key's value and wakes its waiters; APPEND has no reply.
func (s *Server) serveAppend(c *conn, r *bufio.Reader) error {
	k, v, err := readKeyValue(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.keys[k] = append(s.keys[k], v...)
	s.wake(k)
	s.mu.Unlock()
	return nil
}

// serveMultiGet answers MULTI_GET with each key's value, in the request's order.
func (s *Server) serveMultiGet(c *conn, r *bufio.Reader) error {
	n, err := readCount(r)
	if err != nil {
		return err
	}
	var out []byte
	for range n {
		k, err := readKey(r)
		if err != nil {
			return err
		}
		s.mu.Lock()
		out = appendBytes(out, s.keys[k])
		s.mu.Unlock()
	}
	return c.reply(out)
}

// serveMultiSet sets each key, value pair in turn; MULTI_SET has no reply.
func (s *Server) serveMultiSet(c *conn, r *bufio.Reader) error {
	n, err := readCount(r)
	if err != nil {
		return err
	}
	for range n {
		k, v, err := readKeyValue(r)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.keys[k] = v
		s.wake(k)
		s.mu.Unlock()
	}
	return nil
}

// serveQueuePush appends a value to a key's queue and wakes one waiter; QUEUE_PUSH has
// no reply.
func (s *Server) serveQueuePush(c *conn, r *bufio.Reader) error {
	k, v, err := readKeyValue(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.queues[k] = append(s.queues[k], v)
	s.wakeOne(k)
	s.mu.Unlock()
	return nil
}

// serveQueuePop answers QUEUE_POP with the queue's length (8 bytes) and, when it is not
// empty, its first value, which it removes.
func (s *Server) serveQueuePop(c *conn, r *bufio.Reader) error {
	k, err := readKey(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	q := s.queues[k]
	out := binary.LittleEndian.AppendUint64(make([]byte, 0, queuePopPrefix), uint64(len(q)))
	if len(q) > 0 {
		out = appendBytes(out, q[0])
		s.queues[k] = q[1:]
	}
	s.mu.Unlock()
	return c.reply(out)
}

// serveQueueLen answers QUEUE_LEN with the queue's length.
func (s *Server) serveQueueLen(c *conn, r *bufio.Reader) error {
	k, err := readKey(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	n := len(s.queues[k])
	s.mu.Unlock()
	return c.reply(binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// compareSet is torch's COMPARE_SET: it sets k to v when k's value is want (a missing
// key matches an empty want) and returns k's value after; a missing key with a
// non-empty want is left missing and want is returned (torch's own answer).
func (s *Server) compareSet(k string, want, v []byte) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.keys[k]
	switch {
	case !ok && len(want) == 0:
		s.keys[k] = v
		s.wake(k)
		return v
	case !ok:
		s.wake(k)
		return want
	}
	if string(cur) == string(want) {
		s.keys[k] = v
		cur = v
	}
	s.wake(k)
	return cur
}

// add is torch's ADD: k's value, a decimal integer (missing: 0), plus d, stored as
// decimal and returned. A value that is not an integer closes the connection (torch's
// server fails the same request with std::stoll's error).
func (s *Server) add(k string, d int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.keys[k]; ok {
		n, err := strconv.ParseInt(string(cur), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("ADD to %q: value %q is not an integer", k, cur)
		}
		d += n
	}
	s.keys[k] = []byte(strconv.FormatInt(d, 10))
	s.wake(k)
	return d, nil
}

// present reports whether every key exists, as a value or a non-empty queue. s.mu held.
func (s *Server) present(keys []string) bool {
	for _, k := range keys {
		if _, ok := s.keys[k]; ok {
			continue
		}
		if len(s.queues[k]) > 0 {
			continue
		}
		return false
	}
	return true
}

// wake tells every connection waiting for k that k is set, and answers those that
// waited for nothing else. s.mu held.
func (s *Server) wake(k string) {
	for _, c := range s.waiting[k] {
		if c.awaited--; c.awaited == 0 {
			_ = c.reply([]byte{waitStop})
		}
	}
	delete(s.waiting, k)
}

// wakeOne answers the first connection waiting for k alone (a queue push feeds one
// pop). s.mu held.
func (s *Server) wakeOne(k string) {
	list := s.waiting[k]
	for i, c := range list {
		if c.awaited--; c.awaited == 0 {
			s.waiting[k] = append(list[:i:i], list[i+1:]...)
			if len(s.waiting[k]) == 0 {
				delete(s.waiting, k)
			}
			_ = c.reply([]byte{waitStop})
			return
		}
	}
}

// clearWait forgets c's pending WAIT. s.mu held.
func (s *Server) clearWait(c *conn) {
	if c.awaited == 0 {
		return
	}
	c.awaited = 0
	for k, list := range s.waiting {
		out := list[:0]
		for _, w := range list {
			if w != c {
				out = append(out, w)
			}
		}
		if len(out) == 0 {
			delete(s.waiting, k)
		} else {
			s.waiting[k] = out
		}
	}
}

func readU32(r io.Reader) (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

func readI64(r io.Reader) (int64, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(b[:])), nil
}

// readLen reads a uint64 length and checks it against limit.
func readLen(r io.Reader, limit uint64, what string) (int, error) {
	n, err := readI64(r)
	if err != nil {
		return 0, err
	}
	if uint64(n) > limit {
		return 0, fmt.Errorf("%s of %d bytes: more than %d", what, uint64(n), limit)
	}
	return int(n), nil
}

func readKey(r io.Reader) (string, error) {
	n, err := readLen(r, MaxKeyBytes, "key")
	if err != nil {
		return "", err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

func readValue(r io.Reader) ([]byte, error) {
	n, err := readLen(r, MaxValueBytes, "value")
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

func readKeyValue(r io.Reader) (string, []byte, error) {
	k, err := readKey(r)
	if err != nil {
		return "", nil, err
	}
	v, err := readValue(r)
	return k, v, err
}

func readCount(r io.Reader) (int, error) { return readLen(r, MaxKeys, "key count") }

func readKeys(r io.Reader) ([]string, error) {
	n, err := readCount(r)
	if err != nil {
		return nil, err
	}
	keys := make([]string, n)
	for i := range keys {
		if keys[i], err = readKey(r); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// appendBytes appends v as torch writes a vector: its uint64 length, then its bytes.
func appendBytes(out, v []byte) []byte {
	out = binary.LittleEndian.AppendUint64(out, uint64(len(v)))
	return append(out, v...)
}
