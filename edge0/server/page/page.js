// Edge0's live page: a chat through /v1/chat/completions and the engine's steps from
// /v1/edge0/events (docs/server.md). Plain script, no dependencies, this server only.
"use strict";

const $ = (id) => document.getElementById(id);
const MIB = 1 << 20;
const state = { info: null, request: null, steps: [], totals: null, layers: new Map() };

function pct(a, b) { return b ? (100 * a / b).toFixed(0) + "%" : "-"; }
function fix(x, d) { return Number(x).toFixed(d); }

// --- the event stream --------------------------------------------------------------------
function newTotals() {
  return { decode: 0, wall: 0, compute: 0, blocked: 0, bytes: 0, asked: 0, staged: 0,
    reads: 0, cache: 0, predicted: 0, hits: 0, recallHits: 0, recallSlots: 0 };
}

function onEngine(info) {
  state.info = info;
  $("model").textContent = `${info.model} · ${info.mode} · top-k ${info.top_k} · ${info.tiers}` +
    ` · ${info.slots} slots`;
  const exact = info.exactness === "exact" || info.exactness.startsWith("exact");
  $("mode").textContent = info.exactness;
  $("mode").className = exact ? "badge" : "badge approx";
  $("plan").textContent = info.memory_plan || "no memory budget: sizes as given by the flags";
  for (const l of info.streamed_layers) state.layers.set(l, null);
  draw();
  table();
}

function onStep(ev) {
  if (ev.request !== null && ev.request !== state.request) {  // a new request: a new timeline
    state.request = ev.request;
    state.steps = [];
    state.totals = newTotals();
    for (const l of state.layers.keys()) state.layers.set(l, null);
    $("final").textContent = "";
  }
  state.steps.push(ev);
  if (state.steps.length > 2000) state.steps.shift();
  if (state.totals === null) state.totals = newTotals();
  const t = state.totals;
  if (!ev.prefill) {
    t.decode += 1; t.wall += ev.wall_ms; t.compute += ev.compute_ms;
    t.blocked += ev.blocked_ms; t.bytes += ev.bytes;
  }
  t.recallHits += ev.route_recall[0]; t.recallSlots += ev.route_recall[1];
  for (const r of ev.layers) {
    const acc = state.layers.get(r.layer) || { held: 0, asked: 0, staged: 0, reads: 0, cache: 0,
      predicted: 0, hits: 0, ahead: 0, demand: 0, blocked: 0 };
    acc.held = r.held; acc.asked += r.asked; acc.staged += r.staged;
    acc.reads += r.ahead + r.demand; acc.cache += r.cache_hits;
    acc.predicted += r.predicted; acc.hits += r.predicted_hits;
    acc.ahead += r.ahead; acc.demand += r.demand; acc.blocked += r.blocked_ms;
    state.layers.set(r.layer, acc);
    t.asked += r.asked; t.staged += r.staged; t.reads += r.ahead + r.demand;
    t.cache += r.cache_hits; t.predicted += r.predicted; t.hits += r.predicted_hits;
  }
  statsLine(ev);
}

function statsLine(ev) {
  const t = state.totals, n = t.decode;
  const tps = t.wall ? n / (t.wall / 1000) : 0;
  const recall = state.info && state.info.mode === "route"
    ? (t.recallSlots ? `route recall ${pct(t.recallHits, t.recallSlots)}` : "route recall -")
    : `prediction recall ${pct(t.hits, t.predicted)}`;
  const mode = state.info ? state.info.exactness : "";
  $("stats").textContent = `request ${state.request}: ${n} decode steps, ${fix(tps, 1)} tok/s ` +
    `(step time) | compute ${fix(n ? t.compute / n : 0, 1)} ms/step | blocked ` +
    `${fix(n ? t.blocked / n : 0, 1)} ms/step | reads ${fix(n ? t.bytes / n / MIB : 0, 2)} ` +
    `MiB/step | slot hits ${pct(t.staged, t.asked)} | RAM cache hits ${pct(t.cache, t.reads)} ` +
    `| ${recall} | ${mode}`;
  const l = ev.layers.reduce((a, r) => a + r.ahead, 0), d = ev.layers.reduce((a, r) => a + r.demand, 0);
  $("step").textContent = `step ${ev.step}${ev.prefill ? " (prompt)" : ""}${ev.batch ? " (batch)" : ""}: ` +
    `${fix(ev.wall_ms, 1)} ms, compute ${fix(ev.compute_ms, 1)}, blocked ${fix(ev.blocked_ms, 1)}, ` +
    `${l} reads ahead, ${d} on demand, ${fix(ev.bytes / MIB, 2)} MiB`;
}

