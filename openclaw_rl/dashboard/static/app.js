// openclaw-rl dashboard: read-only views over /dashboard/api/*, charts as inline SVG, nothing loaded from elsewhere.
"use strict";
const KEY = "openclaw-rl-dashboard-key";
const REASON_COLORS = ["#b3261e", "#9a6100", "#2457c5", "#6b3fa0", "#0f7c7c", "#8a4b08", "#c2185b", "#455a64",
                       "#558b2f", "#5d4037", "#283593", "#00838f", "#ad1457", "#6d4c41"];
let timer = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v; else if (k === "text") el.textContent = v; else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children.flat(Infinity)) if (c) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}
const fmt = (v, d = 3) => (v === null || v === undefined) ? "–" : (Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 1e-3)) ? v.toExponential(1) : (+v.toFixed(d)).toString();
const when = (t) => t ? new Date(t * 1000).toLocaleTimeString() : "–";
const enc = encodeURIComponent;

async function api(path) {
  const key = sessionStorage.getItem(KEY);
  const res = await fetch("/dashboard/api/" + path, {headers: key ? {Authorization: "Bearer " + key} : {}});
  if (res.status === 401) { askKey(key ? "that key was refused" : ""); throw new Error("unauthorized"); }
  if (!res.ok) throw new Error((await res.json().catch(() => ({}))).error?.message || res.statusText);
  return res.json();
}

function askKey(message) {
  document.getElementById("view").hidden = true;
  const form = document.getElementById("keyform");
  form.hidden = false;
  document.getElementById("keyerror").textContent = message || "";
}
document.getElementById("keyform").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("key").value);
  document.getElementById("keyform").hidden = true;
  document.getElementById("view").hidden = false;
  route();
});

function badge(fate) {
  const s = fate.state;
  let text = s;
  if (s === "dropped") text = "dropped: " + fate.reason;
  else if (s === "trained") text = "trained in step " + fate.step;
  else if (s === "training") text = "in the batch being trained";
  else if (s === "sampled") text = "sampled, waiting in the spool";
  else if (s === "waiting") text = "waiting: " + (fate.reason || "");
  return h("span", {class: "badge " + s, title: fate.detail || null}, text);
}

function lineChart(title, points, name) {
  const W = 320, H = 130, L = 38, R = 8, T = 8, B = 18;
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y0 === y1) { y0 -= 1e-9 + Math.abs(y0) * 0.1; y1 += 1e-9 + Math.abs(y1) * 0.1; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs) === x0 ? x0 + 1 : Math.max(...xs);
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const d = points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
  const last = points[points.length - 1];
  return h("div", {class: "chart", "data-metric": name},
    h("h3", {}, title, h("span", {class: "muted"}, "  last " + fmt(last[1]))),
    svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title},
      svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d9dee4"}),
      svg("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#d9dee4"}),
      svg("text", {x: 2, y: T + 8}, fmt(y1, 2)), svg("text", {x: 2, y: H - B}, fmt(y0, 2)),
      svg("text", {x: L, y: H - 4}, "step " + x0), svg("text", {x: W - R - 48, y: H - 4}, "step " + x1),
      svg("path", {d, fill: "none", stroke: "#2457c5", "stroke-width": 1.8}),
      points.length < 40 ? points.map(p => svg("circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.2, fill: "#2457c5"},
        svg("title", {}, `step ${p[0]}: ${p[1]}`))) : []));
}

function dropChart(drops) {
  const reasons = Object.keys(drops.totals).sort();
  const color = r => REASON_COLORS[reasons.indexOf(r) % REASON_COLORS.length];
  const series = drops.series;
  const W = 320, H = 130, L = 24, B = 18, T = 6;
  const max = Math.max(1, ...series.map(s => Object.values(s.counts).reduce((a, b) => a + b, 0)));
  const bw = (W - L - 4) / Math.max(series.length, 1);
  const bars = [];
  series.forEach((s, i) => {
    let y = H - B;
    for (const r of reasons) {
      const n = s.counts[r] || 0;
      if (!n) continue;
      const hgt = n / max * (H - B - T);
      y -= hgt;
      bars.push(svg("rect", {x: L + i * bw + 1, y, width: Math.max(bw - 2, 1), height: hgt, fill: color(r)},
        svg("title", {}, `${s.label}: ${n} ${r}`)));
    }
  });
  return h("div", {class: "chart", id: "drops-chart"},
    h("h3", {}, "dropped turns by reason", h("span", {class: "muted"}, series.length ? `  per ${series[0].label.startsWith("step") ? "training step" : "minute"}` : "")),
    svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "dropped turns by reason"},
      svg("line", {x1: L, y1: H - B, x2: W, y2: H - B, stroke: "#d9dee4"}),
      svg("text", {x: 2, y: T + 8}, max), svg("text", {x: 2, y: H - B}, 0),
      series.length ? svg("text", {x: L, y: H - 4}, series[0].label) : null,
      series.length > 1 ? svg("text", {x: W - 60, y: H - 4}, series[series.length - 1].label) : null, bars),
    h("div", {class: "legend"}, reasons.map(r => h("span", {}, h("i", {style: null, "data-color": color(r)}), `${r} ${drops.totals[r]}`))));
}

