package schema

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n,omitempty"`
}

// TestMarshal: the version comes first, the record's members after it, and an empty
// record still carries it.
func TestMarshal(t *testing.T) {
	cases := []struct {
		v    any
		want string
	}{
		{rec{Name: "a", N: 2}, `{"schema":1,"name":"a","n":2}`},
		{struct{}{}, `{"schema":1}`},
		{map[string]int{"x": 1}, `{"schema":1,"x":1}`},
	}
	for _, c := range cases {
		b, err := Marshal(JobSpec, c.v)
		if err != nil || string(b) != c.want {
			t.Errorf("Marshal(%#v) = %s, %v; want %s", c.v, b, err, c.want)
		}
	}
	for _, v := range []any{[]int{1}, "text", 3, nil} {
		if b, err := Marshal(JobSpec, v); err == nil {
			t.Errorf("Marshal(%#v) = %s, want an error: not a JSON object", v, b)
		}
	}
	if _, err := Marshal(JobSpec, func() {}); err == nil || !strings.Contains(err.Error(), "job spec") {
		t.Errorf("Marshal of a func: %v, want an error naming the kind", err)
	}
}

// TestOf reads the version wherever "schema" is, a missing one as 1, and refuses a
// version that is no whole number of at least 1.
func TestOf(t *testing.T) {
	cases := []struct {
		data string
		want int
		bad  bool
	}{
		{`{"schema":1,"name":"a"}`, 1, false},
		{`{"schema":12}`, 12, false},
		{`{"name":"a"}`, 1, false},                       // before versions
		{`{"name":"schema"}`, 1, false},                  // the word in a value
		{`{"x":{"schema":5}}`, 1, false},                 // only inside a member
		{`{"name":"a", "schema": 3}`, 3, false},          // not first
		{"{\n  \"schema\": 2,\n  \"n\": 1\n}", 2, false}, // indented (the policy)
		{`{"schema":0}`, 0, true},
		{`{"schema":-1,"n":1}`, 0, true},
		{`{"schema":"2"}`, 0, true},
		{`{"schema":1.5}`, 0, true},
		{`{"schema":2`, 0, true},                    // cut short
		{`[1,2]`, 1, false},                         // no member named schema: version 1; its decoding fails later
		{`{"SCHEMA":5}`, 1, false},                  // the name exactly
		{`{"schema":1,"schema":3}`, 3, false},       // the last, as encoding/json
		{`{"schema":2,"x":{"schema":1}}`, 2, false}, // nested: the top one
	}
	for _, c := range cases {
		got, err := Of([]byte(c.data))
		if c.bad != (err != nil) || !c.bad && got != c.want {
			t.Errorf("Of(%s) = %d, %v; want %d (error: %v)", c.data, got, err, c.want, c.bad)
		}
	}
}

// TestUnmarshalRefusesNewer: a newer record is a NewerError naming both versions, and
// leaves the destination as it was; an older or equal one decodes.
func TestUnmarshalRefusesNewer(t *testing.T) {
	newer, _ := MarshalVersion(Grant, Grant.Version()+1, rec{Name: "new"})
	got := rec{Name: "before"}
	err := Unmarshal(Grant, newer, &got)
	var ne *NewerError
	if !errors.As(err, &ne) || !errors.Is(err, ErrNewer) || ne.Got != Grant.Version()+1 || ne.Reads != Grant.Version() || ne.Kind != Grant {
		t.Fatalf("Unmarshal of a newer record: %v, want a NewerError", err)
	}
	if want := "grant written by a newer gangrun (schema 2; this one reads up to 1)"; err.Error() != want {
		t.Errorf("the reason: %q, want %q", err, want)
	}
	if got.Name != "before" {
		t.Errorf("a refused record changed the destination: %+v", got)
	}
	for _, data := range []string{`{"name":"old"}`, `{"schema":1,"name":"old"}`} {
		var r rec
		if err := Unmarshal(Grant, []byte(data), &r); err != nil || r.Name != "old" {
			t.Errorf("Unmarshal(%s) = %+v, %v", data, r, err)
		}
	}
	if err := Unmarshal(Grant, []byte(`{"schema":"x"}`), &got); err == nil || errors.Is(err, ErrNewer) {
		t.Errorf("a bad version: %v, want an error that is not ErrNewer", err)
	}
}

// TestRoundTrip: what Marshal writes, Unmarshal reads back whole, and encoding/json
// (a gangrun from before versions) reads it too, ignoring the version.
func TestRoundTrip(t *testing.T) {
	in := rec{Name: "a", N: 7}
	for _, k := range Kinds() {
		b, err := Marshal(k, in)
		if err != nil {
			t.Fatal(err)
		}
		var out, old rec
		if err := Unmarshal(k, b, &out); err != nil || out != in {
			t.Errorf("%s: Unmarshal(Marshal) = %+v, %v", k, out, err)
		}
		if err := json.Unmarshal(b, &old); err != nil || old != in {
			t.Errorf("%s: encoding/json read %+v, %v", k, old, err)
		}
	}
}

// TestKinds: every kind has a version and a distinct name.
func TestKinds(t *testing.T) {
	seen := map[Kind]bool{}
	for _, k := range Kinds() {
		if k.Version() < 1 {
			t.Errorf("kind %q has no version", k)
		}
		if seen[k] {
			t.Errorf("kind %q listed twice", k)
		}
		seen[k] = true
	}
	if Kind("no such kind").Version() != 0 {
		t.Error("a string that is no kind has a version")
	}
}

// FuzzOf: Of never panics, and agrees with encoding/json on documents it decodes.
func FuzzOf(f *testing.F) {
	for _, s := range []string{`{"schema":1,"a":2}`, `{"a":1}`, `{"schema":`, `{"schema":99999999999999999999}`, `[]`, ``, `{"sChemA":10000000000000000}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Of(data)
		if err != nil {
			return
		}
		if v < 1 {
			t.Fatalf("Of(%q) = %d without an error", data, v)
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(data, &top) != nil {
			return // not an object: the record's own decoding fails
		}
		want := 1
		if raw, ok := top[Field]; ok {
			if json.Unmarshal(raw, &want) != nil {
				t.Fatalf("Of(%q) = %d, but its schema %s is no number", data, v, raw)
			}
		}
		if v != want {
			t.Fatalf("Of(%q) = %d, encoding/json reads %d", data, v, want)
		}
	})
}