function table() {
  const body = $("layers").tBodies[0];
  const rows = [];
  for (const [layer, a] of [...state.layers.entries()].sort((x, y) => x[0] - y[0])) {
    const tr = document.createElement("tr");
    const cells = a ? [layer, a.held, pct(a.staged, a.asked), pct(a.cache, a.reads),
      a.predicted ? pct(a.hits, a.predicted) : "-", a.ahead, a.demand, fix(a.blocked, 1)]
      : [layer, "-", "-", "-", "-", "-", "-", "-"];
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = String(c);
      tr.appendChild(td);
    }
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

// --- the timeline: a column per step, a row per streamed layer -----------------------------
function draw() {
  const cv = $("timeline"), ctx = cv.getContext("2d");
  const layers = [...state.layers.keys()].sort((a, b) => a - b);
  const rowH = Math.max(6, Math.min(18, Math.floor(360 / Math.max(1, layers.length))));
  const top = 14;
  cv.height = top + rowH * Math.max(1, layers.length) + 4;
  ctx.clearRect(0, 0, cv.width, cv.height);
  const steps = state.steps;
  const colW = Math.max(3, Math.min(14, Math.floor(cv.width / Math.max(1, steps.length))));
  const shown = steps.slice(-Math.floor(cv.width / colW));
  // the scale: the 95th percentile of the decode steps' layers (taller bars are cut at the top)
  const scaled = shown.some((s) => !s.prefill) ? shown.filter((s) => !s.prefill) : shown;
  const sizes = scaled.flatMap((s) => s.layers.map((r) => r.compute_ms + r.blocked_ms));
  sizes.sort((a, b) => a - b);
  const peak = Math.max(0.001, sizes.length ? sizes[Math.floor(0.95 * (sizes.length - 1))] : 0);
  const index = new Map(layers.map((l, i) => [l, i]));
  shown.forEach((s, i) => {
    const x = i * colW;
    ctx.fillStyle = s.prefill ? "#c9c9c9" : "#888";
    ctx.fillRect(x, 2, colW - 1, 8 * Math.min(1, s.blocked_ms / Math.max(s.wall_ms, 0.001)) + 2);
    for (const r of s.layers) {
      const y = top + rowH * index.get(r.layer);
      if (y === undefined || Number.isNaN(y)) continue;
      if (s.prefill) { ctx.fillStyle = "#eeeeee"; ctx.fillRect(x, y, colW - 1, rowH - 1); }
      const h = rowH - 4, hc = Math.min(h, h * r.compute_ms / peak);
      const hb = Math.min(h - hc, h * r.blocked_ms / peak);
      ctx.fillStyle = "#3b6fd8"; ctx.fillRect(x, y + h - hc, colW - 1, hc);
      ctx.fillStyle = "#d8443b"; ctx.fillRect(x, y + h - hc - hb, colW - 1, hb);
      if (r.ahead || r.demand) {
        ctx.fillStyle = r.demand ? "#e08a1e" : "#2f9e5b";
        ctx.fillRect(x, y + rowH - 3, colW - 1, 2);
      }
    }
  });
  ctx.fillStyle = "#555"; ctx.font = "10px sans-serif";
  layers.forEach((l, i) => { if (rowH >= 10) ctx.fillText(`L${l}`, cv.width - 26, top + rowH * i + rowH - 3); });
  cv.dataset.steps = String(steps.length);
  cv.dataset.request = state.request === null ? "" : String(state.request);
}

function listen() {
  const es = new EventSource("/v1/edge0/events");
  const feed = (text, on) => { $("feed").textContent = text; $("feed").className = on ? "badge" : "badge off"; };
  es.addEventListener("open", () => feed("events: live", true));
  es.addEventListener("error", () => feed("events: reconnecting", false));
  es.addEventListener("engine", (e) => onEngine(JSON.parse(e.data)));
  es.addEventListener("steps", (e) => {
    for (const ev of JSON.parse(e.data)) onStep(ev);
    draw();
    table();
  });
  es.addEventListener("done", (e) => {
    const d = JSON.parse(e.data);
    if (d.line) $("final").textContent = `engine: ${d.line}`;
  });
  es.addEventListener("dropped", () => { feed("events: dropped (too slow)", false); es.close(); });
  es.addEventListener("end", () => { feed("events: server stopping", false); es.close(); });
}

// --- the chat ------------------------------------------------------------------------------
const history = [];

function say(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function request(prompt) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history, { role: "user", content: prompt });
  const body = { messages, stream: true, stream_options: { include_usage: true },
    temperature: Number($("temperature").value), max_tokens: Number($("max-tokens").value) };
  const stop = $("stop").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (stop.length) body.stop = stop;
  return body;
}

async function ask(prompt) {
  say("user", prompt);
  const out = say("assistant", "");
  $("send").disabled = true;
  let text = "";
  try {
    const res = await fetch("/v1/chat/completions", { method: "POST",
      headers: { "content-type": "application/json" }, body: JSON.stringify(request(prompt)) });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || `HTTP ${res.status}`);
    }
    const reader = res.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const chunk = buf.slice(0, cut); buf = buf.slice(cut + 2);
        for (const line of chunk.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const msg = JSON.parse(data);
          if (msg.error) throw new Error(msg.error.message);
          const c = msg.choices && msg.choices[0];
          if (c && c.delta && c.delta.content) { text += c.delta.content; out.textContent = text; }
          if (msg.usage) {
            const u = msg.usage;
            $("usage").textContent = `usage: ${u.prompt_tokens} prompt + ${u.completion_tokens} ` +
              `completion = ${u.total_tokens} tokens`;
          }
        }
      }
    }
    history.push({ role: "user", content: prompt }, { role: "assistant", content: text });
  } catch (e) {
    say("error", String(e.message || e));
  } finally {
    $("send").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  listen();
  table();
  draw();
  $("ask").addEventListener("submit", (e) => {
    e.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt) return;
    $("prompt").value = "";
    ask(prompt);
  });
});
