// metricvault UI: one small script, no build step. Every number comes from the gateway's JSON
// APIs; every text from data is set with textContent (never innerHTML), so nothing in a
// record can become markup. window.mvCharts holds what each chart drew (tests read it back).
"use strict";
window.mvCharts = {};
window.mvReady = false;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
const UNITS = { train_loss: "loss", learning_rate: "lr", grad_norm: "norm",
  tokens_per_second: "tokens/s", mfu: "MFU (fraction)" };

function $(id) { return document.getElementById(id); }
function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}
async function api(url) {
  const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  const text = await answer.text();
  if (!answer.ok) {
    let words = text.trim();
    try { const j = JSON.parse(text); words = j.error || words; } catch (e) { /* plain text */ }
    throw new Error(`${url.split("?")[0]} answered ${answer.status}: ${words}`);
  }
  return JSON.parse(text);
}
function fmt(value, digits) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return value.toFixed(digits === undefined ? 3 : digits);
  }
  if (Array.isArray(value)) return value.join(", ");
  return String(value);
}
function empty(parent, message) {
  parent.replaceChildren(el("p", message, { class: "empty" }));
}
function chartWidth(node) { return Math.max(320, Math.floor(node.clientWidth || 800)); }

// One uPlot chart: xs shared, ys one array per line; the data is kept in window.mvCharts.
function drawChart(node, key, xs, lines, opts) {
  window.mvCharts[key] = { x: xs, lines: lines.map((l) => ({ label: l.label, y: l.y })) };
  node.replaceChildren();
  const series = [{ label: opts.xLabel }];
  lines.forEach((l, i) => series.push({ label: l.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true }));
  const plot = new uPlot({
    width: chartWidth(node), height: 300, title: opts.title,
    scales: { x: { time: !!opts.time } },
    axes: [{ label: opts.xLabel, stroke: "currentColor" }, { label: opts.yLabel, stroke: "currentColor" }],
    series,
    // when each chart was drawn, on the page's clock (bench/ui.py reads it)
    hooks: { draw: [() => performance.mark("mv-chart-drawn", { detail: key })] },
  }, [xs, ...lines.map((l) => l.y)], node);
  node.dataset.points = String(xs.length);
  return plot;
}

