// faultline fleet page: plain JavaScript, no build step. Every value from
// the API is put in the page as text (textContent), never as HTML.
"use strict";

const STATES = ["healthy", "quarantined", "draining", "remediating", "escalated", "held", "drifted"];
const TOKEN_KEY = "faultline.token";

// ------------------------------------------------------------ helpers

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === undefined || kid === null) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function svgEl(tag, attrs, ...kids) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const kid of kids) {
    if (typeof kid === "string") e.append(document.createTextNode(kid));
    else if (kid) e.append(kid);
  }
  return e;
}

function fmtTime(t) {
  if (!t) return "";
  const d = new Date(t);
  if (isNaN(d) || d.getTime() <= 0) return "";
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z").replace(/Z$/, " UTC");
}

function ago(t) {
  const d = new Date(t);
  if (isNaN(d) || d.getTime() <= 0) return "";
  let s = Math.max(0, (Date.now() - d.getTime()) / 1000);
  for (const [n, u] of [[86400, "d"], [3600, "h"], [60, "m"]]) {
    if (s >= n) return Math.floor(s / n) + u + " ago";
  }
  return Math.floor(s) + "s ago";
}

function nodeLink(node) {
  return el("a", { href: "#/node/" + encodeURIComponent(node), class: "node-link", "data-node": node, text: node });
}

function stateSpan(state) {
  return el("span", { class: "s-" + state, text: state });
}

// ---------------------------------------------------------------- API

class AuthError extends Error {}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) throw new AuthError("no token");
  const resp = await fetch(path, { headers: { Authorization: "Bearer " + token } });
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (resp.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new AuthError((body && body.message) || "the token was refused");
  }
  if (!resp.ok) throw new Error((body && body.message) || resp.status + " " + resp.statusText);
  return body;
}

// ------------------------------------------------------------- routes

const view = () => document.getElementById("view");

function showLogin(msg) {
  document.getElementById("login").hidden = false;
  document.getElementById("signout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("login-error").textContent = msg || "";
  view().replaceChildren();
}

async function route() {
  if (!sessionStorage.getItem(TOKEN_KEY)) { showLogin(); return; }
  document.getElementById("login").hidden = true;
  document.getElementById("signout").hidden = false;
  const hash = location.hash.replace(/^#/, "") || "/";
  const v = view();
  v.replaceChildren(el("p", { class: "mute", text: "Loading…" }));
  try {
    let m;
    if ((m = hash.match(/^\/node\/([^?]+)/))) await nodeView(v, decodeURIComponent(m[1]));
    else if (hash.startsWith("/faults")) await faultsView(v);
    else await fleetView(v, new URLSearchParams(hash.split("?")[1] || ""));
  } catch (e) {
    if (e instanceof AuthError) { showLogin(e.message); return; }
    v.replaceChildren(el("p", { class: "error", id: "load-error", text: "Could not load: " + e.message }));
  }
}

// -------------------------------------------------------------- fleet

async function fleetView(v, params) {
  const state = params.get("state") || "";
  const token = params.get("page") || "";
  const q = new URLSearchParams({ limit: "50" });
  if (state) q.set("state", state);
  if (token) q.set("pageToken", token);
  // One request: the counts, the breaker and this page of nodes.
  const sum = await api("/v1/fleet/summary?" + q);
  const page = sum.page;
  document.getElementById("who").textContent = "cluster " + sum.cluster;

  const title = el("h1", {}, "Cluster " + sum.cluster + " ",
    sum.dryRun ? el("span", { class: "badge dry", id: "dry-run", text: "dry-run: decisions recorded, none applied" }) : null);
  const cards = el("div", { class: "cards", id: "states" }, STATES.map(s => el("div", {
    class: "card" + (s === state ? " active" : ""), "data-state": s,
    onclick: () => { if (s !== "healthy") location.hash = s === state ? "#/" : "#/?state=" + s; },
  }, el("div", { class: "n s-" + s, text: String(sum.nodes[s] || 0) }), el("div", { class: "l", text: s }))));

  const b = sum.breaker;
  const breaker = el("div", { class: "box", id: "breaker" },
    el("strong", { text: "Circuit breaker: " }),
    el("span", { class: b.state === "open" ? "badge open" : "badge", text: b.state }),
    b.since ? " since " + fmtTime(b.since) : "",
    b.reason ? el("div", { class: "mute", text: b.reason }) : null,
    el("div", {}, b.held ? el("a", { href: "#/?state=held", text: b.held + " node(s) held back: nothing applied to them" }) : "nothing held back"));

  const reporting = el("p", { class: "mute", text: sum.reportingNodes + " nodes reported events between " + fmtTime(sum.since) + " and " + fmtTime(sum.until) +
    (sum.dryRunNodes ? "; " + sum.dryRunNodes + " quarantine(s) decided in dry-run" : "") + "." });

  const rows = page.nodes.map(n => el("tr", { "data-node": n.node },
    el("td", {}, nodeLink(n.node)),
    el("td", {}, stateSpan(n.state), n.dryRun ? el("span", { class: "badge dry", text: "dry-run" }) : null,
      n.drifted ? el("span", { class: "badge s-drifted", text: "drifted" }) : null),
    el("td", { title: fmtTime(n.stateSince), text: ago(n.stateSince) }),
    el("td", { class: "reason", text: n.reason || (n.driftDetail ? "drifted: " + n.driftDetail : "") }),
    el("td", { text: n.check }),
    el("td", { text: n.rule }),
    el("td", { text: [n.drain && "drain " + n.drain, n.remediation && "remediation " + n.remediation].filter(Boolean).join(", ") })));
  const table = el("table", { id: "nodes" },
    el("thead", {}, el("tr", {}, ["node", "state", "since", "reason", "check", "rule", "drain / remediation"].map(h => el("th", { text: h })))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: "7", class: "mute", text: "No node " + (state || "out of service") + "." }))));
  const pager = el("div", { class: "pager" },
    token ? el("a", { href: "#/" + (state ? "?state=" + state : ""), text: "« first page" }) : null,
    page.nextPageToken ? el("a", { id: "next-page", href: "#/?" + new URLSearchParams(Object.assign(state ? { state } : {}, { page: page.nextPageToken })), text: "next page »" }) : null);

  v.replaceChildren(title, cards, statesChart(sum.nodes), breaker, reporting,
    el("h2", { text: state ? "Nodes " + state : "Nodes out of service" }), table, pager);
}

