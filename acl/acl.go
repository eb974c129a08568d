// Package acl is gangrun's identity and access control on Consul's ACL system
// (docs/acl.md): the policies gangrun needs, the tokens `gangrun acl bootstrap` and
// `gangrun acl user` mint, and who a command's token says its caller is.
//
// Consul's rules are prefix rules on keys, the longest matching prefix deciding (Consul
// docs, "ACL Rules": key_prefix, exact-match key rules win over prefixes). Job ids
// are a shared sequence (1, 2, 3 ...), so no prefix could hold one user's jobs only;
// instead each user's token writes only its own request box,
// gangrun/batch/users/<user>/, and the elected agent (whose token writes all of
// gangrun/) carries out what is asked there, as that user: a submit becomes the
// user's job, a cancel is done when the job is the user's (job.ServeRequests). Every
// other key is read-only to a user. The operator's token writes all of gangrun/:
// drain, resume, policy, any job.
package acl

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/gangrun/gangrun/internal/store"
)

// The policies' names in Consul. A user's policy is UserPolicyPrefix + the user name.
const (
	AgentPolicy      = "gangrun-agent"
	OperatorPolicy   = "gangrun-operator"
	UserPolicyPrefix = "gangrun-user-"
	// managementPolicyID is Consul's builtin global-management policy (every right).
	managementPolicyID = "00000000-0000-0000-0000-000000000001"
)

// The tokens' descriptions in Consul (`consul acl token list` shows them); a user's is
// UserDescription + the user name.
const (
	AgentDescription    = "gangrun agent"
	OperatorDescription = "gangrun operator"
	UserDescription     = "gangrun user "
)

// UsersPrefix is where each user's requests go: gangrun/batch/users/<user>/, the one
// place a user's token may write.
const UsersPrefix = "gangrun/batch/users/"

// UserPrefix is user's request box, UsersPrefix + user + "/".
func UserPrefix(user string) string { return UsersPrefix + user + "/" }

// AgentRules are the agents' policy (the elected agent is also the scheduler and the
// job controller): every gangrun key but the operator's policy (read-only to it),
// sessions on any node (an agent's, a step's, the leader's), and reading the catalog's
// nodes (a session bound to a node's serfHealth check).
func AgentRules() string {
	return `key_prefix "gangrun/" {
  policy = "write"
}
key "gangrun/policy/config" {
  policy = "read"
}
session_prefix "" {
  policy = "write"
}
node_prefix "" {
  policy = "read"
}
`
}

// OperatorRules are the operator's policy: every gangrun key (drain, resume, the
// policy, any job's state, the audit log), sessions, and reading the catalog's nodes.
func OperatorRules() string {
	return `key_prefix "gangrun/" {
  policy = "write"
}
session_prefix "" {
  policy = "write"
}
node_prefix "" {
  policy = "read"
}
`
}

// UserRules are user's policy: read every gangrun key (queue, show, nodes, acct,
// logs), write only the user's request box.
func UserRules(user string) string {
	return fmt.Sprintf(`key_prefix "gangrun/" {
  policy = "read"
}
key_prefix %q {
  policy = "write"
}
`, UserPrefix(user))
}

