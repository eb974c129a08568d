package identity

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <netinet/in.h>

// The libmunge calls gangrun makes, as munge.h (MUNGE 0.5) declares them, found with
// dlopen: a gangrun binary starts on a machine without libmunge, as it does without
// the NVIDIA driver.
typedef struct {
	void *handle;
	int (*encode)(char **cred, void *ctx, const void *buf, int len);
	int (*decode)(const char *cred, void *ctx, void **buf, int *len, uid_t *uid, gid_t *gid);
	void *(*ctx_create)(void);
	void (*ctx_destroy)(void *ctx);
	const char *(*ctx_strerror)(void *ctx);
	int (*ctx_set)(void *ctx, int opt, ...);
	int (*ctx_get)(void *ctx, int opt, ...);
} gr_munge;

// munge.h's enum munge_opt.
enum { GR_OPT_TTL = 4, GR_OPT_ADDR4 = 5, GR_OPT_ENCODE_TIME = 6, GR_OPT_SOCKET = 8, GR_OPT_UID_RESTRICTION = 9 };
// munge.h's EMUNGE_NO_MEMORY.
enum { GR_NO_MEMORY = 5 };

static char *gr_dlerror(void) {
	const char *e = dlerror();
	return strdup(e ? e : "unknown dlopen error");
}

// gr_munge_open fills m from the library name; NULL, or the error (malloc'd).
static char *gr_munge_open(const char *name, gr_munge *m) {
	memset(m, 0, sizeof *m);
	m->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!m->handle) return gr_dlerror();
#define GR_SYM(field, sym) if (!(*(void **)(&m->field) = dlsym(m->handle, sym))) return gr_dlerror();
	GR_SYM(encode, "munge_encode")
	GR_SYM(decode, "munge_decode")
	GR_SYM(ctx_create, "munge_ctx_create")
	GR_SYM(ctx_destroy, "munge_ctx_destroy")
	GR_SYM(ctx_strerror, "munge_ctx_strerror")
	GR_SYM(ctx_set, "munge_ctx_set")
	GR_SYM(ctx_get, "munge_ctx_get")
#undef GR_SYM
	return NULL;
}

// gr_ctx opens a context on socket; NULL when out of memory or the socket is refused
// (then *err is the munge error and *msg its text, malloc'd).
static void *gr_ctx(gr_munge *m, const char *socket, int *err, char **msg) {
	void *ctx = m->ctx_create();
	if (!ctx) { *err = GR_NO_MEMORY; return NULL; }
	int e = m->ctx_set(ctx, GR_OPT_SOCKET, socket);
	if (e != 0) {
		const char *s = m->ctx_strerror(ctx);
		*msg = s ? strdup(s) : NULL;
		*err = e;
		m->ctx_destroy(ctx);
		return NULL;
	}
	return ctx;
}

// gr_encode encodes buf; restrict >= 0 lets only that uid decode it
// (MUNGE_OPT_UID_RESTRICTION).
static int gr_encode(gr_munge *m, const char *socket, int ttl, int64_t restrict_uid, const void *buf, int len, char **cred, char **msg) {
	int e = 0;
	void *ctx = gr_ctx(m, socket, &e, msg);
	if (!ctx) return e;
	if (ttl != 0) e = m->ctx_set(ctx, GR_OPT_TTL, ttl);
	if (e == 0 && restrict_uid >= 0) e = m->ctx_set(ctx, GR_OPT_UID_RESTRICTION, (uid_t)restrict_uid);
	if (e == 0) e = m->encode(cred, ctx, buf, len);
	if (e != 0) {
		const char *s = m->ctx_strerror(ctx);
		*msg = s ? strdup(s) : NULL;
	}
	m->ctx_destroy(ctx);
	return e;
}

// gr_decode decodes cred; for the errors that still give the credential's contents
// (expired, rewound, replayed) the outputs are set too.
static int gr_decode(gr_munge *m, const char *socket, const char *cred, void **buf, int *len,
		uid_t *uid, gid_t *gid, int64_t *encoded, int *ttl, uint32_t *addr, char **msg) {
	int e = 0;
	void *ctx = gr_ctx(m, socket, &e, msg);
	if (!ctx) return e;
	e = m->decode(cred, ctx, buf, len, uid, gid);
	if (e != 0) {
		const char *s = m->ctx_strerror(ctx);
		*msg = s ? strdup(s) : NULL;
	}
	time_t t = 0;
	struct in_addr a;
	memset(&a, 0, sizeof a);
	if (m->ctx_get(ctx, GR_OPT_ENCODE_TIME, &t) == 0) *encoded = (int64_t)t;
	m->ctx_get(ctx, GR_OPT_TTL, ttl);
	if (m->ctx_get(ctx, GR_OPT_ADDR4, &a) == 0) *addr = a.s_addr;
	m->ctx_destroy(ctx);
	return e;
}
*/
import "C"