// ------------------------------------------------------------------ experiments
// The table is virtualised: one scroll box as tall as total x row height, holding only the
// rows in view plus a margin (the table moved down by the rows above them, a filler below).
// Rows come in pages of PAGE_ROWS from the server, which filters and sorts; a few pages are
// kept. Arrow keys, PageUp/PageDown, Home/End move the active row (its checkbox focused, so
// Space ticks it for Compare); ticks are kept while rows come and go.
const SUMMARY_COLUMNS = ["gpus", "gpu_hours", "energy_kwh", "final_loss", "mfu_mean"];
const PAGE_ROWS = 100, KEPT_PAGES = 12, MARGIN_ROWS = 20;
function experimentRow(row, picked) {
  const tr = el("tr", null, { "data-id": row.id });
  const box = el("input", null, { type: "checkbox", class: "pick", value: row.id, "aria-label": "select " + row.id });
  box.checked = picked.has(row.id);
  box.addEventListener("change", () => { if (box.checked) picked.add(row.id); else picked.delete(row.id); });
  const first = el("td"); first.append(box); tr.append(first);
  const idCell = el("td"); idCell.append(el("a", row.id, { href: "/ui/experiments/" + encodeURIComponent(row.id) }));
  tr.append(idCell);
  const cells = [["owner", row.owner], ["team", row.team], ["start", row.start], ["end", row.end || "running"],
    ["duration_h", fmt(row.duration_h, 1)]];
  for (const c of SUMMARY_COLUMNS) cells.push([c, fmt(row[c], c === "gpus" ? 0 : (c === "final_loss" || c === "mfu_mean" ? 3 : 1))]);
  cells.push(["git_sha", (row.git_sha || "").slice(0, 10)], ["tags", fmt(row.tags)]);
  for (const [name, text] of cells) {
    const numeric = ["duration_h", ...SUMMARY_COLUMNS].includes(name);
    tr.append(el("td", text, { "data-col": name, class: numeric ? "num" : "", title: name === "tags" ? text : "" }));
  }
  return tr;
}
async function experimentsPage() {
  const params = new URLSearchParams(location.search);
  for (const name of ["q", "tag", "owner", "param"]) $(name).value = params.get(name) || "";
  const state = { sort: params.get("sort") || "start", order: params.get("order") || "desc",
    total: 0, rowHeight: 0, active: -1, generation: 0, pages: new Map(), picked: new Set() };
  const box = $("table-scroll"), tableNode = $("experiments"), filler = $("table-filler");
  const body = tableNode.querySelector("tbody");
  const query = () => {
    const q = new URLSearchParams();
    for (const name of ["q", "tag", "owner", "param"]) if ($(name).value) q.set(name, $(name).value);
    q.set("sort", state.sort); q.set("order", state.order);
    return q;
  };
  // one page of rows (a promise, kept: scrolling back costs no request)
  const page = (n) => {
    if (state.pages.has(n)) {
      const got = state.pages.get(n); state.pages.delete(n); state.pages.set(n, got);
      return got;
    }
    const q = query(); q.set("offset", n * PAGE_ROWS); q.set("limit", PAGE_ROWS);
    const got = api("/api/v1/ui/experiments?" + q.toString());
    got.catch(() => { if (state.pages.get(n) === got) state.pages.delete(n); });
    state.pages.set(n, got);
    while (state.pages.size > KEPT_PAGES) state.pages.delete(state.pages.keys().next().value);
    return got;
  };
  const shown = () => {  // [first, last) rows to render for the current scroll position
    const h = state.rowHeight || 30, total = state.total || PAGE_ROWS;  // unknown: page 0
    const top = Math.floor(box.scrollTop / h), rows = Math.ceil(box.clientHeight / h) + 1;
    return [Math.max(0, Math.min(top, total) - MARGIN_ROWS), Math.min(total, top + rows + MARGIN_ROWS)];
  };
  const render = async () => {
    const generation = state.generation;
    let [first, last] = shown();
    const numbers = [];
    for (let n = Math.floor(first / PAGE_ROWS); n * PAGE_ROWS < Math.max(last, 1); n++) numbers.push(n);
    const pages = await Promise.all(numbers.map(page));
    if (generation !== state.generation) return;
    state.total = pages.length ? pages[0].total : 0;
    last = Math.min(last, state.total);
    first = Math.min(first, last);
    const rows = [];
    pages.forEach((p, i) => p.rows.forEach((row, j) => rows.push([(numbers[i]) * PAGE_ROWS + j, row])));
    const focused = document.activeElement && body.contains(document.activeElement);
    body.replaceChildren(...rows.filter(([i]) => i >= first && i < last).map(([i, row]) => {
      const tr = experimentRow(row, state.picked);
      tr.dataset.index = String(i);
      if (i === state.active) tr.classList.add("active");
      if (i % 2) tr.classList.add("alt");
      return tr;
    }));
    if (!state.rowHeight && body.firstElementChild) state.rowHeight = body.firstElementChild.getBoundingClientRect().height || 30;
    const h = state.rowHeight || 30, end = Math.min(last, first + body.children.length);
    tableNode.style.marginTop = `${first * h}px`;
    filler.style.height = `${Math.max(0, state.total - end) * h}px`;
    if (state.total === 0) {
      const q = query();
      const any = q.has("q") || q.has("tag") || q.has("owner") || q.has("param");
      $("count").textContent = any ? "No experiment matches these filters: clear them to see all."
        : "No experiments yet: `metricvault experiment create` or `metricvault.track()`.";
    } else {
      const top = Math.min(state.total, Math.floor(box.scrollTop / h) + 1);
      const bottom = Math.min(state.total, Math.floor((box.scrollTop + box.clientHeight) / h));
      $("count").textContent = `${state.total} experiment(s); showing ${top}–${Math.max(top, bottom)}`;
    }
    $("prev").disabled = box.scrollTop <= 0;
    $("next").disabled = box.scrollTop + box.clientHeight >= box.scrollHeight - 1;
    if (focused || state.focusActive) {
      state.focusActive = false;
      const tr = body.querySelector(`tr[data-index="${state.active}"]`);
      if (tr) tr.querySelector("input.pick").focus({ preventScroll: true });
    }
  };
  // ready once the latest render is in (a superseded one says nothing)
  const run = () => {
    const generation = state.generation;
    return render().then(() => showError("")).catch((e) => showError(e.message))
      .finally(() => { if (generation === state.generation) window.mvReady = true; });
  };
  const reload = () => {  // filters or order changed: forget the pages, back to the top
    state.generation++; state.pages.clear(); state.active = -1; state.total = 0; box.scrollTop = 0;
    history.replaceState(null, "", "?" + query().toString());
    window.mvReady = false; return run();
  };
  let queued = false;
  box.addEventListener("scroll", () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; state.generation++; run(); });
  });
  const moveTo = (index) => {  // the active row, scrolled into view
    if (!state.total) return;
    const h = state.rowHeight || 30, head = tableNode.tHead.getBoundingClientRect().height;
    state.active = Math.max(0, Math.min(state.total - 1, index));
    const y = state.active * h;
    if (y < box.scrollTop) box.scrollTop = y;
    else if (y + h + head > box.scrollTop + box.clientHeight) box.scrollTop = y + h + head - box.clientHeight;
    state.focusActive = true; state.generation++; run();
  };
  body.addEventListener("focusin", (ev) => {
    const tr = ev.target.closest("tr[data-index]");
    if (tr) state.active = Number(tr.dataset.index);
  });
  const visibleRows = () => Math.max(1, Math.floor(box.clientHeight / (state.rowHeight || 30)) - 2);
  box.addEventListener("keydown", (ev) => {
    const steps = { ArrowDown: 1, ArrowUp: -1, PageDown: visibleRows(), PageUp: -visibleRows() };
    if (ev.key in steps) moveTo((state.active < 0 ? shown()[0] - 1 : state.active) + steps[ev.key]);
    else if (ev.key === "Home") moveTo(0);
    else if (ev.key === "End") moveTo(state.total - 1);
    else return;
    ev.preventDefault();
  });
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); reload(); });
  for (const button of document.querySelectorAll("button.sort")) {
    button.addEventListener("click", () => {
      const col = button.dataset.sort;
      state.order = state.sort === col && state.order === "asc" ? "desc" : "asc";
      state.sort = col; reload();
    });
  }
  const scrollBy = (sign) => {
    window.mvReady = false;
    box.scrollTop += sign * (box.clientHeight - (state.rowHeight || 30));
    state.generation++; run();
  };
  $("prev").addEventListener("click", () => scrollBy(-1));
  $("next").addEventListener("click", () => scrollBy(1));
  $("compare-selected").addEventListener("click", () => {
    const ids = [...state.picked];
    if (ids.length < 1) { showError("Select one or more experiments (the boxes in the first column) to compare."); return; }
    location.href = "/ui/compare?ids=" + ids.map(encodeURIComponent).join(",");
  });
  await reload();
}

