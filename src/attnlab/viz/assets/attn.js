/* attnlab views: head view, model view, step view, heads view, PNG/SVG export. No network, no libraries.
   Tokens are only ever written with textContent (never innerHTML), so any text stays text. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif";
  // matrix "rollout": the head view shows rollout. sets: the page's captures (encoder, decoder,
  // cross); choices: its "attention" list, each a capture and a block [rows) x [cols) of it
  // head: the head whose numbers the views show (the "head" list); heads: the heads the head view
  // overlays, each in its colour (head is one of them), "all" until the data says how many
  var state = { data: null, layer: 0, head: 0, heads: null, token: 0, view: "head",
                pinned: null, stat: "prev", matrix: null, sets: [], choices: [], choice: 0,
                rows: [0, 0], cols: [0, 0] };
  // display_mode: the drawing's colours; ramp = weight 0 -> 1 (the heatmaps' colour scale);
  // palette: a colour per head (by the model's head number), the same hues in both themes, each
  // at least 3:1 against the theme's background (WCAG's contrast for lines and marks)
  var THEMES = {
    light: { bg: "#fff", text: "#222", muted: "#555", faint: "#aaa", frame: "#999",
             masked: [200, 200, 200], lo: [255, 255, 255], hi: [8, 48, 107],
             palette: ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#e6550d", "#8c564b",
                       "#d6338a", "#138d90", "#7a7a00", "#555555", "#393b79", "#ad494a"] },
    dark: { bg: "#000", text: "#ccc", muted: "#999", faint: "#555", frame: "#555",
            masked: [64, 64, 64], lo: [0, 0, 0], hi: [120, 190, 255],
            palette: ["#6fb3ff", "#ff6b6b", "#6ee06e", "#c8a2ff", "#ff9a4d", "#d9a07f",
                      "#ff85c8", "#40d8d8", "#e0e060", "#bdbdbd", "#9ea8ff", "#ffb3a0"] }
  };
  function theme() { return THEMES[document.body.getAttribute("data-theme")] || THEMES.light; }
  function ramp(w) {
    var t = theme();
    return [0, 1, 2].map(function (c) { return Math.round(t.lo[c] + (t.hi[c] - t.lo[c]) * w); });
  }
  function onRamp(w) {  // text colour readable on ramp(w)
    return (w > 0.6) === (theme() === THEMES.light) ? "#fff" : "#111";
  }
  function headColor(h) {
    var p = theme().palette;
    return p[state.data.headIds[h] % p.length];
  }
  function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }

  function $(id) { return document.getElementById(id); }

  function bytes(b64) {
    var bin = atob(b64), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function floats(b64) { return b64 == null ? null : new Float32Array(bytes(b64).buffer); }

  function load(raw) {
    var d = {};
    for (var k in raw) d[k] = raw[k];
    d.W = floats(raw.weights);  // (layers, H, L, S)
    d.M = bytes(raw.mask);      // (L, S), 1 = may attend
    d.LM = raw.layer_masks ? bytes(raw.layer_masks) : null;  // (layers, L, S): each layer's own
    d.B = floats(raw.bias);     // (layers, H, L, S) added to the scores, or null
    d.qTok = raw.tokens;        // L query tokens
    d.kTok = raw.key_tokens || raw.tokens;  // S key tokens (another text's for cross-attention)
    d.layerIds = raw.layer_ids || range(raw.n_layers);  // the model's numbers of the drawn ones
    d.headIds = raw.head_ids || range(raw.n_heads);
    d.Q = floats(raw.queries);  // (layers, H, L, D)
    d.K = floats(raw.keys);     // (layers, H, S, D)
    d.V = floats(raw.values);   // (layers, H, S, Dv)
    d.R = floats(raw.rollout);  // (L, S) attention rollout over every layer, or null
    return d;
  }
  function weight(l, h, i, j) {
    var d = state.data;
    return d.W[((l * d.n_heads + h) * d.L + i) * d.S + j];
  }
  function shown(l, h, i, j) {  // what the head view draws: a head's weights, or the rollout
    return state.matrix === "rollout" ? state.data.R[i * state.data.S + j] : weight(l, h, i, j);
  }
  function range(n) { var r = []; for (var t = 0; t < n; t++) r.push(t); return r; }
  function allowed(i, j, l) {  // layer l's mask when the capture has one per layer
    var d = state.data;
    if (l != null && d.LM && state.matrix !== "rollout") return d.LM[(l * d.L + i) * d.S + j] === 1;
    return d.M[i * d.S + j] === 1;
  }
  function row(A, l, h, i, n, D) {
    var o = ((l * state.data.n_heads + h) * n + i) * D;
    return A.subarray(o, o + D);
  }
  function pct(x) { return (100 * x).toFixed(1) + "%"; }
  function num(x) {
    if (x === -Infinity) return "\u2212\u221e";
    return (x < 0 ? "\u2212" : "") + Math.abs(x).toFixed(3);
  }
  function vecText(v, n) {
    var parts = [];
    for (var i = 0; i < Math.min(n, v.length); i++) parts.push(num(v[i]));
    return "[" + parts.join(", ") + (v.length > n ? ", \u2026" : "") + "]";
  }
  function short(t, n) { return t.length > n ? t.slice(0, n - 1) + "\u2026" : t; }

  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function label(x, y, text, extra) {
    var a = { x: x, y: y, "font-family": FONT, "font-size": 13, fill: theme().text };
    for (var k in extra || {}) a[k] = extra[k];
    return el("text", a, text);
  }
  // "H0 H1 ..." above the columns and "L0 L1 ..." beside the rows of a layers x heads grid
  function gridLabels(svg, d, left, top, step, cell) {
    for (var h = 0; h < d.n_heads; h++) {
      svg.appendChild(label(left + h * step + cell / 2, top - 8, "H" + d.headIds[h],
                            { "text-anchor": "middle", "font-size": 11 }));
    }
    for (var l = 0; l < d.n_layers; l++) {
      svg.appendChild(label(4, top + l * step + cell / 2 + 4, "L" + d.layerIds[l],
                            { "font-size": 11 }));
    }
  }
  function newDrawing(width, height) {
    var svg = $("drawing");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("data-view", state.view);
    svg.setAttribute("data-layer", state.layer);
    svg.setAttribute("data-head", state.head);
    svg.setAttribute("data-choice", state.choice);
    svg.appendChild(el("rect", { "class": "background", x: 0, y: 0, width: width, height: height,
                                 fill: theme().bg }));
    return svg;
  }
  function readout(text) { $("readout").textContent = text; }
  function names(l, h) { return "layer " + state.data.layerIds[l] + ", head " + state.data.headIds[h]; }
  function longestOf(tokens) {
    var n = 0;
    tokens.forEach(function (t) { n = Math.max(n, Math.min(t.length, 18)); });
    return n;
  }

  // ---- head view: each query token (left) to the key tokens it borrows from (right), opacity =
  // weight; several heads at once, each in its colour (bertviz's head view), chosen with a row of
  // coloured squares; the percentages and the readout give one head's numbers (state.head); only
  // the chosen block of rows x columns (bertviz's sentence filter) is drawn
  var SQUARE = 20, SQUARE_GAP = 4;
  function toggleHead(h) {  // a click: show or hide one head; the last one shown stays
    var at = state.heads.indexOf(h);
    if (at >= 0 && state.heads.length === 1) return;
    if (at >= 0) {
      state.heads.splice(at, 1);
      if (state.head === h) state.head = state.heads[0];
    } else {
      state.heads.push(h);
      state.heads.sort(function (a, b) { return a - b; });
      state.head = h;
    }
  }
  function soloHead(h) {  // a double-click: that head alone; on the only head shown: every head
    if (state.heads.length === 1 && state.heads[0] === h) state.heads = range(state.data.n_heads);
    else state.heads = [h];
    state.head = h;
  }
  function drawHead() {
    var d = state.data, l = state.layer, rowH = 22, rollout = state.matrix === "rollout";
    var r0 = state.rows[0], r1 = state.rows[1], c0 = state.cols[0], c1 = state.cols[1];
    var colW = 16 + 8 * Math.max(longestOf(d.qTok.slice(r0, r1)), longestOf(d.kTok.slice(c0, c1)));
    var pctW = 58, gap = 240, xL = pctW + colW, xR = xL + gap;
    var width = Math.max(560, xR + colW + pctW);  // the caption fits
    var perRow = Math.floor((width - 20) / (SQUARE + SQUARE_GAP));
    var top = 34 + (rollout ? 0 : Math.ceil(d.n_heads / perRow) * (SQUARE + SQUARE_GAP) + 6);
    var height = top + rowH * Math.max(r1 - r0, c1 - c0) + 10;
    var svg = newDrawing(width, height);
    svg.setAttribute("data-matrix", state.matrix || "head");
    var caption = label(10, 20, "", { "font-size": 12, fill: theme().muted, "class": "caption" });
    svg.appendChild(caption);
    var links = el("g", { "class": "links" }), byQuery, byKey, squares = [];
    svg.appendChild(links);
    var boxes = el("g", { "class": "head-boxes", "pointer-events": "none" });  // under the tokens
    svg.appendChild(boxes);
    function drawn() { return rollout ? [state.head] : state.heads; }
    // every shown head's lines, opacity = weight / heads shown (bertviz: where n heads' lines
    // overlap they add up to about their mean weight); one token's lines alone: opacity = weight
    function drawLinks() {
      while (links.firstChild) links.removeChild(links.firstChild);
      byQuery = {};
      byKey = {};
      for (var i = r0; i < r1; i++) byQuery[i] = [];
      for (var j = c0; j < c1; j++) byKey[j] = [];
      var heads = drawn(), n = heads.length;
      heads.forEach(function (h) {
        var g = el("g", { "class": "head-links", "data-h": h }), color = headColor(h);
        for (var i = r0; i < r1; i++) {
          for (var j = c0; j < c1; j++) {
            var w = shown(l, h, i, j);
            if (!allowed(i, j, l) || w < 0.002) continue;  // invisible anyway; keeps the page light
            var line = el("line", { "class": "link", x1: xL + 6, y1: top + rowH * (i - r0) + 11,
                                    x2: xR - 6, y2: top + rowH * (j - c0) + 11, stroke: color,
                                    "stroke-width": 2, "stroke-opacity": (w / n).toFixed(4),
                                    "data-i": i, "data-j": j, "data-h": h,
                                    "data-w": w.toFixed(6) });
            g.appendChild(line);
            byQuery[i].push(line);
            byKey[j].push(line);
          }
        }
        links.appendChild(g);
      });
      svg.setAttribute("data-heads", heads.join(","));
      svg.setAttribute("data-head", state.head);
      $("head").value = String(state.head);
      var which = "layer " + d.layerIds[l] + ", heads " + heads.map(function (h) {
        return d.headIds[h]; }).join(", ");
      fitCaption(rollout ?
        ["attention rollout through every layer (heads averaged): where each token (left) came " +
         "from (right); line opacity = share"] : n === 1 ?
        [names(l, heads[0]) + ": each token (left) borrows from (right); line opacity = weight"] :
        [which + ": each token (left) borrows from (right); line opacity = weight \u00f7 " + n +
         " (a hovered token's: weight)",
         which + ": line opacity = weight \u00f7 " + n,
         "layer " + d.layerIds[l] + ", " + n + " heads: line opacity = weight \u00f7 " + n]);
    }
    function fitCaption(texts) {  // the first wording that fits the drawing's width
      for (var t = 0; t < texts.length; t++) {
        caption.textContent = texts[t];
        if (caption.getComputedTextLength() <= width - 20) return;
      }
    }
    function drawSquares() {  // click: show / hide a head; double-click: that head alone
      var g = el("g", { "class": "head-squares", role: "group", "aria-label": "heads shown" });
      range(d.n_heads).forEach(function (h) {
        var x = 10 + (h % perRow) * (SQUARE + SQUARE_GAP);
        var y = 30 + Math.floor(h / perRow) * (SQUARE + SQUARE_GAP);
        var s = el("g", { "class": "head-square", "data-head": h, role: "button", tabindex: 0,
                          cursor: "pointer" });
        s.appendChild(el("rect", { x: x + 1, y: y + 1, width: SQUARE - 2, height: SQUARE - 2,
                                   "stroke-width": 2 }));
        s.appendChild(label(x + SQUARE / 2, y + 14, String(d.headIds[h]),
                            { "text-anchor": "middle", "font-size": 10 }));
        s.appendChild(el("title", {}, "head " + d.headIds[h] + ": click shows or hides it, " +
                         "double-click shows it alone (again: every head)"));
        function act(change) { change(h); drawLinks(); paintSquares(); reset(); }
        s.addEventListener("click", act.bind(null, toggleHead));
        s.addEventListener("dblclick", act.bind(null, soloHead));
        s.addEventListener("keydown", function (ev) {
          if (ev.key !== "Enter" && ev.key !== " ") return;
          ev.preventDefault();
          act(toggleHead);
        });
        squares.push(s);
        g.appendChild(s);
      });
      svg.appendChild(g);
    }
    function paintSquares() {  // filled: shown; outlined: hidden; framed in text colour: state.head
      squares.forEach(function (s, h) {
        var on = state.heads.indexOf(h) >= 0, color = headColor(h);
        s.setAttribute("aria-pressed", String(on));
        s.setAttribute("data-shown", String(on));
        var r = s.querySelector("rect");
        r.setAttribute("fill", on ? color : theme().bg);
        r.setAttribute("stroke", h === state.head ? theme().text : color);
        s.querySelector("text").setAttribute("fill", on ? theme().bg : color);
      });
    }
    var qPct = {}, kPct = {};
    function side(isQuery) {
      var g = el("g", { "class": isQuery ? "queries" : "keys" });
      var a = isQuery ? r0 : c0, b = isQuery ? r1 : c1, toks = isQuery ? d.qTok : d.kTok;
      for (var t = a; t < b; t++) {
        var y = top + rowH * (t - a);
        var tg = el("g", { "class": "tok " + (isQuery ? "q" : "k"), "data-index": t,
                           cursor: "pointer" });
        tg.appendChild(el("rect", { x: isQuery ? pctW : xR, y: y, width: colW, height: rowH - 2,
                                    fill: theme().bg, "fill-opacity": 0 }));
        tg.appendChild(label(isQuery ? xL - 4 : xR + 4, y + 15, short(toks[t], 18),
                             { "text-anchor": isQuery ? "end" : "start", stroke: theme().bg,
                               "stroke-width": 3, "stroke-linejoin": "round",
                               "paint-order": "stroke" }));  // a halo: readable on any box
        tg.appendChild(el("title", {}, toks[t]));
        var p = label(isQuery ? 4 : xR + colW + 4, y + 15, "", { "class": "pct", "font-size": 12 });
        (isQuery ? qPct : kPct)[t] = p;
        g.appendChild(p);
        g.appendChild(tg);
        hookToken(tg, t, isQuery);
      }
      svg.appendChild(g);
    }
    function clearPct() {
      var color = headColor(state.head);
      [qPct, kPct].forEach(function (o) {
        for (var t in o) { o[t].textContent = ""; o[t].setAttribute("fill", color); }
      });
    }
    // a hovered token's weight in every shown head (bertviz's boxes): beside each token on the
    // other side, its column split into one box per shown head (in head order), each in its
    // head's colour with fill opacity = that head's weight for the pair; none where masked
    function clearBoxes() {
      while (boxes.firstChild) boxes.removeChild(boxes.firstChild);
      svg.removeAttribute("data-boxes");
    }
    function drawBoxes(t, isQuery) {
      clearBoxes();
      var heads = drawn(), bw = colW / heads.length, a = isQuery ? c0 : r0, b = isQuery ? c1 : r1;
      var x0 = isQuery ? xR : pctW;
      heads.forEach(function (h, k) {
        var color = headColor(h);
        for (var o = a; o < b; o++) {
          var qi = isQuery ? t : o, kj = isQuery ? o : t;
          if (!allowed(qi, kj, l)) continue;
          var w = shown(l, h, qi, kj);
          boxes.appendChild(el("rect", { "class": "head-box", x: (x0 + k * bw).toFixed(2),
                                         y: top + rowH * (o - a), width: bw.toFixed(2),
                                         height: rowH - 2, fill: color,
                                         "fill-opacity": w.toFixed(6), "data-h": h,
                                         "data-i": qi, "data-j": kj }));
        }
      });
      svg.setAttribute("data-boxes", isQuery ? "keys" : "queries");
    }
    function isolate(lines) {
      links.querySelectorAll(".link").forEach(function (x) { x.setAttribute("display", "none"); });
      lines.forEach(function (x) {
        x.removeAttribute("display");
        x.setAttribute("stroke-opacity", x.getAttribute("data-w"));
      });
    }
    function reset() {
      var n = drawn().length;
      links.querySelectorAll(".link").forEach(function (x) {
        x.removeAttribute("display");
        x.setAttribute("stroke-opacity", (+x.getAttribute("data-w") / n).toFixed(4));
      });
      clearPct();
      clearBoxes();
      readout("Hover a token to see its weights; click one on the left to pin it." +
              (rollout ? "" : " Click a coloured square to show or hide a head, double-click " +
                              "it to show that head alone."));
      svg.querySelectorAll(".tok.q").forEach(function (x) {
        x.querySelector("text").setAttribute(
          "font-weight", +x.getAttribute("data-index") === state.pinned ? "bold" : "normal");
      });
      if (state.pinned != null && state.pinned >= r0 && state.pinned < r1) focus(state.pinned, true);
    }
    function focus(t, isQuery) {  // that token's lines of every shown head; state.head's numbers
      var h = state.head;
      isolate(isQuery ? byQuery[t] : byKey[t]);
      clearPct();
      drawBoxes(t, isQuery);
      var ranked = [], a = isQuery ? c0 : r0, b = isQuery ? c1 : r1;
      for (var o = a; o < b; o++) {
        var qi = isQuery ? t : o, kj = isQuery ? o : t, on = allowed(qi, kj, l);
        var wv = shown(l, h, qi, kj);
        (isQuery ? kPct : qPct)[o].textContent = on ? pct(wv) : "masked";
        if (on) ranked.push([wv, o]);
      }
      ranked.sort(function (x, y) { return y[0] - x[0]; });
      var other = isQuery ? d.kTok : d.qTok;
      var top5 = ranked.slice(0, 5).map(function (r) {
        return "\u201c" + other[r[1]] + "\u201d " + pct(r[0]);
      }).join(", ");
      readout("\u201c" + (isQuery ? d.qTok : d.kTok)[t] + "\u201d " +
              (isQuery ? "borrows from: " : "is borrowed by: ") + top5 +
              (drawn().length > 1 ? "  (head " + d.headIds[h] + "; the lines: every head shown)" :
               ""));
    }
    function hookToken(tg, t, isQuery) {
      tg.addEventListener("mouseenter", function () { focus(t, isQuery); });
      tg.addEventListener("mouseleave", reset);
      if (!isQuery) return;
      tg.addEventListener("click", function () {
        state.pinned = state.pinned === t ? null : t;
        setToken(t);
        reset();
      });
    }
    drawLinks();
    if (!rollout) {
      drawSquares();
      paintSquares();
    }
    side(true);
    side(false);
    reset();
  }

  // ---- model view: layers x heads heatmap thumbnails; click one to open it in the head view
  function heatmapURL(l, h, at) {  // the chosen block of rows x columns only
    var r0 = state.rows[0], c0 = state.cols[0], nR = state.rows[1] - r0, nC = state.cols[1] - c0;
    var c = document.createElement("canvas"), masked = theme().masked;
    c.width = nC;
    c.height = nR;
    var ctx = c.getContext("2d"), img = ctx.createImageData(nC, nR);
    for (var i = 0; i < nR; i++) {
      for (var j = 0; j < nC; j++) {
        var o = 4 * (i * nC + j), w = at ? at(i + r0, j + c0) : weight(l, h, i + r0, j + c0);
        var on = at ? allowed(i + r0, j + c0) : allowed(i + r0, j + c0, l);
        var px = on ? ramp(w) : masked;
        img.data[o] = px[0]; img.data[o + 1] = px[1]; img.data[o + 2] = px[2];
        img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return c.toDataURL("image/png");
  }
  function drawModel() {
    var d = state.data, n = Math.max(state.rows[1] - state.rows[0], state.cols[1] - state.cols[0]);
    var cell = Math.max(44, Math.min(90, 4 * n)), pad = 8, left = 40, top = 48;
    var width = Math.max(560, left + d.n_heads * (cell + pad) + 10), height = top + d.n_layers * (cell + pad) + 10;
    if (d.R) height += cell + 30;
    var svg = newDrawing(width, height);
    svg.appendChild(label(10, 18, "model view: rows = layers, columns = heads (click one to open " +
                          "it; grey = masked)", { "font-size": 12, fill: theme().muted }));
    gridLabels(svg, d, left, top, cell + pad, cell);
    for (var l = 0; l < d.n_layers; l++) {
      for (var h = 0; h < d.n_heads; h++) {
        var x = left + h * (cell + pad), y = top + l * (cell + pad);
        var g = el("g", { "class": "thumb", "data-layer": l, "data-head": h, cursor: "pointer" });
        g.appendChild(el("image", { x: x, y: y, width: cell, height: cell, href: heatmapURL(l, h),
                                    preserveAspectRatio: "none",
                                    style: "image-rendering: pixelated" }));
        var current = l === state.layer && h === state.head;
        g.appendChild(el("rect", { x: x, y: y, width: cell, height: cell, fill: "none",
                                   stroke: current ? "#d62728" : theme().frame,
                                   "stroke-width": current ? 3 : 1 }));
        g.appendChild(el("title", {}, names(l, h)));
        g.addEventListener("click", openThumb.bind(null, l, h));
        svg.appendChild(g);
      }
    }
    if (d.R) {  // attention rollout: every layer at once, heads averaged
      var ry = top + d.n_layers * (cell + pad) + 24;
      svg.appendChild(label(left, ry - 6, "attention rollout (all layers, heads averaged)",
                            { "font-size": 11 }));
      var rg = el("g", { "class": "rollout-thumb", cursor: "pointer" });
      rg.appendChild(el("image", { x: left, y: ry, width: cell, height: cell,
                                   href: heatmapURL(0, 0, function (i, j) { return d.R[i * d.S + j]; }),
                                   preserveAspectRatio: "none", style: "image-rendering: pixelated" }));
      rg.appendChild(el("rect", { x: left, y: ry, width: cell, height: cell, fill: "none",
                                  stroke: state.matrix === "rollout" ? "#d62728" : theme().frame }));
      rg.appendChild(el("title", {}, "attention rollout"));
      rg.addEventListener("click", function () {
        state.matrix = "rollout";
        state.view = "head";
        render();
      });
      svg.appendChild(rg);
    }
    readout("Click a thumbnail to open that head" + (d.R ? ", or the rollout." : "."));
  }
  function openThumb(l, h) {
    state.matrix = null;
    state.layer = l;
    state.head = h;
    state.heads = [h];
    state.view = "head";
    render();
  }

  // ---- heads view: layers x heads coloured by one statistic; hover for the label, click to open
  var UNIT_FREE = { entropy: 1, offset: 1 };  // not on a 0..1 scale: coloured over their range
  function drawHeads() {
    var d = state.data, hs = d.head_stats, cell = 54, pad = 4, left = 40, top = 48;
    var width = Math.max(560, left + d.n_heads * (cell + pad) + 10);
    var height = top + d.n_layers * (cell + pad) + 10;
    var svg = newDrawing(width, height);
    svg.setAttribute("data-stat", state.stat);
    if (!hs) {
      svg.appendChild(label(10, 18, "heads view: no head statistics in this page"));
      return;
    }
    var values = hs.stats[state.stat], lo = 0, hi = 1;
    if (UNIT_FREE[state.stat]) {
      lo = Infinity; hi = -Infinity;
      values.forEach(function (r) { r.forEach(function (v) {
        if (v != null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
      if (!(hi > lo)) { lo = 0; hi = 1; }
    }
    svg.appendChild(label(10, 18, "heads view: " + state.stat + " per head (hover for the label, " +
                          "click to open the head)", { "font-size": 12, fill: theme().muted }));
    gridLabels(svg, d, left, top, cell + pad, cell);
    for (var l = 0; l < d.n_layers; l++) {
      for (var h = 0; h < d.n_heads; h++) {
        var v = values[l][h], x = left + h * (cell + pad), y = top + l * (cell + pad);
        var t = v == null ? 0 : Math.max(0, Math.min(1, (v - lo) / (hi - lo)));
        var fill = v == null ? rgb(theme().masked) : rgb(ramp(t));
        var text = v == null ? "–" : state.stat === "offset" ? (v > 0 ? "+" : "") + v :
          v.toFixed(2);
        var g = el("g", { "class": "headcell", "data-layer": l, "data-head": h,
                          "data-value": v == null ? "" : v, "data-label": hs.labels[l][h],
                          cursor: "pointer" });
        g.appendChild(el("rect", { x: x, y: y, width: cell, height: cell, fill: fill,
                                   stroke: theme().frame, "stroke-width": 1 }));
        g.appendChild(label(x + cell / 2, y + cell / 2 + 4, text,
                            { "text-anchor": "middle", "font-size": 11,
                              fill: onRamp(t) }));
        g.appendChild(el("title", {}, names(l, h) + ": " + hs.labels[l][h] +
                         " (" + state.stat + " = " + text + ")" +
                         (hs.words ? "\n" + hs.words[l][h] : "")));  // the label in words
        g.addEventListener("click", openThumb.bind(null, l, h));
        svg.appendChild(g);
      }
    }
    readout("Labels: " + hs.rules);
  }

  // ---- step view: the lesson's pipeline for one token and head, with the model's numbers and
  // the layer's own mask, softcap (c · tanh(s / c), Gemma 2) and bias (T5), as the model had them
  function softcapOf(l) { var c = state.data.softcap; return c ? c[l] : null; }
  function steps(l, h, i) {
    var d = state.data, q = row(d.Q, l, h, i, d.L, d.D), r = [], cap = softcapOf(l);
    for (var j = 0; j < d.S; j++) {
      var k = row(d.K, l, h, j, d.S, d.D), s = 0;
      for (var t = 0; t < d.D; t++) s += q[t] * k[t];
      var x = s * d.scale;
      if (cap) x = cap * Math.tanh(x / cap);
      if (d.B) x += d.B[((l * d.n_heads + h) * d.L + i) * d.S + j];
      r.push({ score: s, scaled: x, masked: allowed(i, j, l) ? x : -Infinity });
    }
    var m = -Infinity;
    r.forEach(function (x) { m = Math.max(m, x.masked); });
    var total = 0;
    r.forEach(function (x) { x.e = m === -Infinity ? 0 : Math.exp(x.masked - m); total += x.e; });
    var out = new Float64Array(d.Dv);
    r.forEach(function (x, j) {
      x.p = total > 0 ? x.e / total : 0;
      var v = row(d.V, l, h, j, d.S, d.Dv);
      x.v = v;
      for (var t = 0; t < d.Dv; t++) out[t] += x.p * v[t];
    });
    return { q: q, rows: r, out: out };
  }
  // past one head, for the token, layer and head the page opens on (attnlab.explain.layer):
  // q from x, the heads through W_o, the residual and the layer norm, positions; each checked
  function drawWalk(svg, wk, y, rowH, l, h, i) {
    var d = state.data, mono = { "font-family": "DejaVu Sans Mono, monospace", "font-size": 12 };
    var c = wk.checks, e = function (x) { return x.toExponential(1); };
    function line(text, attrs) {
      svg.appendChild(label(10, y, text, attrs || mono));
      y += rowH;
    }
    if (wk.layer !== d.layerIds[l] || wk.head !== d.headIds[h] || wk.token !== i) {
      line("Past one head (q from x, the heads through W_o, the residual): computed for layer " +
           wk.layer + ", head " + wk.head + ", token " + wk.token + " \u201c" + d.qTok[wk.token] +
           "\u201d; open that, or run attnlab lesson --section layer.",
           { "font-size": 12, fill: theme().muted, "class": "walk-elsewhere" });
      return;
    }
    var xin = wk.norm === "pre" ? "LN\u2081(x)" : "x";
    line("Past one head (float64, the model's own weights; checked = largest difference to its forward):",
         { "font-weight": "bold", "font-size": 12, "class": "walk" });
    line("x = " + vecText(wk.x, 6) + "  (" + wk.d_model + " dims: the token entering layer " +
         wk.layer + ")", mono);
    line("q = " + xin + "\u00b7W_q + b_q = " + vecText(wk.q, 6) + "  checked " + e(c.q) +
         " (k " + e(c.k) + ", v " + e(c.v) + ")", { "font-family": mono["font-family"],
                                                  "font-size": 12, "class": "walk-q" });
    line(wk.n_heads + " heads' outputs concatenated = " + vecText(wk.concat, 6) + "  (" +
         wk.n_heads + " \u00d7 " + wk.head_dim + ")", mono);
    line("\u00d7 W_o + b_o = " + vecText(wk.attn_out, 6) + "  (what the heads add)", mono);
    line("+ x (residual) = " + vecText(wk.residual, 6), mono);
    if (wk.attn_norm) {
      line("layer norm = " + vecText(wk.attn_norm, 6) + "  checked " + e(c.attention_output), mono);
    }
    line("+ feed-forward \u2192 the layer's output = " + vecText(wk.output, 6) + "  checked " +
         e(c.layer_output), { "font-family": mono["font-family"], "font-size": 12,
                              "class": "walk-out" });
    var p = wk.positions, pos = "positions: " + (p.kind === "rotary" ?
      "rotary, q\u00b7k unchanged when both move " + p.shift + " on (" +
      p.rotary_dots[0].toFixed(6) + " = " + p.rotary_dots[1].toFixed(6) + ")" :
      "x\u2080 = word + position " + wk.token + (wk.norm === "post" ? " + type, layer norm" : "") +
      (p.x0_error != null ? " (checked " + e(p.x0_error) + ")" : ""));
    if (p.prev_head) {
      pos += "; words taken out, layer " + p.prev_head.layer + " head " + p.prev_head.head +
        " still picks the previous position for " + p.prev_head.hits + " of " + p.prev_head.rows;
    }
    line(pos, { "font-size": 12, fill: theme().muted });
  }
  function drawStep() {
    var d = state.data, l = state.layer, h = state.head, i = state.token, rowH = 22;
    var hasQKV = d.Q && d.K && d.V;
    var cols = hasQKV ? [0, 150, 235, 320, 410, 560, 650] : [0, 150, 260];
    var wk = d.walk, here = wk && hasQKV;
    var width = hasQKV ? 960 : 560, top = hasQKV ? 118 : 70,
        height = top + rowH * d.S + 70 + (here ? 10 * rowH : 0);
    var svg = newDrawing(width, height);
    svg.setAttribute("data-token", i);
    svg.appendChild(label(10, 20, "step view: " + names(l, h) + ", token " + i +
                          " \u201c" + d.qTok[i] + "\u201d", { "font-weight": "bold" }));
    var st = hasQKV ? steps(l, h, i) : null, cap = softcapOf(l);
    if (hasQKV) {
      svg.appendChild(label(10, 42, "1 compare q\u00b7k \u2192 2 scale \u00d7 " + d.scale.toFixed(4) +
                            (cap ? ", softcap " + cap + "\u00b7tanh(s/" + cap + ")" : "") +
                            (d.B ? ", + bias" : "") +
                            " \u2192 3 mask (\u2212\u221e where not allowed) \u2192 4 softmax % " +
                            "\u2192 5 borrow \u03a3 weight \u00d7 value",
                            { "font-size": 12, fill: theme().muted, "class": "pipeline" }));
      svg.appendChild(label(10, 64, "query q = " + vecText(st.q, 6) + "  (" + d.D + " dims)",
                            { "font-size": 12, "font-family": "DejaVu Sans Mono, monospace" }));
    } else {
      svg.appendChild(label(10, 42, "This capture has weights only (no queries, keys, values): " +
                            "showing the softmax step.", { "font-size": 12, fill: "#d44" }));
    }
    var heads = hasQKV ? ["key", "1 q\u00b7k", "2 scaled", "3 masked", "4 softmax", "model",
                          "5 weight \u00d7 value"] : ["key", "model's weight", ""];
    heads.forEach(function (t, c) {
      svg.appendChild(label(10 + cols[c], top - 10, t, { "font-weight": "bold", "font-size": 12 }));
    });
    var maxDiff = 0, mono = { "font-family": "DejaVu Sans Mono, monospace", "font-size": 12 };
    for (var j = 0; j < d.S; j++) {
      var y = top + rowH * j, on = allowed(i, j, l), mw = weight(l, h, i, j);
      var g = el("g", { "class": "step-row", "data-j": j });
      g.appendChild(label(10, y + 15, short(d.kTok[j], 16), { fill: on ? theme().text : theme().faint }));
      if (hasQKV) {
        var r = st.rows[j];
        maxDiff = Math.max(maxDiff, Math.abs(r.p - (on ? mw : 0)));
        [num(r.score), num(r.scaled), num(r.masked)].forEach(function (t, c) {
          g.appendChild(label(10 + cols[c + 1], y + 15, t, mono));
        });
        g.appendChild(el("rect", { x: 10 + cols[4], y: y + 3, width: 90 * r.p, height: rowH - 6,
                                   fill: "#4a7ab7" }));
        g.appendChild(label(10 + cols[4] + 96, y + 15, pct(r.p),
                            { "class": "softmax", "font-size": 12 }));
        g.appendChild(label(10 + cols[5], y + 15, on ? pct(mw) : "masked",
                            { "font-size": 12, fill: theme().muted }));
        var contrib = Array.prototype.map.call(r.v.subarray(0, 3), function (v) { return r.p * v; });
        g.appendChild(label(10 + cols[6], y + 15, vecText(contrib, 3) + " \u2026", mono));
      } else {
        g.appendChild(el("rect", { x: 10 + cols[1], y: y + 3, width: 90 * (on ? mw : 0),
                                   height: rowH - 6, fill: "#4a7ab7" }));
        g.appendChild(label(10 + cols[1] + 96, y + 15, on ? pct(mw) : "masked",
                            { "class": "softmax", "font-size": 12 }));
      }
      svg.appendChild(g);
    }
    if (hasQKV) {
      var yb = top + rowH * d.S + 24;
      svg.appendChild(label(10, yb, "output = \u03a3 weight \u00d7 value = " + vecText(st.out, 6) +
                            "  (" + d.Dv + " dims)", mono));
      svg.appendChild(label(10, yb + 22, "check: max |softmax here \u2212 model's weight| = " +
                            maxDiff.toExponential(1), { "font-size": 12, fill: theme().muted,
                                                        "class": "check" }));
      if (here) drawWalk(svg, wk, yb + 22 + rowH, rowH, l, h, i);
    }
    readout("Token " + i + " \u201c" + d.qTok[i] + "\u201d in " + names(l, h) + ".");
  }

  // ---- controls, export
  function fill(select, n, name) {
    while (select.firstChild) select.removeChild(select.firstChild);
    for (var t = 0; t < n; t++) {
      var o = document.createElement("option");
      o.value = String(t);
      o.textContent = name(t);
      select.appendChild(o);
    }
  }
  function setToken(t) {
    state.token = t;
    $("token").value = String(t);
  }
  function render() {
    var d = state.data;
    if (!d) return;
    $("filter").value = String(state.choice);
    $("layer").value = String(state.layer);
    $("head").value = String(state.head);
    $("token").value = String(state.token);
    document.querySelectorAll(".tab").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.getAttribute("data-view") === state.view));
    });
    $("stat").value = state.stat;
    if (state.view === "model") drawModel();
    else if (state.view === "step") drawStep();
    else if (state.view === "heads") drawHeads();
    else drawHead();
  }
  // the keys a link or the page's data-open set: on the first data they win over the data's
  // own opening (the head explain ranks first for one token, that token pinned)
  var explicit = {};
  function applyOpening(d) {
    var o = d.opening;
    if (!o) return;
    // a link or caller that chose a layer, head or token chose what to show: all or nothing
    var chosen = ["layer", "head", "heads", "matrix", "token", "pin"].some(function (k) {
      return explicit[k] === true;
    });
    if (chosen) return;
    state.layer = o.layer;
    state.head = o.head;
    state.heads = [o.head];
    state.token = o.token;
    state.pinned = o.token;
  }
  function show(raw) {  // one capture's payload, or a document of several with its choices
    if (state.data !== null) state.pinned = null;  // a new sentence: the old pin means nothing
    state.sets = (raw.sets || [raw]).map(load);
    state.choices = raw.choices || [{ name: "", set: 0 }];
    var first = state.choices[Math.min(state.choice, state.choices.length - 1)];
    applyOpening(state.sets[first.set]);
    explicit = {};  // the app's next sentence opens on its own
    fill($("filter"), state.choices.length, function (k) { return state.choices[k].name; });
    $("filter-label").hidden = state.choices.length < 2;
    state.data = null;
    choose(Math.min(state.choice, state.choices.length - 1));
  }
  function choose(k) {  // an entry of the "attention" list: a capture, and a block of it
    var c = state.choices[k], d = state.sets[c.set];
    if (state.data !== null && state.data !== d) state.pinned = null;
    state.choice = k;
    state.data = d;
    state.rows = c.rows || [0, d.L];
    state.cols = c.cols || [0, d.S];
    if (!d.R) state.matrix = null;
    state.layer = Math.min(state.layer, d.n_layers - 1);
    state.head = Math.min(state.head, d.n_heads - 1);
    state.heads = state.heads === "all" ? range(d.n_heads) :
      (state.heads || [state.head]).filter(function (h, k, all) {
        return h < d.n_heads && all.indexOf(h) === k;
      }).sort(function (a, b) { return a - b; });
    if (!state.heads.length) state.heads = [state.head];
    if (state.heads.indexOf(state.head) < 0) state.head = state.heads[0];
    state.token = Math.min(state.token, d.L - 1);
    fill($("layer"), d.n_layers, function (l) { return String(d.layerIds[l]); });
    fill($("head"), d.n_heads, function (h) { return String(d.headIds[h]); });
    fill($("token"), d.L, function (t) { return t + ": " + short(d.qTok[t], 24); });
    var stats = d.head_stats ? Object.keys(d.head_stats.stats) : [];
    fill($("stat"), stats.length, function (n) { return stats[n]; });
    $("stat").querySelectorAll("option").forEach(function (o, n) { o.value = stats[n]; });
    if (stats.length && stats.indexOf(state.stat) < 0) state.stat = stats[0];
    $("stat").parentNode.hidden = !stats.length;  // a cross-attention has no head statistics
    $("title").textContent = d.text == null ? d.qTok.join(" ") : d.text;
    $("meta").textContent = d.model + " \u00b7 " + d.n_layers + " layers \u00d7 " + d.n_heads +
      " heads \u00b7 " + d.L + " tokens" + (d.key_tokens ? " \u2192 " + d.S + " tokens" : "") +
      (d.causal ? " \u00b7 causal" : "");
    render();
  }
  function svgText() {
    var svg = $("drawing").cloneNode(true);
    svg.setAttribute("xmlns", NS);
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(svg);
  }
  function download(blob, name) {
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    setTimeout(function () { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }
  function baseName() {
    return "attention-" + state.view + "-L" + state.data.layerIds[state.layer] + "H" +
      state.data.headIds[state.head];
  }
  function exportSVG() {
    download(new Blob([svgText()], { type: "image/svg+xml" }), baseName() + ".svg");
  }
  function exportPNG() {
    var svg = $("drawing"), w = +svg.getAttribute("width"), h = +svg.getAttribute("height");
    var img = new Image();
    img.onload = function () {
      var c = document.createElement("canvas");
      c.width = 2 * w;
      c.height = 2 * h;
      var ctx = c.getContext("2d");
      ctx.scale(2, 2);
      ctx.drawImage(img, 0, 0, w, h);
      c.toBlob(function (b) { download(b, baseName() + ".png"); }, "image/png");
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText());
  }

  // ---- the local web app: ask the server for a sentence's attention
  function ask(ev) {
    if (ev) ev.preventDefault();
    var err = $("error");
    err.textContent = "";
    $("status").textContent = "running the model\u2026";
    document.body.setAttribute("data-busy", "1");  // tests (and CSS) can wait for the answer
    fetch("api/attention", { method: "POST", headers: { "Content-Type": "application/json" },
                             body: JSON.stringify({ text: $("text").value,
                                                    model: $("model").value }) })
      .then(function (r) {
        return r.json().then(function (body) { return { ok: r.ok, body: body }; });
      })
      .then(function (r) {
        if (!r.ok) err.textContent = r.body.error || "request failed";
        else show(r.body);
      })
      .catch(function (e) { err.textContent = String(e); })
      .then(function () {
        $("status").textContent = "";
        document.body.removeAttribute("data-busy");
      });
  }
  function startApp() {
    fetch("api/models").then(function (r) { return r.json(); }).then(function (body) {
      body.models.forEach(function (name) {
        var o = document.createElement("option");
        o.value = name;
        o.textContent = name;
        $("model").appendChild(o);
      });
      $("text").setAttribute("maxlength", body.max_chars);
      ask();
    });
    $("ask").addEventListener("submit", ask);
  }

  function init() {
    $("layer").addEventListener("change", function () {
      state.layer = +this.value; state.matrix = null; render();
    });
    $("head").addEventListener("change", function () {
      state.head = +this.value; state.heads = [state.head]; state.matrix = null; render();
    });
    $("token").addEventListener("change", function () {  // the head view pins the chosen one
      state.token = +this.value; state.pinned = state.token; render();
    });
    $("stat").addEventListener("change", function () { state.stat = this.value; render(); });
    $("filter").addEventListener("change", function () { choose(+this.value); });
    document.querySelectorAll(".tab").forEach(function (b) {
      b.addEventListener("click", function () { state.view = b.getAttribute("data-view"); render(); });
    });
    $("export-png").addEventListener("click", exportPNG);
    $("export-svg").addEventListener("click", exportSVG);
    // a link can open a given state: page.html#view=step&layer=2&head=8&token=8 (pin=8 pins;
    // heads=2,5 or heads=all: the heads the head view overlays); the page itself can say where it
    // opens (data-open, same syntax), the link overrides it
    var opening = (document.body.getAttribute("data-open") || "") + "&" + location.hash.slice(1);
    opening.split("&").forEach(function (kv) {
      var k = kv.split("=")[0], v = kv.split("=")[1];
      if (k) explicit[k] = true;
      if (k === "view" && ["head", "model", "step", "heads"].indexOf(v) >= 0) state.view = v;
      else if (k === "stat" && /^[a-z_]+$/.test(v)) state.stat = v;
      else if (k === "matrix" && v === "rollout") state.matrix = v;
      else if (k === "heads" && /^(all|\d+(,\d+)*)$/.test(v)) {
        state.heads = v === "all" ? v : v.split(",").map(Number);
      } else if (["layer", "head", "token", "pin", "choice"].indexOf(k) >= 0 && /^\d+$/.test(v)) {
        state[k === "pin" ? "pinned" : k] = +v;
        if (k === "head") state.heads = [+v];  // that head alone, unless a later heads= says more
      }
    });
    if (state.pinned != null && !/token=/.test(opening)) state.token = state.pinned;
    var embedded = $("attn-data");
    if (embedded) show(JSON.parse(embedded.textContent));
    if (document.body.getAttribute("data-mode") === "app") startApp();
  }
  window.attnlabState = state;  // read by the browser tests and handy in devtools
  init();
})();
