// Package identity is who asks: a MUNGE credential, made by the asking host's munged
// and checked by any other host's munged that shares the cluster's key, carries the
// asker's uid and gid, bound to what is asked (docs/acl.md#identity).
//
// This is Slurm's AuthType=auth/munge: sbatch, scancel and scontrol send a credential
// with every request, and slurmctld and slurmd trust the uid munged decodes, never a
// name the request itself gives. gangrun binds each credential to its content: the
// credential's payload is a digest of it (Seal), so a credential lifted from one
// record proves nothing about another (Verify).
//
// Credentials come from libmunge (MUNGE 0.5's munge_encode and munge_decode), loaded
// with dlopen when first needed, so that gangrun starts where munge is not installed
// and needs none of it for `gangrun run`.
package identity

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// The kinds of Error, for errors.Is.
var (
	// ErrNoMunge: libmunge is not installed here.
	ErrNoMunge = errors.New("munge is not installed")
	// ErrNoDaemon: munged does not answer at the socket.
	ErrNoDaemon = errors.New("munged does not answer")
	// ErrMissing: a record or request that must carry a credential carries none.
	ErrMissing = errors.New("no credential")
	// ErrInvalid: not a credential of this cluster (another MUNGE key), or damaged.
	ErrInvalid = errors.New("invalid credential")
	// ErrExpired: older than its time-to-live where a fresh one is needed.
	ErrExpired = errors.New("expired credential")
	// ErrRewound: made in the future (the clocks of the two hosts disagree).
	ErrRewound = errors.New("rewound credential")
	// ErrReplayed: decoded before where each may be used once.
	ErrReplayed = errors.New("replayed credential")
	// ErrUnauthorized: restricted to another uid or gid.
	ErrUnauthorized = errors.New("unauthorized credential")
	// ErrMismatch: a good credential, but bound to other content.
	ErrMismatch = errors.New("credential does not match")
	// ErrMunge: any other failure munged or libmunge reports.
	ErrMunge = errors.New("munge failed")
)

// Error is a credential refused, or munge failing: Kind is one of the Err values
// above, Detail says more; Code is munge's error number when munge gave one.
type Error struct {
	Kind   error
	Detail string
	Code   int
}

func (e *Error) Error() string {
	switch {
	case e.Detail == "":
		return e.Kind.Error()
	case strings.HasPrefix(e.Detail, e.Kind.Error()):
		return e.Detail // the detail says the kind itself
	}
	return e.Kind.Error() + ": " + e.Detail
}

// Is makes errors.Is(err, ErrExpired) (and the others) true for an Error of that kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// PayloadPrefix starts every payload gangrun seals; the rest is the hex SHA-256 of the
// content. A credential of another program (or a bare `munge -n`) never matches.
const PayloadPrefix = "gangrun-sha256:"

// Caller is who made a credential, as munged decoded it.
type Caller struct {
	// UID and GID are the maker's (its effective ids, munge_encode's).
	UID, GID uint32
	// Encoded is when it was made; TTL how long munged keeps it valid from then.
	Encoded time.Time
	TTL     time.Duration
	// Host is the address of the host that made it.
	Host netip.Addr
}

// Expires is when the credential stops being fresh.
func (c Caller) Expires() time.Time { return c.Encoded.Add(c.TTL) }

// payload is what a credential bound to content carries.
func payload(content []byte) []byte {
	sum := sha256.Sum256(content)
	return []byte(PayloadPrefix + hex.EncodeToString(sum[:]))
}

// Digest is the hex SHA-256 of a credential's text: how gangrun names a credential in
// its records (never the credential itself, which could be used again).
func Digest(cred string) string {
	sum := sha256.Sum256([]byte(cred))
	return hex.EncodeToString(sum[:])
}

// Seal makes a credential of this process's uid and gid bound to content, valid for
// munged's default time-to-live, that only root may decode: every credential gangrun
// keeps or sends is checked by its agents, which run as root, and one lifted from a
// record (where any user may read it) is of no use to a user against another service
// sharing the cluster's MUNGE key (Slurm's slurmctld takes a root credential as
// root). Errors: Encode's.
func (m *Munge) Seal(ctx context.Context, content []byte) (string, error) {
	return m.EncodeFor(ctx, payload(content), 0, 0)
}

