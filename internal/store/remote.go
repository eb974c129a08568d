package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The remote store: one process's Store (a Memory) served over HTTP to the other nodes
// of one job, for torchrun's --rdzv-backend c10d --rdzv-endpoint HOST:PORT without
// Consul: the node at HOST holds the store, as torchrun's agent there holds its
// TCPStore, and the others use it through Remote. One process on one host, never
// replicated: when that process ends, the store is gone (Remote's calls then fail
// ErrUnavailable), which is torchrun's failure semantics for its endpoint.
//
// The protocol is gangrun's own: POST RemotePath+METHOD with a JSON request, a JSON
// answer; every request names nothing outside the one store it serves. It has no
// authentication, as torch's TCPStore has none: serve it on a network the job's nodes
// alone reach.

// RemotePath prefixes every request of the remote store's protocol (version 1).
const RemotePath = "/gangrun/store/v1/"

// Limits of the remote store's protocol.
const (
	// remoteBodyMax is the largest request body accepted: a transaction's MaxTxnBytes
	// with room for its JSON framing (values travel base64-encoded).
	remoteBodyMax = 2 * MaxTxnBytes
	// remoteCallTimeout bounds a call that does not block on purpose (all but
	// WatchList, which is given its wait on top).
	remoteCallTimeout = 10 * time.Second
)

// remoteReason names the reason sentinels on the wire.
var remoteReasons = map[string]error{
	"lock_held": ErrLockHeld, "lock_delay": ErrLockDelay, "stale_index": ErrStaleIndex,
	"key_not_found": ErrKeyNotFound, "key_exists": ErrKeyExists, "not_lock_holder": ErrNotLockHolder,
	"session_gone": ErrSessionGone, "too_large": ErrTxnTooLarge,
}

// remoteRequest is every method's request; each uses the fields it needs.
type remoteRequest struct {
	Key     string          `json:"key,omitempty"`
	Prefix  string          `json:"prefix,omitempty"`
	Index   uint64          `json:"index,omitempty"`
	WaitNS  int64           `json:"wait_ns,omitempty"`
	Ops     []Op            `json:"ops,omitempty"`
	Session string          `json:"session,omitempty"`
	Options *SessionOptions `json:"options,omitempty"`
}

// remoteOpError is an OpError on the wire.
type remoteOpError struct {
	Op     int    `json:"op"`
	Key    string `json:"key,omitempty"`
	Reason string `json:"reason,omitempty"`
	What   string `json:"what"`
}

// remoteAnswer is every method's answer.
type remoteAnswer struct {
	Entry   *Entry          `json:"entry,omitempty"`
	Entries []Entry         `json:"entries,omitempty"`
	Keys    []string        `json:"keys,omitempty"`
	Index   uint64          `json:"index,omitempty"`
	Result  *TxnResult      `json:"result,omitempty"`
	ID      string          `json:"id,omitempty"`
	Exists  bool            `json:"exists,omitempty"`
	Error   string          `json:"error,omitempty"`
	Reason  string          `json:"reason,omitempty"` // a sentinel's name, for Error
	TxnErrs []remoteOpError `json:"txn_errors,omitempty"`
}

// RemoteServer serves a Store over HTTP on a listener until Close.
type RemoteServer struct {
	ln  net.Listener
	srv *http.Server
	wg  sync.WaitGroup
}

// ServeRemote serves s on ln; Close stops it (and closes ln).
func ServeRemote(ln net.Listener, s Store) *RemoteServer {
	mux := http.NewServeMux()
	h := remoteHandler{s: s}
	mux.HandleFunc(RemotePath, h.serve)
	r := &RemoteServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: remoteCallTimeout}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = r.srv.Serve(ln)
	}()
	return r
}

// Addr is the address the store is served on.
func (r *RemoteServer) Addr() net.Addr { return r.ln.Addr() }

// Close stops serving: the listener and every connection are closed (a blocked
// WatchList ends), and Close waits for the server to stop.
func (r *RemoteServer) Close() error {
	err := r.srv.Close()
	r.wg.Wait()
	return err
}

type remoteHandler struct{ s Store }

