# ruff: noqa: E501  (HTML, CSS and JavaScript, kept one element a line)
"""The dashboard's pages (Jinja2, autoescaped), its stylesheet and its
script. Inline in Python so the package needs no data files; served from
the app's own routes, so the Content-Security-Policy allows no inline
script or style at all."""

from __future__ import annotations

TEMPLATES = {
    "base.html": """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}sqla-queue{% endblock %} · {{ queue }}</title>
<link rel="stylesheet" href="{{ root }}/static/app.css">
</head>
<body>
<header>
  <a class="brand" href="{{ root }}/">sqla-queue</a>
  <span class="queue">{{ queue }}</span>
  <nav>
    <a href="{{ root }}/">Overview</a>
    <a href="{{ root }}/tasks">Tasks</a>
    <a href="{{ root }}/processes" id="nav-processes">Processes</a>
    <a href="{{ root }}/workers" id="nav-workers">Workers</a>
    <a href="{{ root }}/dead">Dead letter</a>
    <a href="{{ root }}/subscriptions">Subscriptions</a>
  </nav>
  <span class="who">
  {% if read_only %}
    <span class="ro" id="read-only">read-only: requeue, cancel, retry and pause are off</span>
  {% elif user %}
    {{ user }} <form method="post" action="{{ root }}/logout" class="inline">
      <input type="hidden" name="csrf" value="{{ csrf }}"><button id="logout">Log out</button></form>
  {% else %}
    <a href="{{ root }}/login" id="login-link">Log in</a>
  {% endif %}
  </span>
</header>
{% if notice %}<p class="notice" id="notice">{{ notice }}</p>{% endif %}
<main>{% block main %}{% endblock %}</main>
<script src="{{ root }}/static/app.js"></script>
</body>
</html>
""",
    "overview.html": """{% extends "base.html" %}
{% block main %}
<section>
<h2>Tasks by process</h2>
<table id="counts">
<thead><tr><th>process</th>{% for s in states %}<th>{{ s }}</th>{% endfor %}</tr></thead>
<tbody>
{% for name, counts in status.processes.items() %}
<tr><td>{{ name or "(none)" }}{% if name in status.paused %} <span class="paused">paused</span>{% endif %}</td>{% for s in states %}<td class="n">{{ counts[s] }}</td>{% endfor %}</tr>
{% endfor %}
<tr class="total"><td>total</td>{% for s in states %}<td class="n">{{ status.totals[s] }}</td>{% endfor %}</tr>
</tbody>
</table>
<div class="actions" id="pausing">
{% for name in status.processes.keys() %}{% if name %}
<form method="post" action="{{ root }}/api/processes/{{ 'resume' if name in status.paused else 'pause' }}" class="inline">
<input type="hidden" name="csrf" value="{{ csrf }}"><input type="hidden" name="process" value="{{ name }}">
<button class="{{ 'resume' if name in status.paused else 'pause' }}" data-process="{{ name }}" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>{{ 'Resume' if name in status.paused else 'Pause' }} {{ name }}</button>
</form>
{% endif %}{% endfor %}
</div>
<p id="summary">oldest ready task: {{ oldest }} · last {{ window }}:
{{ status.throughput.finished }} attempts finished, {{ status.throughput.failed }} failed</p>
</section>
<section id="history">
<h2>Finished attempts</h2>
<p class="windows">{% for name in windows %}<a href="{{ root }}/?window={{ name }}" id="window-{{ name }}" {% if name == history.window %}class="current"{% endif %}>last {{ name }}</a> {% endfor %}(UTC, every 15 s)</p>
{% include "chart.svg" %}
</section>
<section>
<h2>Running</h2>
{% if status.running %}
<table id="running">
<thead><tr><th>task</th><th>process</th><th>attempt</th><th>worker</th><th>running for</th><th>lease until</th></tr></thead>
<tbody>
{% for t in status.running %}
<tr><td><a href="{{ root }}/tasks/{{ t.id }}">{{ t.id }}</a></td><td>{{ t.process }}</td><td>{{ t.attempt }}</td>
<td>{{ t.worker_id or "-" }}</td><td>{{ age(t.running_seconds) }}</td><td>{{ when(t.lease_expires_at) }}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p>Nothing is running.</p>{% endif %}
</section>
<section>
<h2>Newest failures</h2>
{% if status.failures %}
<table id="failures">
<thead><tr><th>task</th><th>chain</th><th>process</th><th>attempt</th><th>finished</th><th>message</th></tr></thead>
<tbody>
{% for f in status.failures %}
<tr><td><a href="{{ root }}/tasks/{{ f.id }}">{{ f.id }}</a></td><td>{{ f.chain_id }}</td><td>{{ f.process }}</td>
<td>{{ f.attempt }}</td><td>{{ when(f.finished_at) }}</td><td class="msg">{{ f.message or "" }}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p>No failure among the newest attempts.</p>{% endif %}
</section>
{% if status.health %}
<section id="health">
<h2>Table</h2>
<p>{{ mb(status.health.table.table_bytes) }} + indexes {{ mb(status.health.table.index_bytes) }},
{{ status.health.table.dead_tuples }} dead row versions, {{ status.health.table.live_tuples }} live</p>
{% if status.health.warning %}<p class="warn">{{ status.health.warning }}</p>{% endif %}
</section>
{% endif %}
{% endblock %}
""",
    "chart.svg": """<svg xmlns="http://www.w3.org/2000/svg" id="chart" data-window="{{ history.window }}" width="{{ chart.width }}" height="{{ chart.height }}" viewBox="0 0 {{ chart.width }} {{ chart.height }}" role="img" aria-labelledby="chart-title">
<title id="chart-title">attempts finished per {{ chart.per }}, last {{ history.window }}, UTC</title>
{% for value, y in chart.y_ticks %}<line class="grid" x1="{{ chart.left }}" y1="{{ y }}" x2="{{ chart.right }}" y2="{{ y }}"/><text class="tick y" x="{{ chart.left - 6 }}" y="{{ y + 4 }}" text-anchor="end">{{ value }}</text>
{% endfor %}<line class="axis" x1="{{ chart.left }}" y1="{{ chart.bottom }}" x2="{{ chart.right }}" y2="{{ chart.bottom }}"/>
<line class="axis" x1="{{ chart.left }}" y1="{{ chart.top }}" x2="{{ chart.left }}" y2="{{ chart.bottom }}"/>
{% for label, x in chart.x_ticks %}<line class="axis" x1="{{ x }}" y1="{{ chart.bottom }}" x2="{{ x }}" y2="{{ chart.bottom + 4 }}"/><text class="tick x" x="{{ x }}" y="{{ chart.bottom + 16 }}" text-anchor="middle">{{ label }}</text>
{% endfor %}{% for name, css, points in chart.series %}<polyline class="{{ css }}" data-series="{{ name }}" points="{{ points }}"/>
{% endfor %}{% for name, css, total, x in chart.legend %}<rect class="{{ css }} key" x="{{ x }}" y="{{ chart.height - 16 }}" width="10" height="10"/><text class="legend-text" id="legend-{{ name }}" x="{{ x + 14 }}" y="{{ chart.height - 7 }}">{{ name }} ({{ total }})</text>
{% endfor %}</svg>
""",
    "task.html": """{% extends "base.html" %}
{% block title %}task {{ timeline.task_id }}{% endblock %}
{% block main %}
<h2>Task {{ timeline.task_id }}: chain {{ timeline.chain_id }} ({{ timeline.process }}), <span id="state">{{ timeline.state }}</span></h2>
{% if workflow_id %}<p id="workflow">A step of <a href="{{ root }}/workflows/{{ workflow_id }}">workflow {{ workflow_id }}</a>.</p>{% endif %}
<div class="actions">
{% for action, label in actions %}
<form method="post" action="{{ root }}/api/tasks/{{ timeline.task_id }}/{{ action }}" class="inline">
<input type="hidden" name="csrf" value="{{ csrf }}">
<button id="{{ action }}" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>{{ label }}</button>
</form>
{% endfor %}
</div>
<table id="timeline">
<thead><tr><th>kind</th><th>id</th><th>attempt</th><th>state</th><th>run at</th><th>started</th><th>finished</th><th>worker</th><th>message</th></tr></thead>
<tbody>
{% for r in timeline.rows %}
<tr class="{{ r.kind }}"><td>{{ r.kind }}{% if r.subscriber_id %} ({{ r.subscriber_id }}){% endif %}</td>
<td><a href="{{ root }}/tasks/{{ r.id }}">{{ r.id }}</a></td><td>{{ r.attempt }}</td><td title="stored: {{ r.status }}">{{ r.label }}</td>
<td>{{ when(r.run_at) }}</td><td>{{ when(r.started_at) }}</td><td>{{ when(r.finished_at) }}</td>
<td>{{ r.worker_id or "-" }}</td><td class="msg">{{ r.message or "" }}{% set g = gloss(r.message) %}{% if g %} <span class="gloss">[{{ g }}]</span>{% endif %}{% if r.traceback %}
<details class="traceback"><summary>traceback</summary><pre>{{ r.traceback }}</pre></details>{% endif %}</td></tr>
{% endfor %}
</tbody>
</table>
<h3>Payload</h3>
<pre id="payload">{{ payload }}</pre>
{% endblock %}
""",
    "dead.html": """{% extends "base.html" %}
{% block title %}dead letter{% endblock %}
{% block main %}
<h2>Dead letter</h2>
{% if dead %}
<table id="dead">
<thead><tr><th>task</th><th>dead-letter run</th><th>process</th><th>went dead</th><th>status</th><th>message</th><th></th></tr></thead>
<tbody>
{% for d in dead %}
<tr><td><a href="{{ root }}/tasks/{{ d.task_id }}">{{ d.task_id }}</a></td><td>{{ d.dead_id }}</td><td>{{ d.process }}</td>
<td>{{ when(d.went_dead_at) }}</td><td>{{ d.status }}</td><td class="msg">{{ d.message or "" }}</td>
<td>{% if d.requeued_as %}requeued as <a href="{{ root }}/tasks/{{ d.requeued_as }}">{{ d.requeued_as }}</a>
{% else %}<form method="post" action="{{ root }}/api/tasks/{{ d.dead_id }}/requeue" class="inline">
<input type="hidden" name="csrf" value="{{ csrf }}">
<button class="requeue" data-task="{{ d.task_id }}" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>Requeue</button></form>{% endif %}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p>The dead letter is empty.</p>{% endif %}
{% endblock %}
""",
    "subscriptions.html": """{% extends "base.html" %}
{% block title %}subscriptions{% endblock %}
{% block main %}
<h2>Subscriptions</h2>
{% if subscriptions is none %}<p>This worker has no subscriber table.</p>
{% elif subscriptions %}
<table id="subscriptions">
<thead><tr><th>id</th><th>process</th><th>active</th><th>webhook</th></tr></thead>
<tbody>
{% for s in subscriptions %}
<tr><td>{{ s.id }}</td><td>{{ s.process }}</td><td>{{ s.active }}</td><td>{{ s.url or "-" }}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p>No subscription.</p>{% endif %}
<h2>Last deliveries</h2>
{% if copies %}
<table id="deliveries">
<thead><tr><th>copy</th><th>subscription</th><th>publication</th><th>attempt</th><th>status</th><th>finished</th><th>message</th></tr></thead>
<tbody>
{% for c in copies %}
<tr><td><a href="{{ root }}/tasks/{{ c.id }}">{{ c.id }}</a></td><td>{{ c.subscriber_id }}</td><td>{{ c.chain_id }}</td>
<td>{{ c.attempt }}</td><td>{{ c.status }}</td><td>{{ when(c.finished_at) }}</td><td class="msg">{{ c.message or "" }}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p>No copy among the newest attempts.</p>{% endif %}
{% endblock %}
""",
    "login.html": """{% extends "base.html" %}
{% block title %}log in{% endblock %}
{% block main %}
<h2>Log in</h2>
{% if error %}<p class="warn" id="login-error">{{ error }}</p>{% endif %}
<form method="post" action="{{ root }}/login" id="login-form">
<input type="hidden" name="csrf" value="{{ csrf }}">
<label>User <input name="username" id="username" autocomplete="username"></label>
<label>Password <input name="password" id="password" type="password" autocomplete="current-password"></label>
<button id="submit">Log in</button>
</form>
{% endblock %}
""",
    "tasks.html": """{% extends "base.html" %}
{% block title %}tasks{% endblock %}
{% block main %}
<h2>Tasks</h2>
<form method="get" action="{{ root }}/tasks" id="filters" class="filters">
<label>state <select name="state" id="state-filter"><option value="">any</option>
{% for s in task_states %}<option value="{{ s }}" {% if s == filters.state %}selected{% endif %}>{{ s }}</option>{% endfor %}
</select></label>
<label>process <input name="process" id="process-filter" value="{{ filters.process or '' }}"></label>
<label>external key <input name="external_key" id="key-filter" value="{{ filters.external_key or '' }}"></label>
<label>per page <input name="limit" id="limit-filter" size="4" value="{{ filters.limit }}"></label>
<button id="filter">Show</button>
</form>
{% if tasks %}
<form method="post" action="{{ root }}/api/tasks/bulk/requeue" id="bulk">
<input type="hidden" name="csrf" value="{{ csrf }}">
{% for name in ("state", "process", "external_key", "min_id", "max_id") %}{% if filters[name] is not none %}<input type="hidden" name="{{ name }}" value="{{ filters[name] }}">{% endif %}{% endfor %}
<div class="actions">
<button id="bulk-requeue" formaction="{{ root }}/api/tasks/bulk/requeue" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>Requeue</button>
<button id="bulk-cancel" formaction="{{ root }}/api/tasks/bulk/cancel" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>Cancel</button>
<button id="bulk-retry-now" formaction="{{ root }}/api/tasks/bulk/retry-now" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>Retry now</button>
the selected tasks, or <label class="inline"><input type="checkbox" name="everything" value="1" id="everything"> every task this filter matches (the newest {{ bulk_max }})</label>
</div>
<table id="tasks">
<thead><tr><th></th><th>task</th><th>chain</th><th>process</th><th>state</th><th>attempt</th><th>external key</th><th>run at</th><th>started</th><th>finished</th><th>payload</th></tr></thead>
<tbody>
{% for t in tasks %}
<tr class="{{ t.state }}"><td><input type="checkbox" name="ids" value="{{ t.id }}" class="pick" aria-label="select task {{ t.id }}"></td><td><a href="{{ root }}/tasks/{{ t.id }}">{{ t.id }}</a></td><td>{{ t.chain }}</td><td>{{ t.process }}</td>
<td>{{ t.state }}</td><td>{{ t.attempt }}</td><td>{{ t.external_key or "" }}</td><td>{{ when(t.run_at) }}</td>
<td>{{ when(t.started_at) }}</td><td>{{ when(t.finished_at) }}</td><td class="msg">{{ t.payload }}</td></tr>
{% endfor %}
</tbody>
</table>
</form>
{% else %}<p id="none">No task on this page.</p>{% endif %}
{% if next_url %}<p><a id="next" href="{{ next_url }}">Next page</a></p>{% else %}<p id="last">No more tasks.</p>{% endif %}
{% endblock %}
""",
    "workers.html": """{% extends "base.html" %}
{% block title %}workers{% endblock %}
{% block main %}
<h2>Workers</h2>
<p>The workers holding tasks now, from their leases (a worker holding none is not shown).</p>
{% if workers %}
<table id="workers">
<thead><tr><th>worker</th><th>tasks held</th><th>last heartbeat</th><th></th></tr></thead>
<tbody>
{% for w in workers %}
<tr><td>{{ w.worker_id }}</td><td class="n">{{ w.tasks }}</td><td>{{ when(w.last_heartbeat) }}</td><td>{% if w.ago %}{{ w.ago }} ago{% endif %}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p id="none">No worker holds a task.</p>{% endif %}
<p><a href="{{ root }}/tasks?state=running" id="running-tasks">The running tasks</a></p>
{% endblock %}
""",
    "processes.html": """{% extends "base.html" %}
{% block title %}processes{% endblock %}
{% block main %}
<h2>Processes</h2>
{% if fairness %}<p id="fairness">Claims take turns by {{ fairness.by }}{% if fairness.key_concurrency %}, at most {{ fairness.key_concurrency }} running per key{% endif %}{% if fairness.key_rate %}, at most {{ fairness.key_rate }} claimed per second per key{% endif %}.</p>{% endif %}
{% if processes %}
<table id="processes">
<thead><tr><th>process</th><th>paused</th>{% for s in states %}<th>{{ s }}</th>{% endfor %}<th>finished, last {{ window }}</th><th>failure rate</th><th>concurrency limit</th><th>rate limit</th><th></th></tr></thead>
<tbody>
{% for p in processes %}
<tr data-process="{{ p.name }}"><td><a href="{{ root }}/tasks?process={{ p.name or '' }}">{{ p.name or "(none)" }}</a></td>
<td>{% if p.paused %}<span class="paused">paused</span>{% else %}no{% endif %}</td>
{% for s in states %}<td class="n">{{ p.counts[s] }}</td>{% endfor %}
<td class="n">{{ p.throughput.finished if p.throughput else 0 }}</td>
<td class="n">{% if p.throughput and p.throughput.failure_rate is not none %}{{ "%.1f%%" % (100 * p.throughput.failure_rate) }}{% else %}-{% endif %}</td>
<td class="n">{{ p.limits.concurrency if p.limits.concurrency is defined else "-" }}</td>
<td class="n">{% if p.limits.rate is defined %}{{ p.limits.rate }}/s{% else %}-{% endif %}</td>
<td>{% if p.name %}<form method="post" action="{{ root }}/api/processes/{{ 'resume' if p.paused else 'pause' }}" class="inline">
<input type="hidden" name="csrf" value="{{ csrf }}"><input type="hidden" name="process" value="{{ p.name }}"><input type="hidden" name="back" value="processes">
<button class="{{ 'resume' if p.paused else 'pause' }}" data-process="{{ p.name }}" {% if not can_write %}disabled title="log in to act on tasks"{% endif %}>{{ 'Resume' if p.paused else 'Pause' }}</button>
</form>{% endif %}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}<p id="none">No task yet.</p>{% endif %}
{% endblock %}
""",
    "bulk.html": """{% extends "base.html" %}
{% block title %}bulk {{ bulk.action }}{% endblock %}
{% block main %}
<h2>{{ bulk.action }}: <span id="bulk-done">{{ bulk.done }}</span> done, <span id="bulk-refused">{{ bulk.refused }}</span> refused</h2>
{% if bulk.more %}<p class="warn" id="bulk-more">More tasks matched: only the newest {{ bound }} were acted on.</p>{% endif %}
<table id="bulk-results">
<thead><tr><th>task</th><th>outcome</th><th></th></tr></thead>
<tbody>
{% for r in bulk.results %}
<tr class="{{ r.outcome }}"><td><a href="{{ root }}/tasks/{{ r.id }}">{{ r.id }}</a></td><td>{{ r.outcome }}</td>
<td class="msg">{% if r.error %}{{ r.error }}{% elif r.task != r.id %}new chain <a href="{{ root }}/tasks/{{ r.task }}">{{ r.task }}</a>{% endif %}</td></tr>
{% endfor %}
</tbody>
</table>
<p><a href="{{ root }}/tasks" id="back-to-tasks">Back to the tasks</a></p>
{% endblock %}
""",
    "error.html": """{% extends "base.html" %}
{% block main %}<p class="warn" id="error">{{ error }}</p>{% endblock %}
""",
}

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f7f8fa; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1.2em; background: #1d2330; color: #fff; }
header a { color: #cfe0ff; text-decoration: none; }
header .brand { font-weight: 700; color: #fff; }
header nav { display: flex; gap: 1em; }
header .who { margin-left: auto; }
.ro { color: #ffd27a; }
main { padding: 1em 1.2em; }
section { margin-bottom: 1.5em; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #dde1e8; padding: .25em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 700; }
td.msg { max-width: 48em; white-space: pre-wrap; word-break: break-word; }
.warn { color: #a4161a; font-weight: 600; }
.paused { color: #975a16; font-weight: 600; }
.notice { background: #e3f6e8; padding: .5em 1.2em; margin: 0; }
form.inline { display: inline; }
form.filters { display: flex; gap: 1em; align-items: center; margin: .5em 0 1em; }
.actions { margin: .5em 0 1em; }
#chart { background: #fff; border: 1px solid #dde1e8; }
#chart polyline { fill: none; stroke-width: 2; }
#chart .ok { stroke: #2b6cb0; } #chart .bad { stroke: #c53030; } #chart .cancel { stroke: #975a16; }
#chart rect.ok { fill: #2b6cb0; } #chart rect.bad { fill: #c53030; } #chart rect.cancel { fill: #975a16; }
#chart .axis { stroke: #1d2330; } #chart .grid { stroke: #e6e9ef; }
#chart text { font-size: 11px; fill: #1d2330; }
.windows a.current { font-weight: 700; }
label.inline { display: inline; margin: 0; }
label { display: block; margin: .5em 0; }
details.traceback pre { white-space: pre-wrap; font-size: 12px; background: #f0f2f5; padding: .5em; }
"""

# Refreshes the overview: the counts from /api/status every 3 s, the
# history chart (/chart.svg, drawn by the server as the page was) every
# 15 s. Builds elements with textContent and attributes only, and the
# chart with DOMParser as SVG (never innerHTML).
JS = """
(function () {
  var body = document.querySelector("#counts tbody");
  if (!body) { return; }
  var root = document.querySelector("link[rel=stylesheet]").getAttribute("href").replace(/\\/static\\/app\\.css$/, "");
  // control and bidi characters as visible escapes, as the pages show them
  // (sqla_queue.common.redaction.escape_controls)
  var HIDDEN = /[\\p{Cc}\\p{Cf}\\p{Cs}\\p{Zl}\\p{Zp}]/gu;
  function visible(text) {
    return String(text).replace(HIDDEN, function (c) {
      if (c === "\\n" || c === "\\u200c" || c === "\\u200d") { return c; }
      var n = c.codePointAt(0), hex = n.toString(16);
      if (n < 0x100) { return "\\\\x" + ("0" + hex).slice(-2); }
      if (n < 0x10000) { return "\\\\u" + ("000" + hex).slice(-4); }
      return "\\\\U" + ("0000000" + hex).slice(-8);
    });
  }
  var states = ["ready", "scheduled", "running", "retrying", "succeeded", "failed", "cancelled", "dead_letter"];
  function update(status) {
    while (body.firstChild) { body.removeChild(body.firstChild); }
    function row(name, counts, cls) {
      var tr = document.createElement("tr");
      if (cls) { tr.className = cls; }
      var td = document.createElement("td"); td.textContent = visible(name); tr.appendChild(td);
      states.forEach(function (s) {
        var n = document.createElement("td"); n.className = "n"; n.textContent = String(counts[s]); tr.appendChild(n);
      });
      body.appendChild(tr);
    }
    Object.keys(status.processes).forEach(function (name) { row(name || "(none)", status.processes[name]); });
    row("total", status.totals, "total");
  }
  function poll() {
    fetch(root + "/api/status", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) { update(s); } })
      .catch(function () {});
  }
  function redraw() {
    var chart = document.getElementById("chart");
    if (!chart) { return; }
    var url = root + "/chart.svg?window=" + encodeURIComponent(chart.getAttribute("data-window"));
    fetch(url, {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) { return; }
        var drawn = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
        if (drawn.nodeName !== "svg") { return; }
        chart.parentNode.replaceChild(document.importNode(drawn, true), chart);
      })
      .catch(function () {});
  }
  poll();
  setInterval(poll, 3000);
  setInterval(redraw, 15000);
})();
"""
