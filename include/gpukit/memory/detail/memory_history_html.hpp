// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/memory_history_html.hpp: the page of gpukit::to_html (memory_history.hpp),
// a small app that draws a snapshot's JSON with inline JavaScript (no network). to_html writes
// memory_report_head, the snapshot as JSON (`const snapshot = {...}`), then memory_report_tail.
// One string literal a line: each line of the page stands on a line of its own here.
// Not public API.
#pragma once

namespace gpukit::detail {

// clang-format off
/// The page up to `const snapshot = `: styles, headings, the canvas and the segment list.
inline constexpr char const memory_report_head[] =
  "<!doctype html>\n"
  "<html><head><meta charset=\"utf-8\"><title>gpukit memory report</title>\n"
  "<style>\n"
  "body { font: 14px sans-serif; margin: 20px; color: #222; }\n"
  "canvas { border: 1px solid #ccc; }\n"
  ".seg { margin: 2px 0; height: 14px; display: flex; border: 1px solid #999; }\n"
  ".blk { height: 100%; } .a { background: #d9534f; } .f { background: #cfe8cf; }\n"
  "</style></head><body>\n"
  "<h1>gpukit memory report</h1>\n"
  "<p id=\"summary\"></p>\n"
  "<h2>Memory over time</h2>\n"
  "<canvas id=\"plot\" width=\"1000\" height=\"360\"></canvas>\n"
  "<p><span style=\"color:#1f77b4\">&#9632;</span> reserved (segments) &nbsp;\n"
  "<span style=\"color:#d62728\">&#9632;</span> allocated (all streams) &nbsp; thin lines: allocated per stream;\n"
  "x: events in order</p>\n"
  "<h2>Segments at the peak of allocated memory</h2>\n"
  "<p id=\"peakinfo\"></p>\n"
  "<div id=\"segments\"></div>\n"
  "<script>\n"
  "(() => {\n"
  "const snapshot = ";

/// The page after the snapshot: memory over time (reserved, allocated, allocated per stream) and
/// the segment map at the peak of allocated memory.
inline constexpr char const memory_report_tail[] =
  ";\n"
  "const ev = snapshot.events;\n"
  "const streams = [...new Set(ev.filter(e => e.action === 'alloc').map(e => e.stream))];\n"
  "let alloc = 0, reserved = 0; const per = {}; streams.forEach(s => per[s] = 0);\n"
  "const live = new Map(), segs = new Map(); const pts = [];\n"
  "let best = -1, atPeak = null;  // the segment map when allocated memory was highest\n"
  "ev.forEach((e, i) => {\n"
  "  if (e.action === 'alloc') { alloc += e.bytes; per[e.stream] += e.bytes; live.set(e.address, e); }\n"
  "  else if (e.action === 'free') { const a = live.get(e.address); if (a) { alloc -= a.bytes; per[a.stream] -= a.bytes; live.delete(e.address); } }\n"
  "  else if (e.action === 'segment_alloc') { reserved += e.bytes; segs.set(e.address, e); }\n"
  "  else if (e.action === 'segment_free') { reserved -= e.bytes; segs.delete(e.address); }\n"
  "  if (alloc > best) { best = alloc; atPeak = {i, segs: [...segs.values()], blocks: [...live.values()]}; }\n"
  "  pts.push({t: i, alloc, reserved, per: Object.assign({}, per)});\n"
  "});\n"
  "const peakA = Math.max(0, ...pts.map(p => p.alloc)), peakR = Math.max(0, ...pts.map(p => p.reserved));\n"
  "const GiB = b => (b / 1073741824).toFixed(3) + ' GiB';\n"
  "document.getElementById('summary').textContent =\n"
  "  `device ${snapshot.device}: ${ev.length} events, ${snapshot.segments.length} segments now, ` +\n"
  "  `peak allocated ${GiB(peakA)}, peak reserved ${GiB(peakR)}, ${snapshot.dropped_events} events dropped`;\n"
  "const c = document.getElementById('plot'), g = c.getContext('2d');\n"
  "const ymax = Math.max(1, peakA, peakR), t0 = pts.length ? pts[0].t : 0, t1 = pts.length ? pts[pts.length - 1].t : 1;\n"
  "const X = t => 40 + (c.width - 50) * (t1 > t0 ? (t - t0) / (t1 - t0) : 0), Y = v => c.height - 20 - (c.height - 30) * v / ymax;\n"
  "g.font = '11px sans-serif'; g.fillText(GiB(ymax), 2, 12); g.fillText('0', 2, c.height - 20);\n"
  "function line(get, color, width) { g.strokeStyle = color; g.lineWidth = width; g.beginPath();\n"
  "  pts.forEach((p, i) => { const x = X(p.t), y = Y(get(p)); i ? g.lineTo(x, y) : g.moveTo(x, y); }); g.stroke(); }\n"
  "line(p => p.reserved, '#1f77b4', 2); line(p => p.alloc, '#d62728', 2);\n"
  "const colors = ['#2ca02c', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];\n"
  "streams.forEach((s, i) => line(p => p.per[s], colors[i % colors.length], 1));\n"
  "const host = document.getElementById('segments');\n"
  "let shown = snapshot.segments;\n"
  "if (atPeak && atPeak.segs.length) {\n"
  "  shown = atPeak.segs.map(sg => ({address: sg.address, size: sg.bytes, pool: sg.bytes <= 2097152 ? 'small' : 'large', stream: sg.stream,\n"
  "    blocks: atPeak.blocks.filter(b => b.address >= sg.address && b.address < sg.address + sg.bytes)\n"
  "      .sort((x, y) => x.address - y.address)}))\n"
  "    .map(sg => { const out = []; let at = sg.address;  // fill the gaps with free space\n"
  "      for (const b of sg.blocks) { if (b.address > at) out.push({state: 'free', size: b.address - at});\n"
  "        out.push({state: 'allocated', size: b.bytes}); at = b.address + b.bytes; }\n"
  "      if (at < sg.address + sg.size) out.push({state: 'free', size: sg.address + sg.size - at});\n"
  "      return Object.assign(sg, {blocks: out}); });\n"
  "  document.getElementById('peakinfo').textContent = `after event ${atPeak.i}: ${GiB(best)} allocated in ${shown.length} segments (red: allocated, green: free)`;\n"
  "} else {\n"
  "  document.getElementById('peakinfo').textContent = 'no segment events recorded: the segments now';\n"
  "}\n"
  "for (const seg of shown) {\n"
  "  const row = document.createElement('div'); row.className = 'seg';\n"
  "  row.title = `segment ${seg.address.toString(16)}: ${GiB(seg.size)} (${seg.pool}), stream ${seg.stream}`;\n"
  "  row.style.width = Math.max(2, 1000 * seg.size / Math.max(...shown.map(x => x.size))) + 'px';\n"
  "  for (const b of seg.blocks) { const d = document.createElement('div');\n"
  "    d.className = 'blk ' + (b.state === 'allocated' ? 'a' : 'f'); d.style.width = (100 * b.size / seg.size) + '%';\n"
  "    d.title = `${b.state} ${b.size} bytes` + (b.requested ? ` (asked ${b.requested})` : ''); row.appendChild(d); }\n"
  "  host.appendChild(row);\n"
  "}\n"
  "})();\n"
  "</script></body></html>\n";
// clang-format on

}  // namespace gpukit::detail
