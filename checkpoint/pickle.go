package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// A reader of the Python pickles torch.save writes (data.pkl inside its zip archive),
// enough to read a trainer's own bookkeeping — the world sizes DeepSpeed records in
// its model states — without Python or torch. It runs the pickle machine of Python's
// pickletools documentation (protocols 0 to 5) over plain values: None, bools, ints,
// floats, strings, bytes, lists, tuples and dicts (string keys) are kept; everything
// that would need a Python class — a tensor (torch._utils._rebuild_tensor_v2 and its
// storage, a persistent id), an instance, a set — becomes a pyObject naming its class,
// and no code is ever called. collections.OrderedDict becomes a dict, so state dicts
// nest as they do in Python.

// maxPickleBytes bounds the pickle read, in bytes (64 MiB). torch.save keeps tensor data
// outside data.pkl, so even the state dict of a model with thousands of tensors pickles
// to a few MiB.
const maxPickleBytes = 64 << 20

// maxPickleStack and maxPickleMemo bound the machine's stack and memo, in entries: a
// state dict's pickle holds a few values per tensor and batches of at most 1,000 items
// between a MARK and the opcode that takes them, far below these; a crafted pickle
// must not make the reader hold gigabytes.
const (
	maxPickleStack = 1 << 20
	maxPickleMemo  = 1 << 22
)

// errPickle is wrapped by every error of readPickle.
var errPickle = errors.New("not a readable pickle")

// pyDict is a Python dict as the reader keeps it: its string keys' values, in no
// order; other keys are dropped.
type pyDict struct{ m map[string]any }

// pyList is a Python list (mutable: APPEND adds to it through any reference).
type pyList struct{ items []any }

// pyObject is a value the reader does not build: a class (a GLOBAL), or what calling
// one would return (REDUCE, NEWOBJ), or a persistent id. class is "module.name", or
// "persistent id".
type pyObject struct{ class string }

// pyMark is the MARK opcode's marker on the stack.
type pyMark struct{}

// readPickle runs the pickle in data and returns the value STOP leaves, or an error
// wrapping errPickle naming the opcode that failed and its offset.
func readPickle(data []byte) (any, error) {
	if len(data) > maxPickleBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", errPickle, len(data), maxPickleBytes)
	}
	m := &pickleMachine{data: data, memo: map[uint64]any{}}
	v, err := m.run()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errPickle, err)
	}
	return v, nil
}

// pickleMachine is one run of the pickle machine: the input and its position, the
// stack (MARK pushes a pyMark) and the memo.
type pickleMachine struct {
	data  []byte
	pos   int
	stack []any
	memo  map[uint64]any
}

func (m *pickleMachine) run() (any, error) {
	for m.pos < len(m.data) {
		at := m.pos
		op := m.data[m.pos]
		m.pos++
		done, err := m.step(op)
		if err == nil && (len(m.stack) > maxPickleStack || len(m.memo) > maxPickleMemo) {
			err = errors.New("stack or memo beyond the reader's bounds")
		}
		if err != nil {
			return nil, fmt.Errorf("opcode %q at offset %d: %v", op, at, err)
		}
		if done {
			if len(m.stack) != 1 {
				return nil, fmt.Errorf("STOP with %d values on the stack", len(m.stack))
			}
			return m.stack[0], nil
		}
	}
	return nil, errors.New("no STOP opcode: cut short")
}

// errUnknownOpcode is step's error for an opcode the reader does not run.
var errUnknownOpcode = errors.New("unknown or unsupported opcode")

// step executes op; done is true at STOP. It hands op to the handler of its group:
// the stack's own opcodes, numbers, strings and bytes, containers, objects and the memo.
func (m *pickleMachine) step(op byte) (done bool, err error) {
	switch op {
	case '.': // STOP
		return true, nil
	case 0x80, 0x95, '(', '0', '1', '2':
		return false, m.stackOp(op)
	case 'N', 0x88, 0x89, 'I', 'L', 'J', 'K', 'M', 0x8a, 0x8b, 'F', 'G':
		return false, m.numberOp(op)
	case 'S', 'V', 'T', 'U', 'X', 0x8c, 0x8d, 'B', 'C', 0x8e, 0x96:
		return false, m.stringOp(op)
	case ']', ')', '}', 0x8f, 'l', 't', 0x85, 0x86, 0x87, 'd', 'a', 'e', 's', 'u', 0x90, 0x91:
		return false, m.containerOp(op)
	case 'c', 0x93, 'R', 0x81, 0x92, 'b', 'i', 'o', 'P', 'Q', 0x82, 0x83, 0x84:
		return false, m.objectOp(op)
	case 'g', 'h', 'j', 'p', 'q', 'r', 0x94:
		return false, m.memoOp(op)
	}
	return false, errUnknownOpcode
}

