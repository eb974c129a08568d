package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
)

// runACL is `gangrun acl bootstrap [--out DIR]`, `gangrun acl user NAME [--out FILE]`
// and `gangrun acl whoami` (docs/acl.md).
func runACL(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "acl", "bootstrap [--out DIR] | user NAME [--out FILE] | whoami")
	consul := consulFlag(fs)
	out := fs.String("out", "", "bootstrap: write agent.token and operator.token into DIR; user: write the token into FILE (mode 0600, never over an existing file); default: print to stdout")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	verb := fs.Arg(0)
	switch {
	case verb == "bootstrap" && fs.NArg() == 1:
	case verb == "user" && fs.NArg() == 2:
		if err := acl.CheckUser(fs.Arg(1)); err != nil {
			return usageErr(e, "acl", "%v", err)
		}
	case verb == "whoami" && fs.NArg() == 1:
		if *out != "" {
			return usageErr(e, "acl", "--out: whoami writes nothing")
		}
	default:
		return usageErr(e, "acl", "want bootstrap, user NAME or whoami (got %q)", fs.Args())
	}
	files, code := aclOutFiles(e, verb, *out)
	if code != exitOK {
		return code
	}
	s, code := openStore(e, "acl", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	id, code := identify(ctx, e, "acl", s)
	if code != exitOK {
		return code
	}
	if verb == "whoami" {
		return aclWhoami(ctx, e, s, id)
	}
	switch id.Role {
	case acl.RoleOpen:
		return usageErr(e, "acl", "Consul's ACLs are off: turn them on (acl { enabled = true default_policy = \"deny\" } in its configuration) and run `consul acl bootstrap` first (docs/acl.md)")
	case acl.RoleManagement:
	default:
		return usageErr(e, "acl", "%s: permission denied: minting tokens takes Consul's management token (your token is %s)", verb, id.Name())
	}
	names, secrets, code := mintTokens(ctx, e, s, verb, fs.Arg(1))
	if code != exitOK {
		return code
	}
	return writeTokens(e, verb, *out, files, names, secrets)
}

// aclOutFiles returns the files `gangrun acl` writes the tokens of verb into (none
// when out is "": they are printed). It refuses, before any token is minted that would
// be lost, a file that is there already or whose directory is not (bootstrap makes its
// directory out now); the exit code is exitOK, or 2 after printing why.
func aclOutFiles(e *env, verb, out string) ([]string, int) {
	// Refuse a file that is there before minting a token that would be lost.
	var files []string
	switch {
	case out != "" && verb == "bootstrap":
		files = []string{filepath.Join(out, "agent.token"), filepath.Join(out, "operator.token")}
	case out != "":
		files = []string{out}
	}
	for _, f := range files {
		if _, err := os.Lstat(f); err == nil {
			return nil, usageErr(e, "acl", "--out: %s exists: a token is never written over another (remove it first)", f)
		}
	}
	// ... and a place it cannot be written to: the directory must be there (bootstrap
	// makes its own, now), so that no token is minted only to be lost.
	if verb == "bootstrap" && out != "" {
		if err := os.MkdirAll(out, 0o700); err != nil {
			return nil, usageErr(e, "acl", "--out: %v", err)
		}
	}
	for _, f := range files {
		if st, err := os.Stat(filepath.Dir(f)); err != nil || !st.IsDir() {
			return nil, usageErr(e, "acl", "--out %s: its directory %s does not exist (nothing was minted)", f, filepath.Dir(f))
		}
	}
	return files, exitOK
}

// aclWhoami is `gangrun acl whoami`: it prints who id's token is, or with Consul's
// ACLs off whether the agents check MUNGE credentials and, when they do, whose this
// user's are. It returns the exit code.
func aclWhoami(ctx context.Context, e *env, s store.Store, id acl.Identity) int {
	switch id.Role {
	case acl.RoleOpen:
		munge, err := clusterSealer(ctx, e, s)
		switch {
		case err != nil:
			return sealerErr(e, "acl", err)
		case munge != nil:
			who, err := munge.Probe(ctx)
			if err != nil {
				return sealerErr(e, "acl", err)
			}
			fmt.Fprintf(e.stdout, "Consul's ACLs are off; the agents check MUNGE credentials: you are %s (uid %d)\n", userOf(who.UID), who.UID)
		default:
			fmt.Fprintln(e.stdout, "Consul's ACLs are off and no agent checks MUNGE credentials: every command may do everything")
		}
	case acl.RoleUser:
		fmt.Fprintf(e.stdout, "user %s (token %s)\n", id.User, id.Accessor)
	default:
		fmt.Fprintf(e.stdout, "%s (token %s)\n", id.Role, id.Accessor)
	}
	return exitOK
}