// ------------------------------------------------------------------ one experiment
async function experimentPage() {
  await Promise.all([stepCharts(), gpuCharts(), archiveState()]);
}
// The archive state: what `metricvault archive export` wrote for this experiment (snapshot,
// content hash, DVC pointer and tag, pushed), read from the archive's git + DVC repository.
async function archiveState() {
  const box = $("archive");
  const id = box.dataset.experiment;
  const a = await api(`/api/v1/experiments/${encodeURIComponent(id)}/archive`);
  window.mvCharts.archive = a;
  box.dataset.state = a.state;
  box.replaceChildren();
  if (a.state === "not archived") {
    const p = el("p", "Not archived yet: ", { class: "empty", id: "archive-empty" });
    p.append(el("code", a.export_command), document.createTextNode(" writes its snapshot (add --dvc to version, push and tag it)."));
    box.append(p);
    return;
  }
  const t = el("table", null, { class: "kv", id: "archive-state" });
  const rows = [["state", a.state], ["snapshot", a.snapshot + (a.present ? "" : " (not in this workspace)")],
    ["tier", a.tier], ["rows", fmt(a.rows)], ["bytes", a.bytes === null ? "" : bytes(a.bytes)],
    ["content hash", a.content_hash], ["DVC md5", a.md5], ["tag", a.tag],
    ["commit", a.commit ? a.commit.slice(0, 12) : ""], ["DVC remote", a.remote],
    ["pushed", a.pushed === null ? "unknown" : (a.pushed ? "yes" : "no")]];
  for (const [k, v] of rows) {
    if (v === null || v === undefined || v === "") continue;
    const tr = el("tr", null, { "data-field": k.replace(/ /g, "_") }); tr.append(el("th", k), el("td", v)); t.append(tr);
  }
  box.append(t);
  if (a.export_command) {
    const p = el("p", "To finish archiving it: ", { class: "empty" }); p.append(el("code", a.export_command)); box.append(p);
  }
}
const X_AXES = { step: ["training step", "by step"], elapsed: ["hours since start", "by hours since start"], time: ["time (UTC)", "by wall time"] };
async function stepCharts() {
  const box = $("charts");
  const id = box.dataset.experiment;
  const picked = new URLSearchParams(location.search).get("align");
  const select = $("curve-align");
  select.value = X_AXES[picked] ? picked : "step";
  if (!select.dataset.bound) {
    select.dataset.bound = "1";
    select.addEventListener("change", () => {
      history.replaceState(null, "", "?" + new URLSearchParams({ align: select.value }));
      window.mvReady = false;
      stepCharts().then(() => showError("")).catch((e) => showError(e.message)).finally(() => { window.mvReady = true; });
    });
  }
  const align = select.value;
  const data = await api(`/api/v1/experiments/${encodeURIComponent(id)}/history?align=${align}&width=${chartWidth(box) / 2 | 0}`);
  box.replaceChildren();
  const names = Object.keys(data.metrics);
  if (!names.length) {
    empty(box, data.why || "No training curves for this experiment: log them with metricvault.track() (run.log(step, loss=...)).");
    return;
  }
  box.classList.add("charts-grid");
  const [xLabel, by] = X_AXES[align];
  for (const name of names) {
    const node = el("div", null, { class: "chart", id: "chart-" + name, role: "img", "aria-label": `${name} ${by}` });
    box.append(node);
    const m = data.metrics[name];
    drawChart(node, name, m.x, [{ label: name, y: m.y }], { title: `${name} ${by}`, xLabel, yLabel: UNITS[name] || name, time: align === "time" });
    window.mvCharts[name].align = align;
  }
  if (data.missing.length) box.append(el("p", "Not logged by this run: " + data.missing.join(", "), { class: "empty" }));
}
async function gpuCharts() {
  const box = $("gpu-charts");
  const id = box.dataset.experiment;
  const data = await api(`/api/v1/experiments/${encodeURIComponent(id)}/gpus?width=${chartWidth(box) / 2 | 0}`);
  const names = Object.keys(data.metrics);
  if (!names.length) {
    empty(box, "No GPU series in this run's window: its selector matches no DCGM metrics (point `metricvault agent` or dcgm-exporter at the gateway).");
    return;
  }
  box.classList.add("charts-grid");
  for (const name of names) {
    const m = data.metrics[name];
    const node = el("div", null, { class: "chart", id: "chart-" + name, role: "img", "aria-label": `${m.unit} per GPU over time` });
    box.append(node);
    drawChart(node, name, m.x, m.lines, { title: `${m.unit} per GPU`, xLabel: "time (UTC)", yLabel: m.unit, time: true });
  }
  if (data.missing.length) box.append(el("p", "No series of " + data.missing.join(", ") + " in this run.", { class: "empty" }));
}

// ------------------------------------------------------------------ compare
function ema(values, weight) {
  // TensorBoard's debiased exponential moving average; gaps stay gaps
  if (!weight) return values;
  let last = 0, n = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return v;
    last = last * weight + (1 - weight) * v; n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}
