// Package schema versions the records gangrun keeps in Consul, so that two releases can
// share a cluster during a rolling upgrade (docs/operations.md, "Upgrades"): every JSON
// record carries its kind's schema version as its first member, "schema"; a reader
// takes a record of its own version or an older one, and refuses a newer one with a
// reason (NewerError) instead of misreading it, and then neither overwrites nor deletes
// it. A record without "schema" is version 1: what gangrun wrote before records carried
// versions.
//
// The version of a kind changes only when an older reader would misread the record: a
// field renamed, removed or given another meaning, or a new field whose absence an
// older reader would act on wrongly. A field an older reader may ignore keeps the
// version (encoding/json ignores members a struct has no field for), as
// topology.SchemaVersion does. Values that are not JSON records (a lock's holder, a
// counter, a grant id under a GPU key) carry no version: their format is their key's,
// and changing it takes a new key.
//
// One mechanism for every record: writers call Marshal(kind, v), readers
// Unmarshal(kind, data, &v); the version is never a field of the record's Go type, so
// what a record's content is hashed as (a job's spec under its MUNGE credential,
// job.jobContent) is the same for every release that writes the same schema.
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Kind is a kind of record gangrun keeps in Consul. Its name is how messages and
// `gangrun version` call it.
type Kind string

// The kinds of record, with the keys they live under (docs/operations.md lists them
// with their writers and readers).
const (
	JobSpec        Kind = "job spec"          // gangrun/batch/jobs/<id>/spec
	JobState       Kind = "job state"         // gangrun/batch/jobs/<id>/state
	JobAuth        Kind = "job auth"          // gangrun/batch/jobs/<id>/auth
	JobStep        Kind = "job step"          // gangrun/batch/jobs/<id>/steps/<node>
	IdleMark       Kind = "idle mark"         // gangrun/batch/jobs/<id>/idle/<node>
	StepUsage      Kind = "step usage"        // gangrun/batch/usage/<id>/<node>
	CredentialSeen Kind = "credential seen"   // gangrun/batch/seen/<digest>
	RequestBox     Kind = "request box"       // gangrun/batch/users/<user>/<request>, with its answer
	AcctRecord     Kind = "accounting record" // gangrun/acct/jobs/<day>/<id>
	AcctRollup     Kind = "accounting rollup" // gangrun/acct/daily/<day>
	Node           Kind = "node record"       // gangrun/cluster/nodes/<node>
	Drain          Kind = "drain"             // gangrun/cluster/drain/<node>
	Request        Kind = "request"           // gangrun/cluster/requests/<id>
	Grant          Kind = "grant"             // gangrun/cluster/grants/<id>
	Status         Kind = "scheduler status"  // gangrun/scheduler/status
	Inventory      Kind = "inventory"         // gangrun/inventory/<node> (its own "schema_version")
	Policy         Kind = "policy"            // gangrun/policy/config
	Usage          Kind = "usage"             // gangrun/policy/usage
	AuditEntry     Kind = "audit entry"       // gangrun/audit/<day>/<entry>
	RdzvState      Kind = "rendezvous state"  // gangrun/jobs/<job>/ctl/state
	RdzvMember     Kind = "rendezvous member" // gangrun/jobs/<job>/members/<node>
	RdzvRound      Kind = "rendezvous round"  // gangrun/jobs/<job>/rounds/<round>/<node>
	BenchSweep     Kind = "bench sweep"       // gangrun/bench/<job>/sweep
	BenchNode      Kind = "bench node"        // gangrun/bench/<job>/nodes/<rank>
	BenchPair      Kind = "bench pair"        // gangrun/bench/<job>/pairs/<a>/<b>
)

// Kinds returns every kind, in the order `gangrun version` lists them.
func Kinds() []Kind {
	return []Kind{JobSpec, JobState, JobAuth, JobStep, IdleMark, StepUsage, CredentialSeen, RequestBox,
		AcctRecord, AcctRollup, Node, Drain, Request, Grant, Status, Inventory, Policy, Usage,
		AuditEntry, RdzvState, RdzvMember, RdzvRound, BenchSweep, BenchNode, BenchPair}
}

