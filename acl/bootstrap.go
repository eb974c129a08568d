package acl

import (
	"context"
	"fmt"
	"strings"

	"github.com/hashicorp/consul/api"
)

// Tokens are the secrets Bootstrap minted. They are shown once: Consul keeps them, but
// gangrun neither stores nor prints them again.
type Tokens struct {
	// Agent is the secret every `gangrun agent` runs with (CONSUL_HTTP_TOKEN_FILE).
	Agent string
	// Operator is the secret for drain, resume, policy set and cancelling anyone's job.
	Operator string
}

// Bootstrap sets up gangrun's ACL policies in Consul (AgentRules, OperatorRules;
// an existing policy of the same name gets the rules anew) and mints one agent token
// and one operator token. c must hold a token with acl = "write" (Consul's
// management token, from `consul acl bootstrap` or acl.tokens.initial_management).
// Running it again mints new tokens; the old ones stay valid until deleted
// (`consul acl token delete -id ACCESSOR`).
func Bootstrap(ctx context.Context, c *api.Client) (Tokens, error) {
	if err := upsertPolicy(ctx, c, AgentPolicy, "gangrun agents: the nodes, the scheduler, the job controller", AgentRules()); err != nil {
		return Tokens{}, err
	}
	if err := upsertPolicy(ctx, c, OperatorPolicy, "gangrun operators: drain, resume, policy, anyone's jobs", OperatorRules()); err != nil {
		return Tokens{}, err
	}
	agent, err := mint(ctx, c, AgentPolicy, AgentDescription)
	if err != nil {
		return Tokens{}, err
	}
	op, err := mint(ctx, c, OperatorPolicy, OperatorDescription)
	if err != nil {
		return Tokens{}, err
	}
	return Tokens{Agent: agent, Operator: op}, nil
}

// MintUser sets up user's policy (UserRules) and mints a token for the user, returning
// its secret. c must hold a token with acl = "write". Each call mints another token
// for the same user (one per machine, say); all stay valid until deleted.
func MintUser(ctx context.Context, c *api.Client, user string) (string, error) {
	if err := CheckUser(user); err != nil {
		return "", err
	}
	if err := upsertPolicy(ctx, c, UserPolicyPrefix+user, "gangrun user "+user+": read the cluster, write only this user's requests", UserRules(user)); err != nil {
		return "", err
	}
	return mint(ctx, c, UserPolicyPrefix+user, UserDescription+user)
}

// upsertPolicy creates policy name with rules, or sets the rules of the one there.
func upsertPolicy(ctx context.Context, c *api.Client, name, desc, rules string) error {
	q := (&api.QueryOptions{}).WithContext(ctx)
	w := (&api.WriteOptions{}).WithContext(ctx)
	// Consul answers a read by name of a policy that is not there as it answers an
	// unknown token (403 "ACL not found"): the list tells the two apart.
	list, _, err := c.ACL().PolicyList(q)
	if err != nil {
		return fmt.Errorf("list ACL policies: %w", err)
	}
	var p *api.ACLPolicy
	for _, e := range list {
		switch {
		case e.Name == name:
			p = &api.ACLPolicy{ID: e.ID, Name: e.Name}
		case strings.EqualFold(e.Name, name):
			return fmt.Errorf("ACL policy %s: %w by %s (Consul's policy names ignore case)", name, ErrNameTaken, e.Name)
		}
	}
	if p == nil {
		if _, _, err := c.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Description: desc, Rules: rules}, w); err != nil {
			return fmt.Errorf("create ACL policy %s: %w", name, err)
		}
		return nil
	}
	p.Description, p.Rules = desc, rules
	if _, _, err := c.ACL().PolicyUpdate(p, w); err != nil {
		return fmt.Errorf("update ACL policy %s: %w", name, err)
	}
	return nil
}

// mint creates a token linked to policy and returns its secret.
func mint(ctx context.Context, c *api.Client, policy, desc string) (string, error) {
	t, _, err := c.ACL().TokenCreate(&api.ACLToken{Description: desc, Policies: []*api.ACLTokenPolicyLink{{Name: policy}}},
		(&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("create ACL token %q: %w", desc, err)
	}
	return t.SecretID, nil
}