async function comparePage() {
  const params = new URLSearchParams(location.search);
  $("ids").value = params.get("ids") || "";
  $("metric").value = params.get("metric") || "train_loss";
  $("align").value = ["step", "elapsed", "time"].includes(params.get("align")) ? params.get("align") : "step";
  $("smoothing").value = params.get("smoothing") || "0";
  $("smoothing-value").textContent = $("smoothing").value;
  let data = null;
  const draw = () => {
    const weight = Number($("smoothing").value);
    $("smoothing-value").textContent = weight.toFixed(2);
    const q = new URLSearchParams({ ids: $("ids").value, metric: $("metric").value, align: $("align").value, smoothing: String(weight) });
    history.replaceState(null, "", "?" + q.toString());
    $("share-link").href = location.href; $("share-link").textContent = location.href;
    if (!data) return;
    const xs = [...new Set(Object.values(data.curves).flatMap((c) => (c ? c.x : [])))].sort((a, b) => a - b);
    const lines = data.ids.filter((id) => data.curves[id]).map((id) => {
      const c = data.curves[id], at = new Map(c.x.map((x, i) => [x, c.y[i]]));
      return { label: id, y: ema(xs.map((x) => (at.has(x) ? at.get(x) : null)), weight) };
    });
    const node = $("compare-chart");
    const by = { step: "by step", elapsed: "by hours since start", time: "by wall time" }[data.align];
    if (!lines.length) { empty(node, `None of these experiments has ${data.metric} ${by}: check the metric name, or align by another axis.`); return; }
    drawChart(node, "compare", xs, lines, { title: `${data.metric} ${by}`, xLabel: data.x_label, yLabel: UNITS[data.metric] || data.metric, time: data.align === "time" });
    window.mvCharts.compare.align = data.align; window.mvCharts.compare.smoothing = weight;
  };
  const load = async () => {
    const ids = $("ids").value.trim();
    if (!ids) {
      empty($("compare-chart"), "Pick experiments to compare: tick them on the Experiments page, or type ids separated by commas.");
      return;
    }
    // the curves first, drawn as soon as they come; then (after the chart's frame, so that
    // the server's work on them does not compete with the draw) the summary figures
    const url = `/api/v1/compare?ids=${encodeURIComponent(ids)}&metric=${encodeURIComponent($("metric").value)}&align=${encodeURIComponent($("align").value)}&width=${chartWidth($("compare-chart"))}`;
    data = await api(url + "&summaries=0");
    draw();
    await new Promise((resolve) => { requestAnimationFrame(() => setTimeout(resolve, 0)); setTimeout(resolve, 250); });
    const summaries = api(url + "&curves=0");
    const table = $("param-table"); table.replaceChildren();
    const ph = el("tr"); ph.append(el("th", "param")); data.ids.forEach((id) => ph.append(el("th", id))); table.append(ph);
    if (!data.params.length) table.append(el("tr")).append(el("td", "These experiments record no params."));
    for (const p of data.params) {
      const tr = el("tr", null, { class: p.differs ? "differs" : "", "data-param": p.param }); tr.append(el("th", p.param));
      data.ids.forEach((id) => tr.append(el("td", p.values[id])));
      table.append(tr);
    }
    const sums = $("summaries"); sums.replaceChildren();
    const head = el("tr"); ["experiment", "GPUs", "GPU-h", "kWh", "final loss", "mean MFU"].forEach((h) => head.append(el("th", h)));
    sums.append(head);
    for (const s of (await summaries).summaries) {
      const tr = el("tr", null, { "data-id": s.id }); tr.append(el("td", s.id));
      for (const [c, d] of [["gpus", 0], ["gpu_hours", 1], ["energy_kwh", 1], ["final_loss", 3], ["mfu_mean", 3]]) tr.append(el("td", fmt(s[c], d), { class: "num", "data-col": c }));
      sums.append(tr);
    }
  };
  $("compare-form").addEventListener("submit", (ev) => { ev.preventDefault(); window.mvReady = false; load().then(() => showError("")).catch((e) => showError(e.message)).finally(() => { window.mvReady = true; }); });
  $("smoothing").addEventListener("input", draw);
  $("align").addEventListener("change", () => { window.mvReady = false; load().then(() => showError("")).catch((e) => showError(e.message)).finally(() => { window.mvReady = true; }); });
  await load();
}

// ------------------------------------------------------------------ explore
const RANGE_S = { "15m": 900, "1h": 3600, "6h": 21600, "1d": 86400, "7d": 604800, "30d": 2592000,
  "90d": 7776000, "1y": 31536000, "3y": 94608000 };
