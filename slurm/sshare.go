package slurm

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/policy"
)

// sshareFieldList is sshare 22.05's field table (src/sshare/process.c), in its order: a
// --format name picks the first field it is a prefix of, any case.
var sshareFieldList = []sacctField{
	{"Account", -20}, {"Cluster", 10}, {"EffectvUsage", 13}, {"FairShare", 10}, {"LevelFS", 10},
	{"ID", 6}, {"NormShares", 11}, {"NormUsage", 11}, {"Partition", 12}, {"RawShares", 10},
	{"RawUsage", 11}, {"User", 10}, {"GrpTRESMins", 30}, {"TRESRunMins", 30},
}

// sshare's default field lists (src/sshare/process.c, with Slurm 22.05's default
// PriorityFlags, Fair Tree): the default and -l's.
const (
	sshareDefault = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare"
	sshareLong    = "Account,User,RawShares,NormShares,RawUsage,NormUsage,EffectvUsage,FairShare,LevelFS,GrpTRESMins,TRESRunMins"
)

// sshareOptions are sshare 22.05's options, those gangrun builds and, refused, the
// rest.
var sshareOptions = []option{
	{long: "accounts", short: 'A', arg: reqArg},
	{long: "all", short: 'a', arg: noArg},
	{long: "format", short: 'o', arg: reqArg},
	{long: "help", short: 'h', arg: noArg},
	{long: "helpformat", short: 'e', arg: noArg},
	{long: "long", short: 'l', arg: noArg},
	{long: "noheader", short: 'n', arg: noArg},
	{long: "parsable", short: 'p', arg: noArg},
	{long: "parsable2", short: 'P', arg: noArg},
	{long: "usage", arg: noArg},
	{long: "users", short: 'u', arg: reqArg},
	{long: "Users", short: 'U', arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "json", arg: noArg, unsupported: notBuilt},
	{long: "partition", short: 'm', arg: noArg, unsupported: notBuilt},
	{long: "yaml", arg: noArg, unsupported: notBuilt},
}

// shareRow is one line of sshare: the root, an account, or a user in an account.
type shareRow struct {
	account, user string
	depth         int
	root          bool
	s             policy.Share
	cluster       string
	grpGPUHours   float64
}

// value is the text of sshare field key (lower case) for r.
func (r shareRow) value(key string) string {
	f6 := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	switch key {
	case "account":
		return strings.Repeat(" ", r.depth) + r.account
	case "user":
		return r.user
	case "cluster":
		return r.cluster
	case "rawshares":
		switch {
		case r.root:
			return ""
		case r.s.Parent:
			return "parent"
		}
		return strconv.Itoa(r.s.RawShares)
	case "normshares":
		return f6(r.s.NormShares)
	case "rawusage":
		return strconv.FormatInt(int64(math.Round(r.s.RawUsage)), 10)
	case "normusage":
		return f6(r.s.NormUsage)
	case "effectvusage":
		return f6(r.s.EffectvUsage)
	case "fairshare":
		if r.root {
			return ""
		}
		return f6(r.s.Factor)
	case "grptresmins":
		if r.grpGPUHours > 0 {
			return "gres/gpu=" + strconv.FormatInt(int64(r.grpGPUHours*60), 10)
		}
	}
	return ""
}