// stackOp executes the opcodes that move the machine or its stack without making a
// value: PROTO, FRAME, MARK, POP, POP_MARK and DUP.
func (m *pickleMachine) stackOp(op byte) (err error) {
	switch op {
	case 0x80: // PROTO
		_, err = m.take(1)
	case 0x95: // FRAME: frames only group the opcodes that follow
		_, err = m.take(8)
	case '(': // MARK
		m.push(pyMark{})
	case '0': // POP
		_, err = m.pop()
	case '1': // POP_MARK
		_, err = m.popMark()
	case '2': // DUP
		var v any
		if v, err = m.top(); err == nil {
			m.push(v)
		}
	default:
		return errUnknownOpcode
	}
	return err
}

// numberOp executes the opcodes that push None, a bool, an int or a float.
func (m *pickleMachine) numberOp(op byte) (err error) {
	switch op {
	case 'N':
		m.push(nil)
	case 0x88:
		m.push(true)
	case 0x89:
		m.push(false)
	case 'I': // INT: decimal line; "01"/"00" are protocol 0's True/False
		var line string
		if line, err = m.line(); err == nil {
			switch line {
			case "01":
				m.push(true)
			case "00":
				m.push(false)
			default:
				err = m.pushDecimal(line)
			}
		}
	case 'L': // LONG: decimal line with an L suffix
		var line string
		if line, err = m.line(); err == nil {
			err = m.pushDecimal(strings.TrimSuffix(line, "L"))
		}
	case 'J': // BININT
		var b []byte
		if b, err = m.take(4); err == nil {
			m.push(int64(int32(binary.LittleEndian.Uint32(b))))
		}
	case 'K': // BININT1
		var b []byte
		if b, err = m.take(1); err == nil {
			m.push(int64(b[0]))
		}
	case 'M': // BININT2
		var b []byte
		if b, err = m.take(2); err == nil {
			m.push(int64(binary.LittleEndian.Uint16(b)))
		}
	case 0x8a, 0x8b: // LONG1, LONG4: little-endian two's complement
		var b []byte
		if b, err = m.counted(map[byte]int{0x8a: 1, 0x8b: 4}[op]); err == nil {
			m.push(longValue(b))
		}
	case 'F': // FLOAT: decimal line
		var line string
		if line, err = m.line(); err == nil {
			var f float64
			if f, err = strconv.ParseFloat(line, 64); err == nil {
				m.push(f)
			}
		}
	case 'G': // BINFLOAT: big-endian IEEE 754
		var b []byte
		if b, err = m.take(8); err == nil {
			m.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
		}
	default:
		return errUnknownOpcode
	}
	return err
}

// stringOp executes the opcodes that push a string or bytes.
func (m *pickleMachine) stringOp(op byte) (err error) {
	switch op {
	case 'S': // STRING: a quoted Python repr on one line
		var line string
		if line, err = m.line(); err == nil {
			m.push(strings.Trim(line, `'"`))
		}
	case 'V': // UNICODE: raw-unicode-escape line
		var line string
		if line, err = m.line(); err == nil {
			m.push(rawUnicodeEscape(line))
		}
	case 'T', 'U', 'X', 0x8c, 0x8d: // BINSTRING, SHORT_BINSTRING, BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
		var b []byte
		if b, err = m.counted(map[byte]int{'T': 4, 'U': 1, 'X': 4, 0x8c: 1, 0x8d: 8}[op]); err == nil {
			m.push(string(b))
		}
	case 'B', 'C', 0x8e, 0x96: // BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8
		var b []byte
		if b, err = m.counted(map[byte]int{'B': 4, 'C': 1, 0x8e: 8, 0x96: 8}[op]); err == nil {
			m.push(append([]byte(nil), b...))
		}
	default:
		return errUnknownOpcode
	}
	return err
}

