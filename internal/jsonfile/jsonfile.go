package jsonfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// bom is the UTF-8 encoding of U+FEFF, which some editors put at a file's start.
var bom = []byte{0xEF, 0xBB, 0xBF}

// Decode decodes the one JSON document in data into v after Check, refusing a field v
// has no place for (a misspelt key is not ignored) and anything after the document.
// Errors are one line each, in Describe's and Check's terms.
func Decode(data []byte, v any) error {
	if err := Check(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Describe(data, err)
	}
	if dec.More() {
		line, col := lineCol(data, skipSpace(data, dec.InputOffset()))
		return fmt.Errorf("invalid JSON at line %d, column %d: a second value after the document: want one", line, col)
	}
	return nil
}

// Check refuses what encoding/json would misread or let through silently: a UTF-8
// byte-order mark at the start (read as "invalid character 'ï'"), a document of
// nothing but white space (a bare "unexpected end of JSON input"), and a key given
// twice in one object (encoding/json keeps the last, so the first is silently lost).
// Syntax errors are left to the decoder, which Describe explains.
func Check(data []byte) error {
	if bytes.HasPrefix(data, bom) {
		return errors.New("the file starts with a UTF-8 byte-order mark (bytes EF BB BF): save it as UTF-8 without one")
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("the file is empty: want a JSON document")
	}
	return checkDuplicates(data)
}

// checkDuplicates walks data's tokens and returns an error naming the first key given
// twice in one object, with both places. A syntax error ends the walk without an error:
// the decoder reports it.
func checkDuplicates(data []byte) error {
	type frame struct {
		array   bool
		index   int
		key     string
		wantKey bool
		seen    map[string]int64 // key -> offset of its first occurrence
	}
	var stack []*frame
	path := func(last string) string {
		var b strings.Builder
		for _, f := range stack {
			if f.array {
				b.WriteString("[" + strconv.Itoa(f.index) + "]")
				continue
			}
			if f.key == "" {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		}
		if last != "" {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(last)
		}
		return b.String()
	}
	done := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].array {
				stack[n-1].index++
			} else {
				stack[n-1].wantKey = true
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		if n := len(stack); n > 0 && !stack[n-1].array && stack[n-1].wantKey {
			f := stack[n-1]
			if key, ok := tok.(string); ok {
				at := skipSpace(data, start)
				if bytes.HasPrefix(data[at:], []byte(",")) {
					at = skipSpace(data, at+1)
				}
				if first, dup := f.seen[key]; dup {
					l1, c1 := lineCol(data, first)
					l2, c2 := lineCol(data, at)
					f.key = ""
					return fmt.Errorf("invalid JSON at line %d, column %d: field %q given twice (first at line %d, column %d): give each once",
						l2, c2, path(key), l1, c1)
				}
				f.seen[key] = at
				f.key, f.wantKey = key, false
				continue
			}
			stack = stack[:n-1] // '}'
			done()
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, &frame{array: tok == json.Delim('['), wantKey: tok == json.Delim('{'), seen: map[string]int64{}})
		case json.Delim(']'), json.Delim('}'):
			stack = stack[:len(stack)-1]
			done()
		default:
			done()
		}
	}
}

// findKey returns the place and path of the first key named name in data.
func findKey(data []byte, name string) (line, col int, path string, found bool) {
	type frame struct {
		array   bool
		index   int
		key     string
		wantKey bool
	}
	var stack []frame
	pathOf := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.array {
				b.WriteString("[" + strconv.Itoa(f.index) + "]")
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		}
		return b.String()
	}
	done := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].array {
				stack[n-1].index++
			} else {
				stack[n-1].wantKey = true
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return 0, 0, "", false
		}
		if n := len(stack); n > 0 && !stack[n-1].array && stack[n-1].wantKey {
			if key, ok := tok.(string); ok {
				stack[n-1].key, stack[n-1].wantKey = key, false
				if key == name {
					at := skipSpace(data, start)
					if bytes.HasPrefix(data[at:], []byte(",")) {
						at = skipSpace(data, at+1)
					}
					line, col := lineCol(data, at)
					return line, col, pathOf(), true
				}
				continue
			}
			stack = stack[:n-1]
			done()
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, frame{array: tok == json.Delim('['), wantKey: tok == json.Delim('{')})
		case json.Delim(']'), json.Delim('}'):
			stack = stack[:len(stack)-1]
			done()
		default:
			done()
		}
	}
}

// skipSpace returns the offset of the first byte at or after off that is not JSON
// white space.
func skipSpace(data []byte, off int64) int64 {
	for off < int64(len(data)) {
		switch data[off] {
		case ' ', '\t', '\r', '\n':
			off++
		default:
			return off
		}
	}
	return off
}
