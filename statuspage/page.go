package statuspage

// pageHTML is the page's template: inline CSS, no script, no external asset.
const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>gangrun cluster status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
.meta { color: #666; }
.nodes { display: flex; flex-wrap: wrap; gap: .8em; }
.node { border: 2px solid #8a8; border-radius: 6px; padding: .5em .7em; background: #fff; min-width: 14em; }
.node.drained { border-color: #d90; background: #fff8e6; } .node.down { border-color: #999; background: #eee; color: #777; }
.node h3 { margin: 0; font-size: 1em; } .node .state, .node .auth { font-size: .85em; color: #555; } .node .auth.insecure { color: #b00; font-weight: bold; }
.gpus { display: grid; grid-template-columns: repeat(4, 2.6em); gap: 4px; margin-top: .4em; }
.gpu { height: 2.2em; border-radius: 3px; font-size: .75em; text-align: center; line-height: 1.1em; padding-top: .2em; position: relative; overflow: hidden; }
.gpu.free { background: #d8efd8; } .gpu.off { background: #ddd; color: #777; } .gpu.held { background: #7aa7e0; color: #fff; }
.gpu.degraded { outline: 3px solid #f0a020; } .gpu.failed { background: #d9534f; color: #fff; }
.down .gpu { background: #ccc; color: #666; }
.gpu .bar { position: absolute; left: 0; bottom: 0; height: 4px; background: #123a7a; }
table { border-collapse: collapse; background: #fff; } th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; }
th { background: #eee; }
.line { position: relative; height: 1.6em; background: #eee; border-radius: 3px; margin: .2em 0 .6em; min-width: 30em; }
.att { position: absolute; top: 0; bottom: 0; border-radius: 3px; font-size: .75em; color: #fff; overflow: hidden; white-space: nowrap; padding-left: 3px; }
.att.ok { background: #4a9a4a; } .att.bad { background: #c9302c; } .att.running { background: #3a78c2; }
.legend span { display: inline-block; padding: 0 .5em; margin-right: .4em; border-radius: 3px; }
</style>
</head>
<body>
<h1>gangrun cluster</h1>
<div class="meta">at {{.Now}} · scheduler {{if .Leader}}{{.Leader}}{{else}}(none){{end}} · served by {{.Served}} · refreshes every {{.Refresh}} s</div>
<div class="meta legend">GPUs: <span class="gpu free">free</span><span class="gpu held">held</span><span class="gpu off">not grantable</span><span class="gpu failed">failed</span><span style="outline:3px solid #f0a020">degraded</span>{{if .UtilKnown}} · the dark bar is {{.Served}}'s utilisation{{end}}</div>

<h2>Nodes</h2>
<div class="nodes" id="nodes">
{{range .Nodes}}<div class="node {{.State}}" id="node-{{.Name}}">
<h3>{{.Name}}</h3>
<div class="state">{{.State}}{{if .Reason}}: {{.Reason}}{{end}} · {{.Free}}/{{.Total}} free{{if .Model}} · {{.Model}}{{end}}</div>
{{if .Auth}}<div class="auth{{if eq .Auth "none"}} insecure{{end}}">who submits: {{if eq .Auth "munge"}}MUNGE credentials{{else if eq .Auth "acl"}}Consul ACL tokens{{else if eq .Auth "none"}}not checked (--auth none): anyone may run jobs as anyone{{else}}{{.Auth}}{{end}}</div>{{end}}
<div class="gpus">{{range .GPUs}}<div class="gpu {{.Class}}" title="{{.Title}}">{{.Label}}{{if ge .Util 0.0}}<div class="bar" style="width: {{pct .Util}}"></div>{{end}}</div>{{end}}</div>
</div>
{{else}}<p>No node registered.</p>
{{end}}</div>

<h2>Queue</h2>
{{if .Queue}}<table id="queue">
<tr><th>job</th><th>name</th><th>user</th><th>partition</th><th>state</th><th>nodes</th><th>GPUs/node</th><th>restarts</th><th>idle GPUs</th><th>reason</th></tr>
{{range .Queue}}<tr id="job-{{.ID}}"><td>{{.ID}}</td><td>{{.Name}}</td><td>{{.User}}</td><td>{{.Partition}}</td><td>{{.State}}</td><td>{{range $i, $n := .Nodes}}{{if $i}},{{end}}{{$n}}{{end}}</td><td>{{.GPUsPerNode}}</td><td>{{.Restarts}}</td><td>{{if .IdleGPUs}}{{.IdleGPUs}} since {{.IdleSince}}{{end}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>
{{else}}<p>No job queued or running.</p>{{end}}

<h2>Attempts</h2>
{{range .Jobs}}<div class="job" id="attempts-{{.ID}}"><b>{{.ID}}</b> {{.Name}} ({{.User}}) {{.State}}
<div class="line">{{range .Attempts}}<div class="att {{.Class}}" style="left: {{pct .Left}}; width: {{pct .Width}}" title="attempt {{.Number}} on {{.Nodes}}: {{.Started}} to {{.Ended}}: {{.Cause}}{{if .ResumeFrom}}; resumed from {{.ResumeFrom}}{{end}}">#{{.Number}} {{.Cause}}</div>{{end}}</div>
<table><tr><th>attempt</th><th>nodes</th><th>started</th><th>ended</th><th>cause</th><th>resumed from</th></tr>
{{range .Attempts}}<tr><td>{{.Number}}</td><td>{{.Nodes}}</td><td>{{.Started}}</td><td>{{.Ended}}</td><td>{{.Cause}}</td><td>{{.ResumeFrom}}</td></tr>{{end}}
</table></div>
{{else}}<p>No job has run yet.</p>{{end}}
</body>
</html>
`