// containerOp executes the opcodes that build or fill a list, tuple, dict or set.
func (m *pickleMachine) containerOp(op byte) (err error) {
	switch op {
	case ']':
		m.push(&pyList{})
	case ')':
		m.push([]any{})
	case '}':
		m.push(&pyDict{m: map[string]any{}})
	case 0x8f: // EMPTY_SET
		m.push(pyObject{class: "builtins.set"})
	case 'l': // LIST
		var items []any
		if items, err = m.popMark(); err == nil {
			m.push(&pyList{items: items})
		}
	case 't': // TUPLE
		var items []any
		if items, err = m.popMark(); err == nil {
			m.push(items)
		}
	case 0x85, 0x86, 0x87: // TUPLE1, TUPLE2, TUPLE3
		return m.smallTuple(int(op-0x85) + 1)
	case 'd': // DICT
		var items []any
		if items, err = m.popMark(); err == nil {
			d := &pyDict{m: map[string]any{}}
			setItems(d, items)
			m.push(d)
		}
	case 'a': // APPEND
		var v any
		if v, err = m.pop(); err == nil {
			var l any
			if l, err = m.top(); err == nil {
				appendItems(l, []any{v})
			}
		}
	case 'e': // APPENDS
		var items []any
		if items, err = m.popMark(); err == nil {
			var l any
			if l, err = m.top(); err == nil {
				appendItems(l, items)
			}
		}
	case 's': // SETITEM
		return m.setItem()
	case 'u': // SETITEMS
		var items []any
		if items, err = m.popMark(); err == nil {
			var d any
			if d, err = m.top(); err == nil {
				if dict, ok := d.(*pyDict); ok {
					setItems(dict, items)
				}
			}
		}
	case 0x90: // ADDITEMS: to a set, kept opaque
		_, err = m.popMark()
	case 0x91: // FROZENSET
		if _, err = m.popMark(); err == nil {
			m.push(pyObject{class: "builtins.frozenset"})
		}
	default:
		return errUnknownOpcode
	}
	return err
}

// smallTuple executes TUPLE1, TUPLE2 or TUPLE3: the top n values become a tuple.
func (m *pickleMachine) smallTuple(n int) error {
	if len(m.stack) < n {
		return errors.New("stack underflow")
	}
	items := append([]any(nil), m.stack[len(m.stack)-n:]...)
	m.stack = m.stack[:len(m.stack)-n]
	for _, it := range items {
		if _, ok := it.(pyMark); ok {
			return errors.New("a MARK inside a tuple")
		}
	}
	m.push(items)
	return nil
}

// setItem executes SETITEM: the key and value on top go into the dict below them.
func (m *pickleMachine) setItem() error {
	if len(m.stack) < 3 {
		return errors.New("stack underflow")
	}
	k, v := m.stack[len(m.stack)-2], m.stack[len(m.stack)-1]
	m.stack = m.stack[:len(m.stack)-2]
	if d, ok := m.stack[len(m.stack)-1].(*pyDict); ok {
		setItems(d, []any{k, v})
	}
	return nil
}

// objectOp executes the opcodes that name a class or stand for calling one: each
// pushes a pyObject (or, for collections.OrderedDict, an empty dict) and calls nothing.
func (m *pickleMachine) objectOp(op byte) (err error) {
	switch op {
	case 'c': // GLOBAL: module and name lines
		var mod, name string
		if mod, err = m.line(); err == nil {
			if name, err = m.line(); err == nil {
				m.push(pyObject{class: className(mod, name)})
			}
		}
	case 0x93: // STACK_GLOBAL
		var name, mod any
		if name, err = m.pop(); err == nil {
			if mod, err = m.pop(); err == nil {
				m.push(pyObject{class: className(fmt.Sprint(mod), fmt.Sprint(name))})
			}
		}
	case 'R': // REDUCE: callable, args → what calling it returns
		var fn, args any
		if args, err = m.pop(); err == nil {
			if fn, err = m.pop(); err == nil {
				m.push(reduceCall(fn, args))
			}
		}
	case 0x81: // NEWOBJ: cls, args
		var cls any
		if _, err = m.pop(); err == nil {
			if cls, err = m.pop(); err == nil {
				m.push(reduceValue(cls))
			}
		}
	case 0x92: // NEWOBJ_EX: cls, args, kwargs
		if len(m.stack) < 3 {
			return errors.New("stack underflow")
		}
		cls := m.stack[len(m.stack)-3]
		m.stack = m.stack[:len(m.stack)-3]
		m.push(reduceValue(cls))
	case 'b': // BUILD: the state is applied to the object, which is kept opaque
		_, err = m.pop()
	case 'i': // INST: module and name lines, args since the mark
		var mod, name string
		if mod, err = m.line(); err == nil {
			if name, err = m.line(); err == nil {
				if _, err = m.popMark(); err == nil {
					m.push(reduceValue(pyObject{class: className(mod, name)}))
				}
			}
		}
	case 'o': // OBJ: class and args since the mark
		var items []any
		if items, err = m.popMark(); err == nil {
			if len(items) == 0 {
				return errors.New("OBJ without a class")
			}
			m.push(reduceValue(items[0]))
		}
	case 'P': // PERSID: a line
		if _, err = m.line(); err == nil {
			m.push(pyObject{class: "persistent id"})
		}
	case 'Q': // BINPERSID: torch.save's storages
		if _, err = m.pop(); err == nil {
			m.push(pyObject{class: "persistent id"})
		}
	case 0x82, 0x83, 0x84: // EXT1, EXT2, EXT4: the copyreg extension registry
		if _, err = m.take(map[byte]int{0x82: 1, 0x83: 2, 0x84: 4}[op]); err == nil {
			m.push(pyObject{class: "extension"})
		}
	default:
		return errUnknownOpcode
	}
	return err
}

