// attnlab effects page: reads the inline JSON, draws the two grids, a head's steps and the lens.
// Text goes in through textContent only; window.attnlabEffects is the state tests can drive.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("effects-data").textContent);
  var L = data.effect.length, H = data.effect[0].length, tokens = data.tokens;
  var state = { data: data, selected: null, select: select };
  window.attnlabEffects = state;

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fmt(x, d) { return x === null || x === undefined ? "" : Number(x).toFixed(d); }
  var maxAbs = 1e-12;
  data.effect.forEach(function (r) { r.forEach(function (v) { maxAbs = Math.max(maxAbs, Math.abs(v)); }); });
  function effectColour(v) {  // blue below 0, red above, white at 0
    var t = Math.min(1, Math.abs(v) / maxAbs), c = Math.round(255 * (1 - t));
    return v < 0 ? "rgb(" + c + "," + c + ",255)" : "rgb(255," + c + "," + c + ")";
  }
  function weightColour(w) {
    var c = Math.round(255 * (1 - w));
    return "rgb(" + c + "," + Math.round(255 - 120 * w) + ",255)";
  }

  var focusTok = tokens[data.focus];
  document.getElementById("title").textContent = data.model + ": " +
    (data.kind === "patch" ? "activation patching, head by head" : "ablation, head by head");
  document.getElementById("meta").textContent = data.texts.join("\n") + "\n" + data.what +
    (data.kind === "patch" ? " (clean " + fmt(data.clean, 4) + ", corrupt " + fmt(data.baseline, 4) + ")"
                           : " (unablated " + fmt(data.baseline, 4) + ")");
  document.getElementById("effect-caption").textContent = data.kind === "patch"
    ? "share of the gap each head's patch closes" : "measure with the head ablated minus without";
  document.getElementById("weight-caption").textContent =
    "largest weight of " + JSON.stringify(focusTok) + "'s row";
  document.getElementById("caveat").textContent = data.caveat;

  function grid(id, value, colour, label) {
    var t = document.getElementById(id), head = el("tr");
    head.appendChild(el("th", ""));
    for (var h = 0; h < H; h++) head.appendChild(el("th", "h" + h));
    t.appendChild(head);
    for (var l = 0; l < L; l++) {
      var tr = el("tr");
      tr.appendChild(el("th", "L" + l));
      for (var hh = 0; hh < H; hh++) {
        var td = el("td");
        td.style.background = colour(value(l, hh));
        td.title = label(l, hh);
        td.dataset.layer = l; td.dataset.head = hh;
        td.addEventListener("click", function (ev) {
          select(+ev.currentTarget.dataset.layer, +ev.currentTarget.dataset.head);
        });
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
  }
  grid("effect-grid", function (l, h) { return data.effect[l][h]; }, effectColour,
       function (l, h) { return "layer " + l + " head " + h + ": " + fmt(data.effect[l][h], 4); });
  grid("weight-grid", function (l, h) { return data.peak[l][h]; }, weightColour,
       function (l, h) {
         return "layer " + l + " head " + h + ": " + focusTok + " -> " + tokens[data.key[l][h]] +
           " " + Math.round(100 * data.peak[l][h]) + "%";
       });

  function select(l, h) {
    state.selected = [l, h];
    document.querySelectorAll("table.grid td").forEach(function (td) {
      td.setAttribute("aria-selected", +td.dataset.layer === l && +td.dataset.head === h);
    });
    var s = data.steps[l][h];
    document.getElementById("detail-title").textContent = "layer " + l + " head " + h;
    document.getElementById("detail-text").textContent = "effect " + fmt(data.effect[l][h], 4) +
      " (measure " + fmt(data.values[l][h], 4) + "); " + JSON.stringify(focusTok) + " looks at " +
      JSON.stringify(tokens[data.key[l][h]]) + " with " + Math.round(100 * data.peak[l][h]) + "% of its weight";
    var t = document.getElementById("steps");
    t.textContent = "";
    var head = el("tr");
    ["key", "compare q·k", "scale", "mask", "normalize (weight)", ""].forEach(function (x) { head.appendChild(el("th", x)); });
    t.appendChild(head);
    for (var j = 0; j < tokens.length; j++) {
      var tr = el("tr", null, s.allowed[j] ? "" : "masked");
      tr.appendChild(el("td", tokens[j]));
      tr.appendChild(el("td", fmt(s.scores[j], 3)));
      tr.appendChild(el("td", fmt(s.scaled[j], 3)));
      tr.appendChild(el("td", s.allowed[j] ? "may attend" : "masked"));
      tr.appendChild(el("td", fmt(s.weights[j], 3)));
      var cell = el("td"), bar = el("span", null, "bar");
      bar.style.width = Math.round(120 * s.weights[j]) + "px";
      cell.appendChild(bar); tr.appendChild(cell);
      t.appendChild(tr);
    }
  }

  if (data.lens) {
    document.getElementById("lens-section").hidden = false;
    var lt = document.getElementById("lens"), hr = el("tr");
    hr.appendChild(el("th", "after"));
    tokens.forEach(function (tok, i) {
      var th = el("th", tok); if (i === data.focus - 1) th.className = "focus"; hr.appendChild(th);
    });
    lt.appendChild(hr);
    data.lens.top.forEach(function (row, i) {
      var tr = el("tr");
      tr.appendChild(el("th", i === 0 ? "embeddings" : "layer " + (i - 1)));
      row.forEach(function (tok, j) {
        var td = el("td", JSON.stringify(tok) + " " + fmt(data.lens.p[i][j], 2));
        td.style.background = weightColour(data.lens.p[i][j]);
        if (j === data.focus - 1) td.className = "focus";
        tr.appendChild(td);
      });
      lt.appendChild(tr);
    });
  }
  var best = 0;
  for (var k = 1; k < L * H; k++) if (Math.abs(data.effect[Math.floor(k / H)][k % H]) > Math.abs(data.effect[Math.floor(best / H)][best % H])) best = k;
  select(Math.floor(best / H), best % H);
})();