// Sshare is sshare: gangrun's fair-share tree (the policy's accounts and their users,
// and those the usage record charges) with the decayed usage the scheduler keeps, in
// GPU-seconds, and the classic fair-share factor its priority uses
// (policy.FairShare.Share): Slurm's fields and widths, -o, -l, -p/-P, -n, and the
// filters -a, -A, -u, -U.
func Sshare(ctx context.Context, e *Env, args []string) int {
	// Words that are no option are ignored, as sshare 22.05 ignores them.
	v, _, done, code := parseOpts(e, "sshare", sshareOptions, args, 1, "Usage: sshare [OPTIONS]\n")
	if done {
		return code
	}
	if v.has("helpformat") {
		var names []string
		for _, f := range sshareFieldList {
			names = append(names, f.name)
		}
		fmt.Fprintln(e.Stdout, strings.Join(names, " "))
		return 0
	}
	list := sshareDefault
	switch {
	case v.has("format"):
		list = v["format"]
	case v.has("long"):
		list = sshareLong
	}
	cols, err := sshareColumns(list)
	if err != nil {
		return usage(e, "sshare", err.(*UsageError))
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "sshare", 1, "%v", err)
	}
	defer s.Close()
	p, err := policy.Load(ctx, s)
	if err != nil {
		return errorf(e, "sshare", 1, "%v", err)
	}
	if p == nil {
		p = &policy.Policy{}
	}
	u, err := policy.LoadUsage(ctx, s)
	if err != nil {
		return errorf(e, "sshare", 1, "%v", err)
	}
	rows := shareRows(p, u, shareFilter{all: v.has("all"), accounts: splitList(v["accounts"]),
		users: splitList(v["users"]), usersOnly: v.has("Users"), me: currentUser()})
	cluster := ClusterName(ctx, s)
	t := newAcctTable(cols, v)
	if !v.has("noheader") {
		writeAcctHeader(e, t)
	}
	for _, r := range rows {
		r.cluster = cluster
		fmt.Fprintln(e.Stdout, t.line(func(c sacctCol) string { return r.value(c.key) }))
	}
	return 0
}

// sshareColumns are the columns of a --format list (NAME[%WIDTH],...), each name the
// prefix of a field's. Errors are *UsageError: sshare's "Invalid field requested".
func sshareColumns(list string) ([]sacctCol, error) {
	var cols []sacctCol
	for _, item := range splitList(list) {
		name, w, hasW := strings.Cut(item, "%")
		i := slices.IndexFunc(sshareFieldList, func(f sacctField) bool {
			return name != "" && strings.HasPrefix(strings.ToLower(f.name), strings.ToLower(name))
		})
		if i < 0 {
			return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid field requested: \"%s\"", strings.ToLower(name)), Code: 1}
		}
		f := sshareFieldList[i]
		c := sacctCol{key: strings.ToLower(f.name), f: f, width: f.width}
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil || n > maxFieldWidth || n < -maxFieldWidth {
				return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid field requested: \"%s\"", item), Code: 1}
			}
			if n != 0 {
				c.width = n
			}
		}
		cols = append(cols, c)
	}
	return cols, nil
}

// shareFilter is which lines sshare shows: every user's (all) or those of users (by
// default the caller, me), of the accounts given (all when none), and no account
// lines with usersOnly (-U).
type shareFilter struct {
	all, usersOnly  bool
	accounts, users []string
	me              string
}

// shareRows are sshare's lines: the root, then each account (name order) followed by
// its users' lines: the users the policy lists for it and those the usage record
// charges to it.
func shareRows(p *policy.Policy, u *policy.Usage, f shareFilter) []shareRow {
	fs := policy.NewFairShare(p, u, nil)
	users := f.users
	if len(users) == 0 && !f.all {
		users = []string{f.me}
	}
	var rows []shareRow
	if len(fs.Accounts()) == 0 {
		return nil // no association at all: sshare prints its header alone
	}
	if !f.usersOnly && len(f.accounts) == 0 {
		total := 0.0
		for _, v := range u.Accounts {
			total += v
		}
		eff := 0.0
		if total > 0 {
			eff = 1
		}
		rows = append(rows, shareRow{account: "root", root: true,
			s: policy.Share{NormShares: 1, RawUsage: total, NormUsage: eff, EffectvUsage: eff}})
	}
	for _, a := range fs.Accounts() {
		if len(f.accounts) > 0 && !slices.Contains(f.accounts, a) {
			continue
		}
		if !f.usersOnly {
			rows = append(rows, shareRow{account: a, depth: 1, s: fs.Share(a, ""), grpGPUHours: p.Accounts[a].GrpGPUHours})
		}
		for _, name := range accountUsers(p, u, a) {
			if len(users) > 0 && !slices.Contains(users, name) {
				continue
			}
			rows = append(rows, shareRow{account: a, user: name, depth: 2, s: fs.Share(a, name)})
		}
	}
	return rows
}

// accountUsers are the users of account a, in name order: those the policy lists and
// those the usage record charges to it.
func accountUsers(p *policy.Policy, u *policy.Usage, a string) []string {
	set := map[string]bool{}
	for name := range p.Accounts[a].Users {
		set[name] = true
	}
	for key := range u.Users {
		if acct, name, ok := strings.Cut(key, "/"); ok && acct == a {
			set[name] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}