// SealFor is Seal for a credential that only uid may decode (root included: munged
// lets no other uid decode it): the agent's answer
// to a user's request, which the user's command checks.
func (m *Munge) SealFor(ctx context.Context, content []byte, uid uint32) (string, error) {
	return m.EncodeFor(ctx, payload(content), 0, uid)
}

// Freshness says what Verify asks of a credential's age.
type Freshness int

const (
	// Fresh: within its time-to-live and never decoded here before, as munged judges
	// it: a request acted on once, now (a cancel, a drain, a job being queued).
	Fresh Freshness = iota
	// FreshOrReplayed: within its time-to-live; decoded before is no refusal (a
	// request checked again after the checker restarted; replays are the caller's to
	// catch, by the credential's Digest).
	FreshOrReplayed
	// Kept: any age, decoded any number of times: a credential kept in a record and
	// checked whenever the record is used (a queued job's, at each step's start).
	Kept
)

// Verify checks that cred is a credential of this cluster bound to content and as
// fresh as f asks, and returns who made it. Errors (*Error): ErrMissing for "",
// ErrInvalid, ErrMismatch (a good credential bound to other content), ErrExpired,
// ErrRewound, ErrReplayed (by f), ErrUnauthorized, ErrNoDaemon; or ctx's error.
func (m *Munge) Verify(ctx context.Context, cred string, content []byte, f Freshness) (Caller, error) {
	if cred == "" {
		return Caller{}, &Error{Kind: ErrMissing}
	}
	d, err := m.Decode(ctx, cred)
	if err != nil {
		return Caller{}, err
	}
	c := Caller{UID: d.UID, GID: d.GID, Encoded: d.Encoded, TTL: d.TTL, Host: d.Host}
	if !bytes.Equal(d.Payload, payload(content)) {
		return c, &Error{Kind: ErrMismatch, Detail: fmt.Sprintf("made by uid %d for other content", d.UID)}
	}
	if d.Status != nil {
		refuse := true
		switch {
		case f == Kept && d.Status.Kind != ErrRewound:
			refuse = false
		case f == FreshOrReplayed && d.Status.Kind == ErrReplayed:
			refuse = false
		}
		if refuse {
			st := *d.Status
			switch st.Kind {
			case ErrExpired:
				st.Detail = fmt.Sprintf("made by uid %d at %s, valid for %s", d.UID, d.Encoded.Format(time.RFC3339), d.TTL)
			case ErrReplayed:
				st.Detail = fmt.Sprintf("made by uid %d at %s, and used before", d.UID, d.Encoded.Format(time.RFC3339))
			}
			return c, &st
		}
	}
	return c, nil
}

// Who decodes cred and says who made it, whatever its content and age: for a
// credential whose binding is proven otherwise (by the elected agent's attestation
// that names it). Errors: ErrMissing, ErrInvalid, ErrRewound, ErrUnauthorized,
// ErrNoDaemon.
func (m *Munge) Who(ctx context.Context, cred string) (Caller, error) {
	if cred == "" {
		return Caller{}, &Error{Kind: ErrMissing}
	}
	d, err := m.Decode(ctx, cred)
	if err != nil {
		return Caller{}, err
	}
	if d.Status != nil && d.Status.Kind == ErrRewound {
		return Caller{}, d.Status
	}
	if !bytes.HasPrefix(d.Payload, []byte(PayloadPrefix)) {
		return Caller{}, &Error{Kind: ErrMismatch, Detail: fmt.Sprintf("made by uid %d, not by gangrun", d.UID)}
	}
	return Caller{UID: d.UID, GID: d.GID, Encoded: d.Encoded, TTL: d.TTL, Host: d.Host}, nil
}

// Probe checks that munged answers at m's socket and decodes what it makes: a
// credential sealed and verified again. Errors: Seal's and Verify's.
func (m *Munge) Probe(ctx context.Context) (Caller, error) {
	content := []byte("gangrun probe " + time.Now().String())
	cred, err := m.Encode(ctx, payload(content), 0) // decoded here, by whoever runs it
	if err != nil {
		return Caller{}, err
	}
	return m.Verify(ctx, cred, content, Fresh)
}
