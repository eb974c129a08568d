package launcher

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// MaxLineBytes is the longest worker output line kept whole. A longer line (a progress
// bar redrawn with carriage returns, a dump without newlines) is passed on in pieces of
// this size, each ended with a newline.
const MaxLineBytes = 1 << 20

// lineWriter writes whole lines to one destination; many pumps share one, so lines from
// different workers interleave but never mix.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// writeLine writes prefix+line (line ends with '\n') in one Write call.
func (l *lineWriter) writeLine(prefix string, line []byte) {
	if l == nil || l.w == nil {
		return
	}
	buf := make([]byte, 0, len(prefix)+len(line))
	buf = append(buf, prefix...)
	buf = append(buf, line...)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(buf) // a console that went away must not stop the training
}

// activity records when any worker of the gang last wrote output, for --hang-timeout.
type activity struct{ last atomic.Int64 }

func (a *activity) touch()              { a.last.Store(time.Now().UnixNano()) }
func (a *activity) lastTime() time.Time { return time.Unix(0, a.last.Load()) }

// touchAt records activity at t unless a later one is recorded already.
func (a *activity) touchAt(t time.Time) {
	for {
		old := a.last.Load()
		if t.UnixNano() <= old || a.last.CompareAndSwap(old, t.UnixNano()) {
			return
		}
	}
}

// pumpTarget is where a pump's lines go: the console prefix, the log file (nil: none)
// and the activity to touch (nil: none). A standby's is set when it becomes a worker.
type pumpTarget struct {
	mu     sync.Mutex
	prefix string
	file   io.Writer
	act    *activity
	muted  bool // the lines stay off the console
}

// mute keeps the lines off the console from the next one on (or lets them back).
func (t *pumpTarget) mute(m bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.muted = m
}

// set points the pump at prefix, file and act from the next line on.
func (t *pumpTarget) set(prefix string, file io.Writer, act *activity) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prefix, t.file, t.act = prefix, file, act
}

func (t *pumpTarget) get() (string, io.Writer, *activity, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prefix, t.file, t.act, t.muted
}

// pump copies r to console (each line prefixed, when console is non-nil) and to file
// (unprefixed, when non-nil) line by line until r ends, touching act for every line. A
// last line without a newline gets one.
func pump(r io.Reader, prefix string, console *lineWriter, file io.Writer, act *activity) {
	pumpTo(r, console, &pumpTarget{prefix: prefix, file: file, act: act})
}

// pumpTo is pump with a target that may change while it runs.
func pumpTo(r io.Reader, console *lineWriter, t *pumpTarget) {
	br := bufio.NewReaderSize(r, 64<<10)
	var pending []byte
	emit := func(line []byte) {
		prefix, file, act, muted := t.get()
		if act != nil {
			act.touch()
		}
		if !muted {
			console.writeLine(prefix, line)
		}
		if file != nil {
			_, _ = file.Write(line)
		}
	}
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			pending = append(pending, chunk...)
		}
		switch {
		case err == nil:
			emit(pending)
			pending = pending[:0]
		case errors.Is(err, bufio.ErrBufferFull):
			for len(pending) >= MaxLineBytes {
				piece := append(bytes.Clone(pending[:MaxLineBytes]), '\n')
				emit(piece)
				pending = append(pending[:0], pending[MaxLineBytes:]...)
			}
		default: // io.EOF or a read error: the writers are gone
			if len(pending) > 0 {
				emit(append(pending, '\n'))
			}
			return
		}
	}
}
