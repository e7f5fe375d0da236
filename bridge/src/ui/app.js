// The ccattler console: one server-sent-event stream of the cluster's tables
// (/api/events), /explain for any key, /api/rules for the program. Plain
// modules, no build step; nothing is fetched from anywhere but the controller.

const PAGE = 50; // rows a page: no page renders thousands of rows at once
let state = null; // the newest tables
let tab = location.hash.slice(1) || "nodes";
const pages = {}; // group or table → page shown
let groupBy = "zone";
let filter = "";

const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const table = (name) => state?.tables.find((t) => t.table === name)?.rows ?? [];
const num = (s) => Number.parseInt(s, 10) || 0;

function bar(used, total) {
  const pct = total > 0 ? Math.min(100, Math.round((100 * used) / total)) : 0;
  return `<span class="bar" title="${used} of ${total}"><span style="width:${pct}%"></span></span>${esc(used)}/${esc(total)}`;
}

function pager(id, n) {
  const pagesN = Math.ceil(n / PAGE);
  if (pagesN <= 1) return "";
  const p = pages[id] ?? 0;
  return `<div class="pager">${p > 0 ? `<button data-page="${id}" data-to="${p - 1}">‹</button>` : ""}page ${p + 1} of ${pagesN} ${p + 1 < pagesN ? `<button data-page="${id}" data-to="${p + 1}">›</button>` : ""}</div>`;
}

function rowsOf(id, rows) {
  const p = pages[id] ?? 0;
  return rows.slice(p * PAGE, (p + 1) * PAGE);
}

function labelOf(node, key) {
  const labels = node.labels === "-" ? [] : node.labels.split(",");
  const l = labels.find((x) => x.startsWith(key + "="));
  return l ? l.slice(key.length + 1) : "(no " + key + ")";
}

// Nodes: grouped by a label, each group aggregated (counts by state,
// requested of capacity), its nodes a page at a time.
function nodesView() {
  let nodes = table("nodes").filter((n) => !filter || n.name.includes(filter) || n.labels.includes(filter) || n.state.includes(filter));
  const groups = new Map();
  for (const n of nodes) {
    const g = groupBy ? labelOf(n, groupBy) : "all nodes";
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(n);
  }
  let out = `<p><input type="text" id="filter" placeholder="filter by name, label or state" value="${esc(filter)}"> group by label <input type="text" id="groupby" value="${esc(groupBy)}" style="min-width:8em"> <span class="muted">${nodes.length} node(s)</span></p>`;
  for (const [g, list] of [...groups.entries()].sort()) {
    const states = {};
    let [cu, ct, mu, mt] = [0, 0, 0, 0];
    for (const n of list) {
      states[n.state] = (states[n.state] || 0) + 1;
      const [a, b] = n.cpu.split("/"), [c, d] = n.memory.split("/");
      cu += num(a); ct += num(b); mu += num(c); mt += num(d);
    }
    const id = "group:" + g;
    out += `<div class="group"><h3>${esc(groupBy || "nodes")} ${esc(g)} — ${list.length} node(s): ${Object.entries(states).map(([s, k]) => `<span class="state-${esc(s)}">${k} ${esc(s)}</span>`).join(", ")}</h3>
      <div>cpu ${bar(cu, ct)} &nbsp; memory ${bar(mu, mt)}</div>
      <table><tr><th>node</th><th>state</th><th>cpu</th><th>memory</th><th>instances</th><th>address</th><th>labels</th></tr>
      ${rowsOf(id, list).map((n) => {
        const [a, b] = n.cpu.split("/"), [c, d] = n.memory.split("/");
        return `<tr data-node="${esc(n.name)}"><td>${esc(n.name)}</td><td class="state-${esc(n.state)}">${esc(n.state)}</td><td>${bar(num(a), num(b))}</td><td>${bar(num(c), num(d))}</td><td>${esc(n.instances)}</td><td>${esc(n.address)}</td><td>${esc(n.labels)}</td></tr>`;
      }).join("")}</table>${pager(id, list.length)}</div>`;
  }
  return out;
}

function simpleTable(name, columns, rows, click) {
  const id = "table:" + name;
  return `<table><tr>${columns.map((c) => `<th>${esc(c)}</th>`).join("")}</tr>${rowsOf(id, rows)
    .map((r) => `<tr ${click ? `class="click" data-explain="${esc(click(r))}"` : ""}>${columns.map((c) => `<td class="${c === "state" || c === "rollout" ? "state-" + esc(String(r[c]).split(":")[0]) : ""}">${esc(r[c])}</td>`).join("")}</tr>`)
    .join("")}</table>${pager(id, rows.length)}`;
}