func (h remoteHandler) serve(w http.ResponseWriter, req *http.Request) {
	method := strings.TrimPrefix(req.URL.Path, RemotePath)
	if req.Method != http.MethodPost {
		http.Error(w, "want POST", http.StatusMethodNotAllowed)
		return
	}
	var in remoteRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, remoteBodyMax))
	if err := dec.Decode(&in); err != nil {
		writeAnswer(w, http.StatusBadRequest, remoteAnswer{Error: "request: " + err.Error()})
		return
	}
	ctx := req.Context()
	var out remoteAnswer
	var err error
	switch method {
	case "ping":
	case "get":
		out.Entry, err = h.s.Get(ctx, in.Key)
	case "list":
		out.Entries, out.Index, err = h.s.List(ctx, in.Prefix)
	case "keys":
		out.Keys, out.Index, err = h.s.Keys(ctx, in.Prefix)
	case "watch":
		wait := time.Duration(in.WaitNS)
		if wait < 0 || wait > MaxWaitTime {
			writeAnswer(w, http.StatusBadRequest, remoteAnswer{Error: fmt.Sprintf("wait %s: want 0..%s", wait, MaxWaitTime)})
			return
		}
		out.Entries, out.Index, err = h.s.WatchList(ctx, in.Prefix, in.Index, wait)
	case "txn":
		var res TxnResult
		res, err = h.s.Txn(ctx, in.Ops)
		out.Result = &res
	case "session/create":
		if in.Options == nil {
			writeAnswer(w, http.StatusBadRequest, remoteAnswer{Error: "session options missing"})
			return
		}
		out.ID, err = h.s.CreateSession(ctx, *in.Options)
	case "session/renew":
		err = h.s.RenewSession(ctx, in.Session)
	case "session/destroy":
		err = h.s.DestroySession(ctx, in.Session)
	case "session/exists":
		out.Exists, err = h.s.SessionExists(ctx, in.Session)
	default:
		writeAnswer(w, http.StatusNotFound, remoteAnswer{Error: "no method " + method})
		return
	}
	if err == nil {
		writeAnswer(w, http.StatusOK, out)
		return
	}
	var te *TxnError
	switch {
	case errors.As(err, &te):
		a := remoteAnswer{Error: err.Error()}
		for _, oe := range te.Errors {
			a.TxnErrs = append(a.TxnErrs, remoteOpError{Op: oe.Op, Key: oe.Key, Reason: reasonName(oe.Reason), What: oe.What})
		}
		writeAnswer(w, http.StatusConflict, a)
	case errors.Is(err, ErrUnavailable):
		writeAnswer(w, http.StatusServiceUnavailable, remoteAnswer{Error: err.Error()})
	default:
		writeAnswer(w, http.StatusUnprocessableEntity, remoteAnswer{Error: err.Error(), Reason: reasonName(err)})
	}
}

// reasonName is the wire name of the sentinel err is (or wraps); "" for none.
func reasonName(err error) string {
	if err == nil {
		return ""
	}
	for name, s := range remoteReasons {
		if errors.Is(err, s) {
			return name
		}
	}
	return ""
}

func writeAnswer(w http.ResponseWriter, code int, a remoteAnswer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(a)
}

// Remote is the Store a RemoteServer serves, used over HTTP from another process.
// Calls that cannot reach it (refused, reset, timed out, a server error) fail with an
// *UnavailableError naming the endpoint; answers keep their types (*TxnError with its
// reasons, ErrSessionGone). Safe for concurrent use.
type Remote struct {
	addr      string
	client    *http.Client
	transport *http.Transport
}

// NewRemote returns the remote store served at addr ("HOST:PORT"). It connects on the
// first call.
func NewRemote(addr string) *Remote {
	tr := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}
	return &Remote{addr: addr, client: &http.Client{Transport: tr}, transport: tr}
}

// Close releases the idle connections.
func (r *Remote) Close() { r.transport.CloseIdleConnections() }

// Ping asks the server whether it serves a gangrun store: an error says why not (it
// cannot be reached: ErrUnavailable; it answers, but not as gangrun does: a torchrun
// agent's TCPStore on that port, say).
func (r *Remote) Ping(ctx context.Context) error {
	_, err := r.call(ctx, "ping", remoteRequest{}, remoteCallTimeout)
	return err
}