// Version is the schema version of kind k this gangrun writes, and the newest it reads
// (it reads every older one too). 0 for a string that is no kind.
func (k Kind) Version() int {
	switch k {
	case Inventory:
		// topology.SchemaVersion: the inventory's own "schema_version" (topo --json's
		// stable output); kept equal by TestInventoryVersion.
		return 1
	case JobSpec, JobState, JobAuth, JobStep, IdleMark, StepUsage, CredentialSeen, RequestBox,
		AcctRecord, AcctRollup, Node, Drain, Request, Grant, Status, Policy, Usage,
		AuditEntry, RdzvState, RdzvMember, RdzvRound, BenchSweep, BenchNode, BenchPair:
		return 1
	}
	return 0
}

// Field is the member that carries a record's schema version.
const Field = "schema"

// ErrNewer marks a record written by a newer gangrun: errors.Is(err, ErrNewer) holds for
// a *NewerError.
var ErrNewer = errors.New("record written by a newer gangrun")

// NewerError is a record of kind Kind whose schema, Got, is newer than Reads, the
// newest this gangrun reads. The record is left as it is: not run, placed, overwritten
// nor deleted by this reader.
type NewerError struct {
	Kind  Kind
	Got   int
	Reads int
	// Field names the record's version member where it is not "schema" (an inventory
	// file's "schema_version"), so the message names what is in the file.
	Field string
}

// Error says "job spec written by a newer gangrun (schema 3; this one reads up to 2)":
// the reason `gangrun queue`, `show` and `nodes` show for the record.
func (e *NewerError) Error() string {
	field := e.Field
	if field == "" {
		field = "schema"
	}
	return fmt.Sprintf("%s written by a newer gangrun (%s %d; this one reads up to %d)", e.Kind, field, e.Got, e.Reads)
}

// Is makes errors.Is(err, ErrNewer) true.
func (e *NewerError) Is(target error) bool { return target == ErrNewer }

// Marshal returns v's JSON (v must marshal to a JSON object) with kind k's schema
// version as its first member: {"schema":1,...}.
func Marshal(k Kind, v any) ([]byte, error) {
	return MarshalVersion(k, k.Version(), v)
}

// MarshalVersion is Marshal with another version than k's: for the tests that play a
// newer gangrun, and tools that write an older record.
func MarshalVersion(k Kind, version int, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k, err)
	}
	if len(b) < 2 || b[0] != '{' {
		return nil, fmt.Errorf("%s: %T is not a JSON object", k, v)
	}
	head := `{"` + Field + `":` + strconv.Itoa(version)
	if len(b) == 2 {
		return []byte(head + "}"), nil
	}
	out := make([]byte, 0, len(head)+len(b))
	out = append(append(append(out, head...), ','), b[1:]...)
	return out, nil
}

// prefix is how Marshal's output begins.
const prefix = `{"` + Field + `":`

// Of returns data's schema version: its "schema" member (the name exactly so; the last
// one if there are several, as encoding/json reads them), 1 when it has none. An error
// for data that is no JSON, or whose "schema" is not a whole number of at least 1.
func Of(data []byte) (int, error) {
	const member = `"` + Field + `"`
	if len(data) > len(prefix) && string(data[:len(prefix)]) == prefix {
		// Marshal's own output: the version is the digits that follow.
		rest := data[len(prefix):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n > 0 && n < len(rest) && (rest[n] == ',' || rest[n] == '}') && !bytes.Contains(rest, []byte(member)) {
			return version(rest[:n])
		}
	}
	if !bytes.Contains(data, []byte(member)) {
		return 1, nil // written before records carried versions
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return 0, err
	}
	raw, ok := top[Field]
	if !ok {
		return 1, nil // "schema" only inside a value
	}
	return version(raw)
}

// version parses a "schema" value.
func version(raw []byte) (int, error) {
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 1 {
		return 0, fmt.Errorf("schema %s: want a whole number of at least 1", raw)
	}
	return v, nil
}

// Check returns a *NewerError when data, a record of kind k, is newer than this gangrun
// reads; an error when its version cannot be read; nil otherwise.
func Check(k Kind, data []byte) error {
	v, err := Of(data)
	if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	if v > k.Version() {
		return &NewerError{Kind: k, Got: v, Reads: k.Version()}
	}
	return nil
}

// Unmarshal decodes data, a record of kind k, into v, after Check: a record newer than
// this gangrun reads is a *NewerError, and v is left as it was.
func Unmarshal(k Kind, data []byte, v any) error {
	if err := Check(k, data); err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}
