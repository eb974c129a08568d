package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Step is one progress event of the bundled script: rank 0 appends one JSON line per
// step to its --progress file just before running the step.
type Step struct {
	// Op and SizeBytes name the step; InPlace says which half.
	Op        Op    `json:"op"`
	SizeBytes int64 `json:"size_bytes"`
	InPlace   bool  `json:"in_place"`
	// Index is the step's 1-based number of Total.
	Index int `json:"step"`
	Total int `json:"steps"`
	// BytesBefore sums the message sizes of the steps before this one and BytesTotal
	// those of all steps: the weights of Remaining's estimate.
	BytesBefore int64 `json:"bytes_before"`
	BytesTotal  int64 `json:"bytes_total"`
}

// Remaining estimates the time left once step s has started, elapsed after the first
// step started: elapsed × bytes left / bytes done, as if time grew with message bytes
// (true for large messages; small ones are latency-bound and finish sooner). ok is false
// before any bytes are done.
func (s Step) Remaining(elapsed time.Duration) (left time.Duration, ok bool) {
	if s.BytesBefore <= 0 || s.BytesTotal < s.BytesBefore {
		return 0, false
	}
	ratio := float64(s.BytesTotal-s.BytesBefore) / float64(s.BytesBefore)
	return time.Duration(float64(elapsed) * ratio).Round(time.Second), true
}

// ProgressLine formats the progress line: operation, message size and half, step, the
// pair of nodes when sweeping pairs (pair may be ""), time elapsed and, when known,
// time left. It holds no newline.
func ProgressLine(s Step, pair string, elapsed time.Duration, left time.Duration, leftKnown bool) string {
	half := "out-of-place"
	if s.InPlace {
		half = "in-place"
	}
	parts := []string{fmt.Sprintf("%s %s %s", opName(s.Op), FormatSize(s.SizeBytes), half)}
	if s.Total > 0 {
		parts = append(parts, fmt.Sprintf("step %d/%d", s.Index, s.Total))
	}
	if pair != "" {
		parts = append(parts, "pair "+pair)
	}
	parts = append(parts, clock(elapsed)+" elapsed")
	if leftKnown {
		parts = append(parts, "~"+clock(left)+" left")
	}
	return strings.Join(parts, " · ")
}

// clock prints d as m:ss or h:mm:ss.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, s)
	}
	return fmt.Sprintf("%d:%02d", m, s)
}

// ParseStep decodes one line of a progress file.
func ParseStep(line []byte) (Step, error) {
	var s Step
	if err := json.Unmarshal(line, &s); err != nil {
		return Step{}, fmt.Errorf("progress line %q: %w", line, err)
	}
	return s, nil
}

// Follow reads the lines appended to the file at path, checking every interval, and
// calls fn with each complete line (without its newline; fn must not keep the slice)
// until ctx ends; then it reads what is left and returns. A file that does not exist
// yet is waited for.
func Follow(ctx context.Context, path string, interval time.Duration, fn func(line []byte)) error {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	var pending []byte
	buf := make([]byte, 32<<10)
	drain := func() error {
		if f == nil {
			g, err := os.Open(path)
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("follow %s: %w", path, err)
			}
			f = g
		}
		for {
			n, err := f.Read(buf)
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				fn(pending[:i])
				pending = pending[i+1:]
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("follow %s: %w", path, err)
			}
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return drain()
		case <-t.C:
			if err := drain(); err != nil {
				return err
			}
		}
	}
}
