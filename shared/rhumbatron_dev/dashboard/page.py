"""The dashboard page: plain HTML and a small vanilla script, no build step, no CDN.

Kept as Python strings, not package data files: the wheel ships them with the code, and the
page works wherever the package is installed. The script polls ``/dashboard/api/summary``,
``/dashboard/api/feed`` and ``/dashboard/api/trace`` every 2 s and draws each panel with DOM
calls (never ``innerHTML``: a dead letter's reason is text from a failed command, not markup).

Stable hooks for tests and scripts: every panel is a ``section`` with an ``id`` (``panel-lag``,
``panel-backlog``, ``panel-dead-letters``, ``panel-commands``, ``panel-errors``,
``panel-throughput``, ``panel-functions``, ``panel-feed``, ``panel-trace``); rows carry
``data-*`` attributes naming what they show (``data-stream``/``data-consumer``,
``data-letter-id`` with ``data-status`` and ``data-resolution``, ``data-queue``, ``data-role``,
``data-event-id``, a span's ``data-span-id``, ``data-parent-id``, ``data-name``);
``body[data-updates]`` counts the successful refreshes.
"""

from __future__ import annotations

import html

__all__ = ["DASHBOARD_SCRIPT", "POLL_INTERVAL_MS", "render_page"]

#: How often the page asks for fresh data.
POLL_INTERVAL_MS = 2000

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<!-- The run's API token, written in by `rhumbatron up` when it serves this page. Local only:
     the server listens on 127.0.0.1 and answers only Host 127.0.0.1/localhost, so no other
     site can read the page; the Retry and Dismiss buttons call the operator API with it. -->