function seriesName(metric) {
  const name = metric.__name__ || "";
  const labels = Object.entries(metric).filter(([k]) => k !== "__name__").map(([k, v]) => `${k}="${v}"`);
  return name + (labels.length ? `{${labels.join(", ")}}` : "");
}
// Completion in the PromQL box, as the Prometheus UI offers it: a metric name where a name
// is being typed, label names after `{` or `,`, label values after `name="`. Candidates come
// from /api/v1/labels and /api/v1/label/<name>/values, narrowed to the metric before `{`.
const completions = new Map();
function candidates(url) {
  if (!completions.has(url)) completions.set(url, api(url).then((a) => a.data || []).catch(() => []));
  return completions.get(url);
}
function completionContext(before) {
  const open = before.lastIndexOf("{"), close = before.lastIndexOf("}");
  if (open > close) {
    const metric = (before.slice(0, open).match(/([a-zA-Z_:][a-zA-Z0-9_:]*)\s*$/) || [])[1] || "";
    const inner = before.slice(open + 1);
    const value = inner.match(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)$/);
    if (value) return { kind: "value", metric, label: value[1], partial: value[2] };
    const name = inner.match(/(?:^|,)\s*([a-zA-Z_][a-zA-Z0-9_]*)?$/);
    if (name) return { kind: "name", metric, partial: name[1] || "" };
    return null;
  }
  const word = before.match(/([a-zA-Z_:][a-zA-Z0-9_:]*)$/);
  if (!word || /[0-9]$/.test(before.slice(0, -word[1].length))) return null;
  return { kind: "metric", partial: word[1] };
}
function quoted(value) { return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n"); }
function setupCompletion(input, list) {
  let shown = [], active = -1, context = null, asked = 0;
  const close = () => { list.replaceChildren(); list.hidden = true; shown = []; active = -1; input.setAttribute("aria-expanded", "false"); };
  const mark = () => [...list.children].forEach((li, i) => li.setAttribute("aria-selected", i === active ? "true" : "false"));
  const accept = (choice) => {
    const caret = input.selectionStart, before = input.value.slice(0, caret), after = input.value.slice(caret);
    const head = before.slice(0, before.length - context.partial.length);
    const text = context.kind === "value" ? quoted(choice) + (after.startsWith('"') ? "" : '"')
      : context.kind === "name" ? choice + '="' : choice;
    input.value = head + text + after;
    const at = head.length + text.length;
    input.setSelectionRange(at, at);
    close(); input.focus(); refresh();
  };
  const refresh = async () => {
    const ask = ++asked;
    context = completionContext(input.value.slice(0, input.selectionStart));
    if (!context) { close(); return; }
    const match = context.metric ? "?" + new URLSearchParams({ "match[]": context.metric }) : "";
    const url = context.kind === "metric" ? "/api/v1/label/__name__/values"
      : context.kind === "name" ? "/api/v1/labels" + match
        : `/api/v1/label/${encodeURIComponent(context.label)}/values` + match;
    const all = await candidates(url);
    if (ask !== asked) return; // a later keystroke asked again
    const hidden = context.kind === "name" ? ["__name__"] : [];
    shown = all.filter((c) => c.startsWith(context.partial) && !hidden.includes(c) && !(context.kind === "metric" && c === context.partial)).slice(0, 50);
    list.replaceChildren(...shown.map((c, i) => {
      const li = el("li", c, { role: "option", id: "suggest-" + i, "data-value": c, "data-kind": context.kind });
      li.addEventListener("mousedown", (ev) => { ev.preventDefault(); accept(c); });
      return li;
    }));
    list.hidden = !shown.length; active = shown.length ? 0 : -1; mark();
    list.dataset.kind = context.kind;
    input.setAttribute("aria-expanded", shown.length ? "true" : "false");
  };
  input.addEventListener("input", refresh);
  input.addEventListener("click", refresh);
  input.addEventListener("blur", () => setTimeout(close, 150));
  input.addEventListener("keydown", (ev) => {
    if (!shown.length) return;
    if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      ev.preventDefault();
      active = (active + (ev.key === "ArrowDown" ? 1 : shown.length - 1)) % shown.length; mark();
      input.setAttribute("aria-activedescendant", "suggest-" + active);
    } else if ((ev.key === "Tab" || ev.key === "Enter") && active >= 0) {
      ev.preventDefault(); accept(shown[active]);
    } else if (ev.key === "Escape") close();
  });
  close();
}
// Steps a person reads (and the rollup tiers' whole minutes and hours): the range over the
// chart's width, rounded up to one of these, with start and end on whole steps.
const NICE_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
function niceStep(seconds) { return NICE_STEPS.find((s) => s >= seconds) || Math.ceil(seconds / 86400) * 86400; }
function tierWords(servedBy, horizon, start) {
  if (servedBy && servedBy.length) {
    const raw = horizon && start * 1000 < horizon ? ` (raw samples begin ${new Date(horizon).toISOString()})` : "";
    return `the ${servedBy.join(" and ")} rollup tier${servedBy.length > 1 ? "s" : ""}${raw}`;
  }
  return "raw samples";
}
async function explorePage() {
  const params = new URLSearchParams(location.search);
  $("expr").value = params.get("expr") || "";
  $("range").value = params.get("range") || "1h";
  setupCompletion($("expr"), $("suggest"));
  const run = async () => {
    const expr = $("expr").value.trim();
    const chart = $("explore-chart");
    $("warnings").replaceChildren();
    $("served-by").textContent = ""; delete $("served-by").dataset.tiers;
    if (!expr) { empty(chart, "Type a PromQL expression (metric names, label names and values complete as you type) and press Run."); return; }
    const span = RANGE_S[$("range").value];
    history.replaceState(null, "", "?" + new URLSearchParams({ expr, range: $("range").value }).toString());
    const step = niceStep(Math.max(1, Math.ceil(span / chartWidth(chart))));
    const end = Math.floor(Date.now() / 1000 / step) * step, start = end - Math.ceil(span / step) * step;
    const q = new URLSearchParams({ query: expr, start, end, step });
    // where raw samples begin (only the tier sentence needs it): asked beside the query, and
    // the chart is drawn without waiting for it
    const horizon = api("/api/v1/vault/stats?only=raw_horizon").catch(() => ({}));
    const answer = await api("/api/v1/query_range?" + q);
    const tiers = answer.servedBy || [];
    window.mvCharts.exploreQuery = { query: expr, start, end, step };
    $("query-info").textContent = `step ${step}s over ${$("range").value}`;
    for (const w of answer.warnings || []) $("warnings").append(el("li", w));
    const servedBy = async () => {
      const stats = await horizon;
      $("served-by").textContent = "Answered from " + tierWords(tiers, stats.raw_horizon, start);
      $("served-by").dataset.tiers = tiers.length ? tiers.join(",") : "raw";
    };
    const result = answer.data.result || [];
    if (!result.length) { empty(chart, "The query returned no series in this range: try a longer range or check the metric name."); $("explore-table").replaceChildren(); await servedBy(); return; }
    const xs = [...new Set(result.flatMap((s) => s.values.map((v) => v[0])))].sort((a, b) => a - b);
    const lines = result.slice(0, 50).map((s) => {
      const at = new Map(s.values.map((v) => [v[0], Number(v[1])]));
      return { label: seriesName(s.metric), y: xs.map((x) => (at.has(x) ? at.get(x) : null)) };
    });
    drawChart(chart, "explore", xs, lines, { title: expr, xLabel: "time (UTC)", yLabel: "value", time: true });
    // uPlot draws in a microtask: let it (and a paint) happen before the table and the CSV
    await new Promise((resolve) => setTimeout(resolve, 0));
    const table = $("explore-table"); table.replaceChildren();
    const head = el("tr"); ["series", "last time", "last value", "points"].forEach((h) => head.append(el("th", h))); table.append(head);
    const csv = ["series,timestamp,value"];
    for (const s of result) {
      const last = s.values[s.values.length - 1];
      const tr = el("tr"); tr.append(el("td", seriesName(s.metric)), el("td", new Date(last[0] * 1000).toISOString()), el("td", last[1], { class: "num" }), el("td", s.values.length, { class: "num" }));
      table.append(tr);
      for (const [t, v] of s.values) csv.push(`"${seriesName(s.metric).replace(/"/g, '""')}",${t},${v}`);
    }
    $("csv").href = URL.createObjectURL(new Blob([csv.join("\n") + "\n"], { type: "text/csv" }));
    window.mvCharts.exploreResult = result;
    await servedBy();
  };
  $("explore-form").addEventListener("submit", (ev) => { ev.preventDefault(); window.mvReady = false; run().then(() => showError("")).catch((e) => showError(e.message)).finally(() => { window.mvReady = true; }); });
  await run();
}

