/* attnlab lesson page: the lessons' worked example with every number live. No network, no
   libraries. Text is only ever written as text (textContent), never parsed as markup.
   The arithmetic is attnlab.reference's, in float64: scores = q.k, x scale, -inf where masked,
   softmax shifted by the row max, output = weights . values. */
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#e6550d", "#8c564b", "#d6338a",
                "#138d90"];
  var MAX_TOKENS = 8, LIMIT = 1000, DIM_KEYS = 8, SPREAD_PAIRS = 400;
  var D_CHOICES = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512];
  var NEW_TOKENS = [["sat", [-2, 1], [0, 0]], ["tired", [1, -2], [1, 0]], ["on", [-1, -1], [0, 1]],
                    ["was", [2, 2], [0.5, 0]], ["the", [-3, 0], [0, 0.5]]];
  var DATA = JSON.parse(document.getElementById("lesson-data").textContent);

  function copy(x) { return JSON.parse(JSON.stringify(x)); }
  var st = {
    query: copy(DATA.query), keys: copy(DATA.keys), values: copy(DATA.values),
    tokens: copy(DATA.tokens), scaled: true, focus: null,
    norm: { source: "example", scores: copy(DATA.negative_scores), mode: "divide", temperature: 1 },
    dims: { d: 64, seed: 1 },
    grid: { tokens: copy(DATA.grid.tokens), queries: copy(DATA.grid.queries),
            keys: copy(DATA.grid.keys), values: copy(DATA.grid.values), causal: true, cell: null },
    heads: DATA.heads.heads.map(function (h) { return { name: h.name, looks_for: h.looks_for,
                                                        w_q: copy(h.w_q), w_k: copy(h.w_k),
                                                        w_v: copy(h.w_v) }; }),
    w_o: copy(DATA.layer.w_o),
    pos: copy(DATA.positions),
    tried: {}
  };
  var fields = [];   // number/word inputs kept in sync with the state
  var live = {};     // elements update() writes into

  // ---------------------------------------------------------------- arithmetic (float64)
  function dot(a, b) {
    var s = 0;
    for (var i = 0; i < a.length; i++) s += a[i] * b[i];
    return s;
  }
  function softmax(x, allowed) {
    var m = -Infinity, i;
    for (i = 0; i < x.length; i++) if (!allowed || allowed[i]) m = Math.max(m, x[i]);
    if (m === -Infinity) return x.map(function () { return 0; });  // nothing to attend to
    var e = x.map(function (v, j) { return !allowed || allowed[j] ? Math.exp(v - m) : 0; });
    var total = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (v) { return v / total; });
  }
  function mix(w, V) {  // sum_j w[j] * V[j]
    var out = V[0].map(function () { return 0; });
    for (var j = 0; j < V.length; j++) {
      for (var c = 0; c < out.length; c++) out[c] += w[j] * V[j][c];
    }
    return out;
  }
  // one query row against every key; allowed[j] false = masked
  function attendRow(q, K, V, scale, allowed) {
    var scores = K.map(function (k) { return dot(q, k); });
    var scaled = scores.map(function (s) { return s * scale; });
    var w = softmax(scaled, allowed);
    return { scores: scores, scaled: scaled, weights: w, output: mix(w, V) };
  }
  function mainScale() { return st.scaled ? 1 / Math.sqrt(st.query.length) : 1; }
  function mainRow(scaled) {
    var scale = scaled == null ? mainScale() : scaled ? 1 / Math.sqrt(st.query.length) : 1;
    return attendRow(st.query, st.keys, st.values, scale, null);
  }
  function argmax(a) {
    var b = 0;
    for (var i = 1; i < a.length; i++) if (a[i] > a[b]) b = i;
    return b;
  }
  function gridRows() {
    var g = st.grid, scale = 1 / Math.sqrt(g.queries[0].length);
    return g.queries.map(function (q, i) {
      var allowed = g.keys.map(function (_, j) { return !g.causal || j <= i; });
      var r = attendRow(q, g.keys, g.values, scale, allowed);
      r.allowed = allowed;
      return r;
    });
  }
  function headRows() {
    var H = DATA.heads, x = H.embeddings, it = H.tokens.indexOf(H.query_token);
    return st.heads.map(function (h) {
      var project = function (row, W) {
        return W[0].map(function (_, c) {
          var s = 0;
          for (var f = 0; f < row.length; f++) s += row[f] * W[f][c];
          return s;
        });
      };
      var K = x.map(function (row) { return project(row, h.w_k); });
      var q = project(x[it], h.w_q);
      var eye = x.map(function (_, i) { return x.map(function (_, j) { return i === j ? 1 : 0; }); });
      var r = attendRow(q, K, eye, 1 / Math.sqrt(q.length), null);
      r.query = q;
      r.keys = K;
      return r;
    });
  }
  // the heads together (attnlab.explain.lesson_layer): contexts, concatenated, x W_o, + x, norm
  function layerRow() {
    var H = DATA.heads, x = H.embeddings, it = H.tokens.indexOf(H.query_token);
    var rows = headRows(), heads = st.heads.map(function (hd, n) {
      var V = x.map(function (row) {
        return hd.w_v[0].map(function (_, c) {
          var s = 0;
          for (var f = 0; f < row.length; f++) s += row[f] * hd.w_v[f][c];
          return s;
        });
      });
      var w = rows[n].weights, ctx = V[0].map(function (_, c) {
        var s = 0;
        for (var j = 0; j < V.length; j++) s += w[j] * V[j][c];
        return s;
      });
      return { query: rows[n].query, values: V, weights: w, context: ctx };
    });
    var concat = [];
    heads.forEach(function (hd) { concat = concat.concat(hd.context); });
    var a = st.w_o[0].map(function (_, c) {
      var s = 0;
      for (var r = 0; r < concat.length; r++) s += concat[r] * st.w_o[r][c];
      return s;
    });
    var res = x[it].map(function (v, c) { return v + a[c]; });
    var mean = res.reduce(function (p, v) { return p + v; }, 0) / res.length;
    var vr = res.reduce(function (p, v) { return p + (v - mean) * (v - mean); }, 0) / res.length;
    var out = res.map(function (v) { return (v - mean) / Math.sqrt(vr + DATA.layer.eps); });
    return { x: x[it].slice(), heads: heads, concat: concat, w_o: st.w_o, attn_out: a,
             residual: res, output: out };
  }
  // positions (attnlab.explain.lesson_layer.toy_positions): rotary in two dimensions
  function turn(v, a) { return [Math.cos(a) * v[0] - Math.sin(a) * v[1], Math.sin(a) * v[0] + Math.cos(a) * v[1]]; }
  function positionsRow() {
    var P = st.pos, q = DATA.query, k = DATA.keys[0], t = P.theta;
    var qi = turn(q, P.i * t), kj = turn(k, P.j * t);
    var qs = turn(q, (P.i + P.shift) * t), ks = turn(k, (P.j + P.shift) * t);
    return { i: P.i, j: P.j, shift: P.shift, theta: t, q: qi, k: kj, dot: dot(qi, kj),
             q_moved: qs, k_moved: ks, dot_moved: dot(qs, ks), plain: dot(q, k),
             by_distance: dot(q, turn(k, (P.j - P.i) * t)) };
  }
  function normWeights(n) {
    var s = n.source === "compare" ? mainRow(false).scores : n.scores;
    var total = s.reduce(function (a, b) { return a + b; }, 0);
    return { scores: s, total: total,
             divided: s.map(function (v) { return total === 0 ? NaN : v / total; }),
             softmax: softmax(s.map(function (v) { return v / n.temperature; })) };
  }
  // seeded normal numbers: mulberry32 + Box-Muller, so a seed always draws the same vectors
  function normals(seed) {
    var a = seed >>> 0;
    function uniform() {
      a = (a + 0x6D2B79F5) >>> 0;
      var t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296;
    }
    return function () {
      return Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
    };
  }
  var spreads = {};  // "d/seed" -> the standard deviation of q.k over SPREAD_PAIRS random pairs
  function spread(d, seed) {
    var key = d + "/" + seed;
    if (!(key in spreads)) {
      var draw = normals(seed * 7919 + d * 104729 + 1), sum = 0, sq = 0;
      for (var p = 0; p < SPREAD_PAIRS; p++) {
        var x = dot(vec(d, draw), vec(d, draw));
        sum += x;
        sq += x * x;
      }
      var mean = sum / SPREAD_PAIRS;
      spreads[key] = Math.sqrt(sq / SPREAD_PAIRS - mean * mean);
    }
    return spreads[key];
  }
  function vec(n, draw) {
    var v = [];
    for (var i = 0; i < n; i++) v.push(draw());
    return v;
  }
  var dimsCache = null;  // (d, seed) -> the draw; the drawing redraws often, the draw is fixed
  function dims() {
    var d = st.dims.d, key = d + "/" + st.dims.seed;
    if (!dimsCache || dimsCache.key !== key) dimsCache = { key: key, value: drawDims() };
    return dimsCache.value;
  }
  function drawDims() {
    var d = st.dims.d, draw = normals(st.dims.seed * 1000003 + d);
    var q = vec(d, draw), K = [];
    for (var j = 0; j < DIM_KEYS; j++) K.push(vec(d, draw));
    var raw = K.map(function (k) { return dot(q, k); });
    var scaled = raw.map(function (s) { return s / Math.sqrt(d); });
    return { d: d, seed: st.dims.seed, query: q, keys: K, scores: raw, scaled_scores: scaled,
             weights_raw: softmax(raw), weights_scaled: softmax(scaled),
             spread: spread(d, st.dims.seed) };
  }

  // ---------------------------------------------------------------- formatting and elements
  function $(id) { return document.getElementById(id); }
  function fmt(x, digits) {
    if (isNaN(x)) return "\u2014";
    if (!isFinite(x)) return x > 0 ? "\u221e" : "\u2212\u221e";
    var r = +x.toFixed(digits == null ? 3 : digits);
    if (r === 0) r = 0;
    return (r < 0 ? "\u2212" : "") + String(Math.abs(r));
  }
  function pct(x) {
    if (isNaN(x)) return "\u2014";
    var t = (100 * x).toFixed(1);
    return (t.charAt(0) === "-" && +t !== 0 ? "\u2212" + t.slice(1) : t.replace("-", "")) + "%";
  }
  function vecText(v, digits) {
    return "[" + v.map(function (x) { return fmt(x, digits); }).join(", ") + "]";
  }
  function fmtIn(x) { return String(+x.toPrecision(8)); }
  function term(a, b) {
    var sb = fmt(b, 2);
    return fmt(a, 2) + "\u00b7" + (b < 0 ? "(" + sb + ")" : sb);
  }
  function h(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) {
      if (attrs[k] === true) e.setAttribute(k, "");
      else if (attrs[k] !== false && attrs[k] != null) e.setAttribute(k, attrs[k]);
    }
    if (text != null) e.textContent = text;
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) {
      var c = arguments[i];
      if (c != null) parent.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return parent;
  }
  function clear(e) {
    while (e.firstChild) e.removeChild(e.firstChild);
    return e;
  }
  function short(t) { t = String(t); return t.length > 14 ? t.slice(0, 13) + "\u2026" : t; }
  function quote(t) { return "\u201c" + t + "\u201d"; }
  function color(j) { return COLORS[j % COLORS.length]; }
  function toggle(label, pressed, onClick) {
    var b = h("button", { type: "button", "aria-pressed": String(!!pressed) }, label);
    b.addEventListener("click", onClick);
    return b;
  }

  // ---------------------------------------------------------------- inputs that keep the last good value
  function parseNumber(text) {
    var t = String(text).trim().replace(/\u2212/g, "-");
    if (t === "") return { error: "empty: type a number" };
    if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(t)) {
      return { error: quote(short(text)) + " is not a number" };
    }
    var v = Number(t);
    if (!isFinite(v) || Math.abs(v) > LIMIT) {
      return { error: short(text) + " is out of range (\u22121000 \u2026 1000)" };
    }
    return { value: v };
  }
  function parseWord(text) {
    var t = String(text).trim();
    if (t === "") return { error: "empty: type a word" };
    if (t.length > 16) return { error: "at most 16 characters" };
    return { value: t };
  }
  var nextId = 0;
  function field(label, get, set, parse, cls) {
    var id = "f" + (nextId++);
    var wrap = h("span", { "class": "field" });
    var input = h("input", { type: "text", id: id, "aria-label": label, autocomplete: "off",
                             spellcheck: "false", inputmode: parse === parseWord ? null : "decimal",
                             "class": cls || null });
    var msg = h("span", { "class": "msg", id: id + "-msg", "aria-live": "polite" });
    input.setAttribute("aria-describedby", msg.id);
    var show = parse === parseWord ? String : fmtIn;
    input.value = show(get());
    input.addEventListener("input", function () {
      var r = parse(input.value);
      if (r.error) {
        msg.textContent = r.error + "; still using " + show(get());
        input.setAttribute("aria-invalid", "true");
        wrap.classList.add("bad");
        return;
      }
      msg.textContent = "";
      input.removeAttribute("aria-invalid");
      wrap.classList.remove("bad");
      set(r.value);
      update();
    });
    add(wrap, input, msg);
    fields.push({ input: input, wrap: wrap, get: get, show: show });
    return wrap;
  }
  function syncFields() {
    fields = fields.filter(function (f) { return document.body.contains(f.input); });
    fields.forEach(function (f) {
      if (document.activeElement === f.input || f.wrap.classList.contains("bad")) return;
      var want = f.show(f.get());
      if (f.input.value !== want) f.input.value = want;
    });
  }
  function vectorFields(label, v, onSet) {
    var span = h("span", { "class": "vec" });
    v.forEach(function (_, c) {
      add(span, field(label + ", number " + (c + 1), function () { return v[c]; },
                      function (x) { v[c] = x; if (onSet) onSet(); }, parseNumber));
    });
    return span;
  }

  // ---------------------------------------------------------------- 2-D planes with arrows
  function Plane(svg, size) {
    this.svg = svg;
    this.size = size;
    svg.setAttribute("width", size);
    svg.setAttribute("height", size);
    svg.setAttribute("viewBox", "0 0 " + size + " " + size);
  }
  // R: half the width shown, in vector units; c: the point at the centre (default the origin)
  Plane.prototype.start = function (R, xLabel, yLabel, c) {
    var s = this.size, svg = clear(this.svg), P = this;
    this.c = c || [0, 0];
    this.k = (s - 40) / (2 * R);
    var step = [0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500].filter(function (x) {
      return x >= R / 6;
    })[0] || 1000;
    svg.appendChild(sv("rect", { x: 0, y: 0, width: s, height: s, fill: "#fff" }));
    var o = P.px(0, 0), ox = Math.max(20, Math.min(s - 20, o[0])), oy = Math.max(20, Math.min(s - 20, o[1]));
    var lines = sv("g"), ticks = sv("g", { "font-size": 10, fill: "#999" });
    for (var i = Math.ceil((this.c[0] - R) / step); i * step <= this.c[0] + R; i++) {
      var x = P.px(i * step, 0)[0];
      lines.appendChild(sv("line", { x1: x, y1: 20, x2: x, y2: s - 20, stroke: i ? "#eee" : "#888" }));
      if (i) ticks.appendChild(sv("text", { x: x, y: oy + 13, "text-anchor": "middle" }, fmt(i * step)));
    }
    for (i = Math.ceil((this.c[1] - R) / step); i * step <= this.c[1] + R; i++) {
      var y = P.px(0, i * step)[1];
      lines.appendChild(sv("line", { x1: 20, y1: y, x2: s - 20, y2: y, stroke: i ? "#eee" : "#888" }));
      if (i) ticks.appendChild(sv("text", { x: ox - 4, y: y + 3, "text-anchor": "end" }, fmt(i * step)));
    }
    add(svg, lines, ticks);
    if (xLabel) svg.appendChild(sv("text", { x: s - 20, y: oy + 26, "font-size": 12,
                                             fill: "#555", "text-anchor": "end" }, xLabel + " \u2192"));
    if (yLabel) svg.appendChild(sv("text", { x: ox + 8, y: 14, "font-size": 12, fill: "#555" },
                                   "\u2191 " + yLabel));
    this.placed = [];
    return svg;
  };
  Plane.prototype.px = function (x, y) {  // a 1-number vector is drawn on the x axis
    x = x || 0;
    y = y || 0;
    return [this.size / 2 + this.k * (x - this.c[0]), this.size / 2 - this.k * (y - this.c[1])];
  };
  Plane.prototype.world = function (ev) {
    var r = this.svg.getBoundingClientRect();
    var sx = (ev.clientX - r.left) * this.size / r.width, sy = (ev.clientY - r.top) * this.size / r.height;
    return [this.c[0] + (sx - this.size / 2) / this.k, this.c[1] + (this.size / 2 - sy) / this.k];
  };
  Plane.prototype.arrow = function (from, to, col, width, attrs) {
    var a = this.px(from[0], from[1]), b = this.px(to[0], to[1]);
    var g = sv("g", attrs || {}), dx = b[0] - a[0], dy = b[1] - a[1], n = Math.hypot(dx, dy);
    if (n < 1) return g;
    var ux = dx / n, uy = dy / n, head = Math.min(12, n * 0.6) + width;
    var bx = b[0] - ux * head * 0.8, by = b[1] - uy * head * 0.8;
    g.appendChild(sv("line", { x1: a[0], y1: a[1], x2: bx, y2: by, stroke: col,
                               "stroke-width": width, "stroke-linecap": "round" }));
    var w = head * 0.45;
    g.appendChild(sv("polygon", { fill: col, points: [b[0], b[1], bx - uy * w, by + ux * w,
                                                      bx + uy * w, by - ux * w].join(" ") }));
    return g;
  };
  // a label just beyond the arrow's tip, on the side the arrow points to, with a white halo;
  // moved down a line at a time while it would cover a label placed before it
  Plane.prototype.label = function (p, text, col, extra) {
    var o = this.px(0, 0), q = this.px(p[0], p[1]), dx = q[0] - o[0], dy = q[1] - o[1];
    var n = Math.hypot(dx, dy) || 1, ux = dx / n, uy = n > 1 ? dy / n : -1;
    var a = { x: q[0] + 12 * ux, y: q[1] + 12 * uy + 4, "font-size": 13, fill: col,
              "font-weight": "bold", stroke: "#fff", "stroke-width": 3, "paint-order": "stroke",
              "text-anchor": ux < -0.35 ? "end" : ux > 0.35 ? "start" : "middle" };
    if (uy > 0.35) a.y += 8;
    for (var k in extra || {}) a[k] = extra[k];
    var t = sv("text", a, text);
    this.svg.appendChild(t);
    for (var tries = 0; tries < 8; tries++) {
      var b = t.getBBox(), hit = this.placed.some(function (r) {
        return b.x < r.x + r.width && r.x < b.x + b.width && b.y < r.y + r.height && r.y < b.y + b.height;
      });
      if (!hit) break;
      t.setAttribute("y", +t.getAttribute("y") + 15);
    }
    this.placed.push(t.getBBox());
    return t;
  };

  // ---------------------------------------------------------------- 1. compare
  var cmpPlane = null, drag = null;
  function extent(vs, min) {
    var m = 0;
    vs.forEach(function (v) { m = Math.max(m, Math.abs(v[0] || 0), Math.abs(v[1] || 0)); });
    return m * 1.1 > min ? m * 1.1 : min;
  }
  function compareR() { return Math.ceil(extent([st.query].concat(st.keys), 5) * 2) / 2; }
  function drawCompare(row) {
    var P = cmpPlane, focused = document.activeElement, keep = focused &&
      focused.getAttribute && focused.getAttribute("data-handle");
    var svg = P.start(compareR(), "1st number", "2nd number"), q = two(st.query);
    var sel = st.focus != null && st.focus < st.keys.length ? st.focus : argmax(row.scores);
    var k = two(st.keys[sel]), qq = q[0] * q[0] + q[1] * q[1];
    live.caption.textContent = st.query.length !== 2 ? "" : qq === 0
      ? "The query is zero: it lines up with nothing, every score is 0."
      : "Shaded: how far the key of " + quote(st.tokens[sel]) + " reaches along the query (its shadow, " +
        fmt(row.scores[sel] / Math.sqrt(qq), 2) + " long). Score = |q| \u00d7 shadow = " +
        fmt(Math.sqrt(qq), 2) + " \u00d7 " + fmt(row.scores[sel] / Math.sqrt(qq), 2) + " = " +
        fmt(row.scores[sel], 2) + ". Pointing away makes the shadow, and the score, negative.";
    // the picture behind the number: |q| x (length of the key's shadow on the query's line)
    if (qq > 0) {
      var t = (k[0] * q[0] + k[1] * q[1]) / qq, foot = [t * q[0], t * q[1]];
      var a = P.px(k[0], k[1]), b = P.px(foot[0], foot[1]), o = P.px(0, 0);
      // the shadow, drawn a few pixels beside the query's line so the arrow does not hide it
      var qn = Math.sqrt(qq), side = (k[0] * q[1] - k[1] * q[0]) >= 0 ? -1 : 1;  // away from the key
      var off = [7 * side * q[1] / qn, 7 * side * q[0] / qn];  // px: screen y points down
      svg.appendChild(sv("line", { x1: o[0] + off[0], y1: o[1] + off[1], x2: b[0] + off[0],
                                   y2: b[1] + off[1], stroke: color(sel), "stroke-width": 6,
                                   "stroke-opacity": 0.45, "class": "shadow" }));
      svg.appendChild(sv("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: color(sel),
                                   "stroke-dasharray": "4 3" }));
      var ang1 = Math.atan2(q[1], q[0]), ang2 = Math.atan2(k[1], k[0]), r = 26;
      var d = ang2 - ang1;
      while (d > Math.PI) d -= 2 * Math.PI;
      while (d < -Math.PI) d += 2 * Math.PI;
      var p1 = [o[0] + r * Math.cos(ang1), o[1] - r * Math.sin(ang1)];
      var p2 = [o[0] + r * Math.cos(ang1 + d), o[1] - r * Math.sin(ang1 + d)];
      svg.appendChild(sv("path", { d: "M" + p1.join(" ") + " A" + r + " " + r + " 0 0 " +
                                      (d > 0 ? 0 : 1) + " " + p2.join(" "),
                                   fill: "none", stroke: "#666" }));
      var mid = ang1 + d / 2;
      svg.appendChild(sv("text", { x: o[0] + (r + 16) * Math.cos(mid), y: o[1] - (r + 16) *
                                   Math.sin(mid) + 4, "font-size": 11, fill: "#555",
                                   "text-anchor": "middle" }, fmt(Math.abs(d) * 180 / Math.PI, 0) +
                                   "\u00b0"));
    }
    st.keys.forEach(function (kv, j) {
      svg.appendChild(P.arrow([0, 0], kv, color(j), 3, { "class": "key-arrow" }));
    });
    svg.appendChild(P.arrow([0, 0], q, "#111", 4, { "class": "query-arrow" }));
    P.label(q, quote(DATA.query_token), "#111", { "font-size": 15 });
    st.keys.forEach(function (kv, j) {
      P.label(kv, short(st.tokens[j]) + " " + fmt(row.scores[j], 2), color(j));
    });
    st.keys.forEach(function (kv, j) { svg.appendChild(handle("k" + j, kv, 7, color(j))); });
    svg.appendChild(handle("q", st.query, 10, "#111"));
    if (keep) {
      var again = svg.querySelector('[data-handle="' + keep + '"]');
      if (again) again.focus();
    }
    if (st.query.length !== 2) {
      svg.appendChild(sv("text", { x: 10, y: P.size - 6, "font-size": 11, fill: "#a33" },
                         st.query.length > 2 ? "showing the first 2 of " + st.query.length +
                         " numbers" : "1 number: drawn on the first axis"));
    }
  }
  function handle(name, v, r, col) {
    var p = cmpPlane.px(v[0], v[1]);  // v is the state's own vector: keys move it
    var who = name === "q" ? "query for " + quote(DATA.query_token)
      : "key of " + quote(st.tokens[+name.slice(1)]);
    var g = sv("g", { "class": "handle", tabindex: "0", "data-handle": name, role: "slider",
                      "aria-label": who + " " + vecText(v) + "; arrow keys move it by 0.1",
                      "aria-valuetext": vecText(v), cursor: "grab" });
    g.appendChild(sv("circle", { cx: p[0], cy: p[1], r: r + 8, fill: "#fff", "fill-opacity": 0 }));
    g.appendChild(sv("circle", { "class": "ring", cx: p[0], cy: p[1], r: r, fill: col,
                                 "fill-opacity": 0.12, stroke: col, "stroke-width": 1.5 }));
    g.addEventListener("keydown", function (e) {
      var dx = { ArrowLeft: -0.1, ArrowRight: 0.1 }[e.key] || 0;
      var dy = { ArrowDown: -0.1, ArrowUp: 0.1 }[e.key] || 0;
      if (!dx && !dy) return;
      e.preventDefault();
      v[0] = Math.round((v[0] + dx) * 1e9) / 1e9;
      if (v.length > 1) v[1] = Math.round((v[1] + dy) * 1e9) / 1e9;
      if (name !== "q") st.focus = +name.slice(1);
      update();
    });
    return g;
  }
  function two(v) { return [v[0], v.length > 1 ? v[1] : 0]; }  // what the plane can show
  function vectorOf(name) { return name === "q" ? st.query : st.keys[+name.slice(1)]; }
  function hookDrag() {
    var svg = cmpPlane.svg;
    svg.addEventListener("pointerdown", function (e) {
      var p = cmpPlane.world(e), best = "q", dist = Infinity;
      ["q"].concat(st.keys.map(function (_, j) { return "k" + j; })).forEach(function (n) {
        var v = two(vectorOf(n)), dd = Math.hypot(v[0] - p[0], v[1] - p[1]) * cmpPlane.k;
        if (dd < dist - 0.5 && dd < 18) { best = n; dist = dd; }
      });
      drag = { name: best, id: e.pointerId, R: compareR() };
      if (best !== "q") st.focus = +best.slice(1);
      svg.setPointerCapture(e.pointerId);
      e.preventDefault();
      moveTo(p);
    });
    svg.addEventListener("pointermove", function (e) {
      if (drag && e.pointerId === drag.id) moveTo(cmpPlane.world(e));
    });
    var stop = function (e) { if (drag && e.pointerId === drag.id) drag = null; };
    svg.addEventListener("pointerup", stop);
    svg.addEventListener("pointercancel", stop);
  }
  function moveTo(p) {
    var v = vectorOf(drag.name), R = drag.R;
    v[0] = Math.max(-R, Math.min(R, Math.round(p[0] * 10) / 10));
    if (v.length > 1) v[1] = Math.max(-R, Math.min(R, Math.round(p[1] * 10) / 10));
    update();
  }
  function buildCompare() {
    var side = clear($("compare-side"));
    var tbl = h("table", { "class": "vectors" });
    add(tbl, add(h("tr"), h("th", {}, ""), h("th", {}, "token"), h("th", {}, "key"),
                 h("th", {}, "value"), h("th", {}, "")));
    add(tbl, add(h("tr", { "class": "query-row" }),
                 add(h("td"), h("span", { "class": "swatch", style: "background:#111" })),
                 h("td", {}, quote(DATA.query_token) + " (query)"),
                 add(h("td"), vectorFields("query for " + DATA.query_token, st.query)),
                 h("td", { "class": "note" }, "the query is what \u201cit\u201d looks for"),
                 h("td")));
    st.tokens.forEach(function (tok, j) {
      var rm = h("button", { type: "button", "aria-label": "remove " + tok,
                             disabled: st.tokens.length <= 1 }, "\u00d7");
      rm.addEventListener("click", function () { removeToken(j); });
      add(tbl, add(h("tr", { "data-token": j }),
                   add(h("td"), h("span", { "class": "swatch", style: "background:" + color(j) })),
                   add(h("td"), field("token " + (j + 1), function () { return st.tokens[j]; },
                                      function (t) { st.tokens[j] = t; }, parseWord, "word")),
                   add(h("td"), vectorFields("key of token " + (j + 1), st.keys[j],
                                             function () { st.focus = j; })),
                   add(h("td"), vectorFields("value of token " + (j + 1), st.values[j],
                                             function () { st.tried.values_edited = true; })),
                   add(h("td"), rm)));
    });
    var more = h("button", { type: "button", id: "add-token",
                             disabled: st.tokens.length >= MAX_TOKENS }, "+ add a token");
    more.addEventListener("click", addToken);
    add(side, tbl, add(h("p", { "class": "controls" }), more,
                       h("span", { "class": "note" }, "up to " + MAX_TOKENS + " tokens")));
    add(side, h("h3", {}, "Dot products, written out"));
    live.dots = h("table", { "class": "dots" });
    live.best = h("p", { "class": "big", id: "compare-best" });
    add(side, live.dots, live.best);
  }
  function updateCompare(row) {
    drawCompare(row);
    var tbl = clear(live.dots), q = st.query, nq = Math.hypot.apply(null, q);
    add(tbl, add(h("tr"), h("th", {}, "key"), h("th", {}, "q \u00b7 k"), h("th", { "class": "num" }, "score"),
                 h("th", {}, "= |q| \u00d7 |k| \u00d7 cos(angle)")));
    st.keys.forEach(function (k, j) {
      var nk = Math.hypot.apply(null, k), cos = nq && nk ? row.scores[j] / (nq * nk) : NaN;
      var angle = Math.acos(Math.max(-1, Math.min(1, cos))) * 180 / Math.PI;
      add(tbl, add(h("tr", { "class": "dot", "data-token": j }),
                   add(h("td"), h("span", { "class": "swatch", style: "background:" + color(j) }),
                       short(st.tokens[j])),
                   h("td", { "class": "mono arith" }, q.map(function (x, c) { return term(x, k[c]); })
                     .join(" + ") + " ="),
                   h("td", { "class": "num mono score" }, fmt(row.scores[j])),
                   h("td", { "class": "note" }, isNaN(cos) ? "a zero vector: score 0"
                     : fmt(nq, 2) + " \u00d7 " + fmt(nk, 2) + " \u00d7 cos " + fmt(angle, 0) +
                       "\u00b0 (" + fmt(cos, 2) + ")")));
    });
    var b = argmax(row.scores);
    live.best.textContent = "Best match: " + quote(st.tokens[b]) + " (score " +
      fmt(row.scores[b]) + "). Nothing is borrowed yet: the scores only measure match strength.";
  }
  function addToken() {
    if (st.tokens.length >= MAX_TOKENS) return;
    var pick = NEW_TOKENS[(st.tokens.length - 3 + NEW_TOKENS.length * 3) % NEW_TOKENS.length];
    var D = st.query.length, Dv = st.values[0].length;
    st.tokens.push(pick[0]);
    st.keys.push(pad(pick[1], D));
    st.values.push(pad(pick[2], Dv));
    rebuild();
    $("add-token").focus();
  }
  function pad(v, n) {
    var out = v.slice(0, n);
    while (out.length < n) out.push(0);
    return out;
  }
  function removeToken(j) {
    if (st.tokens.length <= 1) return;
    st.tokens.splice(j, 1);
    st.keys.splice(j, 1);
    st.values.splice(j, 1);
    st.focus = null;
    rebuild();
    $("add-token").focus();
  }

  // ---------------------------------------------------------------- 2. normalize
  function bars(parent, labels, values, opts) {
    var lo = Math.min(0, Math.min.apply(null, values.filter(isFinite)));
    var hi = Math.max(opts.max || 1, Math.max.apply(null, values.filter(isFinite)));
    var W = opts.width || 360, zero = W * (-lo) / (hi - lo), box = h("div", { "class": "bars" });
    var top = opts.top ? argmax(values) : -1;
    labels.forEach(function (lab, j) {
      var v = values[j], x = isFinite(v) ? W * (v - lo) / (hi - lo) : zero;
      var fill = h("div", { "class": "fill" + (v < 0 ? " neg" : "") + (j === top ? " top" : ""),
                            style: "left:" + Math.min(x, zero) + "px;width:" +
                              Math.max(1, Math.abs(x - zero)) + "px" });
      add(box, add(h("div", { "class": "bar-row " + (opts.cls || "") }),
                   h("span", { "class": "lab" }, short(lab)),
                   add(h("span", { "class": "track", style: "width:" + W + "px" }), fill,
                       lo < 0 ? h("span", { "class": "axis", style: "left:" + zero + "px" }) : null),
                   h("span", { "class": "val" }, opts.format(v))));
    });
    parent.appendChild(box);
    return box;
  }
  function buildNormalize() {
    var body = clear($("normalize-body")), n = st.norm;
    var src = add(h("div", { "class": "controls" }), h("span", {}, "Scores:"));
    var bEx = toggle("the lesson's example", n.source === "example", function () {
      n.source = "example"; buildNormalize(); update(); });
    var bCmp = toggle("the scores from Compare", n.source === "compare", function () {
      n.source = "compare"; buildNormalize(); update(); });
    add(src, bEx, bCmp);
    if (n.source === "example") {
      add(src, add(h("span", {}), "(", vectorFields("example score", n.scores), ")"));
    }
    var mode = add(h("div", { "class": "controls" }), h("span", {}, "Turn them into weights by:"));
    live.modeButtons = [["divide", "dividing by the total"], ["softmax", "softmax"]].map(function (m) {
      var b = toggle(m[1], n.mode === m[0], function () {
        n.mode = m[0];
        if (m[0] === "softmax" && n.source === "example") st.tried.tried_softmax = true;
        update();
      });
      b.setAttribute("data-mode", m[0]);
      mode.appendChild(b);
      return b;
    });
    var slider = h("input", { type: "range", id: "temperature", min: "0.1", max: "5", step: "0.1",
                              value: String(n.temperature), "aria-label": "softmax temperature" });
    slider.addEventListener("input", function () { n.temperature = +slider.value; update(); });
    live.tempLabel = h("span", { id: "temperature-value" });
    var temp = add(h("div", { "class": "controls" }),
                   add(h("label", { "for": "temperature" }, "softmax temperature T "), slider),
                   live.tempLabel);
    live.normBars = h("div", { id: "normalize-bars" });
    live.normNote = h("p", { "class": "big", id: "normalize-note" });
    live.normOther = h("p", { "class": "note", id: "normalize-other" });
    add(body, src, mode, temp, live.normBars, live.normNote, live.normOther);
  }
  function updateNormalize() {
    var n = st.norm, r = normWeights(n), labels;
    labels = n.source === "compare" ? st.tokens : r.scores.map(function (s) { return "score " + fmt(s); });
    live.modeButtons.forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.getAttribute("data-mode") === n.mode));
    });
    live.tempLabel.textContent = "= " + n.temperature.toFixed(1) + "  (softmax of score \u00f7 T; " +
      "smaller T = sharper)";
    clear(live.normBars);
    var w = n.mode === "divide" ? r.divided : r.softmax;
    bars(live.normBars, labels, w, { format: pct, cls: "norm", top: n.mode === "softmax" });
    var sum = w.reduce(function (a, b) { return a + b; }, 0);
    if (n.mode === "divide") {
      var bad = w.some(function (x) { return x < 0 || x > 1; });
      live.normNote.className = "big " + (bad || isNaN(sum) ? "warn" : "");
      live.normNote.textContent = r.total === 0 ? "The scores add up to 0: dividing by the total " +
        "is impossible." : "Each score \u00f7 total " + fmt(r.total) + ". Sum: " + pct(sum) + "." +
        (bad ? " A negative weight and one above 100% are not shares of anything: dividing " +
         "breaks when scores can be negative." : "");
    } else {
      live.normNote.className = "big ok";
      live.normNote.textContent = "Every weight is positive and they sum to " + pct(sum) +
        "; the biggest score gets the most.";
    }
    live.normOther.textContent = (n.mode === "divide" ? "Softmax (T = " + n.temperature.toFixed(1) +
      ") would give: " + r.softmax.map(pct).join(", ") : "Dividing by the total would give: " +
      r.divided.map(pct).join(", ")) + ".";
  }

  // ---------------------------------------------------------------- 3. scale
  function buildScale() {
    var body = clear($("scale-body"));
    add(body, h("h3", {}, "The lesson's vectors"));
    live.scaleTable = h("table", { id: "scale-table" });
    var cb = h("input", { type: "checkbox", id: "scaled", checked: st.scaled });
    cb.addEventListener("change", function () { st.scaled = cb.checked; update(); });
    live.scaledBoxes = [cb];
    add(body, live.scaleTable, add(h("p", { "class": "controls" }), add(h("label"), cb,
        " divide by \u221ad before softmax (what attention does; Borrow uses these weights)")));
    add(body, h("h3", {}, "Random vectors of size d"));
    var slider = h("input", { type: "range", id: "dims", min: "0", max: String(D_CHOICES.length - 1),
                              step: "1", value: String(D_CHOICES.indexOf(st.dims.d)),
                              "aria-label": "vector size d" });
    slider.addEventListener("input", function () { st.dims.d = D_CHOICES[+slider.value]; update(); });
    live.dimsSlider = slider;
    var reroll = h("button", { type: "button", id: "reroll" }, "re-roll the vectors");
    reroll.addEventListener("click", function () { st.dims.seed += 1; update(); });
    live.dLabel = h("span", { "class": "big", id: "dims-value" });
    live.dSeed = h("span", { "class": "note" });
    add(body, add(h("div", { "class": "controls" }), add(h("label", { "for": "dims" }, "d "), slider),
                  live.dLabel, reroll, live.dSeed));
    add(body, h("p", { "class": "note" }, "One query and " + DIM_KEYS + " keys, every number drawn " +
                "at random (mean 0, spread 1). Each dot is one key's score."));
    live.strips = sv("svg", { id: "dims-strips", width: 620, height: 120 });
    live.spread = h("p", { id: "dims-spread" });
    live.topBars = h("div", { id: "dims-top" });
    live.chart = sv("svg", { id: "dims-chart", width: 300, height: 150 });
    add(body, add(h("div", { "class": "cols" }), add(h("div", { "class": "figure" }), live.strips),
                  add(h("div", { "class": "figure" }), live.chart)), live.spread, live.topBars);
  }
  function updateScale() {
    var raw = mainRow(false), sc = mainRow(true), D = st.query.length, tbl = clear(live.scaleTable);
    add(tbl, add(h("tr"), h("th", {}, "key"), h("th", { "class": "num" }, "score q\u00b7k"),
                 h("th", { "class": "num" }, "softmax"), h("th", { "class": "num" }, "score \u00f7 \u221a" + D),
                 h("th", { "class": "num" }, "softmax of that")));
    st.tokens.forEach(function (t, j) {
      add(tbl, add(h("tr", { "data-token": j }),
                   add(h("td"), h("span", { "class": "swatch", style: "background:" + color(j) }), short(t)),
                   h("td", { "class": "num" }, fmt(raw.scores[j])),
                   h("td", { "class": "num raw-w" + (st.scaled ? "" : " on") }, pct(raw.weights[j])),
                   h("td", { "class": "num" }, fmt(sc.scaled[j])),
                   h("td", { "class": "num scaled-w" + (st.scaled ? " on" : "") }, pct(sc.weights[j]))));
    });
    live.scaledBoxes.forEach(function (b) { b.checked = st.scaled; });
    var r = dims(), svg = clear(live.strips), W = 620, x0 = 150, x1 = W - 20;
    live.dimsSlider.value = String(Math.max(0, D_CHOICES.indexOf(r.d)));
    live.dimsSlider.setAttribute("aria-valuetext", "d = " + r.d);
    live.dLabel.textContent = "d = " + r.d;
    live.dSeed.textContent = "seed " + r.seed;
    var M = Math.max(3, Math.max.apply(null, r.scores.map(Math.abs)));
    var X = function (v) { return x0 + (x1 - x0) * (v + M) / (2 * M); };
    [["raw scores q\u00b7k", r.scores, 35], ["scores \u00f7 \u221a" + r.d, r.scaled_scores, 85]]
      .forEach(function (s) {
        svg.appendChild(sv("text", { x: 0, y: s[2] + 4, "font-size": 13, fill: "#222" }, s[0]));
        svg.appendChild(sv("line", { x1: x0, y1: s[2], x2: x1, y2: s[2], stroke: "#bbb" }));
        svg.appendChild(sv("line", { x1: X(0), y1: s[2] - 8, x2: X(0), y2: s[2] + 8, stroke: "#777" }));
        s[1].forEach(function (v, j) {
          svg.appendChild(sv("circle", { cx: X(v), cy: s[2], r: 6, fill: color(j), "fill-opacity": 0.8 }));
        });
      });
    [-M, M].forEach(function (v) {
      svg.appendChild(sv("text", { x: X(v), y: 112, "font-size": 11, fill: "#777",
                                   "text-anchor": "middle" }, fmt(v, 1)));
    });
    drawChart(r);
    live.spread.textContent = "Spread of q\u00b7k over " + SPREAD_PAIRS + " random pairs: " +
      fmt(r.spread, 2) + " \u2248 \u221a" + r.d + " = " + fmt(Math.sqrt(r.d), 2) +
      ". Divided by \u221ad it stays about 1 (here " + fmt(r.spread / Math.sqrt(r.d), 2) + ").";
    clear(live.topBars);
    add(live.topBars, h("p", { "class": "note" }, "Largest softmax weight among the " + DIM_KEYS +
                        " keys:"));
    var tops = [Math.max.apply(null, r.weights_raw), Math.max.apply(null, r.weights_scaled)];
    bars(live.topBars, ["without \u00f7\u221ad", "with \u00f7\u221ad"], tops, { format: pct, cls: "top-w" });
  }

  // the measured spread of q.k for every d on the slider, against the curve sqrt(d)
  function drawChart(r) {
    var svg = clear(live.chart), W = 300, H = 150, x0 = 34, x1 = W - 10, y0 = H - 26, y1 = 22;
    var top = 24, X = function (d) { return x0 + (x1 - x0) * (Math.log2(d) - 1) / 8; };
    var Y = function (v) { return y0 - (y0 - y1) * Math.min(v, top) / top; };
    svg.appendChild(sv("text", { x: x0, y: 13, "font-size": 12, fill: "#222" },
                       "spread of q\u00b7k against d (line: \u221ad)"));
    svg.appendChild(sv("line", { x1: x0, y1: y0, x2: x1, y2: y0, stroke: "#999" }));
    svg.appendChild(sv("line", { x1: x0, y1: y0, x2: x0, y2: y1, stroke: "#999" }));
    [2, 8, 32, 128, 512].forEach(function (d) {
      svg.appendChild(sv("text", { x: X(d), y: y0 + 14, "font-size": 10, fill: "#777",
                                   "text-anchor": "middle" }, String(d)));
    });
    [0, 10, 20].forEach(function (v) {
      svg.appendChild(sv("text", { x: x0 - 4, y: Y(v) + 3, "font-size": 10, fill: "#777",
                                   "text-anchor": "end" }, String(v)));
    });
    var pts = [];
    for (var t = 1; t <= 9.001; t += 0.125) pts.push(X(Math.pow(2, t)) + "," + Y(Math.sqrt(Math.pow(2, t))));
    svg.appendChild(sv("polyline", { points: pts.join(" "), fill: "none", stroke: "#999",
                                     "stroke-dasharray": "4 3" }));
    D_CHOICES.forEach(function (d) {
      var here = d === r.d;
      svg.appendChild(sv("circle", { cx: X(d), cy: Y(spread(d, r.seed)), r: here ? 6 : 3.5,
                                     fill: here ? "#e6550d" : "#4a7ab7" }));
    });
  }

  // ---------------------------------------------------------------- 4. borrow
  var borrowPlane = null;
  function buildBorrow() {
    var side = clear($("borrow-side"));
    var cb = h("input", { type: "checkbox", id: "scaled-borrow", checked: st.scaled });
    cb.addEventListener("change", function () { st.scaled = cb.checked; update(); });
    live.scaledBoxes.push(cb);
    add(side, add(h("p", { "class": "controls" }), add(h("label"), cb, " weights with \u00f7\u221ad")));
    live.recipe = h("table", { id: "borrow-recipe" });
    live.context = h("p", { "class": "big", id: "borrow-context" });
    live.meaning = h("p", { "class": "note", id: "borrow-meaning" });
    add(side, live.recipe, live.context, live.meaning,
        h("p", { "class": "note" }, "Change the values in Compare: the weights stay put (queries " +
          "and keys decide them); only the mix changes."));
  }
  function updateBorrow(row) {
    var V = st.values, out = row.output, w = row.weights;
    // frame the values, the context vector and the origin
    var pts = V.concat([out, [0, 0]]), lo = [Infinity, Infinity], hi = [-Infinity, -Infinity];
    pts.forEach(function (v) {
      for (var c = 0; c < 2; c++) {
        lo[c] = Math.min(lo[c], v[c] || 0);
        hi[c] = Math.max(hi[c], v[c] || 0);
      }
    });
    var R = Math.max(0.5, (hi[0] - lo[0]) / 2, (hi[1] - lo[1]) / 2) * 1.3;
    var P = borrowPlane, meaning = DATA.value_meaning;
    var svg = P.start(R, meaning[0], meaning[1], [(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2]);
    V.forEach(function (v, j) {
      svg.appendChild(P.arrow([0, 0], v, color(j), 2, { opacity: 0.35 }));
      P.label(v, short(st.tokens[j]), color(j), { opacity: 0.8, "font-weight": "normal" });
    });
    var at = [0, 0];
    V.forEach(function (v, j) {
      var to = [at[0] + w[j] * v[0], at[1] + w[j] * (v[1] || 0)];
      svg.appendChild(P.arrow(at, to, color(j), 4, { "class": "share" }));
      at = to;
    });
    svg.appendChild(P.arrow([0, 0], out, "#111", 2.5, { "class": "context-arrow", opacity: 0.9 }));
    P.label(out, "context", "#111");
    var tbl = clear(live.recipe);
    add(tbl, add(h("tr"), h("th", {}, "token"), h("th", { "class": "num" }, "weight"), h("th", {}, "\u00d7 value"),
                 h("th", {}, "= share")));
    st.tokens.forEach(function (t, j) {
      add(tbl, add(h("tr", { "data-token": j }),
                   add(h("td"), h("span", { "class": "swatch", style: "background:" + color(j) }), short(t)),
                   h("td", { "class": "num" }, fmt(w[j])),
                   h("td", { "class": "mono" }, "\u00d7 " + vecText(V[j])),
                   h("td", { "class": "mono" }, "= " + vecText(V[j].map(function (x) { return w[j] * x; })))));
    });
    live.context.textContent = "context vector for " + quote(DATA.query_token) + " = " + vecText(out);
    live.meaning.textContent = out.length === meaning.length
      ? "Read it as " + out.map(function (x, c) { return pct(x) + " " + quote(meaning[c]); })
          .join(" and ") + " (each value says how much of " + meaning.join(" / ") + " a token carries)."
      : "";
  }

  // ---------------------------------------------------------------- 5. mask
  function buildMask() {
    var body = clear($("mask-body")), g = st.grid;
    var cb = h("input", { type: "checkbox", id: "causal", checked: g.causal });
    cb.addEventListener("change", function () { g.causal = cb.checked; update(); });
    live.causalBox = cb;
    add(body, add(h("p", { "class": "controls" }), add(h("label"), cb, " causal mask (no peeking ahead)"),
                  h("span", { "class": "note" }, "Row = the token looking; column = the token it " +
                    "looks at. Click a cell to see why.")));
    var tbl = h("table", { "class": "grid", id: "mask-grid" });
    var head = add(h("tr"), h("th"));
    g.tokens.forEach(function (t) { head.appendChild(h("th", { style: "text-align:center" }, short(t))); });
    tbl.appendChild(head);
    live.cells = g.tokens.map(function (rowTok, i) {
      var tr = add(h("tr"), h("th", {}, short(rowTok)));
      var row = g.tokens.map(function (colTok, j) {
        var b = h("button", { type: "button", "data-i": i, "data-j": j });
        b.addEventListener("click", function () {
          g.cell = [i, j];
          if (g.causal && j > i) st.tried.clicked_hidden = true;
          update();
        });
        tr.appendChild(add(h("td"), b));
        return b;
      });
      tbl.appendChild(tr);
      return row;
    });
    live.why = h("p", { "class": "why", id: "mask-why", "aria-live": "polite" });
    add(body, tbl, live.why);
  }
  function updateMask() {
    var g = st.grid, rows = gridRows(), toks = g.tokens;
    live.causalBox.checked = g.causal;
    rows.forEach(function (r, i) {
      r.weights.forEach(function (w, j) {
        var b = live.cells[i][j], hidden = !r.allowed[j];
        b.textContent = hidden ? "hidden" : pct(w);
        b.className = (hidden ? "hidden" : "") + (g.cell && g.cell[0] === i && g.cell[1] === j ? " sel" : "");
        b.style.background = hidden ? "" : "rgba(31, 78, 137, " + (0.08 + 0.8 * w).toFixed(3) + ")";
        b.style.color = !hidden && w > 0.5 ? "#fff" : "";
        b.setAttribute("aria-label", quote(toks[i]) + " looking at " + quote(toks[j]) + ": " +
                       (hidden ? "hidden" : pct(w)));
      });
    });
    if (!g.cell) {
      live.why.textContent = "Click a cell. With the mask on, " + quote(toks[0]) + " can only look " +
        "at itself and " + quote(toks[toks.length - 1]) + " sees the whole sentence so far.";
      return;
    }
    var i = g.cell[0], j = g.cell[1], w = rows[i].weights[j], a = quote(toks[i]), b = quote(toks[j]);
    if (!rows[i].allowed[j]) {
      live.why.textContent = "Hidden: " + b + " comes after " + a + ". A model learning to predict " +
        "the next word must not see it, so its score becomes \u2212\u221e and softmax gives it " +
        "exactly 0%. " + a + " spreads its attention over " +
        toks.slice(0, i + 1).map(quote).join(", ") + ".";
    } else if (j > i) {
      live.why.textContent = "No mask: " + a + " peeks at " + b + ", a later word, with " + pct(w) +
        " of its attention. Switch the causal mask on to forbid it.";
    } else {
      live.why.textContent = "Allowed: " + (i === j ? a + " may look at itself" : b +
        " comes before " + a) + "; weight " + pct(w) + " (the row's weights sum to " +
        pct(rows[i].weights.reduce(function (x, y) { return x + y; }, 0)) + ").";
    }
  }

  // ---------------------------------------------------------------- 6. heads
  function buildHeads() {
    var body = clear($("heads-body")), H = DATA.heads;
    add(body, h("p", { "class": "note" }, "Every token is four features (" + H.features.join(", ") +
                "). A head projects them with its own W_q (for the query) and W_k (for the keys), " +
                "4 features \u2192 2 numbers, then runs the attention above (\u00f7\u221a2)."));
    var emb = h("table", { "class": "mat", id: "embeddings" });
    add(emb, add(h("tr"), h("th"), H.tokens.map(function (t) { return h("th", {}, short(t)); })
      .reduce(function (f, e) { f.appendChild(e); return f; }, document.createDocumentFragment())));
    H.features.forEach(function (f, r) {
      var tr = add(h("tr"), h("th", {}, f));
      H.embeddings.forEach(function (e) { tr.appendChild(h("td", { "class": "num" }, fmt(e[r]))); });
      emb.appendChild(tr);
    });
    add(body, emb);
    var box = h("div", { "class": "heads" });
    live.heads = st.heads.map(function (hd, n) {
      var card = h("div", { "class": "head", "data-head": n });
      add(card, h("h3", {}, "head " + quote(hd.name) + " looks for " + hd.looks_for));
      var mats = h("div", { "class": "controls" });
      [["W_q", hd.w_q], ["W_k", hd.w_k], ["W_v", hd.w_v]].forEach(function (m) {
        var t = add(h("table", { "class": "mat" }), add(h("tr"), h("th"),
                                                        h("th", { colspan: 2, "class": "mname" }, m[0])));
        m[1].forEach(function (row, r) {
          var tr = add(h("tr"), h("th", {}, H.features[r]));
          row.forEach(function (_, c) {
            tr.appendChild(add(h("td"), field("head " + hd.name + " " + m[0] + " " + H.features[r] +
                                              " column " + (c + 1), function () { return row[c]; },
                                              function (x) { row[c] = x; st.tried.heads_edited = true; },
                                              parseNumber)));
          });
          t.appendChild(tr);
        });
        mats.appendChild(t);
      });
      var q = h("p", { "class": "mono head-query" }), bx = h("div"), top = h("p", { "class": "big head-top" });
      add(card, mats, q, bx, top);
      box.appendChild(card);
      return { q: q, bars: bx, top: top };
    });
    add(body, box);
    // the heads together: what happens after each head's weighted sum
    var lb = h("div", { "class": "layer", id: "layer-block" });
    add(lb, h("h3", {}, "Past one head: the heads together"),
        h("p", { "class": "note" }, "Each head borrows with its own W_v (4 features \u2192 2 " +
          "numbers): its context vector for " + quote(H.query_token) + ". The two are " +
          "concatenated (4 numbers), multiplied by W_o (back to the 4 features), added to " +
          quote(H.query_token) + "'s own vector x (the residual: the heads add to x, they do not " +
          "replace it), and normalized (mean 0, variance 1): the layer's output for " +
          quote(H.query_token) + ". A real model does the same with 384 numbers " +
          "(attnlab lesson --section layer, or the view's step view)."));
    var wo = add(h("table", { "class": "mat", id: "w-o" }), add(h("tr"), h("th"),
                 h("th", { colspan: 4, "class": "mname" }, "W_o")));
    st.w_o.forEach(function (row, r) {
      var tr = add(h("tr"), h("th", {}, "concat " + (r + 1)));
      row.forEach(function (_, c) {
        tr.appendChild(add(h("td"), field("W_o row " + (r + 1) + " " + H.features[c],
                                          function () { return st.w_o[r][c]; },
                                          function (x) { st.w_o[r][c] = x; st.tried.heads_edited = true; },
                                          parseNumber)));
      });
      wo.appendChild(tr);
    });
    live.layer = {};
    add(lb, wo);
    ["contexts", "concat", "attn_out", "residual", "output"].forEach(function (k) {
      live.layer[k] = h("p", { "class": "mono layer-" + k });
      lb.appendChild(live.layer[k]);
    });
    add(body, lb);
    // positions: how a head can know order
    var pb = h("div", { "class": "layer", id: "positions-block" });
    add(pb, h("h3", {}, "Positions: how a head knows order"),
        h("p", { "class": "note" }, "Attention itself ignores order: q\u00b7k is the same " +
          "wherever the two words stand. A model adds position to its vectors. Rotary " +
          "positions (attnlab's GPT) turn q by its position \u00d7 \u03b8 and k by its own: " +
          "moving both by the same number of places turns both by the same angle, which leaves " +
          "the dot product as it was, so q\u00b7k depends on the distance only, and a head can " +
          "prefer \u201cthe word one place back\u201d whatever the word. (MiniLM instead adds a " +
          "learned position vector: attnlab lesson --section layer.)"));
    var ctl = h("p", { "class": "controls" });
    [["i", "position of \u201cit\u201d"], ["j", "position of \u201c" + DATA.tokens[0] + "\u201d"],
     ["shift", "move both by"]].forEach(function (f) {
      add(ctl, h("span", {}, f[1] + " "), field(f[1], function () { return st.pos[f[0]]; },
                                                 function (x) { st.pos[f[0]] = x; },
                                                 parseNumber), h("span", {}, "  "));
    });
    add(pb, ctl);
    live.pos = {};
    ["turned", "moved", "plain"].forEach(function (k) {
      live.pos[k] = h("p", { "class": "mono positions-" + k });
      pb.appendChild(live.pos[k]);
    });
    add(body, pb);
  }
  function updatePositions() {
    var P = positionsRow(), c = quote(DATA.tokens[0]);
    live.pos.turned.textContent = "q for \u201cit\u201d at " + P.i + " = " + vecText(P.q) + ", k for " +
      c + " at " + P.j + " = " + vecText(P.k) + "; q\u00b7k = " + fmt(P.dot, 4);
    live.pos.moved.textContent = "both moved " + P.shift + ": q\u00b7k = " + fmt(P.dot_moved, 4) +
      "  (the same: only the distance " + (P.i - P.j) + " counts)";
    live.pos.plain.textContent = "without positions: q\u00b7k = " + fmt(P.plain, 4) +
      " wherever the words stand";
  }
  function updateLayer() {
    var L = layerRow(), q = quote(DATA.heads.query_token);
    live.layer.contexts.textContent = L.heads.map(function (hd, n) {
      return "head " + quote(st.heads[n].name) + " context = " + vecText(hd.context);
    }).join("; ");
    live.layer.concat.textContent = "concatenated = " + vecText(L.concat);
    live.layer.attn_out.textContent = "\u00d7 W_o = " + vecText(L.attn_out) +
      "  (what the heads add to " + q + ")";
    live.layer.residual.textContent = "+ x " + vecText(L.x) + " = " + vecText(L.residual) +
      "  (the residual)";
    live.layer.output.textContent = "layer norm = " + vecText(L.output) + "  (the layer's output for " +
      q + ")";
  }
  function updateHeads() {
    var H = DATA.heads, rows = headRows();
    rows.forEach(function (r, n) {
      var ui = live.heads[n], b = argmax(r.weights);
      ui.q.textContent = "query for " + quote(H.query_token) + " = " + vecText(r.query) +
        "; scores " + r.scores.map(function (s) { return fmt(s, 2); }).join(", ");
      clear(ui.bars);
      bars(ui.bars, H.tokens, r.weights, { format: pct, width: 220, top: true, cls: "head-w" });
      ui.top.textContent = "\u2192 " + quote(H.query_token) + " borrows most from " +
        quote(H.tokens[b]) + " (" + pct(r.weights[b]) + ")";
    });
  }

  // ---------------------------------------------------------------- 7. check yourself
  var TASKS = {
    best_is_mat: function () { return st.tokens[argmax(mainRow().scores)] === "mat"; },
    away_from_cat: function () {
      var j = st.tokens.indexOf("cat");
      return j >= 0 && dot(st.query, st.keys[j]) < 0;
    },
    clicked_hidden: function () { return !!st.tried.clicked_hidden; },
    heads_edited: function () { return !!st.tried.heads_edited; },
    values_edited: function () { return !!st.tried.values_edited; },
    tried_softmax: function () { return !!st.tried.tried_softmax; },
    big_d: function () { return st.dims.d >= 256; }
  };
  function buildCheck() {
    var body = clear($("check-body")), lesson = null;
    live.questions = DATA.questions.map(function (q, n) {
      if (q.lesson !== lesson) {
        lesson = q.lesson;
        body.appendChild(h("p", { "class": "lesson-name" }, lesson));
      }
      var card = h("div", { "class": "q", "data-q": n });
      var answer = h("div", { "class": "answer", hidden: true });
      add(answer, h("b", {}, "attnlab's answer (with the lesson's starting numbers): "), q.answer);
      var feedback = h("span", { "class": "feedback", "aria-live": "polite" });
      var choices = h("div", { "class": "choices", role: "group", "aria-label": q.try });
      var order = q.choices.map(function (_, i) { return (i + n) % q.choices.length; });
      order.forEach(function (i) {
        var b = h("button", { type: "button", "data-right": String(i === 0) }, q.choices[i]);
        b.addEventListener("click", function () {
          b.classList.add(i === 0 ? "right" : "wrong");
          feedback.textContent = i === 0 ? " \u2713 right" : " \u2717 not quite \u2014 see the answer";
          feedback.className = "feedback " + (i === 0 ? "ok" : "warn");
          answer.hidden = false;
        });
        choices.appendChild(b);
      });
      add(card, h("div", { "class": "ask" }, q.question), add(h("div"), "Try: " + q.try, feedback),
          choices);
      var task = null;
      if (q.task) {
        task = h("div", { "class": "task" });
        card.appendChild(task);
      }
      card.appendChild(answer);
      body.appendChild(card);
      return { q: q, task: task, answer: answer };
    });
  }
  function updateCheck() {
    live.questions.forEach(function (it) {
      if (!it.task) return;
      var done = TASKS[it.q.task]();
      it.task.textContent = (done ? "\u2713 done: " : "Or do it: ") + it.q.task_text;
      it.task.className = "task" + (done ? " ok" : "");
      if (done) it.answer.hidden = false;
    });
  }

  // ---------------------------------------------------------------- driving it all
  function update() {
    var row = mainRow();
    updateCompare(row);
    updateNormalize();
    updateScale();
    updateBorrow(row);
    updateMask();
    updateHeads();
    updateLayer();
    updatePositions();
    updateCheck();
    syncFields();
    document.body.setAttribute("data-ready", "1");
  }
  function rebuild() {
    buildCompare();
    buildNormalize();
    buildScale();
    buildBorrow();
    buildMask();
    buildHeads();
    update();
  }

  // window.attnlabLesson: read every number, or drive the page (tests, and readers at the console)
  function matrix(name, m, rows, cols) {
    if (!Array.isArray(m) || m.length < 1 || (rows != null && m.length !== rows)) {
      throw new Error("attnlabLesson.set: " + name + ": expected " + (rows == null ? "at least 1" : rows) +
                      " rows, got " + JSON.stringify(m));
    }
    m.forEach(function (r) { vector(name, r, cols); });
    return copy(m);
  }
  function vector(name, v, n) {
    if (!Array.isArray(v) || v.length < 1 || (n != null && v.length !== n) ||
        !v.every(function (x) { return typeof x === "number" && isFinite(x); })) {
      throw new Error("attnlabLesson.set: " + name + ": expected " + (n == null ? "" : n + " ") +
                      "finite numbers, got " + JSON.stringify(v));
    }
    return v.slice();
  }
  function set(p) {
    p = p || {};
    var q = "query" in p ? vector("query", p.query) : st.query;
    var K = "keys" in p ? matrix("keys", p.keys, null, q.length) : st.keys;
    if (K.length > MAX_TOKENS) throw new Error("attnlabLesson.set: keys: at most " + MAX_TOKENS + " tokens");
    K.forEach(function (k) { vector("keys", k, q.length); });
    var V = "values" in p ? matrix("values", p.values, K.length, p.values[0] && p.values[0].length)
      : st.values;
    if (V.length !== K.length) throw new Error("attnlabLesson.set: values: expected " + K.length + " rows");
    var T = "tokens" in p ? p.tokens.map(String) : st.tokens;
    if (T.length !== K.length) {
      if ("tokens" in p) throw new Error("attnlabLesson.set: tokens: expected " + K.length + " names");
      T = K.map(function (_, j) { return st.tokens[j] || "token " + (j + 1); });
    }
    var grid = st.grid;
    if (p.grid) {
      var G = p.grid, n = G.queries ? G.queries.length : grid.queries.length;
      var gq = G.queries ? matrix("grid.queries", G.queries) : grid.queries;
      var gk = G.keys ? matrix("grid.keys", G.keys, n, gq[0].length) : grid.keys;
      var gv = G.values ? matrix("grid.values", G.values, n) : grid.values;
      if (gk.length !== n || gv.length !== n || gk[0].length !== gq[0].length) {
        throw new Error("attnlabLesson.set: grid: queries, keys, values need the same number of rows");
      }
      grid = { tokens: G.tokens ? G.tokens.map(String) : gq.map(function (_, i) {
                 return grid.tokens[i] || "t" + i; }),
               queries: gq, keys: gk, values: gv,
               causal: "causal" in G ? !!G.causal : grid.causal, cell: null };
    }
    var heads = st.heads;
    if (p.heads) {
      heads = st.heads.map(function (hd, n) {
        var x = p.heads[n] || {};
        return { name: hd.name, looks_for: hd.looks_for,
                 w_q: x.w_q ? matrix("heads.w_q", x.w_q, 4, 2) : hd.w_q,
                 w_k: x.w_k ? matrix("heads.w_k", x.w_k, 4, 2) : hd.w_k,
                 w_v: x.w_v ? matrix("heads.w_v", x.w_v, 4, 2) : hd.w_v };
      });
    }
    var wO = p.layer && p.layer.w_o ? matrix("layer.w_o", p.layer.w_o, 4, 4) : st.w_o;
    var pos = copy(st.pos);
    if (p.positions) {
      ["i", "j", "shift", "theta"].forEach(function (k) {
        if (k in p.positions) pos[k] = vector("positions." + k, [p.positions[k]], 1)[0];
      });
    }
    if (p.normalize) {
      var N = p.normalize;
      if ("scores" in N) vector("normalize.scores", N.scores);
      if ("temperature" in N && !(N.temperature > 0 && isFinite(N.temperature))) {
        throw new Error("attnlabLesson.set: normalize.temperature: expected a positive number");
      }
    }
    if (p.dims && "d" in p.dims && !(p.dims.d >= 2 && p.dims.d <= 512 && p.dims.d % 1 === 0)) {
      throw new Error("attnlabLesson.set: dims.d: expected an integer 2 \u2026 512");
    }
    var structural = "query" in p || "keys" in p || "values" in p || "tokens" in p || p.grid ||
      p.heads || p.layer || p.positions || (p.normalize && "scores" in p.normalize);
    st.query = q.slice();
    st.keys = copy(K);
    st.values = copy(V);
    st.tokens = T.slice();
    st.grid = copy(grid);
    st.heads = copy(heads);
    st.w_o = copy(wO);
    st.pos = pos;
    if ("scaled" in p) st.scaled = !!p.scaled;
    if (p.normalize) {
      ["source", "mode", "temperature"].forEach(function (k) { if (k in p.normalize) st.norm[k] = p.normalize[k]; });
      if ("scores" in p.normalize) st.norm.scores = p.normalize.scores.slice();
    }
    if (p.dims) {
      if ("d" in p.dims) st.dims.d = p.dims.d;
      if ("seed" in p.dims) st.dims.seed = p.dims.seed;
    }
    st.focus = null;
    if (structural) rebuild();
    else { buildNormalize(); update(); }
    return get();
  }
  function get() {
    var row = mainRow(), n = normWeights(st.norm);
    return copy({
      query: st.query, keys: st.keys, values: st.values, tokens: st.tokens,
      scaled: st.scaled, scale: mainScale(), scores: row.scores, scaled_scores: row.scaled,
      weights: row.weights, output: row.output,
      normalize: { source: st.norm.source, mode: st.norm.mode, temperature: st.norm.temperature,
                   scores: n.scores, divided: n.divided, softmax: n.softmax },
      dims: dims(),
      grid: (function () {
        var rows = gridRows();
        return { tokens: st.grid.tokens, queries: st.grid.queries, keys: st.grid.keys,
                 values: st.grid.values, causal: st.grid.causal,
                 scale: 1 / Math.sqrt(st.grid.queries[0].length),
                 scores: rows.map(function (r) { return r.scores; }),
                 weights: rows.map(function (r) { return r.weights; }),
                 output: rows.map(function (r) { return r.output; }) };
      })(),
      heads: headRows().map(function (r, n) {
        return { name: st.heads[n].name, w_q: st.heads[n].w_q, w_k: st.heads[n].w_k,
                 w_v: st.heads[n].w_v,
                 query: r.query, keys: r.keys, scores: r.scores, weights: r.weights };
      }),
      layer: layerRow(),
      positions: positionsRow()
    });
  }

  cmpPlane = new Plane($("compare-plane"), 400);
  live.caption = h("p", { "class": "note caption", id: "compare-caption" });
  $("compare-plane").parentNode.appendChild(live.caption);
  borrowPlane = new Plane($("borrow-plane"), 340);
  hookDrag();
  buildCheck();
  rebuild();
  window.attnlabLesson = { get: get, set: set };
})();