function paintLegend(root) {  // colours set through the CSSOM: the page's CSP allows no inline style attributes
  root.querySelectorAll("i[data-color]").forEach(i => { i.style.background = i.dataset.color; });
}

function sessionTable(sessions) {
  return h("div", {class: "scroll"}, h("table", {id: "sessions"},
    h("thead", {}, h("tr", {}, h("th", {}, "session"), h("th", {}, "turns"), h("th", {}, "what became of them"),
                                h("th", {class: "hide-narrow"}, "last"))),
    h("tbody", {}, sessions.map(s => h("tr", {},
      h("td", {}, h("a", {href: "#/session/" + enc(s.session)}, s.session)), h("td", {}, s.turns),
      h("td", {}, Object.entries(s.states).map(([k, n]) => [h("span", {class: "badge " + k}, `${n} ${k}`), " "])),
      h("td", {class: "hide-narrow"}, when(s.last)))))));
}

async function overview(view) {
  const d = await api("overview");
  const t = d.training, last = t.last || {};
  const turns = d.sessions.reduce((a, s) => a + s.turns, 0);
  const dropped = Object.values(d.drops.totals).reduce((a, b) => a + b, 0);
  const trained = d.sessions.reduce((a, s) => a + (s.states.trained || 0), 0);
  const card = (k, v, id) => h("div", {class: "card", id}, h("div", {class: "v"}, v), h("div", {class: "k"}, k));
  view.replaceChildren(...[
    h("h1", {}, "Is it learning?"),
    h("div", {class: "cards", id: "cards"},
      card("training steps", t.steps, "card-steps"), card("last batch reward", fmt(last["rollout/reward_mean"]), "card-reward"),
      card("learning curve (preferred rate)", last["sim/preferred_rate"] !== undefined ? Math.round(last["sim/preferred_rate"] * 100) + "%" : "–", "card-rate"),
      card("your turns", turns, "card-turns"), card("trained", trained, "card-trained"), card("dropped", dropped, "card-dropped")),
    h("h2", {}, "Training"),
    t.curves.length ? h("div", {class: "charts", id: "charts"}, t.curves.map(c => lineChart(c.title, c.points, c.name)))
                    : h("p", {class: "muted"}, "no training step yet (serve collects samples only; local and train log a line per step)"),
    h("h2", {}, "Why turns were dropped"),
    dropped ? h("div", {class: "charts"}, dropChart(d.drops)) : h("p", {class: "muted", id: "no-drops"}, "no dropped turn"),
    h("h2", {}, "Sessions"), d.sessions.length ? sessionTable(d.sessions.slice(0, 15)) : h("p", {class: "muted"}, "no session for this key yet"),
    d.sessions.length > 15 ? h("p", {}, h("a", {href: "#/sessions"}, `all ${d.sessions.length} sessions`)) : null,
  ].filter(Boolean));
  paintLegend(view);
}

async function sessions(view) {
  const d = await api("overview");
  view.replaceChildren(h("h1", {}, "Sessions"), sessionTable(d.sessions));
}

async function session(view, id) {
  const d = await api("session?id=" + enc(id));
  view.replaceChildren(h("h1", {}, "Session ", h("code", {}, id)),
    h("div", {class: "scroll"}, h("table", {id: "turns"},
      h("thead", {}, h("tr", {}, h("th", {}, "turn"), h("th", {}, "what became of it"), h("th", {}, "reward"),
                                  h("th", {class: "hide-narrow"}, "reply"), h("th", {class: "hide-narrow"}, "time"))),
      h("tbody", {}, d.turns.map(t => h("tr", {},
        h("td", {}, h("a", {href: `#/turn/${enc(id)}/${t.turn}/${enc(t.epoch || "")}`}, "#" + t.turn)),
        h("td", {}, badge(t.fate)), h("td", {}, fmt(t.reward, 2)),
        h("td", {class: "hide-narrow"}, t.reply || ""), h("td", {class: "hide-narrow"}, when(t.time))))))));
}