const views = {
  nodes: nodesView,
  services: () => simpleTable("services", ["name", "wanted", "placed", "running", "ready", "rollout", "image", "intent"], table("services")),
  pending: () =>
    `<p class="muted">Click an instance for every node's reasons (explain --why-not).</p>` +
    simpleTable("pending", ["instance", "service", "reason"], table("pending"), (r) => "placement/instance/" + r.instance + "?why_not") +
    `<div id="whynot">${answers.whynot ?? ""}</div>`,
  rollouts: () => simpleTable("rollouts", ["service", "generation", "updated", "ready", "state"], table("rollouts")),
  explain: () =>
    `<p><input type="text" id="key" placeholder="a key, e.g. placement/instance/web-0" value="${esc(lastKey)}"> <label><input type="checkbox" id="whynotbox" ${lastWhyNot ? "checked" : ""}> why not</label> <button id="ask">explain</button></p><div id="answer"></div>`,
  rules: () => `<div id="rulesview">loading…</div>`,
  problems: () => simpleTable("problems", ["kind", "key", "why"], (state?.problems ?? []).map(([kind, key, why]) => ({ kind, key, why }))),
};

// Answers already shown, by the element they went into: a new state
// re-renders the tables but keeps what the user asked for.
const answers = {};
let lastKey = "";
let lastWhyNot = false;

function render() {
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.tab === tab));
  if (state) {
    $("#revision").textContent = "as of revision " + state.revision;
    $("#summary").innerHTML = table("summary").map((r) => `<span><b>${esc(r.count)}</b> ${esc(r.what)} <span class="muted">${esc(r.detail)}</span></span>`).join("");
  }
  // The explain and rules pages keep what they show while the tables change.
  if ((tab === "explain" || tab === "rules") && $("#main").dataset.tab === tab) return;
  const focused = document.activeElement?.id;
  $("#main").innerHTML = state || tab === "explain" || tab === "rules" ? views[tab]() : "waiting for the controller…";
  $("#main").dataset.tab = tab;
  if (focused && $("#" + focused)) { const el = $("#" + focused); el.focus(); el.setSelectionRange?.(el.value.length, el.value.length); }
  if (tab === "rules") loadRules();
}

// The derivation tree, down to the stored keys.
function node(n) {
  const head = n.kind === "input"
    ? `${esc(n.fact)} ← <span class="key">${esc(n.key)} = ${esc(JSON.stringify(n.value))}</span> <span class="muted">(revision ${esc(n.mod_revision)}${n.writer ? ", writer " + esc(n.writer) : ""})</span>`
    : `${esc(n.fact)} ${n.rule ? `<span class="rule">← ${esc(n.rule.location)}: ${esc(n.rule.text)}</span>` : ""} ${n.builtin ? `<span class="rule">← built-in ${esc(n.builtin)}${n.note ? ": " + esc(n.note) : ""}</span>` : ""}`;
  const kids = [];
  for (const p of n.premises ?? []) {
    if (p.kind === "fact" && p.proof) kids.push(node(p.proof));
    else if (p.kind === "absent") kids.push(`<div>${esc(p.fact)} is absent <span class="muted">(${esc(p.literal)}${p.key ? ", no key " + esc(p.key) : ""})</span></div>`);
    else if (p.kind === "condition") kids.push(`<div class="muted">${esc(p.literal)}: holds</div>`);
  }
  for (const c of n.contributions ?? []) {
    kids.push(`<details><summary>${c.decides ? "→ " : ""}contribution ${esc(JSON.stringify(c.value))}</summary>${(c.premises ?? []).map((p) => (p.proof ? node(p.proof) : `<div>${esc(p.literal ?? "")}</div>`)).join("")}</details>`);
  }
  return kids.length ? `<details open><summary>${head}</summary>${kids.join("")}</details>` : `<div>${head}</div>`;
}

// The one-line verdict, found as `explain --why-not` finds it
// (engine/src/explain/render.rs: verdict): the nearest assign's summary.
function verdictOf(w) {
  if (w.assign) {
    const a = w.assign;
    if (a.nodes > 0 && (a.reasons ?? []).every((r) => r.count > 0)) return `${a.fit}/${a.nodes} nodes can take ${a.instance}${a.verdict ? " — " + a.verdict : ""}`;
    return a.summary;
  }
  if ((w.preempt ?? []).length) return w.preempt[0];
  for (const r of w.rules ?? []) for (const f of r.failures ?? []) for (const l of f.failed ?? []) {
    const v = l.because && verdictOf(l.because);
    if (v) return v;
  }
  return null;
}