// userName is what a user name may be: a Consul policy name takes letters, digits,
// '-' and '_' (up to 128 bytes), and the name is a key segment too. Most Unix names
// fit (POSIX's portable set less '.').
var userName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$`)

// CheckUser reports whether name can be a gangrun user: 1 to 64 letters, digits, '_'
// and '-', not beginning with '-', not all digits, and not root. A user's jobs run as
// the Unix user of that name on every node, so a name of digits would be taken for a
// uid (useradd refuses such names for that reason), and a token for root would run its
// holder's jobs as root everywhere: root submits as itself, on a node.
func CheckUser(name string) error {
	if !userName.MatchString(name) {
		return fmt.Errorf("user %q: want 1 to 64 letters, digits, '_' and '-' (not first), as Consul's policy names take", name)
	}
	if strings.Trim(name, "0123456789") == "" {
		return fmt.Errorf("user %q: a name of digits only would be taken for a uid by the nodes (the jobs of a token's user run as that Unix user)", name)
	}
	if name == "root" {
		return fmt.Errorf("user %q: a token's jobs run as its user on every node, and gangrun mints none for root (root submits as itself, on a node)", name)
	}
	return nil
}

// Role is what a token lets its holder do in gangrun.
type Role string

// The roles. RoleOpen is no ACL system at all (Consul's ACLs are off): everyone may do
// everything, as before ACLs.
const (
	RoleOpen       Role = "open"
	RoleManagement Role = "management"
	RoleOperator   Role = "operator"
	RoleAgent      Role = "agent"
	RoleUser       Role = "user"
)

// Identity is who a token says its holder is.
type Identity struct {
	// Role is what the token may do; User the user name of a RoleUser token.
	Role Role
	User string
	// Accessor is the token's AccessorID: Consul's public name of the token (its
	// refusals name it too), never its secret. "" when ACLs are off.
	Accessor string
}

// Admin reports whether the identity may drain, resume, set the policy and cancel
// anyone's job: the operator, Consul's management token, and everyone when ACLs are
// off.
func (id Identity) Admin() bool {
	return id.Role == RoleOpen || id.Role == RoleOperator || id.Role == RoleManagement
}

// Name says whose the token is, for messages: "bob's", "the operator's",
// "the agents'", "Consul's management token"; "" when ACLs are off.
func (id Identity) Name() string {
	switch id.Role {
	case RoleUser:
		return id.User + "'s"
	case RoleOperator:
		return "the operator's"
	case RoleAgent:
		return "the agents'"
	case RoleManagement:
		return "Consul's management token"
	}
	return ""
}

// ErrNoToken marks a command run against a Consul with ACLs on and no token, or one
// Consul does not know.
var ErrNoToken = errors.New("no valid Consul ACL token")

// ErrForeignToken marks a token Consul knows that is none of gangrun's (no gangrun
// policy, not management).
var ErrForeignToken = errors.New("not a gangrun token")

// ErrNameTaken is wrapped by MintUser's error for a user whose policy name differs only
// in case from an existing policy's: Consul's ACL policy names are unique regardless
// of case (its state store indexes them case-insensitively), so "ALICE" cannot have a
// policy beside "alice".
var ErrNameTaken = errors.New("the name is taken")

// Whoami asks Consul who s's token is (store.TokenOwner). With Consul's ACLs off, or
// a store that has none (store.Memory), it returns RoleOpen. Errors: ErrNoToken (no
// token, or one Consul does not know), ErrForeignToken, or Consul unreachable
// (store.ErrUnavailable).
func Whoami(ctx context.Context, s store.Store) (Identity, error) {
	o, ok := store.FindTokenOwner(s)
	if !ok {
		return Identity{Role: RoleOpen}, nil
	}
	tok, err := o.TokenSelf(ctx)
	if err != nil {
		var se api.StatusError
		msg := err.Error()
		switch {
		case strings.Contains(msg, "ACL support disabled"):
			return Identity{Role: RoleOpen}, nil
		case errors.Is(err, store.ErrPermissionDenied), errors.As(err, &se) && (se.Code == 403 || se.Code == 401), strings.Contains(msg, "ACL not found"):
			return Identity{}, fmt.Errorf("%w: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE to the token `gangrun acl user NAME` minted for you", ErrNoToken)
		}
		return Identity{}, fmt.Errorf("ask Consul whose the token is: %w", err)
	}
	return identityOf(tok)
}

// identityOf reads a token's identity from the policies linked to it.
func identityOf(tok *api.ACLToken) (Identity, error) {
	id := Identity{Accessor: tok.AccessorID}
	for _, p := range tok.Policies {
		switch {
		case p.ID == managementPolicyID:
			id.Role = RoleManagement
			return id, nil
		case p.Name == OperatorPolicy:
			id.Role = RoleOperator
			return id, nil
		}
	}
	for _, p := range tok.Policies {
		switch {
		case p.Name == AgentPolicy:
			id.Role = RoleAgent
			return id, nil
		case strings.HasPrefix(p.Name, UserPolicyPrefix):
			id.Role, id.User = RoleUser, strings.TrimPrefix(p.Name, UserPolicyPrefix)
			return id, nil
		}
	}
	return id, fmt.Errorf("token %s: %w (it has none of the policies %s, %s, %s<user>)", tok.AccessorID, ErrForeignToken, AgentPolicy, OperatorPolicy, UserPolicyPrefix)
}
