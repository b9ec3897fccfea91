// The dashboard page the monitor's HTTP endpoint serves at /: one document, no asset from anywhere
// else. It polls /status every two seconds and draws the members, the job and its workers, a
// timeline of membership events and the generations this node installed, every node's figures as the monitor gossip brought them here
// (stale ones marked), and SVG charts whose points a test can count: the node's training history
// (loss, samples/s, the rate), rank 0's evaluations (test accuracy), and each node's speed and
// bytes in and out per second since the page opened. A status it cannot fetch is shown as such; the
// last figures stay.

#include "actors/monitor_http.hpp"

namespace tepdist::actors {

const std::string& MonitorHttp::dashboard_html() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tepdist</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .2em; }
h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
table { border-collapse: collapse; }
th, td { padding: .2em .8em .2em 0; text-align: left; }
th { border-bottom: 1px solid #999; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.dead, .stale { color: #b00; }
.suspect { color: #b60; }
.left { color: #777; }
#error { color: #b00; }
svg { border: 1px solid #ccc; background: #fafafa; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
</style>
</head>
<body>
<h1>tepdist <span id="source"></span></h1>
<div id="error"></div>
<div id="job">no job</div>
<h2>Members (<span id="member-count">0</span>)</h2>
<table id="members"><thead><tr><th>id</th><th>state</th><th>address</th><th>region</th><th>roles</th></tr></thead><tbody></tbody></table>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>id</th><th>state</th><th>age</th><th>generation</th><th>step</th><th>step ms</th><th>samples/s</th><th>loss</th><th>accuracy</th><th>MB in</th><th>MB out</th><th>queued KB</th></tr></thead><tbody></tbody></table>
<h2>Workers</h2>
<table id="workers"><thead><tr><th>id</th><th>position</th><th>step</th><th>lag</th><th>samples/s</th><th>share</th><th>staleness</th></tr></thead><tbody></tbody></table>
<h2>Training</h2>
<div class="charts">
<figure><svg id="chart-loss" width="480" height="200"></svg><figcaption>training loss (this node's history)</figcaption></figure>
<figure><svg id="chart-accuracy" width="480" height="200"></svg><figcaption>test accuracy (rank 0's evaluations)</figcaption></figure>
<figure><svg id="chart-throughput" width="480" height="200"></svg><figcaption>samples/s (this node's history)</figcaption></figure>
<figure><svg id="chart-lr" width="480" height="200"></svg><figcaption>learning rate in effect</figcaption></figure>
<figure><svg id="chart-speed" width="480" height="200"></svg><figcaption>samples/s per node, since this page opened</figcaption></figure>
<figure><svg id="chart-bytes" width="480" height="200"></svg><figcaption>MB/s in + out per node, since this page opened</figcaption></figure>
</div>
<h2>Timeline</h2>
<table id="timeline"><thead><tr><th>when</th><th>what</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const seen = { speed: {}, bytes: {}, last: {} };
const keep = 300;
const colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"];

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function fill(tbody, rows) {
  tbody.replaceChildren();
  for (const r of rows) {
    const tr = tbody.insertRow();
    for (const [text, cls] of r) cell(tr, text, cls);
  }
}

// One polyline per series, x = sample index, y scaled to the series' maximum.
function chart(svg, series) {
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value, pad = 6;
  let max = 0;
  for (const s of series) for (const v of s.values) if (v > max) max = v;
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  series.forEach((s, k) => {
    const n = s.values.length;
    if (n === 0) return;
    const xy = s.values.map((v, i) => [pad + (n === 1 ? 0 : i * (w - 2 * pad) / (n - 1)),
                                       h - pad - (max > 0 ? v / max : 0) * (h - 2 * pad)]);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", xy.map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colours[k % colours.length]);
    line.setAttribute("data-series", s.name);
    svg.appendChild(line);
    // Few points (an evaluation or two): each one visible on its own.
    if (n <= 40)
      for (const [x, y] of xy) {
        const dot = document.createElementNS(ns, "circle");
        dot.setAttribute("cx", x.toFixed(1));
        dot.setAttribute("cy", y.toFixed(1));
        dot.setAttribute("r", "2.5");
        dot.setAttribute("fill", colours[k % colours.length]);
        svg.appendChild(dot);
      }
  });
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", w - pad);
  label.setAttribute("y", 14);
  label.setAttribute("text-anchor", "end");
  label.textContent = "max " + (max < 0.01 ? max.toExponential(2) : max.toFixed(2));
  svg.appendChild(label);
}

function show(doc) {
  window.lastStatus = doc;  // what the page drew last (a test compares the charts with it)
  document.getElementById("error").textContent = "";
  document.getElementById("source").textContent = "at " + doc.source;
  document.getElementById("member-count").textContent = doc.members.length;
  fill(document.querySelector("#members tbody"),
       doc.members.map(m => [[m.id], [m.state, m.state], [m.address], [m.region], [m.roles.join(", ")]]));
  const num = (v, digits) => (v === undefined || v === null ? "" : v.toFixed(digits));
  fill(document.querySelector("#nodes tbody"), (doc.nodes || []).map(n => {
    const f = n.figures;
    return [[n.id], [n.stale ? "stale" : n.state, n.stale ? "stale" : n.state], [n.age_s.toFixed(0) + " s", "num"],
            [num(f.generation, 0), "num"], [num(f.step, 0), "num"],
            [num(f.step_seconds === undefined ? undefined : f.step_seconds * 1e3, 1), "num"],
            [num(f.samples_per_second, 0), "num"],
            [num(f.loss, 4), "num"], [num(f.test_accuracy, 4), "num"],
            [num(f.bytes_in === undefined ? undefined : f.bytes_in / 1e6, 1), "num"],
            [num(f.bytes_out === undefined ? undefined : f.bytes_out / 1e6, 1), "num"],
            [num(f.send_queue_bytes === undefined ? undefined : f.send_queue_bytes / 1e3, 1), "num"]];
  }));
  for (const n of doc.nodes || [])
    if (n.figures.samples_per_second !== undefined && !n.stale)
      (seen.speed[n.id] = seen.speed[n.id] || []).push(n.figures.samples_per_second);
  // Bytes: each node's counters' rise between two of its summaries, per second.
  for (const n of doc.nodes || []) {
    const f = n.figures, before = seen.last[n.id];
    if (f.bytes_in === undefined || f.bytes_out === undefined || n.stale) continue;
    if (before && n.unix_ms > before.unix_ms) {
      const rate = (f.bytes_in + f.bytes_out - before.bytes) / 1e6 / ((n.unix_ms - before.unix_ms) / 1000);
      (seen.bytes[n.id] = seen.bytes[n.id] || []).push(Math.max(0, rate));
    }
    if (!before || n.unix_ms > before.unix_ms) seen.last[n.id] = { unix_ms: n.unix_ms, bytes: f.bytes_in + f.bytes_out };
  }
  for (const a of Object.values(seen.speed).concat(Object.values(seen.bytes))) while (a.length > keep) a.shift();
  chart(document.getElementById("chart-speed"), Object.entries(seen.speed).map(([name, values]) => ({ name, values })));
  chart(document.getElementById("chart-bytes"), Object.entries(seen.bytes).map(([name, values]) => ({ name, values })));
  const job = doc.job;
  const last = job && job.evaluations.length ? job.evaluations[job.evaluations.length - 1] : null;
  document.getElementById("job").textContent = job
    ? `job ${job.job_id}, ${job.mode}, generation ${job.generation}, ${job.phase}: step ${job.step}, ` +
      `epoch ${job.epoch}, loss ${job.loss.toFixed(4)}, rate ${job.lr.toPrecision(3)}` +
      (last ? `, test accuracy ${last.test_accuracy.toFixed(4)} at step ${last.step}` : "")
    : "no job";
  fill(document.querySelector("#workers tbody"), job ? job.workers.map(w =>
    [[w.id], [String(w.position), "num"], [num(w.step, 0), "num"], [num(w.lag_steps, 0), "num"],
     [num(w.samples_per_second, 0), "num"], [num(w.share, 0), "num"], [num(w.staleness, 1), "num"]]) : []);
  if (!job) return;
  // Membership events and the generations this node installed, newest first.
  const timeline = (doc.events || []).map(e => [e.unix_ms, `${e.member} ${e.kind}`, e.kind]).concat(
    job.generations.map(g => [g.installed_unix_ms, `generation ${g.generation}: ${g.workers} workers, from step ${g.resume_step}`, "generation"]));
  timeline.sort((a, b) => b[0] - a[0]);
  fill(document.querySelector("#timeline tbody"),
       timeline.map(([t, what, kind]) => [[new Date(t).toLocaleTimeString()], [what, kind]]));
  chart(document.getElementById("chart-loss"), [{ name: "loss", values: job.history.map(p => p.loss) }]);
  chart(document.getElementById("chart-accuracy"), [{ name: "accuracy", values: job.evaluations.map(e => e.test_accuracy) }]);
  chart(document.getElementById("chart-throughput"), [{ name: "samples/s", values: job.history.map(p => p.samples_per_second) }]);
  chart(document.getElementById("chart-lr"), [{ name: "lr", values: job.history.map(p => p.lr) }]);
}

async function poll() {
  try {
    const res = await fetch("/status", { cache: "no-store" });
    if (!res.ok) throw new Error("/status answered " + res.status + ": " + (await res.text()));
    show(await res.json());
  } catch (e) {
    document.getElementById("error").textContent = "status unavailable (" + e.message + "); the figures below are the last seen";
  }
  setTimeout(poll, 2000);
}
poll();
</script>
</body>
</html>
)HTML";
  return page;
}

}  // namespace tepdist::actors
