package policy

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Usage is the decayed GPU usage fair-share and grp_gpu_hours read, in GPU-seconds: per
// account, and per user in an account (key "account/user"). The elected scheduler keeps
// it (UsageKey) and applies the decay rule at every pass:
//
//	usage(now) = usage(Updated) × 2^(−(now − Updated) / half-life) + GPU-seconds since Updated
//
// which is Slurm's PriorityDecayHalfLife decay applied at each PriorityCalcPeriod.
type Usage struct {
	Updated  time.Time          `json:"updated"`
	Accounts map[string]float64 `json:"accounts"`
	Users    map[string]float64 `json:"users"`
}

// forgetBelow is the decayed usage, in GPU-seconds, below which an entry is dropped:
// the record keeps what still weighs.
const forgetBelow = 1e-3

// NewUsage returns an empty usage record.
func NewUsage() *Usage { return &Usage{Accounts: map[string]float64{}, Users: map[string]float64{}} }

// Decay ages the usage to now with halfLife; the first call only sets Updated.
func (u *Usage) Decay(now time.Time, halfLife time.Duration) {
	if u.Updated.IsZero() || !now.After(u.Updated) {
		if u.Updated.IsZero() {
			u.Updated = now
		}
		return
	}
	k := math.Exp2(-float64(now.Sub(u.Updated)) / float64(halfLife))
	for _, m := range []map[string]float64{u.Accounts, u.Users} {
		for key, v := range m {
			if v *= k; v < forgetBelow {
				delete(m, key)
			} else {
				m[key] = v
			}
		}
	}
	u.Updated = now
}

// Charge adds gpuSeconds to account and to user in it.
func (u *Usage) Charge(account, user string, gpuSeconds float64) {
	if gpuSeconds <= 0 {
		return
	}
	u.Accounts[account] += gpuSeconds
	u.Users[account+"/"+user] += gpuSeconds
}

// LoadUsage reads the usage record (an empty one when none was written).
func LoadUsage(ctx context.Context, s store.Store) (*Usage, error) {
	u := NewUsage()
	e, err := s.Get(ctx, UsageKey)
	if err != nil || e == nil {
		return u, err
	}
	if err := schema.Unmarshal(schema.Usage, e.Value, u); err != nil {
		return nil, fmt.Errorf("usage %s: %w", UsageKey, err)
	}
	if u.Accounts == nil {
		u.Accounts = map[string]float64{}
	}
	if u.Users == nil {
		u.Users = map[string]float64{}
	}
	return u, nil
}