// mintTokens mints verb's tokens: bootstrap's agent and operator tokens, or user's
// token. It returns each token's name and secret, in the same order, and exitOK, or
// the exit code after printing why not.
func mintTokens(ctx context.Context, e *env, s store.ConsulClient, verb, user string) (names, secrets []string, code int) {
	if verb == "bootstrap" {
		t, err := acl.Bootstrap(ctx, s.Client())
		if err != nil {
			return nil, nil, failErr(e, "acl", err)
		}
		return []string{"agent", "operator"}, []string{t.Agent, t.Operator}, exitOK
	}
	t, err := acl.MintUser(ctx, s.Client(), user)
	if errors.Is(err, acl.ErrNameTaken) {
		return nil, nil, usageErr(e, "acl", "user %q: %v: nothing was minted", user, err)
	}
	if err != nil {
		return nil, nil, failErr(e, "acl", err)
	}
	return []string{"user " + user}, []string{t}, exitOK
}

// writeTokens prints the minted tokens (names[i]'s secret is secrets[i]) when files is
// empty, else writes each into its file (files[i], mode 0600, in out for bootstrap).
// It returns the exit code.
func writeTokens(e *env, verb, out string, files, names, secrets []string) int {
	if len(files) == 0 {
		for i, n := range names {
			fmt.Fprintf(e.stdout, "%s token: %s\n", n, secrets[i])
		}
		fmt.Fprintln(e.stderr, "gangrun acl: each token is shown this once: keep it in a file of mode 0600 and point CONSUL_HTTP_TOKEN_FILE at it")
		return exitOK
	}
	if verb == "bootstrap" {
		if err := os.MkdirAll(out, 0o700); err != nil {
			return failErr(e, "acl", fmt.Errorf("--out: %w", err))
		}
	}
	for i, f := range files {
		if err := writeSecret(f, secrets[i]); err != nil {
			return failErr(e, "acl", fmt.Errorf("--out: %w (the %s token was minted; delete it with consul acl token delete)", err, names[i]))
		}
		fmt.Fprintf(e.stdout, "%s token written to %s\n", names[i], f)
	}
	return exitOK
}

// writeSecret writes secret into a new file of mode 0600, never over an existing one.
func writeSecret(path, secret string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, secret); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// identify asks Consul who the command's token is; on failure it prints one line and
// returns the exit code (2 with no valid token or a foreign one, 1 when Consul cannot
// be asked).
func identify(ctx context.Context, e *env, cmd string, s store.Store) (acl.Identity, int) {
	id, err := acl.Whoami(ctx, s)
	switch {
	case errors.Is(err, acl.ErrNoToken), errors.Is(err, acl.ErrForeignToken):
		return id, usageErr(e, cmd, "%v", err)
	case err != nil:
		return id, failErr(e, cmd, err)
	}
	return id, exitOK
}

// openReader is openStore for a command that only reads: it first asks Consul whose
// the token is, so that with ACLs on and no valid token the command says so (one line,
// exit 2) instead of showing the empty lists Consul's ACLs leave it. A token that is
// none of gangrun's may read what its policies allow.
func openReader(ctx context.Context, e *env, cmd, addr string) (store.ConsulClient, int) {
	s, code := openStore(e, cmd, addr)
	if code != exitOK {
		return nil, code
	}
	_, err := acl.Whoami(ctx, s)
	switch {
	case err == nil, errors.Is(err, acl.ErrForeignToken):
		return s, exitOK
	case errors.Is(err, acl.ErrNoToken):
		s.Close()
		return nil, usageErr(e, cmd, "%v", err)
	}
	s.Close()
	return nil, failErr(e, cmd, err)
}

// needAdmin refuses an administrative command (what, as "draining a node") to a token
// that is not the operator's: one line, exit 2.
func needAdmin(e *env, cmd, what string, id acl.Identity) int {
	if id.Admin() {
		return exitOK
	}
	return usageErr(e, cmd, "permission denied: %s takes the operator's token (your token is %s)", what, id.Name())
}

