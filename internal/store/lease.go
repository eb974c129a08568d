package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// A session guards work: the GPUs a grant's session locks, the membership a rendezvous
// session holds. When its holder loses contact with Consul, Consul invalidates the
// session and hands what it guarded to others, while the holder, unaware, may go on
// using it: two gangs then write one checkpoint directory at once (the lock-holder
// problem of Consul issues #1843 and #9788). A Lease is the holder's side of the rule
// that prevents it: a holder stops its work before Consul may invalidate its session.
//
// What the holder can know for certain: Consul invalidates a session no earlier than
// its TTL after the last renewal the servers accepted (Consul's documentation: "up to
// 2×TTL"; the leader's timer runs 2×TTL, agent/consul/session_ttl.go, and a newly
// elected leader restarts every timer at the full value), and a renewal is accepted no
// earlier than it was sent. Measured from the moment the holder sent its last accepted
// renewal, the session is therefore its own for at least TTL. The lease gives the
// holder less than that, on its own monotonic clock:
//
//	renew every        TTL/5             (4 s for gangrun's 20 s sessions, SessionTTL)
//	each renewal times out after TTL/5
//	stop by            TTL×6/10 (12 s)   with no renewal accepted since: the lease is over
//	kill by            TTL×8/10 (16 s)   everything the session guards must be dead
//	Consul's earliest invalidation: TTL (20 s); in practice 2×TTL (40 s)
//
// A lease that is over stays over, even if a later renewal succeeds: a process that was
// stopped (SIGSTOP, a VM paused) longer than the lease wakes to a lease it no longer
// holds, whatever its first renewal then says, and must not resume the guarded work.
const (
	leaseRenewDivisor = 5
	leaseStopTenths   = 6
	leaseKillTenths   = 8
)

// SessionTTL is the TTL of every session gangrun holds (an agent's, a requester's, a
// rendezvous node's, a job step's): 20 s, twice Consul's minimum. With it a lease ends
// 12 s after the last accepted renewal, so a holder rides out a Consul leader election
// (2 to 5 s with raft_multiplier 1, measured here under load up to 5.4 s; up to about
// 10 s at Consul's default raft_multiplier 5) without stopping what it guards, while a
// holder that died is known within 2×TTL = 40 s (sooner when its machine dies: a session
// bound to the node's serfHealth ends with the node).
const SessionTTL = 20 * time.Second

// LeaseStop returns how long after its last accepted renewal a lease of a session with
// the given TTL is over (TTL×6/10).
func LeaseStop(ttl time.Duration) time.Duration { return ttl * leaseStopTenths / 10 }

// LeaseKill returns how long after its last accepted renewal everything a session with
// the given TTL guards must be dead (TTL×8/10).
func LeaseKill(ttl time.Duration) time.Duration { return ttl * leaseKillTenths / 10 }

// ErrLeaseExpired means no renewal was accepted within the lease: the holder must stop
// what the session guards, as Consul may soon invalidate it.
var ErrLeaseExpired = errors.New("lease expired")

// Lease keeps a session alive and tells its holder, from its own clock, until when the
// session is certainly still its own. Create one with Keep; all methods are safe for
// concurrent use.
type Lease struct {
	s   Store
	id  string
	ttl time.Duration
	log *zap.Logger

	cancel context.CancelFunc
	exited chan struct{}

	mu      sync.Mutex
	renewed time.Time // when the last accepted renewal (or the creation) was sent
	err     error     // why the lease is over; nil while it holds
	done    chan struct{}
	onRenew func(killBy time.Time)
}

// Keep starts renewing session id, whose TTL is ttl, and returns its lease. since is
// when the request that created the session was sent (or any later moment the session
// was known to be renewed). The lease ends (Done closes, Err says why) when the store
// reports the session gone (ErrSessionGone), or when no renewal was accepted for
// LeaseStop(ttl) (ErrLeaseExpired); then it stops renewing and, for an expired lease,
// destroys the session as soon as the store answers, so that what it guarded is freed
// at once rather than when Consul's timer runs out. log (nil: none) hears of the first
// failed renewal, every 30 s of failures after it, the recovery, and the lease's end.
func Keep(s Store, id string, ttl time.Duration, since time.Time, log *zap.Logger) *Lease {
	if log == nil {
		log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lease{s: s, id: id, ttl: ttl, log: log, cancel: cancel, exited: make(chan struct{}),
		renewed: since, done: make(chan struct{})}
	go func() {
		defer close(l.exited)
		l.keep(ctx)
	}()
	return l
}

// Session returns the session's id.
func (l *Lease) Session() string { return l.id }

// TTL returns the session's TTL.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Done is closed when the lease is over.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns why the lease is over (wrapping ErrSessionGone or ErrLeaseExpired), or nil
// while it holds.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Valid reports whether the lease still holds, judged now on the monotonic clock: a
// caller that was itself stalled past the lease learns it here before acting, even if
// the lease's own timer has not yet run.
func (l *Lease) Valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkLocked(time.Now())
}

// StopBy returns when the lease ends unless a renewal is accepted first.
func (l *Lease) StopBy() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(LeaseStop(l.ttl))
}

