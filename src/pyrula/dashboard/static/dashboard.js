// The pyrula dashboard: reads the JSON routes under the page's data-base and draws them.
// No framework, no build step. Every fetch that fails shows the banner instead of throwing.
(function () {
  "use strict";

  var BASE = document.body.getAttribute("data-base") || "/";
  var API = BASE + "api/";
  var ACTIONS = document.body.getAttribute("data-actions") === "true";
  var HAS_FLEET = document.body.getAttribute("data-fleet") === "true";
  var REFRESH_MS = 2000;
  var PALETTE = ["#1f5fa8", "#1d7a46", "#a05a00", "#7b3fa0", "#00838f", "#b3261e",
                 "#5d6773", "#8a6d00", "#3949ab", "#2e7d32"];
  var timer = null;
  var runsPage = { cursors: [null], index: 0, next: null, filters: {} };

  function $(id) { return document.getElementById(id); }

  // A DOM element with attributes and children (strings become text: no HTML injection).
  function el(tag, attrs) {
    var node = document.createElement(tag);
    var key;
    for (key in attrs || {}) {
      if (key === "class") { node.className = attrs[key]; }
      else if (key === "text") { node.textContent = attrs[key]; }
      else if (key.indexOf("on") === 0) { node.addEventListener(key.slice(2), attrs[key]); }
      else if (attrs[key] !== null && attrs[key] !== undefined) { node.setAttribute(key, attrs[key]); }
    }
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) { continue; }
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svgEl(tag, attrs) {
    var node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (var key in attrs) { node.setAttribute(key, attrs[key]); }
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  function banner(message) {
    var node = $("banner");
    node.textContent = message;
    node.hidden = false;
  }

  function clearBanner() { $("banner").hidden = true; }

  // GET (or POST) a JSON route; rejects with an Error whose message is the route's own.
  function api(path, options) {
    var controller = typeof AbortController === "function" ? new AbortController() : null;
    var opts = options || {};
    if (controller) { opts.signal = controller.signal; }
    var stop = setTimeout(function () { if (controller) { controller.abort(); } }, 8000);
    return fetch(API + path, opts).then(function (response) {
      return response.text().then(function (text) {
        var body = null;
        try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
        if (!response.ok) {
          var why = body && body.error ? body.error.message : (response.status + " " + response.statusText);
          var error = new Error(why);
          error.status = response.status;
          throw error;
        }
        return body;
      });
    }, function (error) {
      throw new Error("the dashboard's server did not answer (" + (error && error.message || "network error") + ")");
    }).finally(function () { clearTimeout(stop); });
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // Every instant the JSON routes answer is ISO-8601 UTC ("2026-12-01T16:40:00.123Z");
  // the page draws with epoch seconds.
  function secs(iso) {
    return iso === null || iso === undefined ? null : Date.parse(iso) / 1000;
  }

  function fmtTime(iso) {
    if (iso === null || iso === undefined) { return "-"; }
    var d = new Date(iso);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined || isNaN(s)) { return "-"; }
    if (s < 1) { return (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms"; }
    if (s < 120) { return s.toFixed(s < 10 ? 2 : 1) + " s"; }
    if (s < 7200) { return (s / 60).toFixed(1) + " min"; }
    return (s / 3600).toFixed(1) + " h";
  }

  function fmtBytes(n) {
    if (!n) { return "-"; }
    return (n / 1048576).toFixed(0) + " MB";
  }

  function pill(text) { return el("span", { "class": "pill s-" + text, text: text }); }

  function runLink(runId) { return el("a", { href: "#/run/" + encodeURIComponent(runId) }, el("code", { text: runId })); }

  function shardsText(shards) {
    var names = Object.keys(shards || {});
    if (!names.length) { return "-"; }
    return names.map(function (n) { return n + ": " + shards[n]; }).join(", ");
  }

  function fill(tbody, rows, empty, columns) {
    clear(tbody);
    if (!rows.length) {
      tbody.appendChild(el("tr", null, el("td", { "class": "muted", colspan: String(columns), text: empty })));
      return;
    }
    rows.forEach(function (row) { tbody.appendChild(row); });
  }

  // --- the fleet ---------------------------------------------------------------------

  function loadFleet() {
    return Promise.all([
      api("overview").then(drawOverview),
      api("series").then(drawSeries),
      api("queues").then(drawQueues),
      api("shards").then(drawShards),
    ]);
  }

  function drawOverview(body) {
    var fleet = body.fleet;
    if (!fleet) {
      $("fleet-status").textContent = "";
      $("fleet-summary").textContent = "Served outside a fleet: no children to show.";
      fill($("children").tBodies[0], [], "no fleet here", 10);
      return;
    }
    var status = $("fleet-status");
    status.textContent = fleet.status;
    status.className = "pill s-" + fleet.status;
    var parts = [fleet.children.length + " children", fleet.restarts + " restarts"];
    if (fleet.desired !== undefined) { parts.push("elastic " + fleet.min + ".." + fleet.max + ", wants " + fleet.desired); }
    if (fleet.generations) { parts.push("upgrading: " + fleet.generations.map(function (g) { return "generation " + g.id + " " + g.state + " (" + g.children + ")"; }).join(", ")); }
    $("fleet-summary").textContent = parts.join(" · ");
    fill($("children").tBodies[0], fleet.children.map(function (c) {
      return el("tr", { "data-slot": String(c.slot) },
        el("td", { text: c.slot }), el("td", { text: c.pid }), el("td", null, pill(c.state)),
        el("td", { text: c.generation === undefined ? "-" : c.generation }),
        el("td", { text: fmtBytes(c.rss_bytes) }), el("td", { text: c.in_flight }),
        el("td", { text: c.runs_done }), el("td", { text: c.restarts }),
        el("td", { text: shardsText(c.shards) }), el("td", null, el("code", { text: c.worker_id || "-" })));
    }), "no children", 10);
  }

  function drawSeries(body) {
    var points = body.points || [];
    var window = body.window_s || 300;
    chart($("chart-throughput"), points, window, [
      { key: "completed_per_s", label: "completed/s", color: PALETTE[1] },
      { key: "failed_per_s", label: "failed/s", color: PALETTE[5] },
    ], body.available === false ? body.why : null, function (v) { return v.toFixed(1); });
    chart($("chart-latency"), points, window, [
      { key: "run_p95_s", label: "run p95", color: PALETTE[0] },
      { key: "run_mean_s", label: "run mean", color: PALETTE[4] },
      { key: "claim_p95_s", label: "claim p95", color: PALETTE[2] },
    ], body.available === false ? body.why : null, fmtSeconds);
  }

  // A line chart of the last `window` seconds; null values break the line.
  function chart(svg, points, window, lines, unavailable, fmt) {
    clear(svg);
    var W = 600, H = 170, L = 46, R = 8, T = 18, B = 20;
    svg.appendChild(svgEl("line", { "class": "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    svg.appendChild(svgEl("line", { "class": "axis", x1: L, y1: T, x2: L, y2: H - B }));
    if (unavailable) {
      var t = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle" });
      t.textContent = unavailable;
      svg.appendChild(t);
      return;
    }
    var now = points.length ? secs(points[points.length - 1].at) : Date.now() / 1000;
    var top = 0;
    points.forEach(function (p) {
      lines.forEach(function (line) { var v = p[line.key]; if (v !== null && v > top) { top = v; } });
    });
    top = top > 0 ? top * 1.15 : 1;
    function x(at) { return L + (W - L - R) * (1 - (now - at) / window); }
    function y(v) { return H - B - (H - T - B) * (v / top); }
    [["" + fmt(top), T + 4], [fmt(0), H - B]].forEach(function (label) {
      var text = svgEl("text", { x: L - 4, y: label[1], "text-anchor": "end" });
      text.textContent = label[0];
      svg.appendChild(text);
    });
    var ago = svgEl("text", { x: L, y: H - 5 });
    ago.textContent = "-" + Math.round(window / 60) + " min";
    svg.appendChild(ago);
    var nowLabel = svgEl("text", { x: W - R, y: H - 5, "text-anchor": "end" });
    nowLabel.textContent = "now";
    svg.appendChild(nowLabel);
    lines.forEach(function (line, i) {
      var segment = [];
      function flush() {
        if (segment.length) {
          svg.appendChild(svgEl("polyline", { points: segment.join(" "), fill: "none",
            stroke: line.color, "stroke-width": 1.6, "stroke-linejoin": "round" }));
        }
        segment = [];
      }
      points.forEach(function (p) {
        var v = p[line.key];
        if (v === null || v === undefined || now - secs(p.at) > window) { flush(); return; }
        segment.push(x(secs(p.at)).toFixed(1) + "," + y(v).toFixed(1));
      });
      flush();
      var last = points.length ? points[points.length - 1][line.key] : null;
      var key = svgEl("text", { x: L + 8 + i * 150, y: 12 });
      key.setAttribute("fill", line.color);
      key.textContent = line.label + ": " + (last === null || last === undefined ? "-" : fmt(last));
      svg.appendChild(key);
    });
  }

  function drawQueues(body) {
    if (!body.supported) {
      fill($("queues").tBodies[0], [], "this store cannot tell its queues", 3);
      return;
    }
    fill($("queues").tBodies[0], body.queues.map(function (q) {
      return el("tr", null, el("td", { text: q.workflow }), el("td", { text: q.depth }),
        el("td", { text: q.oldest_age_s === null ? "-" : fmtSeconds(q.oldest_age_s) }));
    }), "no workflow served yet", 3);
  }

  function drawShards(body) {
    var box = $("shards");
    clear(box);
    if (!body.sharded) {
      box.appendChild(el("p", { "class": "muted", text: "not sharded: this store has one queue per workflow" }));
      return;
    }
    var colours = {};
    body.workers.forEach(function (w, i) { colours[w.worker_id] = PALETTE[i % PALETTE.length]; });
    var legend = el("div", { "class": "legend" });
    body.workers.forEach(function (w) {
      legend.appendChild(el("span", null, el("i", { style: "background:" + colours[w.worker_id] }),
        w.worker_id + (w.pid ? " (pid " + w.pid + ")" : "")));
    });
    box.appendChild(legend);
    Object.keys(body.names).forEach(function (name) {
      var info = body.names[name];
      var owner = {};
      Object.keys(info.held).forEach(function (w) { info.held[w].forEach(function (s) { owner[s] = w; }); });
      var cells = el("div", { "class": "cells" });
      for (var s = 0; s < info.shards; s++) {
        var w = owner[s];
        cells.appendChild(el("span", { "class": "cell", title: "shard " + s + ": " + (w || "unleased"),
          style: w ? "background:" + (colours[w] || "#5d6773") : null }));
      }
      box.appendChild(el("div", { "class": "shardmap" },
        el("strong", { text: name }), " ", el("span", { "class": "muted",
          text: info.shards + " shards, " + info.unleased + " unleased" }), cells));
    });
    if (!body.workers.length) { box.appendChild(el("p", { "class": "muted", text: "no live worker" })); }
  }

  // --- runs ----------------------------------------------------------------------------

  function query(params) {
    return Object.keys(params).filter(function (k) { return params[k]; })
      .map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]); }).join("&");
  }

  function loadRuns() {
    var params = Object.assign({ limit: "25" }, runsPage.filters);
    params.cursor = runsPage.cursors[runsPage.index];
    return api("runs?" + query(params)).then(function (body) {
      runsPage.next = body.cursor;
      $("older").disabled = !body.cursor;
      $("newer").disabled = runsPage.index === 0;
      $("page-label").textContent = "page " + (runsPage.index + 1);
      fill($("runs").tBodies[0], body.runs.map(function (r) {
        var took = r.finished_at && r.created_at ? fmtSeconds(secs(r.finished_at) - secs(r.created_at)) : "-";
        return el("tr", { "data-run": r.run_id }, el("td", null, runLink(r.run_id)),
          el("td", { text: r.workflow }), el("td", null, pill(r.status)),
          el("td", { text: r.owner || "-" }), el("td", { text: r.attempt }),
          el("td", { text: fmtTime(r.created_at) }), el("td", { text: took }));
      }), "no runs", 7);
    });
  }

  // --- one run -------------------------------------------------------------------------

  function action(label, path, body, confirmText) {
    var button = el("button", { type: "button", "class": "primary", text: label });
    if (!ACTIONS) {
      button.disabled = true;
      button.title = "read-only: start the fleet with --dashboard-actions";
      return button;
    }
    button.addEventListener("click", function () {
      if (confirmText && !window.confirm(confirmText)) { return; }
      button.disabled = true;
      api(path, { method: "POST", headers: { "Content-Type": "application/json" },
                  body: JSON.stringify(body || {}) })
        .then(function (answer) {
          clearBanner();
          if (answer && answer.retries) { location.hash = "#/run/" + encodeURIComponent(answer.run_id); }
          else { refresh(); }
        })
        .catch(function (error) { banner(label + " failed: " + error.message); button.disabled = false; });
    });
    return button;
  }

  function loadRun(runId) {
    return api("runs/" + encodeURIComponent(runId)).then(function (run) { drawRun(run); return run; });
  }

  function drawRun(run) {
    $("run-id").textContent = run.run_id;
    var status = $("run-status");
    status.textContent = run.status;
    status.className = "pill s-" + run.status;
    var bar = $("run-actions");
    clear(bar);
    var ended = ["completed", "failed", "cancelled"].indexOf(run.status) >= 0;
    var id = encodeURIComponent(run.run_id);
    if (run.status === "failed") { bar.appendChild(action("Retry", "runs/" + id + "/retry", null, null)); }
    if (!ended) {
      bar.appendChild(action("Cancel", "runs/" + id + "/cancel", null, "Cancel run " + run.run_id + "?"));
      var name = el("input", { placeholder: "signal name", size: "14" });
      var payload = el("input", { placeholder: "payload (JSON)", size: "18" });
      var send = action("Send signal", "runs/" + id + "/signal", null, null);
      if (ACTIONS) {
        send = el("button", { type: "button", "class": "primary", text: "Send signal", onclick: function () {
          var value = null;
          try { value = payload.value ? JSON.parse(payload.value) : null; }
          catch (e) { banner("the payload is not JSON: " + e.message); return; }
          api("runs/" + id + "/signal", { method: "POST", headers: { "Content-Type": "application/json" },
            body: JSON.stringify({ name: name.value, payload: value }) })
            .then(function () { clearBanner(); refresh(); })
            .catch(function (error) { banner("signal failed: " + error.message); });
        } });
      }
      bar.appendChild(name); bar.appendChild(payload); bar.appendChild(send);
    }
    if (!ACTIONS) { bar.appendChild(el("span", { "class": "muted", text: "read-only: actions need --dashboard-actions" })); }
    var facts = [["workflow", run.workflow], ["owner", run.owner || "-"],
      ["priority", run.priority === undefined ? 0 : run.priority], ["attempt", run.attempt],
      ["created", fmtTime(run.created_at)], ["started", fmtTime(run.started_at)],
      ["finished", fmtTime(run.finished_at)], ["events", run.events]];
    if (run.waiting_for && run.waiting_for.length) { facts.push(["waiting for", run.waiting_for.join(", ")]); }
    if (run.wake_at) { facts.push(["wakes", fmtTime(run.wake_at)]); }
    if (run.idempotency_key) { facts.push(["idempotency key", run.idempotency_key]); }
    var tbody = $("run-facts").tBodies[0];
    clear(tbody);
    facts.forEach(function (f) { tbody.appendChild(el("tr", null, el("td", { text: f[0] }), el("td", { text: f[1] }))); });
    if (run.retries) {
      tbody.appendChild(el("tr", null, el("td", { text: "retries" }), el("td", null, runLink(run.retries))));
    }
    if (run.parent_id) {
      tbody.appendChild(el("tr", { "data-parent": run.parent_id }, el("td", { text: "parent" }),
        el("td", null, runLink(run.parent_id))));
    }
    drawChildren(run);
    $("run-params").textContent = JSON.stringify(run.params, null, 2);
    var failed = run.error !== null && run.error !== undefined;
    $("run-outcome-title").textContent = failed ? "Error" : "Result";
    $("run-outcome").textContent = failed ? errorText(run.error)
      : (run.status === "completed" ? JSON.stringify(run.result, null, 2) : "(not ended)");
    drawTimeline(run);
  }

  // The children the run started (the first 50; the rest counted), each linked to its page.
  function drawChildren(run) {
    var children = run.children || [];
    var more = run.more_children || 0;
    $("run-family").hidden = !children.length && !more;
    fill($("run-children").tBodies[0], children.map(function (c) {
      return el("tr", { "data-child": c.run_id }, el("td", null, runLink(c.run_id)),
        el("td", { text: c.name }), el("td", null, c.status ? pill(c.status) : "-"));
    }), "no children", 3);
    var rest = $("run-more-children");
    rest.hidden = !more;
    rest.textContent = more ? "… and " + more + " more " + (more === 1 ? "child" : "children") : "";
  }

    // A run's error as a reader wants it: the one-line cause, its traceback as lines of
  // text (not one escaped JSON string), then whatever else its detail holds.
  function errorText(error) {
    var detail = Object.assign({}, error.detail || {});
    var trace = typeof detail.traceback === "string" ? detail.traceback : null;
    delete detail.traceback;
    var text = error.code + ": " + error.error_type + ": " + error.message;
    if (Object.keys(detail).length) { text += "\n\n" + JSON.stringify(detail, null, 2); }
    if (trace) { text += "\n\n" + trace.replace(/\s+$/, ""); }
    return text;
  }

  function drawTimeline(run) {
    var list = $("timeline");
    clear(list);
    var entries = run.timeline || [];
    if (!entries.length) { list.appendChild(el("li", { "class": "muted", text: "not started" })); return; }
    var first = null, last = null;
    var now = Date.now() / 1000;
    entries.forEach(function (e) {
      var start = secs(e.start), end = e.end === null || e.end === undefined ? (e.kind === "attempt" || e.kind === "patch" || e.kind === "forked" ? start : now) : secs(e.end);
      if (start !== null && start !== undefined) { first = first === null ? start : Math.min(first, start); }
      if (end !== null && end !== undefined) { last = last === null ? end : Math.max(last, end); }
    });
    var finished = secs(run.finished_at);
    if (finished) { last = Math.max(last || finished, finished); }
    var span = Math.max((last || 0) - (first || 0), 1e-3);
    entries.forEach(function (e) {
      if (e.kind === "attempt") {
        var who = (e.worker || "?") + (e.pid ? " (pid " + e.pid + ")" : "");
        list.appendChild(el("li", { "class": "attempt" }, el("span", null,
          "attempt " + e.attempt + " on " + who + " at " + fmtTime(e.start) + " ",
          e.after ? el("span", { "class": "why", text: "(" + e.after + ")" }) : null)));
        return;
      }
      if (e.kind === "forked") {
        list.appendChild(el("li", { "class": "patch" }, el("span", null,
          "forked from run " + e.from_run + " at step " + e.from_step + " (call " +
          e.from_call + "), reusing " + e.reused + " step call(s)")));
        return;
      }
      if (e.kind === "patch") {
        list.appendChild(el("li", { "class": "patch" }, el("span", null,
          "patch " + e.patch + " applied (call " + e.call + ") at " + fmtTime(e.start))));
        return;
      }
      var start = secs(e.start), end = e.end === null || e.end === undefined ? now : secs(e.end);
      var left = ((start - first) / span) * 100;
      var width = Math.max(((end - start) / span) * 100, 0.3);
      var label, cls, took;
      if (e.kind === "step") {
        var tries = e.attempts === 1 ? "1 try" : e.attempts + " tries";
        label = "step " + e.name + " · " + e.outcome + " · " + tries;
        cls = "bar " + e.outcome;
        took = e.seconds === null ? "running" : fmtSeconds(e.seconds);
      } else {
        label = "parked: " + e.why;
        cls = "bar parked";
        took = e.seconds === null ? "parked" : fmtSeconds(e.seconds);
      }
      list.appendChild(el("li", { "class": e.kind },
        el("span", { text: label }),
        el("span", { "class": "track" }, el("span", { "class": cls,
          style: "left:" + left.toFixed(2) + "%;width:" + Math.min(width, 100 - left).toFixed(2) + "%" })),
        el("span", { "class": "took", text: took })));
    });
  }

  // --- stuck ---------------------------------------------------------------------------

  function loadStuck() {
    return api("stuck").then(function (body) {
      drawStuckCount(body.runs.length);
      fill($("stuck").tBodies[0], body.runs.map(function (r) {
        var retry = r.status === "failed"
          ? action("Retry", "runs/" + encodeURIComponent(r.run_id) + "/retry", null, null) : null;
        return el("tr", { "data-run": r.run_id }, el("td", null, runLink(r.run_id)),
          el("td", { text: r.workflow }), el("td", null, pill(r.status)),
          el("td", { "class": "wrap", text: r.why }), el("td", { text: fmtTime(r.updated_at) }),
          el("td", null, retry));
      }), "no stuck runs", 6);
    });
  }

  function drawStuckCount(n) { $("stuck-count").textContent = n ? String(n) : ""; }

  // --- projections -----------------------------------------------------------------------

  function projectionLink(name) {
    return el("a", { href: "#/projection/" + encodeURIComponent(name) }, el("code", { text: name }));
  }

  function loadProjections() {
    return api("projections").then(function (body) {
      fill($("projections").tBodies[0], body.projections.map(function (p) {
        return el("tr", { "data-projection": p.name }, el("td", null, projectionLink(p.name)),
          el("td", { text: String(p.folded) }), el("td", { text: p.keyed ? "yes" : "no" }),
          el("td", { text: p.checkpoint ? fmtTime(p.checkpoint.finished_at) : "-" }),
          el("td", { text: fmtTime(p.updated_at) }));
      }), "no projections yet", 5);
    });
  }

  function loadProjection(name) {
    return api("projections/" + encodeURIComponent(name)).then(function (p) {
      $("projection-name").textContent = p.name;
      var tbody = $("projection-facts").tBodies[0];
      clear(tbody);
      [["runs folded", p.folded], ["keyed", p.keyed ? "yes" : "no"], ["version", p.version],
        ["checkpoint", p.checkpoint ? fmtTime(p.checkpoint.finished_at) + " " + p.checkpoint.run_id : "-"],
        ["updated", fmtTime(p.updated_at)]].forEach(function (f) {
        tbody.appendChild(el("tr", null, el("td", { text: f[0] }), el("td", { text: String(f[1]) })));
      });
      $("projection-state").textContent = JSON.stringify(p.state, null, 2);
    });
  }

  // --- routing -------------------------------------------------------------------------

  function current() {
    var hash = location.hash.replace(/^#\/?/, "");
    if (hash.indexOf("run/") === 0) { return { view: "run", id: decodeURIComponent(hash.slice(4)) }; }
    if (hash.indexOf("projection/") === 0) {
      return { view: "projection", id: decodeURIComponent(hash.slice(11)) };
    }
    if (hash === "runs" || hash === "stuck" || hash === "projections") { return { view: hash }; }
    return { view: "fleet" };
  }

  function refresh() {
    var where = current();
    var work;
    if (where.view === "run") { work = loadRun(where.id); }
    else if (where.view === "runs") { work = loadRuns(); }
    else if (where.view === "stuck") { work = loadStuck(); }
    else if (where.view === "projections") { work = loadProjections(); }
    else if (where.view === "projection") { work = loadProjection(where.id); }
    else { work = loadFleet(); }
    return Promise.resolve(work).then(function () {
      clearBanner();
      $("updated").textContent = "updated " + fmtTime(new Date().toISOString()).slice(11);
    }).catch(function (error) {
      banner("Could not load the " + where.view + " view: " + (error && error.message || error));
    });
  }

  function show() {
    var where = current();
    ["fleet", "runs", "run", "stuck", "projections", "projection"].forEach(function (name) {
      $("view-" + name).hidden = name !== where.view;
    });
    var tab = { run: "runs", projection: "projections" }[where.view] || where.view;
    Array.prototype.forEach.call(document.querySelectorAll("nav a"), function (a) {
      a.className = a.getAttribute("data-view") === tab ? "current" : "";
    });
    if (timer !== null) { clearInterval(timer); }
    refresh();
    // The runs table refreshes on its first page only: a later page would shift under the reader.
    timer = setInterval(function () {
      var now = current();
      if (now.view === "runs" && runsPage.index > 0) { return; }
      refresh();
    }, REFRESH_MS);
  }

  $("run-filters").addEventListener("submit", function (event) {
    event.preventDefault();
    var form = event.target;
    runsPage = { cursors: [null], index: 0, next: null, filters: {
      workflow: form.elements.workflow.value.trim(), status: form.elements.status.value,
      owner: form.elements.owner.value.trim() } };
    refresh();
  });
  $("older").addEventListener("click", function () {
    if (!runsPage.next) { return; }
    runsPage.cursors = runsPage.cursors.slice(0, runsPage.index + 1).concat([runsPage.next]);
    runsPage.index += 1;
    refresh();
  });
  $("newer").addEventListener("click", function () {
    if (runsPage.index === 0) { return; }
    runsPage.index -= 1;
    refresh();
  });
  window.addEventListener("hashchange", show);
  window.addEventListener("unhandledrejection", function (event) {
    banner("Unexpected error: " + (event.reason && event.reason.message || event.reason));
    event.preventDefault();
  });
  if (!HAS_FLEET) { document.querySelector("nav a[data-view=fleet]").textContent = "Overview"; }
  show();
  api("stuck").then(function (body) { drawStuckCount(body.runs.length); }).catch(function () {});
}());