// ------------------------------------------------------------------ alerts
function alertRow(x, role) {
  const tr = el("tr", null, { class: role || "", "data-alert": x.labels.alertname || "", "data-state": x.state });
  const rest = Object.fromEntries(Object.entries(x.labels).filter(([k]) => !["alertname", "incident", "root_cause"].includes(k)));
  tr.append(el("td", x.state), el("td", x.labels.alertname), el("td", seriesName(rest)), el("td", x.activeAt), el("td", x.value || ""));
  return tr;
}
function alertHead() {
  const head = el("tr"); ["state", "alert", "labels", "active since", "value"].forEach((h) => head.append(el("th", h))); return head;
}
async function alertsPage() {
  const alerts = $("alerts"), rules = $("rules"), box = $("incidents");
  const data = await api("/api/v1/ui/alerts");
  window.mvCharts.alerts = data;
  box.replaceChildren();
  const firing = data.incidents.length + data.ungrouped.length;
  $("alert-summary").textContent = firing ? `${data.incidents.length} incident(s); ${data.ungrouped.length} alert(s) in none` : "";
  for (const inc of data.incidents) {
    const section = el("section", null, { class: "incident", "data-incident": inc.incident });
    const cause = inc.root_cause;
    const title = cause ? `${inc.incident}: ${(inc.cause || "").replace(/_/g, " ")}` : `${inc.incident} (root cause not named yet)`;
    section.append(el("h3", title));
    if (cause && cause.annotations && cause.annotations.description) section.append(el("p", cause.annotations.description, { class: "cause" }));
    const t = el("table", null, { class: "data" }); t.append(alertHead());
    if (cause) t.append(alertRow(cause, "root-cause"));
    for (const x of inc.evidence) t.append(alertRow(x, "evidence"));
    section.append(t); box.append(section);
  }
  if (!data.ungrouped.length) empty(alerts, firing ? "Every alert is in an incident." : "Nothing is firing or pending.");
  else { alerts.replaceChildren(alertHead()); for (const x of data.ungrouped) alerts.append(alertRow(x)); }
  if (!data.rules.length) empty(rules, data.tenant ? "The rules evaluated here are not this tenant's." : "No rule groups loaded: start `metricvault serve --rules rules.yml` to see alerts and rule health.");
  else {
    const head = el("tr"); ["group", "rule", "type", "health", "last error", "last evaluation"].forEach((h) => head.append(el("th", h))); rules.replaceChildren(head);
    for (const x of data.rules) {
      const tr = el("tr", null, { "data-rule": x.rule, "data-health": x.health || "" });
      tr.append(el("td", x.group), el("td", x.rule), el("td", x.type), el("td", x.health), el("td", x.last_error), el("td", x.last_evaluation || "")); rules.append(tr);
    }
  }
  const params = new URLSearchParams(location.search);
  if (params.get("range")) $("anomaly-range").value = params.get("range");
  $("anomaly-form").addEventListener("submit", (ev) => { ev.preventDefault(); window.mvReady = false; anomalyCharts().then(() => showError("")).catch((e) => showError(e.message)).finally(() => { window.mvReady = true; }); });
  await anomalyCharts();
}
// Anomaly scores over the chosen range, and for the highest ones their source series beside
// the baseline learned for it (metricvault baseline: mean, P95, P99 as flat lines).
async function anomalyCharts() {
  const span = $("anomaly-range").value;
  history.replaceState(null, "", "?" + new URLSearchParams({ range: span }));
  const chart = $("anomaly-score-chart"), charts = $("anomaly-charts"), table = $("anomaly-table");
  const data = await api(`/api/v1/ui/anomalies?range=${encodeURIComponent(span)}&width=${chartWidth(chart) / 2 | 0}`);
  window.mvCharts.anomalies = data;
  charts.replaceChildren(); table.replaceChildren();
  if (!data.top.length) {
    empty(chart, `No anomaly scores in the last ${span}: set anomaly_score_selectors and run \`metricvault maintain\` (docs/anomaly.md).`);
    $("anomaly-info").textContent = "";
    return;
  }
  $("anomaly-info").textContent = `${data.series} scored series in the last ${span}; the ${data.top.length} with the highest scores:`;
  const xs = [...new Set(data.top.flatMap((a) => a.score.x))].sort((a, b) => a - b);
  const lines = data.top.map((a) => { const at = new Map(a.score.x.map((x, i) => [x, a.score.y[i]])); return { label: shortName(a), y: xs.map((x) => (at.has(x) ? at.get(x) : null)) }; });
  drawChart(chart, "anomaly_score", xs, lines, { title: `anomaly score (last ${span})`, xLabel: "time (UTC)", yLabel: "score", time: true });
  const head = el("tr"); ["series", "detector", "max score", "baseline mean", "baseline P95", "baseline P99"].forEach((h) => head.append(el("th", h))); table.append(head);
  charts.classList.add("charts-grid");
  data.top.forEach((a, i) => {
    const name = seriesName({ __name__: a.source_metric, ...sourceLabels(a.labels) });
    const b = a.baseline || {};
    const tr = el("tr", null, { "data-series": name });
    tr.append(el("td", name), el("td", a.detector || ""), el("td", fmt(a.max_score, 3), { class: "num", "data-col": "max_score" }),
      el("td", fmt(b.mean, 2), { class: "num", "data-col": "mean" }), el("td", fmt(b.p95, 2), { class: "num", "data-col": "p95" }), el("td", fmt(b.p99, 2), { class: "num", "data-col": "p99" }));
    table.append(tr);
    if (!a.source) return;
    const node = el("div", null, { class: "chart", id: `anomaly-${i}`, role: "img", "aria-label": `${name} beside its baseline` });
    charts.append(node);
    const lines2 = [{ label: a.source_metric, y: a.source.y }];
    for (const stat of ["mean", "p95", "p99"]) if (b[stat] !== undefined) lines2.push({ label: `baseline ${stat}`, y: a.source.x.map(() => b[stat]) });
    drawChart(node, `anomaly_${i}`, a.source.x, lines2, { title: `${shortName(a)} and its baseline`, xLabel: "time (UTC)", yLabel: a.source_metric, time: true });
  });
}
// A scored series' name on the charts: its metric and host/GPU where it has them, else all
// its labels.
function shortName(a) {
  const l = sourceLabels(a.labels);
  const host = l.Hostname || l.hostname || l.instance || "";
  const where = [host, l.gpu !== undefined ? `gpu ${l.gpu}` : ""].filter(Boolean).join(" ");
  return where ? `${a.source_metric} ${where}` : seriesName({ __name__: a.source_metric, ...l });
}
function sourceLabels(labels) {
  return Object.fromEntries(Object.entries(labels).filter(([k]) => !["__name__", "source_metric", "detector"].includes(k)));
}