// call sends one request and decodes its answer, within timeout.
func (r *Remote) call(ctx context.Context, method string, in remoteRequest, timeout time.Duration) (remoteAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := json.Marshal(in)
	if err != nil {
		return remoteAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.addr+RemotePath+method, bytes.NewReader(body))
	if err != nil {
		return remoteAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	what := "c10d endpoint " + r.addr + " " + method
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
			return remoteAnswer{}, ctx.Err()
		}
		return remoteAnswer{}, &UnavailableError{Op: what, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return remoteAnswer{}, &UnavailableError{Op: what, Err: err}
	}
	var out remoteAnswer
	if err := json.Unmarshal(data, &out); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		return remoteAnswer{}, fmt.Errorf("%s: not a gangrun endpoint (HTTP %d): does a torchrun agent or another service hold the port?", what, resp.StatusCode)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return out, nil
	case resp.StatusCode == http.StatusConflict:
		te := &TxnError{}
		for _, oe := range out.TxnErrs {
			te.Errors = append(te.Errors, OpError{Op: oe.Op, Key: oe.Key, Reason: remoteReasons[oe.Reason], What: oe.What})
		}
		return out, te
	case resp.StatusCode >= 500:
		return out, &UnavailableError{Op: what, Err: errors.New(out.Error)}
	}
	if s := remoteReasons[out.Reason]; s != nil {
		return out, fmt.Errorf("%s: %w", strings.TrimSuffix(out.Error, ": "+s.Error()), s)
	}
	return out, fmt.Errorf("%s: %s", what, out.Error)
}

// Get implements Store.
func (r *Remote) Get(ctx context.Context, key string) (*Entry, error) {
	out, err := r.call(ctx, "get", remoteRequest{Key: key}, remoteCallTimeout)
	return out.Entry, err
}

// List implements Store.
func (r *Remote) List(ctx context.Context, prefix string) ([]Entry, uint64, error) {
	out, err := r.call(ctx, "list", remoteRequest{Prefix: prefix}, remoteCallTimeout)
	return out.Entries, out.Index, err
}

// Keys implements Store.
func (r *Remote) Keys(ctx context.Context, prefix string) ([]string, uint64, error) {
	out, err := r.call(ctx, "keys", remoteRequest{Prefix: prefix}, remoteCallTimeout)
	return out.Keys, out.Index, err
}

// WatchList implements Store.
func (r *Remote) WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]Entry, uint64, error) {
	wait = min(max(wait, 0), MaxWaitTime)
	out, err := r.call(ctx, "watch", remoteRequest{Prefix: prefix, Index: index, WaitNS: int64(wait)}, wait+remoteCallTimeout)
	if err != nil && ctx.Err() != nil {
		return nil, 0, ctx.Err()
	}
	return out.Entries, out.Index, err
}

// Txn implements Store.
func (r *Remote) Txn(ctx context.Context, ops []Op) (TxnResult, error) {
	if err := CheckTxn(ops); err != nil {
		return TxnResult{}, err
	}
	out, err := r.call(ctx, "txn", remoteRequest{Ops: ops}, remoteCallTimeout)
	if err != nil || out.Result == nil {
		return TxnResult{}, err
	}
	return *out.Result, nil
}

// CreateSession implements Store.
func (r *Remote) CreateSession(ctx context.Context, o SessionOptions) (string, error) {
	if err := o.Validate(); err != nil {
		return "", err
	}
	out, err := r.call(ctx, "session/create", remoteRequest{Options: &o}, remoteCallTimeout)
	return out.ID, err
}

// RenewSession implements Store.
func (r *Remote) RenewSession(ctx context.Context, id string) error {
	_, err := r.call(ctx, "session/renew", remoteRequest{Session: id}, remoteCallTimeout)
	return err
}

// DestroySession implements Store.
func (r *Remote) DestroySession(ctx context.Context, id string) error {
	_, err := r.call(ctx, "session/destroy", remoteRequest{Session: id}, remoteCallTimeout)
	return err
}

// SessionExists implements Store.
func (r *Remote) SessionExists(ctx context.Context, id string) (bool, error) {
	out, err := r.call(ctx, "session/exists", remoteRequest{Session: id}, remoteCallTimeout)
	return out.Exists, err
}