// auditOp is the operation that records an administrative action by id's holder.
func auditOp(id acl.Identity, action, target, owner, detail string) store.Op {
	return audit.Op(auditEntry(id, action, target, owner, detail))
}

// auditEntry is the audit entry of an administrative action by id's holder.
func auditEntry(id acl.Identity, action, target, owner, detail string) audit.Entry {
	tok := string(id.Role)
	switch id.Role {
	case acl.RoleOpen:
		tok = "none"
	case acl.RoleUser:
		tok = "user:" + id.User
	}
	return audit.Entry{User: currentUser(), Token: tok, Accessor: id.Accessor, Action: action, Target: target, Owner: owner, Detail: detail}
}

// runAudit is `gangrun audit [--since] [--user] [--json]`.
func runAudit(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "audit", "[--since DATE|DURATION] [--user U] [--json]")
	consul := consulFlag(fs)
	sinceFlag := fs.String("since", "", "actions from: YYYY-MM-DD[THH:MM[:SS]] (UTC) or a time ago (90m, 36h, 7d); default: the last 7 days")
	user := fs.String("user", "", "only the actions of this user (the Unix user, or the token's user)")
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "audit", "unexpected argument %q: audit takes flags only", fs.Arg(0))
	}
	if *user != "" {
		if err := store.CheckSegment("--user", *user); err != nil {
			return usageErr(e, "audit", "%v", err)
		}
	}
	now := time.Now().UTC()
	since := now.Add(-7 * 24 * time.Hour)
	if *sinceFlag != "" {
		var err error
		if since, err = parseWhen(*sinceFlag, now); err != nil {
			return usageErr(e, "audit", "--since %q: %v", *sinceFlag, err)
		}
	}
	s, code := openReader(ctx, e, "audit", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	entries, newer, err := audit.ListAll(ctx, s, since, *user)
	if err != nil {
		return failErr(e, "audit", err)
	}
	if len(newer) > 0 {
		// Not misread, not hidden: who wrote them this gangrun cannot tell.
		fmt.Fprintf(e.stderr, "gangrun audit: %d entries left out: %v\n", len(newer), newer[0])
	}
	// Where the agents check MUNGE credentials they seal the entries they write: root
	// can check each seal (the seals are root's alone to decode), and sees an entry
	// anyone wrote into Consul for what it is.
	munge, err := clusterSealer(ctx, e, s)
	if err != nil {
		return sealerErr(e, "audit", err)
	}
	checks := make([]string, len(entries))
	for i, a := range entries {
		checks[i] = checkEntry(ctx, munge, a)
	}
	if *asJSON {
		type checked struct {
			audit.Entry
			// Check is sealed, unsealed, forged (with why), or "" when not checked
			// (no MUNGE, or not root).
			Check string `json:"check,omitempty"`
		}
		out := make([]checked, len(entries))
		for i, a := range entries {
			a.Seal = ""
			out[i] = checked{a, checks[i]}
		}
		return printJSON(e, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	head := "TIME\tUSER\tTOKEN\tHOST\tACTION\tTARGET\tOWNER\tDETAIL"
	if munge != nil {
		head += "\tCHECK"
	}
	fmt.Fprintln(tw, head)
	for i, a := range entries {
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", a.At.Format("2006-01-02T15:04:05Z"), a.User, a.Token, a.Host, a.Action, a.Target,
			orDash(a.Owner), orDash(oneLine(a.Detail)))
		if munge != nil {
			line += "\t" + orDash(checks[i])
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	return exitOK
}

// checkEntry says whether audit entry a is sealed by root or the agents, unsealed, or
// forged (audit.Check), with m (nil: not checked, ""); "" too where this user cannot
// decode the seals (they are root's).
func checkEntry(ctx context.Context, m *identity.Munge, a audit.Entry) string {
	if m == nil {
		return ""
	}
	verify := func(ctx context.Context, cred string, content []byte) (uint32, error) {
		c, err := m.Verify(ctx, cred, content, identity.Kept)
		if errors.Is(err, identity.ErrUnauthorized) || errors.Is(err, identity.ErrNoDaemon) || errors.Is(err, identity.ErrNoMunge) {
			return 0, fmt.Errorf("%w: %v", audit.ErrUncheckable, err)
		}
		return c.UID, err
	}
	got, why, err := audit.Check(ctx, a, verify, func(uid uint32) bool { return uid == 0 })
	switch {
	case err != nil:
		return ""
	case got == audit.Forged:
		return "FORGED: " + why
	}
	return got
}
