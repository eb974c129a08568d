// Package jsonfile decodes a JSON document a user wrote (a scheduling policy, a
// recorded topology inventory) and says what is wrong with it in the file's own terms:
// the line and column, the field as the file spells it (priority.weights.age,
// gpus[0].nvlinks), what the file holds and what is wanted. Go's type names ("Go struct
// field Weights.priority.weights.age of type int64"), a bare "unexpected EOF" and a
// byte-order mark read as "invalid character 'ï'" never reach the user. It also refuses
// what encoding/json lets through: a key given twice in one object (the last would
// silently win) and a byte-order mark.
package jsonfile

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// Describe turns an encoding/json error from decoding data into one line in JSON's own
// terms: where (line and column), which field (a path such as gpus[0].nvlinks), what
// the file has and what is wanted ("want an array, got a string"). Go type names never
// appear in it. An unknown field (json.Decoder.DisallowUnknownFields) is named with its
// path and place, a document cut short as such.
func Describe(data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if name, ok := unknownField(err); ok {
		if line, col, path, found := findKey(data, name); found {
			return fmt.Errorf("invalid JSON at line %d, column %d: unknown field %q (a misspelling?)", line, col, path)
		}
		return fmt.Errorf("invalid JSON: unknown field %q (a misspelling?)", name)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("invalid JSON: the file ends before the document does (truncated?)")
	}
	switch {
	case errors.As(err, &syn) && syn.Offset >= int64(len(bytes.TrimRight(data, " \t\r\n"))):
		return errors.New("invalid JSON: the file ends before the document does (truncated?)")
	case errors.As(err, &syn):
		// Offset counts the bytes read, the offending one included.
		line, col := lineCol(data, syn.Offset-1)
		return fmt.Errorf("invalid JSON at line %d, column %d: %s", line, col, syn.Error())
	case errors.As(err, &typ):
		line, col := lineCol(data, typ.Offset)
		field := jsonPath(data, typ.Offset)
		if field == "" {
			return fmt.Errorf("invalid JSON at line %d, column %d: the top level: want %s, got %s",
				line, col, jsonWant(typ.Type), jsonGot(typ.Value))
		}
		return fmt.Errorf("invalid JSON at line %d, column %d: field %q: want %s, got %s",
			line, col, field, jsonWant(typ.Type), jsonGot(typ.Value))
	}
	// A value's own UnmarshalJSON refused it: its message, which names the value.
	return fmt.Errorf("invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

// unknownField returns the name in encoding/json's `json: unknown field "NAME"`.
func unknownField(err error) (string, bool) {
	const prefix = "json: unknown field "
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return "", false
	}
	name, qerr := strconv.Unquote(strings.TrimPrefix(msg, prefix))
	return name, qerr == nil
}

// lineCol returns the 1-based line and column of byte offset in data.
func lineCol(data []byte, offset int64) (line, col int) {
	offset = max(0, min(offset, int64(len(data))))
	before := data[:offset]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(offset) - bytes.LastIndexByte(before, '\n')
	return line, col
}

// jsonWant names what a Go type decodes from, in JSON terms, with its article.
func jsonWant(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		return "a string"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonWant(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer from %d to %d", minInt(t.Bits()), maxInt(t.Bits()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer from 0 to %d", maxUint(t.Bits()))
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another value"
}

func minInt(bits int) int64   { return -1 << (bits - 1) }
func maxInt(bits int) int64   { return 1<<(bits-1) - 1 }
func maxUint(bits int) uint64 { return 1<<bits - 1 }

// jsonGot names what the file holds from UnmarshalTypeError.Value ("string", "number",
// "number 1.5", "array", "object", "bool").
func jsonGot(v string) string {
	switch {
	case v == "string":
		return "a string"
	case v == "number":
		return "a number"
	case strings.HasPrefix(v, "number "):
		return strings.TrimPrefix(v, "number ")
	case v == "array":
		return "an array"
	case v == "object":
		return "an object"
	case v == "bool":
		return "true or false"
	case v == "null":
		return "null"
	}
	return strconv.Quote(v)
}

// jsonPath returns the path of the value that ends at offset in data (an
// UnmarshalTypeError's Offset: just past a scalar, or just past the '[' or '{' that
// opens a composite value), as object keys and array indices: "gpus[0].nvlinks". The
// top-level value is "".
func jsonPath(data []byte, offset int64) string {
	type frame struct {
		array   bool
		index   int
		key     string
		wantKey bool
	}
	var stack []frame
	path := func() string {
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
	done := func() { // a value of the innermost composite ended
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
		tok, err := dec.Token()
		if err != nil {
			return path()
		}
		at := dec.InputOffset()
		if n := len(stack); n > 0 && !stack[n-1].array && stack[n-1].wantKey {
			if key, ok := tok.(string); ok {
				stack[n-1].key, stack[n-1].wantKey = key, false
				continue
			}
			stack = stack[:n-1] // '}'
			done()
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if at >= offset {
				return path()
			}
			stack = append(stack, frame{array: tok == json.Delim('['), wantKey: tok == json.Delim('{')})
		case json.Delim(']'), json.Delim('}'):
			stack = stack[:len(stack)-1]
			done()
		default:
			if at >= offset {
				return path()
			}
			done()
		}
	}
}