// memoOp executes the memo's opcodes: GET and its binary forms push a memo entry, PUT
// and its binary forms and MEMOIZE store the top of the stack.
func (m *pickleMachine) memoOp(op byte) (err error) {
	switch op {
	case 'g', 'h', 'j': // GET, BINGET, LONG_BINGET
		var idx uint64
		if idx, err = m.memoIndex(op); err == nil {
			v, ok := m.memo[idx]
			if !ok {
				return fmt.Errorf("memo %d not set", idx)
			}
			m.push(v)
		}
	case 'p', 'q', 'r': // PUT, BINPUT, LONG_BINPUT
		var idx uint64
		if idx, err = m.memoIndex(op); err == nil {
			var v any
			if v, err = m.top(); err == nil {
				m.memo[idx] = v
			}
		}
	case 0x94: // MEMOIZE
		var v any
		if v, err = m.top(); err == nil {
			m.memo[uint64(len(m.memo))] = v
		}
	default:
		return errUnknownOpcode
	}
	return err
}

// memoIndex reads the memo index of GET/PUT (a decimal line) or their binary forms.
func (m *pickleMachine) memoIndex(op byte) (uint64, error) {
	switch op {
	case 'g', 'p':
		line, err := m.line()
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(line, 10, 64)
	case 'h', 'q':
		b, err := m.take(1)
		if err != nil {
			return 0, err
		}
		return uint64(b[0]), nil
	}
	b, err := m.take(4)
	if err != nil {
		return 0, err
	}
	return uint64(binary.LittleEndian.Uint32(b)), nil
}

// reduceValue is what calling fn returns, as far as the reader builds values: an empty
// dict for collections.OrderedDict (filled by SETITEMS after), an opaque object of fn's
// class otherwise.
func reduceValue(fn any) any {
	if o, ok := fn.(pyObject); ok {
		if o.class == "collections.OrderedDict" {
			return &pyDict{m: map[string]any{}}
		}
		return pyObject{class: o.class}
	}
	return pyObject{class: "unknown"}
}

// className is "module.name", with the Python 2 module names protocols 0 to 2 write
// for Python 3's (__builtin__, copy_reg: Lib/_compat_pickle.py) mapped back.
func className(mod, name string) string {
	switch mod {
	case "__builtin__":
		mod = "builtins"
	case "copy_reg":
		mod = "copyreg"
	}
	return mod + "." + name
}

// reduceCall is REDUCE's result for fn(*args): protocols 0 and 1 pickle an instance as
// copyreg._reconstructor(cls, base, state), which stands for an instance of cls; and
// bytes as _codecs.encode(text, "latin1"), which the reader decodes. Anything else is
// reduceValue(fn).
func reduceCall(fn, args any) any {
	o, _ := fn.(pyObject)
	a, _ := args.([]any)
	switch {
	case o.class == "copyreg._reconstructor" && len(a) > 0:
		if cls, ok := a[0].(pyObject); ok {
			return reduceValue(cls)
		}
	case o.class == "_codecs.encode" && len(a) == 2:
		text, ok1 := a[0].(string)
		enc, ok2 := a[1].(string)
		if ok1 && ok2 && (enc == "latin1" || enc == "latin-1") {
			out := make([]byte, 0, len(text))
			for _, r := range text {
				if r > 0xff {
					return pyObject{class: "builtins.bytes"}
				}
				out = append(out, byte(r))
			}
			return out
		}
	}
	return reduceValue(fn)
}