<meta name="rhumbatron-api-token" content="__TOKEN__">
<meta name="rhumbatron-poll-ms" content="__POLL_MS__">
<title>Rhumbatron - local dashboard</title>
<style>
  :root { --fg: #1d2733; --muted: #6b7785; --line: #dde3ea; --bad: #b42318; --ok: #067647;
          --warn: #b54708; --bg: #f6f8fa; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
  header { display: flex; align-items: baseline; gap: 1rem; padding: .8rem 1.2rem;
           background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { font-size: 1.1rem; margin: 0; }
  header small { color: var(--muted); font-weight: normal; }
  #status { margin-left: auto; color: var(--muted); }
  #status[data-state="error"] { color: var(--bad); }
  main { display: grid; grid-template-columns: repeat(auto-fill, minmax(22rem, 1fr));
         gap: 1rem; padding: 1rem 1.2rem; }
  .panel { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: .8rem 1rem;
           overflow-x: auto; }
  .wide { grid-column: 1 / -1; }
  h2 { font-size: .95rem; margin: 0 0 .5rem; }
  .note { color: var(--muted); font-size: .8rem; margin: 0 0 .5rem; }
  .panel-error { color: var(--bad); font-size: .85rem; }
  .panel-error:empty { display: none; }
  table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
  th, td { text-align: left; padding: .2rem .5rem; border-bottom: 1px solid var(--line);
           vertical-align: top; }
  th { color: var(--muted); font-weight: 600; font-size: .8rem; }
  td.num, th.num { text-align: right; }
  .tiles { display: flex; flex-wrap: wrap; gap: 1.2rem; }
  .tile b { display: block; font-size: 1.5rem; }
  .tile span { color: var(--muted); font-size: .8rem; }
  .behind { color: var(--warn); font-weight: 600; }
  tr[data-status="open"] td:first-child { border-left: 3px solid var(--bad); }
  tr[data-status="closed"] { color: var(--muted); }
  .reason { max-width: 36rem; font-size: .8rem; }
  button { font: inherit; padding: .1rem .5rem; margin-right: .3rem; cursor: pointer; }
  .bars { display: flex; align-items: flex-end; gap: 3px; height: 4rem; margin: .5rem 0; }
  .bars div { flex: 1; background: #7aa7d9; min-height: 1px; }
  select { font: inherit; }
  .track { position: relative; height: .9rem; min-width: 16rem; background: var(--bg); }
  .track div { position: absolute; top: 0; bottom: 0; background: #7aa7d9; min-width: 2px; }
  tr[data-error] .track div { background: var(--bad); }
</style>
<script src="/dashboard/dashboard.js" defer></script>
</head>
<body data-updates="0">
<header>
  <h1>Rhumbatron <small>local dashboard: the CloudWatch dashboard's panels, live</small></h1>
  <span id="status" data-state="loading">loading...</span>
</header>
<p class="note" id="local-token-note">This page carries the API token of every tenant
  (a platform token), and any program on this machine can read it from here: serve it on
  loopback only, for one developer. In the cloud there is no such page.</p>
<main>
  <section id="panel-lag" class="panel wide">
    <h2>Consumer lag</h2>
    <p class="note">pending / unacknowledged records, per router consumer and event stream</p>
    <p class="panel-error"></p>
    <table>
      <thead><tr id="lag-head"><th>consumer</th></tr></thead>
      <tbody id="lag-rows"></tbody>
    </table>
    <p>total pending <b id="lag-total-pending">-</b>, unacknowledged
       <b id="lag-total-ack-pending">-</b></p>
    <ul id="lag-waiting" class="note"></ul>
  </section>
  <section id="panel-backlog" class="panel">
    <h2>Outbox backlog</h2>
    <p class="note">outbox rows over every actor file, by state</p>
    <p class="panel-error"></p>
    <div class="tiles">
      <div class="tile"><b id="backlog-pending" data-state="pending">-</b>
        <span>pending</span></div>
      <div class="tile"><b id="backlog-retry-wait" data-state="retry_wait">-</b>
        <span>retry_wait</span></div>
      <div class="tile"><b id="backlog-failed" data-state="failed">-</b>
        <span>failed</span></div>
      <div class="tile"><b id="backlog-published" data-state="published">-</b>
        <span>published</span></div>
    </div>
  </section>
  <section id="panel-capacity" class="panel">
    <h2>Capacity</h2>
    <p class="note">events a day the router's bounded jobs keep up with, against the volume
      sized for and the one the streams carry (rhumbatron capacity)</p>
    <p class="panel-error"></p>
    <div class="tiles">
      <div class="tile"><b id="capacity-expected">-</b><span>sized for (a day)</span></div>
      <div class="tile"><b id="capacity-observed">-</b><span>observed (a day)</span></div>
      <div class="tile"><b id="capacity-binding">-</b><span>lowest ceiling</span></div>
    </div>
    <ul id="capacity-warnings"></ul>
  </section>
  <section id="panel-errors" class="panel">
    <h2>Publish errors and Clef-flash</h2>
    <p class="panel-error"></p>
    <div class="tiles">
      <div class="tile"><b id="publish-errors">-</b><span>publish errors this run</span></div>
      <div class="tile"><b id="clef-flash-calls">-</b>
        <span>Clef-flash calls today (UTC)</span></div>
      <div class="tile"><b id="clef-flash-decisions">-</b>
        <span>Clef-flash decisions today</span></div>
    </div>
    <p class="note" id="publish-error-last"></p>
  </section>
  <section id="panel-dead-letters" class="panel wide">
    <h2>Dead letters <small id="dead-letters-open">-</small> open</h2>
    <p class="panel-error"></p>
    <table id="dead-letter-counts">
      <thead><tr><th>queue (or consumer)</th><th>kind</th><th class="num">open</th></tr></thead>
      <tbody id="dead-letter-count-rows"></tbody>
    </table>
    <p class="note">open letters first, then the latest closed ones</p>
    <table>
      <thead><tr><th>id</th><th>kind</th><th>queue</th><th>command</th><th class="num">attempt</th>
        <th>status</th><th>last error</th><th>actions</th></tr></thead>
      <tbody id="dead-letter-rows"></tbody>
    </table>
  </section>
  <section id="panel-commands" class="panel">
    <h2>Commands per queue</h2>
    <p class="note">deliveries to each queue's consumer (redeliveries included), waiting, and
       what the local consumer settled</p>
    <p class="panel-error"></p>
    <table>
      <thead><tr><th>queue</th><th class="num">delivered</th><th class="num">waiting</th>
        <th class="num">unacked</th><th>handled</th></tr></thead>
      <tbody id="command-rows"></tbody>
    </table>
  </section>
  <section id="panel-throughput" class="panel">
    <h2>Throughput</h2>
    <p class="panel-error"></p>
    <div class="tiles">
      <div class="tile"><b id="events-last-minute">-</b><span>events this minute</span></div>
      <div class="tile"><b id="events-published">-</b><span>published this run</span></div>
      <div class="tile"><b id="events-stored">-</b><span>on the event streams</span></div>
    </div>
    <div class="bars" id="throughput-bars"
         title="events published per minute, last 10 minutes"></div>
    <table><thead><tr><th>EVENT_METRICS, last hour</th><th class="num">points</th></tr></thead>
      <tbody id="event-metric-rows"></tbody></table>
  </section>
  <section id="panel-functions" class="panel wide">
    <h2>Functions</h2>
    <p class="note">each role's ticks in this process (the Lambdas' invocations, errors and
       durations); router nudges run in the background: <b id="router-nudges">-</b></p>
    <table>
      <thead><tr><th>role</th><th class="num">ticks</th><th class="num">busy</th>
        <th class="num">errors</th><th class="num">items</th><th class="num">last ms</th>
        <th class="num">avg ms</th><th class="num">max ms</th><th>last error</th></tr></thead>
      <tbody id="role-rows"></tbody>
    </table>
  </section>
  <section id="panel-feed" class="panel wide">
    <h2>Event feed <select id="feed-project" aria-label="project"></select></h2>
    <p class="note" id="feed-view"></p>
    <p class="panel-error"></p>
    <table>
      <thead><tr><th class="num">seq</th><th>event</th><th>id</th><th>occurred</th></tr></thead>
      <tbody id="feed-rows"></tbody>
    </table>
  </section>
  <section id="panel-trace" class="panel wide">
    <h2>Change trace <select id="trace-change" aria-label="change"></select></h2>
    <p class="note" id="trace-note"></p>
    <p class="panel-error"></p>
    <table>
      <thead><tr><th>span</th><th class="num">at ms</th><th class="num">took ms</th>
        <th>timeline</th></tr></thead>
      <tbody id="trace-rows"></tbody>
    </table>
  </section>
</main>
</body>
</html>
"""

#: The page's script, served at ``/dashboard/dashboard.js`` (the page's Content-Security-Policy
#: allows scripts from the page's origin only, so none is inline).
DASHBOARD_SCRIPT = """"use strict";
(() => {
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const token = meta("rhumbatron-api-token");
  const pollMs = Number(meta("rhumbatron-poll-ms")) || 2000;
  const auth = { Authorization: "Bearer " + token };
  const $ = (id) => document.getElementById(id);
  // What the operator's last Retry or Dismiss of each letter answered, kept across redraws.
  const actions = new Map();
  let project = null;
  let updates = 0;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(key, String(value));
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
    }
    return node;
  }
  const num = (value) => el("td", { class: "num" }, value ?? "-");
  const text = (id, value) => { $(id).textContent = value ?? "-"; };

  // A panel whose source did not answer shows why and keeps its last data.
  function failed(panelId, data) {
    const panel = $(panelId);
    const error = data && data.error ? data.error : "";
    panel.querySelector(".panel-error").textContent = error;
    if (error) panel.setAttribute("data-error", error); else panel.removeAttribute("data-error");
    return Boolean(error);
  }

  async function getJson(path) {
    const response = await fetch(path, { headers: auth, cache: "no-store" });
    if (!response.ok) throw new Error(`${path} answered ${response.status}`);
    return response.json();
  }

  function drawLag(lags) {
    if (failed("panel-lag", lags)) return;
    const streams = [...new Set(lags.rows.map((r) => r.stream))];
    const consumers = [...new Set(lags.rows.map((r) => r.consumer))];
    $("lag-head").replaceChildren(el("th", {}, "consumer"),
      ...streams.map((s) => el("th", { class: "num" }, s)));
    const cell = (stream, consumer) => {
      const r = lags.rows.find((x) => x.stream === stream && x.consumer === consumer);
      const behind = r.numPending + r.numAckPending > 0;
      return el("td", { class: behind ? "num behind" : "num", "data-stream": stream,
        "data-consumer": consumer, "data-num-pending": r.numPending,
        "data-num-ack-pending": r.numAckPending, "data-exists": r.exists },
        `${r.numPending} / ${r.numAckPending}`);
    };
    $("lag-rows").replaceChildren(...(consumers.length ? consumers.map((consumer) =>
      el("tr", { "data-consumer": consumer }, el("th", {}, consumer),
        ...streams.map((stream) => cell(stream, consumer))))
      : [el("tr", { "data-empty": "true" },
          el("td", {}, "No consumers yet: the router makes them when the streams exist."))]));
    text("lag-total-pending", lags.totalPending);
    text("lag-total-ack-pending", lags.totalAckPending);
    // Why records wait: a nudge applies a stream's events as they are published; what is
    // left waits for the stream's sweep tick, every 8 minutes.
    $("lag-waiting").replaceChildren(...lags.waiting.map((w) => el("li",
      { "data-stream": w.stream, "data-next-sweep-at": w.nextSweepAt },
      `${w.stream}: ${w.pending} waiting for the stream's next sweep tick at ` +
      `${w.nextSweepAt.slice(11, 16)} UTC (every 8 minutes), or a nudge sooner`)));
  }

  function drawBacklog(outbox) {
    if (failed("panel-backlog", outbox)) return;
    text("backlog-pending", outbox.pending);
    text("backlog-retry-wait", outbox.retry_wait);
    text("backlog-failed", outbox.failed);
    text("backlog-published", outbox.published);
  }

  function drawCapacity(capacity) {
    if (failed("panel-capacity", capacity)) return;
    text("capacity-expected", capacity.expectedEventsPerDay.toLocaleString("en"));
    text("capacity-observed", capacity.observedEventsPerDay === null ? "unknown"
      : capacity.observedEventsPerDay.toLocaleString("en"));
    const [name, limit] = Object.entries(capacity.ceilings).sort((a, b) => a[1] - b[1])[0];
    text("capacity-binding", limit.toLocaleString("en") + " (" + name + ")");
    $("capacity-warnings").replaceChildren(...capacity.warnings.map((w) => el("li", {}, w)));
  }

  function drawErrors(publish, clef) {
    failed("panel-errors", clef);
    text("publish-errors", publish.total);
    text("publish-error-last", publish.last ? "last: " + publish.last : "");
    if (!clef.error) {
      text("clef-flash-calls", clef.calls);
      text("clef-flash-decisions", clef.decisions.reduce((n, d) => n + d.count, 0));
    }
  }

  function letterActions(letter) {
    const cell = el("td", { "data-field": "actions" });
    const button = (action, label) =>
      el("button", { type: "button", "data-action": action, "data-letter-id": letter.id }, label);
    if (letter.status === "open") {
      // A letter that can only be dismissed (a poison event, a body that is no command)
      // offers no Retry: the API would refuse it (409).
      if (letter.retryable) cell.append(button("retry", "Retry"));
      cell.append(button("dismiss", "Dismiss"));
    }
    const done = actions.get(letter.id);
    if (done) {
      cell.append(el("span", { "data-field": "action-result", "data-ok": done.ok }, done.text));
    }
    return cell;
  }

  function drawDeadLetters(letters) {
    if (failed("panel-dead-letters", letters)) return;
    text("dead-letters-open", letters.open);
    $("dead-letter-count-rows").replaceChildren(...letters.openByQueueAndKind.map((c) =>
      el("tr", { "data-queue": c.queue, "data-kind": c.kind, "data-count": c.count },
        el("td", {}, c.queue), el("td", {}, c.kind), num(c.count))));
    if (!letters.letters.length) {
      $("dead-letter-rows").replaceChildren(el("tr", { "data-empty": "true" },
        el("td", { colspan: "8" }, "No dead letters: nothing has failed for good.")));
      return;
    }
    $("dead-letter-rows").replaceChildren(...letters.letters.map((x) => {
      const done = actions.get(x.id);
      return el("tr", { "data-letter-id": x.id, "data-status": x.status,
          "data-resolution": x.resolution, "data-retried-attempt": x.retriedAttempt,
          "data-action-result": done ? done.text : null },
        el("td", {}, x.id), el("td", {}, x.kind), el("td", {}, x.queue || x.consumer),
        el("td", {}, x.commandType ? `${x.commandType} ${x.commandId}` : x.eventId),
        num(x.retriedAttempt ? `${x.attempt} -> ${x.retriedAttempt}` : x.attempt),
        el("td", { "data-field": "status" },
          x.resolution ? `${x.status} (${x.resolution})` : x.status),
        el("td", { class: "reason" }, x.lastError), letterActions(x));
    }));
  }

  function drawCommands(commands) {
    if (failed("panel-commands", commands)) return;
    $("command-rows").replaceChildren(...Object.entries(commands.queues).map(([queue, q]) => {
      const handled = Object.entries(q.handled || {}).filter(([, n]) => n > 0)
        .map(([outcome, n]) => `${outcome} ${n}`).join(", ");
      return el("tr", { "data-queue": queue, "data-deliveries": q.deliveries },
        el("td", {}, queue), num(q.deliveries), num(q.numPending), num(q.numAckPending),
        el("td", {}, handled || "-"));
    }));
  }

  function drawThroughput(t) {
    if (failed("panel-throughput", t)) return;
    text("events-last-minute", t.lastMinute);
    text("events-published", t.publishedTotal);
    text("events-stored", t.streamTotal);
    const most = Math.max(1, ...t.eventsPerMinute.map((m) => m.events));
    $("throughput-bars").replaceChildren(...t.eventsPerMinute.map((m) => {
      const at = new Date(m.minute * 1000).toLocaleTimeString();
      const bar = el("div", { title: `${at}: ${m.events}`, "data-minute": m.minute,
        "data-events": m.events });
      bar.style.height = `${(100 * m.events) / most}%`;
      return bar;
    }));
    $("event-metric-rows").replaceChildren(...Object.entries(t.eventMetricsLastHour).map(
      ([name, n]) => el("tr", { "data-metric": name }, el("td", {}, name), num(n))));
  }

  function drawRoles(roles, nudges) {
    text("router-nudges", nudges);
    $("role-rows").replaceChildren(...Object.entries(roles).map(([role, r]) =>
      el("tr", { "data-role": role, "data-ticks": r.ticks, "data-errors": r.errors },
        el("td", {}, role), num(r.ticks), num(r.busyTicks), num(r.errors), num(r.items),
        num(r.lastDurationMs), num(r.avgDurationMs), num(r.maxDurationMs),
        el("td", { class: "reason" }, r.lastError || ""))));
  }

  function drawFeed(feed) {
    failed("panel-feed", null);
    project = feed.projectId;
    const select = $("feed-project");
    if (select.options.length !== feed.projects.length || select.value !== (project || "")) {
      select.replaceChildren(...feed.projects.map((p) => el("option", { value: p }, p)));
      select.value = project || "";
    }
    const view = feed.view;
    text("feed-view", view ? `${view.eventsApplied} events applied; changes ` +
      JSON.stringify(view.changesByState) + "; tasks " + JSON.stringify(view.tasksByState)
      : "no project yet");
    $("feed-rows").replaceChildren(...feed.items.map((e) =>
      el("tr", { "data-event-id": e.eventId, "data-event-type": e.eventType },
        num(e.streamSeq), el("td", {}, e.eventType), el("td", {}, e.eventId),
        el("td", {}, e.occurredAt))));
  }

  // The Change whose trace is shown: ?project=&change= in the address, then the select.
  const asked = new URLSearchParams(window.location.search);
  let traced = asked.get("change") ?
    { projectId: asked.get("project"), changeId: asked.get("change") } : null;

  function drawTrace(trace) {
    failed("panel-trace", null);
    const select = $("trace-change");
    const key = (c) => c && c.changeId ? `${c.projectId}/${c.changeId}` : "";
    const keys = trace.changes.map(key);
    if (select.options.length !== keys.length || select.value !== key(trace)) {
      select.replaceChildren(...keys.map((k) => el("option", { value: k }, k)));
      select.value = key(trace);
    }
    if (!trace.enabled) {
      text("trace-note", "No spans are recorded: RHUMBATRON_TRACE_SPANS is off.");
    } else {
      text("trace-note", trace.traceId ? `trace ${trace.traceId}: ${trace.spans.length} spans`
        : "No Change has spans yet.");
    }
    $("panel-trace").setAttribute("data-change-id", trace.changeId || "");
    const total = Math.max(1, ...trace.spans.map((s) => s.offsetMs + s.durationMs));
    $("trace-rows").replaceChildren(...trace.spans.map((s) => {
      const bar = el("div", {});
      bar.style.left = `${(100 * s.offsetMs) / total}%`;
      bar.style.width = `${(100 * s.durationMs) / total}%`;
      const name = el("td", { title: s.error || "" }, s.name);
      name.style.paddingLeft = `${0.5 + s.depth}rem`;
      return el("tr", { "data-span-id": s.spanId, "data-parent-id": s.parentId,
        "data-name": s.name, "data-offset-ms": s.offsetMs, "data-error": s.error },
        name, num(s.offsetMs.toFixed(1)), num(s.durationMs.toFixed(1)),
        el("td", {}, el("div", { class: "track" }, bar)));
    }));
  }

  async function refresh() {
    try {
      const summary = await getJson("/dashboard/api/summary");
      drawLag(summary.lags);
      drawBacklog(summary.outbox);
      drawCapacity(summary.capacity);
      drawErrors(summary.publishErrors, summary.clefFlash);
      drawDeadLetters(summary.deadLetters);
      drawCommands(summary.commands);
      drawThroughput(summary.throughput);
      drawRoles(summary.roles, summary.routerNudges);
      try {
        const query = project ? "?project=" + encodeURIComponent(project) : "";
        drawFeed(await getJson("/dashboard/api/feed" + query));
      } catch (error) {
        failed("panel-feed", { error: error.message });
      }
      try {
        const query = new URLSearchParams();
        if (traced && traced.projectId) query.set("project", traced.projectId);
        if (traced && traced.changeId) query.set("change", traced.changeId);
        drawTrace(await getJson("/dashboard/api/trace?" + query));
      } catch (error) {
        failed("panel-trace", { error: error.message });
      }
      updates += 1;
      document.body.setAttribute("data-updates", String(updates));
      $("status").setAttribute("data-state", "ok");
      $("status").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      $("status").setAttribute("data-state", "error");
      $("status").textContent = error.message;
    }
  }

  // Retry and Dismiss call the operator API itself (POST /dead-letters/{id}/retry|dismiss),
  // exactly as an operator's script would; the dashboard adds no route of its own.
  async function act(button) {
    const id = button.getAttribute("data-letter-id");
    const action = button.getAttribute("data-action");
    // A dismissal closes the letter for good: ask first.
    if (action === "dismiss" &&
        !window.confirm(`Dismiss ${id}? It closes for good and cannot be retried after.`)) {
      return;
    }
    button.disabled = true;
    let done;
    try {
      const response = await fetch(`/dead-letters/${encodeURIComponent(id)}/${action}`,
        { method: "POST", headers: auth });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) {
        const why = body.error ? body.error.message : response.statusText;
        done = { ok: false, text: `${action} refused (${response.status}): ${why}` };
      } else if (action === "retry") {
        done = { ok: true, text: body.sent ? `retried: sent attempt ${body.attempt}`
          : `already retried as attempt ${body.alreadyRetriedAs}` };
      } else {
        done = { ok: true, text: "dismissed" };
      }
    } catch (error) {
      done = { ok: false, text: `${action} failed: ${error.message}` };
    }
    actions.set(id, done);
    await refresh();
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) act(button);
  });
  document.addEventListener("change", (event) => {
    if (event.target.id === "feed-project") { project = event.target.value; refresh(); }
    if (event.target.id === "trace-change") {
      const [projectId, changeId] = event.target.value.split("/");
      traced = { projectId, changeId };
      refresh();
    }
  });

  async function poll() {
    await refresh();
    setTimeout(poll, pollMs);
  }
  poll();
})();
"""


def render_page(token: str) -> str:
    """The page with the run's API token written in (see the comment in its head)."""
    return _PAGE.replace("__TOKEN__", html.escape(token, quote=True)).replace(
        "__POLL_MS__", str(POLL_INTERVAL_MS)
    )