// ------------------------------------------------------------------ vault
function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
async function vaultPage() {
  const s = await api("/api/v1/vault/stats");
  const storage = $("storage"); storage.replaceChildren();
  if (s.tiers) {
    storage.append(el("p", `${fmt(s.series)} series; stored ${bytes(s.stored_bytes)}; rollup lag ${fmt(Math.round((s.rollup.lag_ms || 0) / 1000))} s (${fmt(s.rollup.pending_hours)} hour(s) pending); buffer ${fmt(s.buffer.samples)} samples (${bytes(s.buffer.bytes)})`, { id: "summary" }));
    const t = el("table", null, { class: "data", id: "tiers" });
    const head = el("tr"); ["tier", "files", "rows", "bytes", "bytes/row", "first", "last"].forEach((h) => head.append(el("th", h))); t.append(head);
    for (const [name, x] of Object.entries(s.tiers)) {
      const tr = el("tr", null, { "data-tier": name });
      tr.append(el("td", name), el("td", fmt(x.files), { class: "num" }), el("td", fmt(x.rows), { class: "num", "data-col": "rows" }), el("td", bytes(x.bytes), { class: "num" }),
        el("td", fmt(x.bytes_per_row, 2), { class: "num" }), el("td", x.first ? new Date(x.first).toISOString() : ""), el("td", x.last ? new Date(x.last).toISOString() : ""));
      t.append(tr);
    }
    storage.append(t);
  } else {
    storage.append(el("p", `${fmt(s.series)} series of tenant ${s.tenant}. The storage figures of the whole vault are shown to an administrator credential only.`, { id: "summary" }));
  }
  agentsTable(s.agents || []);
  const ret = $("retention"); ret.replaceChildren();
  const rh = el("tr"); ["tier", "kept for", "series"].forEach((h) => rh.append(el("th", h))); ret.append(rh);
  for (const [tier, kept] of Object.entries(s.retention || {})) {
    const tr = el("tr", null, { "data-tier": tier }); tr.append(el("td", tier), el("td", kept, { "data-col": "retention" }), el("td", "all (default)")); ret.append(tr);
  }
  for (const o of s.retention_overrides || []) {
    const tr = el("tr", null, { class: "override", "data-tier": o.tier }); tr.append(el("td", o.tier), el("td", o.retention, { "data-col": "retention" }), el("td", o.selector)); ret.append(tr);
  }
  ingest();
  table($("label-cardinality"), ["label", "series", "distinct values"], (s.labels || []).map((r) => [r.label, fmt(r.series), fmt(r.values)]), "label");
  table($("top-values"), ["label", "value", "series"], (s.top_values || []).map((r) => [r.label, r.value, fmt(r.series)]), "value");
  const card = $("cardinality"); card.replaceChildren();
  if (!s.cardinality.length) { empty(card, "No series yet: point Prometheus or `metricvault agent` at this gateway."); return; }
  const head = el("tr"); head.append(el("th", "metric"), el("th", "series")); card.append(head);
  for (const c of s.cardinality) { const tr = el("tr", null, { "data-metric": c.metric }); tr.append(el("td", c.metric), el("td", fmt(c.series), { class: "num" })); card.append(tr); }
}
// Agents seen: from their own series (metricvault_agent_info, and the push series of those
// that push), newest first; the age is their last sample's.
function age(seconds) {
  if (seconds < 120) return `${Math.round(seconds)} s ago`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h ago`;
  return `${(seconds / 86400).toFixed(1)} days ago`;
}
function agentsTable(agents) {
  const node = $("agents"); node.replaceChildren();
  if (!agents.length) { empty(node, "No agent seen in the last 7 days: run `metricvault agent --push http://THIS-GATEWAY` on a GPU host, or let Prometheus scrape one (`metricvault prometheus-config --agent`)."); return; }
  const head = el("tr"); ["host", "instance", "profile", "how", "last sample", "age", "pushes stored", "version", "GPU source"].forEach((h) => head.append(el("th", h))); node.append(head);
  for (const a of agents) {
    const tr = el("tr", null, { "data-instance": a.instance });
    tr.append(el("td", a.hostname, { "data-col": "hostname" }), el("td", a.instance), el("td", a.profile || "", { "data-col": "profile" }),
      el("td", a.mode === "push" ? "pushes" : "scraped", { "data-col": "mode" }), el("td", new Date(a.last_ms).toISOString(), { "data-col": "last" }),
      el("td", age(a.age_s), { "data-col": "age" }), el("td", a.sent_requests === null ? "" : fmt(a.sent_requests), { class: "num", "data-col": "sent" }),
      el("td", a.version || ""), el("td", a.gpu_source || ""));
    node.append(tr);
  }
}
function table(node, heads, rows, key) {
  node.replaceChildren();
  if (!rows.length) { empty(node, "No series yet."); return; }
  const head = el("tr"); heads.forEach((h) => head.append(el("th", h))); node.append(head);
  for (const r of rows) {
    const tr = el("tr", null, { ["data-" + key]: r[heads.indexOf(key)] });
    r.forEach((c, i) => tr.append(el("td", c, { "data-col": heads[i] }))); node.append(tr);
  }
}
// The gateway's own counters (its /metrics exposition): totals since it started, and the
// ingest rate between two reads a few seconds apart.
function counters(text) {
  const out = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^(metricvault_(?:samples_stored|samples_dropped|requests_rejected)_total)\{[a-z]+="([^"]*)"\} ([0-9.eE+-]+)$/);
    if (m) out[`${m[1]}|${m[2]}`] = Number(m[3]);
  }
  return out;
}
const INGEST_EVERY_MS = 3000;
async function ingest() {
  const read = async () => {
    const answer = await fetch("/metrics", { credentials: "same-origin" });
    if (!answer.ok) throw new Error(`/metrics answered ${answer.status}`);
    return { at: performance.now(), values: counters(await answer.text()) };
  };
  let before;
  try { before = await read(); } catch (e) { empty($("ingest"), "This gateway's counters are not readable (/metrics): " + e.message); return; }
  const show = (now) => {
    const rows = Object.entries(now.values).map(([k, v]) => {
      const [name, label] = k.split("|");
      const what = { metricvault_samples_stored_total: "samples stored", metricvault_samples_dropped_total: "samples dropped", metricvault_requests_rejected_total: "requests rejected" }[name];
      return [what, label, fmt(v)];
    });
    table($("ingest"), ["counter", "by", "since start"], rows, "by");
    if (!rows.length) empty($("ingest"), "Nothing written to this gateway since it started (a `metricvault ui` never ingests).");
  };
  show(before);
  const tick = async () => {
    let now;
    try { now = await read(); } catch (e) { return; }
    const stored = (v) => Object.entries(v).filter(([k]) => k.startsWith("metricvault_samples_stored_total|")).reduce((a, [, x]) => a + x, 0);
    const rejected = (v) => Object.entries(v).filter(([k]) => k.startsWith("metricvault_requests_rejected_total|")).reduce((a, [, x]) => a + x, 0);
    const seconds = (now.at - before.at) / 1000;
    const rate = (stored(now.values) - stored(before.values)) / seconds;
    const node = $("ingest-rate");
    node.textContent = `ingest: ${rate.toFixed(1)} samples/s, ${(rejected(now.values) - rejected(before.values)).toLocaleString("en-US")} request(s) rejected over the last ${seconds.toFixed(0)} s`;
    node.dataset.stored = String(stored(now.values));
    node.dataset.rate = String(rate);
    show(now); before = now;
  };
  setInterval(tick, INGEST_EVERY_MS);
}

const PAGES = { experiments: experimentsPage, experiment: experimentPage, compare: comparePage,
  explore: explorePage, alerts: alertsPage, vault: vaultPage };
function csrfToken() {
  const m = document.cookie.match(/(?:^|;\s*)mv_csrf=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}
// Logging out is a POST with the session's CSRF token (double submit: the mv_csrf cookie's
// value in X-CSRF-Token); the form shows only while a login session is open.
function setupLogout() {
  const form = $("logout");
  if (!form || !csrfToken()) return;
  form.hidden = false;
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const answer = await fetch("/ui/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrfToken() } });
    if (answer.ok || answer.redirected) location.href = "/ui/login"; else showError(`logout answered ${answer.status}: ${(await answer.text()).trim()}`);
  });
}
document.addEventListener("DOMContentLoaded", () => {
  setupLogout();
  const run = PAGES[document.body.dataset.page];
  if (!run) { window.mvReady = true; return; }
  run().catch((e) => showError(e.message)).finally(() => { window.mvReady = true; });
});