// statesChart draws nodes per state as horizontal SVG bars.
function statesChart(nodes) {
  const w = 520, rowH = 18, labelW = 90;
  const max = Math.max(1, ...STATES.map(s => nodes[s] || 0));
  const svg = svgEl("svg", { width: w, height: STATES.length * rowH + 4, id: "states-chart", role: "img", "aria-label": "nodes per state" });
  STATES.forEach((s, i) => {
    const n = nodes[s] || 0, y = i * rowH + 2;
    svg.append(svgEl("text", { x: 0, y: y + 12 }, s));
    const bw = Math.max(n ? 2 : 0, (w - labelW - 60) * n / max);
    const rect = svgEl("rect", { x: labelW, y, width: bw, height: rowH - 5, class: "s-" + s });
    rect.style.fill = getComputedStyle(document.documentElement).getPropertyValue("--" + ({ healthy: "ok", quarantined: "bad", escalated: "bad", held: "held", drifted: "drift" }[s] || "warn"));
    svg.append(rect, svgEl("text", { x: labelW + bw + 4, y: y + 12 }, String(n)));
  });
  return el("div", { class: "box" }, svg);
}

// --------------------------------------------------------------- node

async function nodeView(v, node) {
  const [d, evs, acts] = await Promise.all([
    api("/v1/fleet/nodes/" + encodeURIComponent(node)),
    api("/v1/events?" + new URLSearchParams({ node, limit: "200" })),
    api("/v1/actions?" + new URLSearchParams({ node, limit: "200" })),
  ]);
  document.getElementById("who").textContent = "cluster " + d.cluster;
  const head = el("h1", { id: "node-title" }, "Node " + node + " — ", stateSpan(d.state),
    d.row && d.row.dryRun ? el("span", { class: "badge dry", text: "dry-run" }) : null,
    d.row && d.row.drifted ? el("span", { class: "badge s-drifted", text: "drifted" }) : null);
  const since = d.stateSince ? el("p", { class: "mute", text: d.state + " since " + fmtTime(d.stateSince) + (d.row && d.row.reason ? " — " + d.row.reason : "") }) : null;

  const faults = el("table", { id: "faults" },
    el("thead", {}, el("tr", {}, ["check", "entities", "since", "rule", "what faultline set", "message", "caused by"].map(h => el("th", { text: h })))),
    el("tbody", {}, d.faults.length ? d.faults.map(f => el("tr", {},
      el("td", { text: f.check }), el("td", { text: f.entities }), el("td", { text: fmtTime(f.since) }), el("td", { text: f.rule }),
      el("td", { text: [f.cordon && "cordon", f.taint && "taint " + f.taint, f.condition && "condition " + f.condition + "=False", "label faultline.io/quarantined=true"].filter(Boolean).join("; ") + (f.dryRun ? " (dry-run: not applied)" : "") }),
      el("td", { text: f.message || f.reason }),
      el("td", {}, f.eventIds.map(id => causeLink(id))))) : el("tr", {}, el("td", { colspan: "7", class: "mute", text: "faultline holds no fault on this node." }))));
  const release = el("ul", { class: "release", id: "release" }, d.release.map(r => el("li", { text: r })));

  // The timeline: events and actions merged, newest first.
  const items = [];
  for (const e of evs.events || []) items.push({ t: e.generatedTimestamp || e.receivedTimestamp, ev: e });
  for (const a of acts.actions || []) items.push({ t: a.timestamp, act: a });
  items.sort((x, y) => new Date(y.t) - new Date(x.t));
  const tl = el("table", { id: "timeline" },
    el("thead", {}, el("tr", {}, ["time", "", "what", "detail", "cause ids"].map(h => el("th", { text: h })))),
    el("tbody", {}, items.map(it => it.ev ? eventRow(it.ev) : actionRow(it.act))));
  const more = [];
  if (evs.nextPageToken || acts.nextPageToken) more.push(el("p", { class: "mute", text: "Showing the newest " + (evs.events || []).length + " events and " + (acts.actions || []).length + " actions; older ones: GET /v1/events?node=" + node + "&pageToken=…" }));

  v.replaceChildren(el("p", {}, el("a", { href: "#/", text: "« fleet" })), head, since,
    el("h2", { text: "What faultline holds it for" }), faults,
    el("h2", { text: "How to release it" }), release,
    el("h2", { text: "Timeline" }), timelineChart(items), tl, ...more);
  const target = location.hash.split("?ev=")[1];
  if (target) focusRow(decodeURIComponent(target));
}

