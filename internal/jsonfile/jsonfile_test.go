package jsonfile

import (
	"strings"
	"testing"
)

type doc struct {
	Name  string            `json:"name"`
	Count int32             `json:"count"`
	Items []struct{ A int } `json:"items"`
	Tags  map[string]string `json:"tags"`
}

// TestDecodeSaysWhatInTheFilesTerms: each error is one line with the place and the
// field as the file spells it, never Go's type names.
func TestDecodeSaysWhatInTheFilesTerms(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"name": "x"}`, ""},
		{"\xEF\xBB\xBF{}", "the file starts with a UTF-8 byte-order mark (bytes EF BB BF): save it as UTF-8 without one"},
		{" \n\t", "the file is empty: want a JSON document"},
		{`{"name": "a",` + "\n" + `"name": "b"}`, `invalid JSON at line 2, column 1: field "name" given twice (first at line 1, column 2): give each once`},
		{`{"tags": {"k": "1", "k": "2"}}`, `field "tags.k" given twice`},
		{`{"items": [{"A": 1}, {"A": 1, "A": 2}]}`, `field "items[1].A" given twice`},
		{`{"count": 3000000000}`, `invalid JSON at line 1, column 21: field "count": want an integer from -2147483648 to 2147483647, got 3000000000`},
		{`{"items": [{"A": "x"}]}`, `field "items[0].A": want an integer`},
		{`{"nmae": "x"}`, `invalid JSON at line 1, column 2: unknown field "nmae" (a misspelling?)`},
		{`{"tags": {"a": "b"}, "extra": {"deep": 1}}`, `unknown field "extra"`},
		{`{"name": "x"`, "invalid JSON: the file ends before the document does (truncated?)"},
		{`{"name": "x"} []`, "invalid JSON at line 1, column 15: a second value after the document: want one"},
		{`{"name": x}`, "invalid JSON at line 1, column 10: invalid character 'x' looking for beginning of value"},
		{`[1]`, "the top level: want an object, got an array"},
	} {
		var d doc
		err := Decode([]byte(tc.in), &d)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s", tc.in, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "Go struct") || strings.Contains(err.Error(), "int32") || strings.Contains(err.Error(), "\n")) {
			t.Errorf("%q: %v: Go's words or two lines", tc.in, err)
		}
	}
}

// FuzzDecode: any input decodes or is refused in one line without a panic; Check never
// refuses what it should let the decoder judge.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"name": "x"}`, `{"a": 1, "a": 2}`, "\xEF\xBB\xBF{}", `{"items": [{"A": 1}]}`, `[`, `{"tags": {"": ""}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var d doc
		if err := Decode(data, &d); err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("two-line error: %q", err)
		}
	})
}