// KillBy returns when everything the session guards must be dead unless a renewal is
// accepted first: LeaseKill(ttl) after the last accepted renewal was sent.
func (l *Lease) KillBy() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(LeaseKill(l.ttl))
}

// OnRenew registers f (replacing any earlier one; nil removes it) to be called with
// the new KillBy after every accepted renewal, and once at once with the current one.
// f runs on the lease's goroutine and must not block.
func (l *Lease) OnRenew(f func(killBy time.Time)) {
	l.mu.Lock()
	l.onRenew = f
	kill := l.renewed.Add(LeaseKill(l.ttl))
	l.mu.Unlock()
	if f != nil {
		f(kill)
	}
}

// Close stops renewing the session without destroying it, and waits for the lease's
// goroutine to exit. The lease then reports itself over with ErrLeaseExpired unless it
// already was over.
func (l *Lease) Close() {
	l.cancel()
	<-l.exited
	l.mu.Lock()
	l.endLocked(fmt.Errorf("session %s: no longer renewed: %w", l.id, ErrLeaseExpired))
	l.mu.Unlock()
}

// checkLocked ends the lease when now is past its stop time, and reports whether it
// still holds.
func (l *Lease) checkLocked(now time.Time) bool {
	if l.err != nil {
		return false
	}
	if stop := l.renewed.Add(LeaseStop(l.ttl)); now.After(stop) {
		l.endLocked(fmt.Errorf("no renewal of session %s accepted for %s (session TTL %s): %w",
			l.id, now.Sub(l.renewed).Round(100*time.Millisecond), l.ttl, ErrLeaseExpired))
		return false
	}
	return true
}

func (l *Lease) endLocked(err error) {
	if l.err == nil {
		l.err = err
		close(l.done)
	}
}

// accepted records a renewal sent at sent that the store accepted. It extends the lease
// only if the lease still held when it was sent; it returns the callback to call with
// the new kill time (nil when none is registered), and whether the lease holds.
func (l *Lease) accepted(sent time.Time) (f func(time.Time), killBy time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.checkLocked(sent) {
		return nil, time.Time{}, false
	}
	if sent.After(l.renewed) {
		l.renewed = sent
	}
	return l.onRenew, l.renewed.Add(LeaseKill(l.ttl)), true
}

func (l *Lease) keep(ctx context.Context) {
	every := l.ttl / leaseRenewDivisor
	renew := time.NewTimer(every)
	defer renew.Stop()
	expiry := time.NewTimer(time.Until(l.StopBy()))
	defer expiry.Stop()
	backoff := retryMin
	var downSince, reported time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			if l.Valid() {
				expiry.Reset(time.Until(l.StopBy()))
				continue
			}
		case <-renew.C:
			sent := time.Now()
			if !l.Valid() {
				break
			}
			rctx, cancel := context.WithTimeout(ctx, every)
			err := l.s.RenewSession(rctx, l.id)
			cancel()
			switch {
			case err == nil:
				f, kill, ok := l.accepted(sent)
				if !ok {
					break // sent after the lease was over: it stays over
				}
				if f != nil {
					f(kill)
				}
				if !downSince.IsZero() {
					l.log.Info("coordinator reachable again: session renewed", zap.Duration("after", time.Since(downSince).Round(time.Second)))
					downSince = time.Time{}
				}
				backoff = retryMin
				renew.Reset(every)
				continue
			case errors.Is(err, ErrSessionGone):
				l.mu.Lock()
				l.endLocked(err)
				l.mu.Unlock()
				l.log.Warn("session lost", zap.Error(err))
				return
			case ctx.Err() != nil:
				return
			default:
				now := time.Now()
				switch {
				case downSince.IsZero():
					downSince, reported = now, now
					l.log.Warn("coordinator unreachable: cannot renew the session, retrying", zap.Error(err),
						zap.Duration("session_ttl", l.ttl), zap.Duration("lease_ends_in", time.Until(l.StopBy()).Round(100*time.Millisecond)))
				case now.Sub(reported) >= unreachableReport:
					reported = now
					l.log.Warn("coordinator still unreachable", zap.Duration("for", now.Sub(downSince).Round(time.Second)), zap.Error(err))
				}
				if l.Valid() {
					renew.Reset(backoff)
					backoff = min(backoff*2, every)
					continue
				}
			}
		}
		// The lease is over.
		l.log.Warn("lease over: what this session guards must stop now", zap.Error(l.Err()))
		l.release(ctx)
		return
	}
}

// release destroys the session of an expired lease as soon as the store answers, so
// that its keys go at once; it gives up once Consul must have invalidated the session
// on its own (2×TTL after the last accepted renewal) or ctx ends.
func (l *Lease) release(ctx context.Context) {
	l.mu.Lock()
	giveUp := l.renewed.Add(ttlMultiplier*l.ttl + time.Second)
	l.mu.Unlock()
	backoff := retryMin
	for time.Now().Before(giveUp) {
		dctx, cancel := context.WithTimeout(ctx, l.ttl/leaseRenewDivisor)
		err := l.s.DestroySession(dctx, l.id)
		cancel()
		if err == nil || errors.Is(err, ErrSessionGone) || ctx.Err() != nil {
			return
		}
		if !Sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, retryMax)
	}
}

// unreachableReport is how often a Lease repeats that the store is still unreachable.
const unreachableReport = 30 * time.Second
