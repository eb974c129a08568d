package acl_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

func storeAs(t *testing.T, addr, token string) *store.Consul {
	t.Helper()
	s, err := store.NewConsulToken(addr, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestPoliciesOnRealConsul: on a Consul dev agent with ACLs on and default deny, the
// tokens Bootstrap and MintUser mint say who they are, a user's token writes its own
// request box and nothing else, the agent's token takes sessions and locks, the
// operator's writes the policy, the agent's does not.
func TestPoliciesOnRealConsul(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := consultest.StartACL(t)
	mgmt := storeAs(t, a.Addr, a.ManagementToken)
	toks, err := acl.Bootstrap(ctx, mgmt.Client())
	if err != nil {
		t.Fatal(err)
	}
	alice, err := acl.MintUser(ctx, mgmt.Client(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := acl.MintUser(ctx, mgmt.Client(), "bob")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token string
		want  acl.Identity
	}{
		{a.ManagementToken, acl.Identity{Role: acl.RoleManagement}},
		{toks.Operator, acl.Identity{Role: acl.RoleOperator}},
		{toks.Agent, acl.Identity{Role: acl.RoleAgent}},
		{alice, acl.Identity{Role: acl.RoleUser, User: "alice"}},
	} {
		id, err := acl.Whoami(ctx, storeAs(t, a.Addr, c.token))
		if err != nil {
			t.Fatalf("whoami %s: %v", c.want.Role, err)
		}
		if id.Role != c.want.Role || id.User != c.want.User || id.Accessor == "" {
			t.Errorf("whoami: %+v, want %+v", id, c.want)
		}
	}
	if _, err := acl.Whoami(ctx, storeAs(t, a.Addr, "00000000-1111-2222-3333-444444444444")); !errors.Is(err, acl.ErrNoToken) {
		t.Errorf("whoami with an unknown token: %v, want ErrNoToken", err)
	}
	if id, err := acl.Whoami(ctx, storeAs(t, consultest.Start(t).Addr, "")); err != nil || id.Role != acl.RoleOpen {
		t.Errorf("whoami without ACLs: %+v %v, want RoleOpen", id, err)
	}

	as, bs, ag, op := storeAs(t, a.Addr, alice), storeAs(t, a.Addr, bob), storeAs(t, a.Addr, toks.Agent), storeAs(t, a.Addr, toks.Operator)
	set := func(s store.Store, key string) error {
		_, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: []byte("x")}})
		return err
	}
	if err := set(as, acl.UserPrefix("alice")+"r1"); err != nil {
		t.Errorf("alice writes her own box: %v", err)
	}
	for _, key := range []string{acl.UserPrefix("alice") + "r2", "gangrun/batch/jobs/1/state", "gangrun/cluster/drain/n1", "gangrun/policy/config"} {
		if err := set(bs, key); !errors.Is(err, store.ErrPermissionDenied) {
			t.Errorf("bob writes %s: %v, want permission denied", key, err)
		}
	}
	if _, err := bs.Get(ctx, acl.UserPrefix("alice")+"r1"); err != nil {
		t.Errorf("bob reads alice's box: %v", err)
	}
	if err := set(ag, "gangrun/policy/config"); !errors.Is(err, store.ErrPermissionDenied) {
		t.Errorf("the agent writes the policy: %v, want permission denied", err)
	}
	if err := set(op, "gangrun/policy/config"); err != nil {
		t.Errorf("the operator writes the policy: %v", err)
	}
	sid, err := ag.CreateSession(ctx, store.SessionOptions{Name: "t", TTL: 10 * time.Second, NodeHealth: true})
	if err != nil {
		t.Fatalf("the agent takes a session: %v", err)
	}
	if _, err := ag.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "gangrun/cluster/alive/n1", Session: sid}}); err != nil {
		t.Errorf("the agent locks a key: %v", err)
	}
	if _, err := bs.CreateSession(ctx, store.SessionOptions{Name: "t", TTL: 10 * time.Second}); !errors.Is(err, store.ErrPermissionDenied) {
		t.Errorf("bob takes a session: %v, want permission denied", err)
	}
	if _, err := acl.MintUser(ctx, op.Client(), "carol"); err == nil {
		t.Errorf("the operator's token minted a user token; only acl = write may")
	}
	if _, err := acl.MintUser(ctx, mgmt.Client(), "bad.name"); err == nil {
		t.Errorf("MintUser took a name Consul's policy names refuse")
	}
}