function tokenView(sample) {
  const adv = sample.advantage;
  const masked = new Set(sample.masked || []);
  const scale = adv ? Math.max(1e-6, ...adv.map(Math.abs)) : 1;
  const spans = sample.tokens.map((text, i) => {
    const a = adv ? adv[i] : null;
    const span = h("span", {class: "tok" + (masked.has(i) ? " masked" : ""),
                            title: a === null || a === undefined ? `token ${i}` : `token ${i}: advantage ${a}`}, text);
    if (a !== null && a !== undefined) {
      const alpha = Math.sqrt(Math.min(1, Math.abs(a) / scale)) * 0.75;  // sqrt: small advantages stay visible
      span.dataset.bg = a >= 0 ? `rgba(31,122,58,${alpha})` : `rgba(179,38,30,${alpha})`;
    }
    return span;
  });
  return h("div", {class: "sample", "data-sample": sample.id},
    h("p", {}, `sample ${sample.kind}, reward ${fmt(sample.reward, 2)}`,
      adv ? ` · teacher advantage per token (log p_teacher − log p_rollout), max |A| ${fmt(scale)}` : " · no per-token teacher signal (RL: every token has the reward as its advantage)"),
    adv ? h("div", {class: "legend"}, h("span", {}, h("i", {"data-color": "rgba(31,122,58,.75)"}), "the teacher prefers it"),
            h("span", {}, h("i", {"data-color": "rgba(179,38,30,.75)"}), "the teacher disfavours it"),
            masked.size ? h("span", {}, "struck: masked out of the loss") : null) : null,
    h("div", {class: "box tokens", id: "tokens-" + sample.id.slice(0, 8)}, spans),
    h("p", {class: "muted tokinfo"}, "tap a token for its advantage"));
}
document.addEventListener("click", (e) => {  // a phone has no hover: a tap shows the token's value
  const tok = e.target.closest && e.target.closest(".tok");
  if (!tok) return;
  const info = tok.closest(".sample").querySelector(".tokinfo");
  info.textContent = `${JSON.stringify(tok.textContent)} — ${tok.title}`;
});

function judgeView(j) {
  if (!j) return h("p", {class: "muted"}, "no judge record (the turn was dropped before judging)");
  const out = [];
  if (j.score !== undefined) out.push(h("p", {}, `PRM score ${j.score} (${j.source || "judge"})`));
  const votes = j.votes || [];
  const reasons = j.reasons || [];
  votes.forEach((v, i) => {
    const score = typeof v === "object" && v !== null ? v.score : v;
    const reasoning = typeof v === "object" && v !== null ? v.raw : reasons[i];
    out.push(h("div", {class: "vote"}, h("strong", {}, `vote ${i + 1}: ${score === null ? "none" : score}`),
      typeof v === "object" && v && v.hint ? h("div", {}, "hint: ", v.hint) : null,
      reasoning ? h("details", {}, h("summary", {}, "reasoning"), h("div", {class: "box"}, reasoning)) : null));
  });
  if (j.hint !== undefined) out.push(h("p", {}, "accepted hint: ", j.hint ? h("q", {id: "hint"}, j.hint) : h("span", {class: "muted"}, "none")));
  if (j.eval) out.push(h("p", {}, `evaluation PRM score ${j.eval.score}`));
  if (j.teacher_error) out.push(h("p", {class: "bad"}, "teacher: " + j.teacher_error));
  if (j.representative_eval) out.push(h("details", {}, h("summary", {}, "representative judge answer"), h("div", {class: "box"}, j.representative_eval)));
  return h("div", {id: "judge"}, out);
}

async function turn(view, id, n, epoch) {
  const d = await api(`turn?session=${enc(id)}&turn=${n}` + (epoch ? `&epoch=${enc(epoch)}` : ""));
  const f = d.fate;
  let why = "";
  if (f.state === "trained") why = `trained in step ${f.step}: sampled by weights ${f.weight_version || "(unversioned)"}, trained into ${f.trained_into}`;
  else if (f.state === "dropped") why = `dropped: ${f.reason}` + (f.detail ? ` (${f.detail})` : "");
  else if (f.state === "waiting") why = `waiting: ${f.reason}`;
  else if (f.state === "training") why = "in the batch the trainer holds now";
  else why = "sampled: waiting in the spool for a training batch";
  view.replaceChildren(...[
    h("p", {}, h("a", {href: "#/session/" + enc(id)}, "← session " + id)),
    h("h1", {}, `Turn ${n}`, " ", badge(f)),
    h("p", {id: "fate"}, why),
    d.prompt ? [h("h2", {}, "Last user message"), h("div", {class: "box"}, d.prompt)] : null,
    h("h2", {}, "Reply"), h("div", {class: "box", id: "reply"}, d.reply ?? "(none)"),
    h("h2", {}, "Next state"), d.next_state ? h("div", {class: "box", id: "next-state"}, `[${d.next_state.role}] ${d.next_state.content}`)
                                            : h("p", {class: "muted"}, "none (the session ended first)"),
    h("h2", {}, "Judge"), judgeView(d.judge),
    d.samples.length ? [h("h2", {}, "Tokens"), d.samples.map(tokenView)] : null,
  ].flat(Infinity).filter(Boolean));
  view.querySelectorAll("[data-bg]").forEach(s => { s.style.background = s.dataset.bg; });
  paintLegend(view);
}

async function route() {
  clearTimeout(timer);
  const view = document.getElementById("view");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "session" && parts[1]) await session(view, parts[1]);
    else if (parts[0] === "turn" && parts[1]) await turn(view, parts[1], +parts[2], parts[3] || "");
    else if (parts[0] === "sessions") await sessions(view);
    else await overview(view);
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.ready = "1";
  } catch (e) {
    if (e.message !== "unauthorized") view.replaceChildren(h("p", {class: "bad"}, "error: " + e.message));
    return;
  }
  if (parts[0] !== "turn") timer = setTimeout(route, 5000);
}
window.addEventListener("hashchange", route);
route();