function whyNot(w, top = true) {
  let out = "";
  const verdict = top && verdictOf(w);
  if (verdict) out += `<p class="verdict"><b>verdict:</b> ${esc(verdict)}</p>`;
  if (w.assign) {
    const a = w.assign;
    out += `<p><b>${a.fit}/${a.nodes} nodes can take ${esc(a.instance)}</b>${a.verdict ? " — " + esc(a.verdict) : ""}</p><ul>`;
    for (const r of a.reasons ?? []) out += `<li>${r.count} × ${esc(r.reason)} <details><summary class="muted">nodes</summary>${esc(r.nodes.join(", "))}</details></li>`;
    out += "</ul>";
    if ((a.lacking ?? []).length) out += `<table><tr><th>node</th><th>resource</th><th>needs</th><th>free</th><th>total</th></tr>${a.lacking.slice(0, 200).map((l) => `<tr><td>${esc(l.node)}</td><td>${esc(l.resource)}</td><td>${esc(l.needs)}</td><td>${esc(l.free)}</td><td>${esc(l.total)}</td></tr>`).join("")}</table>`;
  }
  for (const p of w.preempt ?? []) out += `<p>preempt: ${esc(p)}</p>`;
  if (w.input) out += `<p>${esc(w.fact)}: key <span class="key">${esc(w.input.key)}</span> ${w.input.rejected ? "was rejected: " + esc(w.input.rejected) : w.input.stored !== undefined ? "holds " + esc(JSON.stringify(w.input.stored)) : "does not exist"}</p>`;
  for (const r of w.rules ?? []) {
    out += `<details><summary class="rule">rule ${esc(r.rule.location)}: ${esc(r.rule.text)}</summary>`;
    for (const f of r.failures ?? []) for (const l of f.failed ?? []) out += `<div>✗ ${esc(l.instance)} — ${esc(l.reason)}${l.because ? whyNot(l.because, false) : ""}</div>`;
    out += "</details>";
  }
  return `<div class="tree">${out}</div>`;
}

async function explain(key, why, into) {
  into.innerHTML = "asking…";
  const res = await fetch(`/explain?key=${encodeURIComponent(key)}${why ? "&why_not=true" : ""}`);
  if (!res.ok) { into.textContent = await res.text(); answers[into.id] = into.innerHTML; return; }
  const e = await res.json();
  let out = `<p><b>${esc(e.key)}</b> ${e.holds ? "holds" : "does not hold"} at revision ${esc(e.revision)} <span class="muted">${esc(e.relation)}${e.doc ? ": " + esc(e.doc) : ""}</span></p>`;
  out += `<div class="tree">${(e.proofs ?? []).map(node).join("")}</div>`;
  if (e.why_not) out += whyNot(e.why_not);
  into.innerHTML = out;
  answers[into.id] = out;
}

async function loadRules() {
  const res = await fetch("/api/rules");
  const r = await res.json();
  const hl = (t) => esc(t).replace(/(\/\/[^\n]*)/g, '<span class="com">$1</span>').replace(/\b(input|output|relation|type|from|to|not|per|default)\b/g, '<span class="kw">$1</span>').replace(/(&quot;[^\n]*?&quot;)/g, '<span class="str">$1</span>');
  $("#rulesview").innerHTML =
    `<h3>Outputs and the keys each holds</h3><table><tr><th>relation</th><th>keys</th></tr>${Object.entries(r.outputs).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${v}</td></tr>`).join("")}</table>` +
    r.files.map(([name, text]) => `<details><summary>${esc(name)}</summary><pre class="rules">${hl(text)}</pre></details>`).join("");
}

document.addEventListener("click", (ev) => {
  const t = ev.target.closest("[data-page],[data-explain],#ask,nav a");
  if (!t) return;
  if (t.dataset.page) { pages[t.dataset.page] = Number(t.dataset.to); render(); }
  else if (t.dataset.explain) { const [key, q] = t.dataset.explain.split("?"); explain(key, q === "why_not", $("#whynot")); }
  else if (t.id === "ask") { lastKey = $("#key").value.trim(); lastWhyNot = $("#whynotbox").checked; explain(lastKey, lastWhyNot, $("#answer")); }
  else if (t.dataset.tab) { tab = t.dataset.tab; }
});
document.addEventListener("input", (ev) => {
  if (ev.target.id === "filter") { filter = ev.target.value; pages["group"] = 0; render(); }
  if (ev.target.id === "groupby") { groupBy = ev.target.value.trim(); render(); }
});
window.addEventListener("hashchange", () => { tab = location.hash.slice(1) || "nodes"; render(); });

const timing = (window.ccattlerTiming = { first: null, applied: [], revision: null });

// One stream for the whole page: each event is the cluster at a revision.
function connect() {
  const es = new EventSource("/api/events");
  es.addEventListener("state", (ev) => {
    const t0 = performance.now();
    state = JSON.parse(ev.data);
    $("#live").className = "live on";
    $("#live").textContent = "live";
    render();
    // What the browser test and the 5,000-node measurement read: when the
    // first state was painted, and how long each took from arrival to paint.
    const revision = state.revision;
    requestAnimationFrame(() => setTimeout(() => {
      timing.applied.push(performance.now() - t0);
      timing.first ??= performance.now();
      timing.revision = revision;
    }));
  });
  es.onerror = () => { $("#live").className = "live off"; $("#live").textContent = "reconnecting…"; };
}
render();
connect();