function causeLink(id) {
  const base = location.hash.split("?")[0];
  return el("a", { href: base + "?ev=" + encodeURIComponent(id), class: "cause", "data-id": id, text: id.slice(0, 13) + "… ", title: id,
    onclick: (e) => { e.preventDefault(); focusRow(id); } });
}

function focusRow(id) {
  document.querySelectorAll("tr.target").forEach(r => r.classList.remove("target"));
  const row = document.getElementById("ev-" + id) || document.getElementById("act-" + id);
  if (row) { row.classList.add("target"); row.scrollIntoView({ block: "center" }); }
}

function eventRow(e) {
  const kind = e.isHealthy ? "healthy" : e.isFatal ? "fatal" : "unhealthy";
  return el("tr", { id: "ev-" + e.id },
    el("td", { text: fmtTime(e.generatedTimestamp) }),
    el("td", {}, el("span", { class: e.isHealthy ? "s-healthy" : "s-quarantined", text: "event" })),
    el("td", { text: e.checkName + " " + kind + (e.derivedBy ? " (derived by " + e.derivedBy + ")" : "") }),
    el("td", { text: [e.message, (e.errorCode || []).join(","), (e.entitiesImpacted || []).map(x => x.entityType + "=" + x.entityValue).join(",")].filter(Boolean).join(" — ") }),
    el("td", {}, (e.causeIds || []).map(causeLink)));
}

function actionRow(a) {
  return el("tr", { id: "act-" + a.id },
    el("td", { text: fmtTime(a.timestamp) }),
    el("td", {}, el("span", { class: "s-draining", text: "action" })),
    el("td", { text: a.role + " " + a.kind + " → " + a.outcome + (a.dryRun ? " (dry-run)" : "") }),
    el("td", { text: [a.reason, a.rule && "rule " + a.rule].filter(Boolean).join(" — ") }),
    el("td", {}, (a.eventIds || []).map(causeLink)));
}

// timelineChart plots events (circles: red fatal, orange unhealthy, green
// healthy) and actions (squares) on a time axis.
function timelineChart(items) {
  const w = 900, h = 70, pad = 10;
  const svg = svgEl("svg", { width: w, height: h, id: "timeline-chart", role: "img", "aria-label": "timeline" });
  const ts = items.map(i => new Date(i.t).getTime()).filter(x => !isNaN(x));
  if (!ts.length) return el("div", { class: "box mute", text: "No events or actions recorded for this node." });
  const lo = Math.min(...ts), hi = Math.max(...ts), span = Math.max(1, hi - lo);
  const x = t => pad + (w - 2 * pad) * (t - lo) / span;
  svg.append(svgEl("line", { x1: pad, x2: w - pad, y1: 45, y2: 45, stroke: "#b0bec5" }));
  for (const it of items) {
    const t = new Date(it.t).getTime();
    if (isNaN(t)) continue;
    if (it.ev) {
      const c = svgEl("circle", { cx: x(t), cy: 25, r: 4, fill: it.ev.isHealthy ? "#2e7d32" : it.ev.isFatal ? "#c62828" : "#ef6c00" });
      c.append(svgEl("title", {}, fmtTime(it.t) + " " + it.ev.checkName));
      svg.append(c);
    } else {
      const r = svgEl("rect", { x: x(t) - 4, y: 37, width: 8, height: 8, fill: "#1565c0" });
      r.append(svgEl("title", {}, fmtTime(it.t) + " " + it.act.kind + " " + it.act.outcome));
      svg.append(r);
    }
  }
  svg.append(svgEl("text", { x: pad, y: h - 4 }, fmtTime(lo)), svgEl("text", { x: w - pad - 150, y: h - 4 }, fmtTime(hi)));
  return el("div", { class: "box" }, svg);
}