import (
	"context"
	"fmt"
	"net/netip"
	"time"
	"unsafe"
)

// Where gangrun finds munged and libmunge.
const (
	// DefaultSocket is munged's socket as munge installs it (munged --socket's
	// default; Debian's and Red Hat's packages).
	DefaultSocket = "/run/munge/munge.socket.2"
	// SocketEnv names the environment variable that, when set, gives another socket
	// (a munged of a test, or one installed elsewhere), as Slurm's auth/munge takes
	// AuthInfo=socket=PATH.
	SocketEnv = "MUNGE_SOCKET"
	// Library is libmunge's soname (MUNGE 0.5's ABI), opened when first needed.
	Library = "libmunge.so.2"
	// MaxPayload bounds what a credential carries, in bytes: gangrun seals a digest, so
	// a few hundred are plenty, and munged refuses large messages anyway.
	MaxPayload = 4096
	// MaxCredential bounds the credential text gangrun decodes, in bytes.
	MaxCredential = 16 << 10
)

// munge.h's munge_err_t values gangrun tells apart.
const (
	codeSocket       = 6
	codeBadCred      = 8
	codeBadVersion   = 9
	codeBadCipher    = 10
	codeBadMAC       = 11
	codeBadZip       = 12
	codeBadRealm     = 13
	codeCredInvalid  = 14
	codeExpired      = 15
	codeRewound      = 16
	codeReplayed     = 17
	codeUnauthorized = 18
)

// Munge is a client of the node's munged: it makes credentials that carry this
// process's uid and gid, and decodes those made on any host sharing the cluster's
// MUNGE key. Safe for concurrent use (one libmunge context a call).
type Munge struct {
	socket string
	lib    *C.gr_munge
}

// SocketFrom is the socket gangrun uses: getenv(SocketEnv) when set, else
// DefaultSocket.
func SocketFrom(getenv func(string) string) string {
	if s := getenv(SocketEnv); s != "" {
		return s
	}
	return DefaultSocket
}

// Open loads libmunge for munged at socket ("" for DefaultSocket). It does not talk to
// munged: Probe does. Errors: ErrNoMunge when libmunge is missing (munge is not
// installed).
func Open(socket string) (*Munge, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	lib := (*C.gr_munge)(C.malloc(C.size_t(unsafe.Sizeof(C.gr_munge{}))))
	name := C.CString(Library)
	defer C.free(unsafe.Pointer(name))
	if msg := C.gr_munge_open(name, lib); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		C.free(unsafe.Pointer(lib))
		return nil, &Error{Kind: ErrNoMunge, Detail: fmt.Sprintf("%s: %s (install munge: apt-get install munge)", Library, C.GoString(msg))}
	}
	return &Munge{socket: socket, lib: lib}, nil
}

// Socket is the munged socket m talks to.
func (m *Munge) Socket() string { return m.socket }

// Encode makes a credential carrying payload (at most MaxPayload bytes), valid for ttl
// (0: munged's default, 300 s), that anyone may decode. Errors: ErrNoDaemon when
// munged does not answer at m's socket; ctx's error when it ends first (the call itself
// runs on: libmunge has its own timeouts).
func (m *Munge) Encode(ctx context.Context, payload []byte, ttl time.Duration) (string, error) {
	return m.encode(ctx, payload, ttl, -1)
}

// EncodeFor is Encode for a credential only uid may decode, root not excepted (munged's
// MUNGE_OPT_UID_RESTRICTION): one lifted from where it is kept is of no use to anyone
// else, on this cluster or any other service sharing its MUNGE key.
func (m *Munge) EncodeFor(ctx context.Context, payload []byte, ttl time.Duration, uid uint32) (string, error) {
	return m.encode(ctx, payload, ttl, int64(uid))
}

