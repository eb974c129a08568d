package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockPollInterval is how often lockDir retries a held lock.
const lockPollInterval = 10 * time.Millisecond

// lockDir takes the exclusive flock(2) on DIR/.gangrun/lock that serialises Pin with
// Plan.Apply's move-aside of one checkpoint. It waits until ctx is done. flock locks
// are per open file and released when the process dies, so a crashed holder never
// leaves the lock taken. (On NFS, flock is emulated with POSIX locks by Linux clients.)
// The lock file is opened through st, so a link or a FIFO put at its name is refused,
// not followed or waited on.
func lockDir(ctx context.Context, st *stateDir) (unlock func(), err error) {
	f, err := st.dir.OpenFile(lockFileName, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	path := st.dir.Join(lockFileName)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(lockPollInterval):
		}
	}
}