// ------------------------------------------------------------- faults

const RANGES = { "1d": 86400e3, "7d": 7 * 86400e3, "30d": 30 * 86400e3, "90d": 90 * 86400e3 };

async function faultsView(v) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const list = (await api("/v1/fleet/analytics")).queries;
  const name = params.get("q") || (list.find(q => q.name === "remediation_outcomes") || list[0] || {}).name;
  const range = params.get("range") || "7d";
  const pick = el("select", { id: "query", onchange: (e) => { location.hash = "#/faults?" + new URLSearchParams({ q: e.target.value, range }); } },
    list.map(q => el("option", { value: q.name, selected: q.name === name, text: q.name })));
  const rangeSel = el("select", { id: "range", onchange: (e) => { location.hash = "#/faults?" + new URLSearchParams({ q: name, range: e.target.value }); } },
    Object.keys(RANGES).map(r => el("option", { value: r, selected: r === range, text: "last " + r })));
  const q = list.find(x => x.name === name);
  const out = [el("h1", { text: "Faults" }), el("p", {}, "Query ", pick, " over the ", rangeSel)];
  if (q) {
    out.push(el("p", { class: "mute", text: q.description }));
    const qs = new URLSearchParams();
    const until = new Date(), since = new Date(until.getTime() - RANGES[range]);
    for (const p of q.params) {
      if (p.Name === "since") qs.set("since", since.toISOString().replace(/\.\d+Z$/, "Z"));
      else if (p.Name === "until" || p.Name === "now") qs.set(p.Name, until.toISOString().replace(/\.\d+Z$/, "Z"));
      else if (p.Name === "window" && p.Type === "UInt64") qs.set("window", String(Math.round(RANGES[range] / 1000)));
    }
    const tab = await api("/v1/fleet/analytics/" + encodeURIComponent(name) + "?" + qs);
    out.push(barChart(tab), resultTable(tab));
    if (tab.truncated) out.push(el("p", { class: "mute", id: "truncated", text: "Only the first " + tab.rows.length + " rows: narrow the range for the rest." }));
  }
  v.replaceChildren(...out);
}

function resultTable(tab) {
  return el("table", { id: "result" },
    el("thead", {}, el("tr", {}, tab.columns.map(c => el("th", { text: c })))),
    el("tbody", {}, tab.rows.length ? tab.rows.map(r => el("tr", {}, r.map((c, i) => el("td", {},
      tab.columns[i] === "node" ? nodeLink(String(c)) : Array.isArray(c) ? c.join(", ") : String(c)))))
      : el("tr", {}, el("td", { colspan: String(tab.columns.length || 1), class: "mute", text: "No rows in this range." }))));
}

// barChart plots the first numeric column against the text columns.
function barChart(tab) {
  const num = tab.types.findIndex(t => /^(U?Int|Float)/.test(t));
  if (num < 0 || !tab.rows.length) return el("div");
  const labels = tab.rows.slice(0, 30).map(r => r.filter((c, i) => i !== num && !/^(U?Int|Float)/.test(tab.types[i])).map(String).join(" / "));
  const vals = tab.rows.slice(0, 30).map(r => Number(r[num]) || 0);
  const c = el("canvas", { id: "chart", width: "900", height: String(20 * vals.length + 10) });
  const g = c.getContext("2d");
  const max = Math.max(1, ...vals), labelW = 360;
  g.font = "11px system-ui, sans-serif";
  vals.forEach((v, i) => {
    const y = i * 20 + 5;
    g.fillStyle = "#6b6f75";
    g.fillText(labels[i].slice(0, 60), 0, y + 12);
    g.fillStyle = "#1565c0";
    const bw = Math.max(v ? 2 : 0, (900 - labelW - 60) * v / max);
    g.fillRect(labelW, y, bw, 14);
    g.fillStyle = "#1d1f21";
    g.fillText(String(v), labelW + bw + 4, y + 12);
  });
  return el("div", { class: "box" }, el("div", { class: "mute", text: tab.columns[num] }), c);
}

// --------------------------------------------------------------- boot

document.getElementById("login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = document.getElementById("token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  document.getElementById("token").value = "";
  route();
});
document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
});
window.addEventListener("hashchange", route);
route();
