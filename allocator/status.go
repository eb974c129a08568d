package allocator

import (
	"encoding/json"
	"slices"
	"time"
)

// The scheduler's status is one Consul value (at most 512 KiB), and with 10,000 pending
// requests their reasons alone, written out for each, pass that. Reasons repeat (the
// same shape waits for the same resources, a user's jobs for the same limit), so the
// status is written with each distinct reason once: "reasons" lists them, "pending"
// maps each request to its reason's index. Readers (ReadStatus) get the map back.

// statusJSON is SchedulerStatus as stored.
type statusJSON struct {
	Reasons  []string            `json:"reasons,omitempty"`
	Pending  map[string]int      `json:"pending"`
	Reserved map[string][]string `json:"reserved,omitempty"`
	Leader   string              `json:"leader"`
	Updated  time.Time           `json:"updated"`
}

// MarshalJSON writes the status with each distinct reason once.
func (st SchedulerStatus) MarshalJSON() ([]byte, error) {
	out := statusJSON{Pending: make(map[string]int, len(st.Pending)), Reserved: st.Reserved, Leader: st.Leader, Updated: st.Updated}
	index := map[string]int{}
	ids := make([]string, 0, len(st.Pending))
	for id := range st.Pending {
		ids = append(ids, id)
	}
	slices.Sort(ids) // the same status is written the same way
	for _, id := range ids {
		why := st.Pending[id]
		i, ok := index[why]
		if !ok {
			i = len(out.Reasons)
			index[why] = i
			out.Reasons = append(out.Reasons, why)
		}
		out.Pending[id] = i
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads a status MarshalJSON wrote.
func (st *SchedulerStatus) UnmarshalJSON(b []byte) error {
	var in statusJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*st = SchedulerStatus{Pending: make(map[string]string, len(in.Pending)), Reserved: in.Reserved, Leader: in.Leader, Updated: in.Updated}
	for id, i := range in.Pending {
		if i >= 0 && i < len(in.Reasons) {
			st.Pending[id] = in.Reasons[i]
		}
	}
	return nil
}