// rawUnicodeEscape decodes Python's raw-unicode-escape codec, protocol 0's text
// encoding: each byte is the code point of that value (Latin-1), except \uXXXX and
// \UXXXXXXXX escapes.
func rawUnicodeEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') {
			n := 4
			if s[i+1] == 'U' {
				n = 8
			}
			if i+2+n <= len(s) {
				if r, err := strconv.ParseUint(s[i+2:i+2+n], 16, 32); err == nil && r <= 0x10ffff {
					b.WriteRune(rune(r))
					i += 1 + n
					continue
				}
			}
		}
		b.WriteRune(rune(s[i]))
	}
	return b.String()
}

// setItems stores key, value pairs into d; non-string keys are dropped.
func setItems(d *pyDict, kv []any) {
	for i := 0; i+1 < len(kv); i += 2 {
		if k, ok := kv[i].(string); ok {
			d.m[k] = kv[i+1]
		}
	}
}

// appendItems appends items to l when it is a list; anything else ignores them (a
// set, an object whose append method the reader does not run).
func appendItems(l any, items []any) {
	if list, ok := l.(*pyList); ok {
		list.items = append(list.items, items...)
	}
}

// longValue decodes a LONG1/LONG4 payload: an int64 when it fits, else a pyObject.
func longValue(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var buf [8]byte
		copy(buf[:], b)
		if b[len(b)-1]&0x80 != 0 {
			for i := len(b); i < 8; i++ {
				buf[i] = 0xff
			}
		}
		return int64(binary.LittleEndian.Uint64(buf[:]))
	}
	return pyObject{class: "builtins.int"}
}

// pushDecimal pushes a protocol 0 integer: an int64 when it fits.
func (m *pickleMachine) pushDecimal(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		m.push(n)
		return nil
	}
	if _, ok := new(big.Int).SetString(s, 10); ok {
		m.push(pyObject{class: "builtins.int"})
		return nil
	}
	return fmt.Errorf("%q is not an integer", clip(s))
}

func (m *pickleMachine) push(v any) { m.stack = append(m.stack, v) }

func (m *pickleMachine) pop() (any, error) {
	if len(m.stack) == 0 {
		return nil, errors.New("stack underflow")
	}
	v := m.stack[len(m.stack)-1]
	m.stack = m.stack[:len(m.stack)-1]
	if _, ok := v.(pyMark); ok {
		return nil, errors.New("popped a MARK")
	}
	return v, nil
}

func (m *pickleMachine) top() (any, error) {
	if len(m.stack) == 0 {
		return nil, errors.New("stack underflow")
	}
	v := m.stack[len(m.stack)-1]
	if _, ok := v.(pyMark); ok {
		return nil, errors.New("a MARK where a value was expected")
	}
	return v, nil
}

// popMark pops the values above the topmost MARK, and the MARK.
func (m *pickleMachine) popMark() ([]any, error) {
	for i := len(m.stack) - 1; i >= 0; i-- {
		if _, ok := m.stack[i].(pyMark); ok {
			items := append([]any(nil), m.stack[i+1:]...)
			m.stack = m.stack[:i]
			return items, nil
		}
	}
	return nil, errors.New("no MARK")
}

// take returns the next n bytes.
func (m *pickleMachine) take(n int) ([]byte, error) {
	if n < 0 || n > len(m.data)-m.pos {
		return nil, errors.New("cut short")
	}
	b := m.data[m.pos : m.pos+n]
	m.pos += n
	return b, nil
}

// counted returns the bytes a little-endian length of width bytes announces.
func (m *pickleMachine) counted(width int) ([]byte, error) {
	b, err := m.take(width)
	if err != nil {
		return nil, err
	}
	var buf [8]byte
	copy(buf[:], b)
	n := binary.LittleEndian.Uint64(buf[:])
	if n > uint64(len(m.data)-m.pos) {
		return nil, errors.New("length beyond the end: cut short")
	}
	return m.take(int(n))
}

// line returns the text up to the next newline, which it consumes.
func (m *pickleMachine) line() (string, error) {
	i := bytes.IndexByte(m.data[m.pos:], '\n')
	if i < 0 {
		return "", errors.New("line without its newline: cut short")
	}
	s := string(m.data[m.pos : m.pos+i])
	m.pos += i + 1
	return s, nil
}