// encode is Encode, restricted to uid restrict when it is not negative.
func (m *Munge) encode(ctx context.Context, payload []byte, ttl time.Duration, restrict int64) (string, error) {
	if len(payload) > MaxPayload {
		return "", fmt.Errorf("munge: payload of %d bytes: at most %d", len(payload), MaxPayload)
	}
	type result struct {
		cred string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		sock := C.CString(m.socket)
		defer C.free(unsafe.Pointer(sock))
		var buf unsafe.Pointer
		if len(payload) > 0 {
			buf = C.CBytes(payload)
			defer C.free(buf)
		}
		var cred, msg *C.char
		code := C.gr_encode(m.lib, sock, C.int(ttl/time.Second), C.int64_t(restrict), buf, C.int(len(payload)), &cred, &msg)
		if cred != nil {
			defer C.free(unsafe.Pointer(cred))
		}
		if code != 0 {
			done <- result{err: m.failure(int(code), msg)}
			return
		}
		done <- result{cred: C.GoString(cred)}
	}()
	select {
	case r := <-done:
		return r.cred, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Decoded is what munged says of a credential.
type Decoded struct {
	// UID and GID are those of the process that made the credential.
	UID, GID uint32
	// Encoded is when it was made (to the second); TTL how long it was valid for.
	Encoded time.Time
	TTL     time.Duration
	// Host is the IPv4 address of the host that made it (munged's --origin).
	Host netip.Addr
	// Payload is what it carries.
	Payload []byte
	// Status is "" for a good credential, or why munged refused it though it could
	// read it: ErrExpired, ErrRewound or ErrReplayed.
	Status *Error
}

// Decode asks munged what cred says. A credential munged could read but refused as
// expired, rewound (made in the future) or replayed (decoded on this host before)
// is returned with Status set and no error: what that means is the caller's to say.
// Errors: ErrInvalid (not made with this cluster's key, or damaged), ErrUnauthorized,
// ErrNoDaemon, ctx's error.
func (m *Munge) Decode(ctx context.Context, cred string) (*Decoded, error) {
	if len(cred) > MaxCredential {
		return nil, &Error{Kind: ErrInvalid, Detail: fmt.Sprintf("a credential of %d bytes (at most %d)", len(cred), MaxCredential)}
	}
	type result struct {
		d   *Decoded
		err error
	}
	done := make(chan result, 1)
	go func() {
		sock, text := C.CString(m.socket), C.CString(cred)
		defer C.free(unsafe.Pointer(sock))
		defer C.free(unsafe.Pointer(text))
		var buf unsafe.Pointer
		var n, ttl C.int
		var uid C.uid_t
		var gid C.gid_t
		var encoded C.int64_t
		var addr C.uint32_t
		var msg *C.char
		code := int(C.gr_decode(m.lib, sock, text, &buf, &n, &uid, &gid, &encoded, &ttl, &addr, &msg))
		if buf != nil {
			defer C.free(buf)
		}
		var status *Error
		switch code {
		case 0:
		case codeExpired, codeRewound, codeReplayed:
			status = m.failure(code, msg).(*Error) // frees msg
		default:
			done <- result{err: m.failure(code, msg)}
			return
		}
		a := uint32(addr) // network byte order in memory
		host := netip.AddrFrom4([4]byte{byte(a), byte(a >> 8), byte(a >> 16), byte(a >> 24)})
		d := &Decoded{UID: uint32(uid), GID: uint32(gid), Encoded: time.Unix(int64(encoded), 0).UTC(),
			TTL: time.Duration(ttl) * time.Second, Host: host, Status: status}
		if buf != nil && n > 0 {
			d.Payload = C.GoBytes(buf, n)
		}
		done <- result{d: d}
	}()
	select {
	case r := <-done:
		return r.d, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// failure is the error of munge error code with libmunge's text msg (freed here).
func (m *Munge) failure(code int, msg *C.char) error {
	text := ""
	if msg != nil {
		text = C.GoString(msg)
		C.free(unsafe.Pointer(msg))
	}
	kind := ErrMunge
	switch code {
	case codeSocket:
		kind = ErrNoDaemon
		text = fmt.Sprintf("munged does not answer at %s (start it: systemctl start munge; %s names another socket): %s", m.socket, SocketEnv, text)
	case codeBadCred, codeBadVersion, codeBadCipher, codeBadMAC, codeBadZip, codeBadRealm, codeCredInvalid:
		// Not a credential munged can read: the credential's fault, never the
		// checker's (a damaged one would otherwise be tried again for ever).
		kind = ErrInvalid
	case codeExpired:
		kind = ErrExpired
	case codeRewound:
		kind = ErrRewound
	case codeReplayed:
		kind = ErrReplayed
	case codeUnauthorized:
		kind = ErrUnauthorized
	}
	return &Error{Kind: kind, Detail: text, Code: code}
}
