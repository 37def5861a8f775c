// fxlens report page: builds the module tree and the (virtual) ops table from the embedded
// JSON, makes static tables sortable, pans/zooms the graph and shows node details (a run of
// blocks or the folded plumbing drawn as one node: what it stands for, from VIEW.graph).
// Every string from the report reaches the DOM through textContent, never innerHTML.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("fxlens-data").textContent);
  var R = DATA.report, VIEW = DATA.view || {};
  var nodes = R.nodes || [], modules = R.modules || [];
  var byId = new Map();
  nodes.forEach(function (n) { byId.set(n.id, n); });
  var times = VIEW.times || {};
  var hasTimes = Object.keys(times).length > 0;
  var mem = R.memory || null;
  var timeline = mem && Array.isArray(mem.timeline) && mem.timeline.length === nodes.length
    ? mem.timeline : null;
  var live = new Map();
  if (timeline) nodes.forEach(function (n, i) { live.set(n.id, timeline[i]); });
  var blocks = VIEW.blocks || [];
  // The graph draws a run of alike blocks as one node ("b<first block's index>") and the
  // input plumbing as one ("p0"); which ops and blocks each stands for:
  var G = VIEW.graph || {};
  var runs = G.runs || [], runOfBlock = {}, runByItem = {};
  runs.forEach(function (r) {
    runByItem[r.item] = r;
    for (var i = r.first; i < r.first + r.count; i++) runOfBlock[i] = r;
  });
  var fold = G.folded || {nodes: []};
  var folded = new Set(fold.nodes);
  var hidden = new Set(G.hidden || []);   // asserts: drawn nowhere
  var revealModule = null;     // set by the module tree: open its rows down to a path

  // --- formatting (SI for counts, binary for bytes, as the Python renderers) ---------------
  var SI = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  var BIN = [[Math.pow(2, 50), "PiB"], [Math.pow(2, 40), "TiB"], [Math.pow(2, 30), "GiB"],
             [Math.pow(2, 20), "MiB"], [1024, "KiB"]];
  function si(v, unit) {
    unit = unit || "";
    for (var i = 0; i < SI.length; i++) {
      if (Math.abs(v) >= SI[i][0]) return (v / SI[i][0]).toFixed(2) + " " + SI[i][1] + unit;
    }
    return (v.toFixed(0) + " " + unit).trim();
  }
  function bytes(v) {
    for (var i = 0; i < BIN.length; i++) {
      if (Math.abs(v) >= BIN[i][0]) return (v / BIN[i][0]).toFixed(2) + " " + BIN[i][1];
    }
    return v.toFixed(0) + " B";
  }
  function secs(v) {
    if (v >= 1) return v.toFixed(2) + " s";
    if (v >= 1e-3) return (v * 1e3).toFixed(2) + " ms";
    if (v >= 1e-6) return (v * 1e6).toFixed(2) + " µs";
    return (v * 1e9).toFixed(0) + " ns";
  }
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(1) + "%" : "-"; }
  function shortOp(t) {   // as fxlens.reports.units.short_op
    return t.replace(/^aten\./, "").replace(/\.default$/, "").replace("_for_cpu", "");
  }
  function shape(n) {
    if (!n.outputs || !n.outputs.length) return "—";
    var o = n.outputs[0];
    var s = (o.shape && o.shape.length ? o.shape.join("×") : "scalar") + " " + (o.dtype || "");
    return n.outputs.length > 1 ? s + " (+" + (n.outputs.length - 1) + ")" : s;
  }
  function lastPart(path) { return path ? path.slice(path.lastIndexOf(".") + 1) : "(root)"; }
  function parentOf(path) { var i = path.lastIndexOf("."); return i < 0 ? "" : path.slice(0, i); }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  // --- sortable header helper ------------------------------------------------------------
  function header(table, columns, state, onSort) {
    var tr = el("tr");
    columns.forEach(function (c) {
      var th = el("th", c.label, c.num ? "num" : "");
      th.dataset.key = c.key;
      if (state.key === c.key) th.classList.add(state.dir > 0 ? "asc" : "desc");
      th.addEventListener("click", function () {
        if (state.key === c.key) state.dir = -state.dir;
        else { state.key = c.key; state.dir = c.num ? -1 : 1; }
        onSort();
        header(table, columns, state, onSort);
      });
      tr.appendChild(th);
    });
    var thead = table.querySelector("thead");
    thead.textContent = "";
    thead.appendChild(tr);
  }
  function comparator(column, dir) {
    return function (a, b) {
      var x = column.get(a), y = column.get(b);
      if (x < y) return -dir;
      if (x > y) return dir;
      return 0;
    };
  }

  // --- module tree -------------------------------------------------------------------------
  function moduleTree() {
    var table = document.getElementById("module-table");
    if (!table) return;
    var total = R.totals.flops || 0;
    var alloc = mem && mem.allocated_by_module ? mem.allocated_by_module : null;
    var known = new Set(modules.map(function (m) { return m.path; }));
    var kids = new Map(), root = null;
    modules.forEach(function (m) {
      if (m.path === "") { root = m; return; }
      var p = parentOf(m.path);
      while (p && !known.has(p)) p = parentOf(p);
      if (!kids.has(p)) kids.set(p, []);
      kids.get(p).push(m);
    });
    var columns = [
      {key: "path", label: "module", get: function (m) { return m.path; }},
      {key: "type", label: "type", get: function (m) { return lastPart(m.type); }},
      {key: "params", label: "params", num: true, get: function (m) { return m.params; },
       fmt: function (v) { return si(v); }},
      {key: "flops", label: "FLOPs", num: true, get: function (m) { return m.flops; },
       fmt: function (v) { return si(v); }},
      {key: "share", label: "share", num: true, get: function (m) { return m.flops; },
       fmt: function (v) { return pct(v, total); }},
      {key: "bytes_read", label: "read", num: true, get: function (m) { return m.bytes_read; },
       fmt: bytes},
      {key: "bytes_written", label: "written", num: true,
       get: function (m) { return m.bytes_written; }, fmt: bytes},
      {key: "nodes", label: "ops", num: true, get: function (m) { return m.nodes; },
       fmt: String}
    ];
    function summed(m, byPath) {    // a run of blocks: the sum over its members
      return m.run ? m.run.reduce(function (s, x) { return s + (byPath[x.path] || 0); }, 0)
                   : byPath[m.path] || 0;
    }
    var mtimes = VIEW.module_times || {};
    if (Object.keys(mtimes).length) {
      columns.push({key: "time", label: "est. time", num: true,
                    get: function (m) { return summed(m, mtimes); }, fmt: secs});
    }
    if (alloc) {
      columns.push({key: "alloc", label: "allocated (own ops)", num: true,
                    get: function (m) { return summed(m, alloc); }, fmt: bytes});
    }
    // Runs of identical numbered siblings (layers.0 … layers.31: one type, same params and
    // FLOPs) are one row "0–31 ×32" holding their sums; expanding it lists the members.
    function same(a, b) {
      return a.type === b.type && a.params === b.params && a.flops === b.flops &&
        /^\d+$/.test(lastPart(a.path)) && /^\d+$/.test(lastPart(b.path));
    }
    function runs(children) {
      var out = [], i = 0;
      while (i < children.length) {
        var j = i + 1;
        while (j < children.length && same(children[i], children[j])) j++;
        if (j - i < 2) { out.push(children[i]); i = j; continue; }
        var members = children.slice(i, j), first = members[0];
        var path = parentOf(first.path) + (parentOf(first.path) ? "." : "") +
          lastPart(first.path) + "–" + lastPart(members[members.length - 1].path);
        var sum = function (k) {
          return members.reduce(function (s, m) { return s + (m[k] || 0); }, 0);
        };
        var run = {path: path, type: first.type, depth: first.depth, params: sum("params"),
                   flops: sum("flops"), bytes_read: sum("bytes_read"),
                   bytes_written: sum("bytes_written"), nodes: sum("nodes"),
                   label: lastPart(path) + " ×" + members.length, run: members};
        kids.set(path, members);
        out.push(run);
        i = j;
      }
      return out;
    }
    var state = {key: null, dir: 1};
    var expanded = new Set([""]);
    modules.forEach(function (m) { if (m.depth < 2) expanded.add(m.path); });
    var body = table.querySelector("tbody");
    function render() {
      var frag = document.createDocumentFragment();
      var col = columns.filter(function (c) { return c.key === state.key; })[0];
      var stack = root ? [[root, 0]] : [];
      if (!root) (kids.get("") || []).slice().reverse().forEach(function (m) { stack.push([m, 0]); });
      while (stack.length) {
        var item = stack.pop(), m = item[0], level = item[1];
        var children = kids.get(m.path) || [];
        var tr = el("tr");
        tr.dataset.path = m.path;
        var first = el("td");
        first.style.paddingLeft = (0.5 + level * 1.1) + "em";
        var toggle = el("span", children.length ? (expanded.has(m.path) ? "▾" : "▸") : "",
                        "toggle");
        first.appendChild(toggle);
        first.appendChild(document.createTextNode(m.label || lastPart(m.path)));
        first.title = m.path || "(root)";
        tr.appendChild(first);
        columns.slice(1).forEach(function (c) {
          var v = c.get(m);
          tr.appendChild(el("td", c.fmt ? c.fmt(v) : v, c.num ? "num" : ""));
        });
        frag.appendChild(tr);
        if (children.length && expanded.has(m.path)) {
          var ordered = col ? children.slice().sort(comparator(col, state.dir))
                            : m.run ? children : runs(children);   // a run lists its members
          for (var i = ordered.length - 1; i >= 0; i--) stack.push([ordered[i], level + 1]);
        }
      }
      body.textContent = "";
      body.appendChild(frag);
    }
    body.addEventListener("click", function (e) {
      var tr = e.target.closest("tr");
      if (!tr) return;
      var path = tr.dataset.path;
      if (e.target.classList.contains("toggle")) {
        if (expanded.has(path)) expanded.delete(path); else expanded.add(path);
        render();
      } else {
        showModule(path);
      }
    });
    document.getElementById("tree-expand").addEventListener("click", function () {
      modules.forEach(function (m) { expanded.add(m.path); });
      render();
    });
    document.getElementById("tree-collapse").addEventListener("click", function () {
      expanded = new Set([""]);
      render();
    });
    revealModule = function (path) {
      for (var p = path; p; p = parentOf(p)) expanded.add(parentOf(p));
      render();
      kids.forEach(function (members, key) {       // the run row "0–31 ×32" holding it
        if (key !== parentOf(path) && members.some(function (m) { return m.path === path; }))
          expanded.add(key);
      });
      render();
      var row = Array.prototype.filter.call(body.rows, function (r) {
        return r.dataset.path === path; })[0];
      if (!row) return;
      row.scrollIntoView({block: "center"});
      row.classList.add("flash");
      setTimeout(function () { row.classList.remove("flash"); }, 1600);
    };
    header(table, columns, state, render);
    render();
  }

  // --- ops table (virtual: only visible rows exist) ----------------------------------------
  var ROW_H = 22;
  function opsTable() {
    var table = document.getElementById("ops-table");
    if (!table) return;
    var scroller = document.getElementById("ops-scroll");
    var columns = [
      {key: "id", label: "node", num: true, get: function (n) { return n.id; }, fmt: String},
      {key: "op", label: "op", get: function (n) { return shortOp(n.target); }},
      {key: "module", label: "module", get: function (n) { return n.module || "(root)"; }},
      {key: "shape", label: "output", get: shape},
      {key: "flops", label: "FLOPs", num: true, get: function (n) { return n.flops; },
       fmt: function (v) { return si(v); }},
      {key: "bytes", label: "bytes moved", num: true,
       get: function (n) { return n.bytes_read + n.bytes_written; }, fmt: bytes}
    ];
    if (hasTimes) {
      columns.push({key: "time", label: "est. time", num: true,
                    get: function (n) { return times[n.id] || 0; }, fmt: secs});
    }
    if (timeline) {
      columns.push({key: "live", label: "live after", num: true,
                    get: function (n) { return live.get(n.id) || 0; }, fmt: bytes});
    }
    columns.push({key: "status", label: "status", get: function (n) { return n.status; }});
    columns.push({key: "source", label: "source", get: function (n) { return n.source; }});
    var state = {key: null, dir: 1};
    var showFree = document.getElementById("op-free");
    function shown(n) { return showFree.checked || n.status !== "free"; }
    var view = nodes.filter(shown);
    var hay = null;
    var query = [];
    var body = table.querySelector("tbody");
    var count = document.getElementById("op-count");
    function draw() {
      var headH = table.querySelector("thead").offsetHeight || ROW_H;
      var top = Math.max(0, scroller.scrollTop - headH);
      var first = Math.max(0, Math.floor(top / ROW_H) - 10);
      var visible = Math.ceil((scroller.clientHeight || 600) / ROW_H) + 20;
      var last = Math.min(view.length, first + visible);
      var frag = document.createDocumentFragment();
      var pad = el("tr");
      pad.style.height = (first * ROW_H) + "px";
      frag.appendChild(pad);
      for (var i = first; i < last; i++) {
        var n = view[i], tr = el("tr");
        tr.dataset.node = n.id;
        columns.forEach(function (c) {
          var v = c.get(n);
          var td = el("td", c.fmt ? c.fmt(v) : v, c.num ? "num" : "");
          if (c.key === "source" || c.key === "module") td.title = String(v);
          tr.appendChild(td);
        });
        frag.appendChild(tr);
      }
      var rest = el("tr");
      rest.style.height = ((view.length - last) * ROW_H) + "px";
      frag.appendChild(rest);
      body.textContent = "";
      body.appendChild(frag);
    }
    function resort() {
      var col = columns.filter(function (c) { return c.key === state.key; })[0];
      if (col) {
        var cmp = comparator(col, state.dir);
        view.sort(function (a, b) { return cmp(a, b) || a.id - b.id; });
      }
      draw();
    }
    function refilter() {
      if (!hay) {
        hay = new Map();
        nodes.forEach(function (n) {
          hay.set(n.id, [n.target, n.module, n.module_type, shape(n), n.source, n.status,
                         "#" + n.id].join(" ").toLowerCase());
        });
      }
      view = nodes.filter(function (n) {
        var h = hay.get(n.id);
        return shown(n) && query.every(function (q) { return h.indexOf(q) >= 0; });
      });
      count.textContent = view.length + " of " + nodes.length + " ops";
      scroller.scrollTop = 0;
      resort();
    }
    var pending = null;
    document.getElementById("op-filter").addEventListener("input", function (e) {
      query = e.target.value.toLowerCase().split(/\s+/).filter(Boolean);
      clearTimeout(pending);
      pending = setTimeout(refilter, 120);
    });
    showFree.addEventListener("change", refilter);
    count.textContent = view.length + " of " + nodes.length + " ops";
    var ticking = false;
    scroller.addEventListener("scroll", function () {
      if (ticking) return;
      ticking = true;
      requestAnimationFrame(function () { ticking = false; draw(); });
    });
    header(table, columns, state, resort);
    draw();
  }

  // --- static tables (hotspots, findings, quant): click a header to sort ------------------
  var UNITS = {k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, KiB: 1024, MiB: Math.pow(2, 20),
               GiB: Math.pow(2, 30), TiB: Math.pow(2, 40), PiB: Math.pow(2, 50),
               ms: 1e-3, "µs": 1e-6, ns: 1e-9};
  function cellValue(text) {
    var m = /^(-?[\d.]+(?:e[+-]?\d+)?)\s*(KiB|MiB|GiB|TiB|PiB|ms|µs|ns|[kMGTP])?/.exec(text);
    return m ? parseFloat(m[1]) * (UNITS[m[2]] || 1) : null;
  }
  function staticTables() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      var dirs = {};
      table.querySelectorAll("thead th").forEach(function (th, index) {
        th.addEventListener("click", function () {
          var rows = Array.prototype.slice.call(table.tBodies[0].rows);
          var dir = dirs[index] = -(dirs[index] || 1);
          var key = function (r) {
            var text = r.cells[index] ? r.cells[index].textContent : "";
            var v = cellValue(text);
            return v === null ? text : v;
          };
          rows.sort(function (a, b) {
            var x = key(a), y = key(b);
            if (typeof x !== typeof y) { x = String(x); y = String(y); }
            return x < y ? dir : x > y ? -dir : 0;
          });
          rows.forEach(function (r) { table.tBodies[0].appendChild(r); });
          table.querySelectorAll("th").forEach(function (h) { h.className = ""; });
          th.className = dir < 0 ? "desc" : "asc";
        });
      });
    });
  }

  // --- details panel -------------------------------------------------------------------------
  var panel = document.getElementById("details");
  var panelBody = document.getElementById("details-body");
  function showFields(title, fields) {
    panelBody.textContent = "";
    panelBody.appendChild(el("h3", title));
    var dl = el("dl");
    fields.forEach(function (f) {
      if (f[1] === undefined || f[1] === null || f[1] === "") return;
      dl.appendChild(el("dt", f[0]));
      var dd = el("dd");
      if (f[1] instanceof Node) dd.appendChild(f[1]); else dd.textContent = String(f[1]);
      dl.appendChild(dd);
    });
    panelBody.appendChild(dl);
    panel.hidden = false;
  }
  function nodeLinks(ids) {
    var span = el("span");
    ids.forEach(function (id, i) {
      if (i) span.appendChild(document.createTextNode(", "));
      if (byId.has(id)) {
        var a = el("a", "#" + id + " " + shortOp(byId.get(id).target));
        a.dataset.node = id;
        span.appendChild(a);
      } else {
        span.appendChild(document.createTextNode("#" + id + " (param/input)"));
      }
    });
    return span;
  }
  function showNode(id) {
    var n = byId.get(id);
    if (!n) return;
    var users = nodes.filter(function (m) { return m.inputs.indexOf(id) >= 0; })
      .map(function (m) { return m.id; });
    showFields("node " + n.id + " · " + shortOp(n.target), [
      ["op", n.target], ["status", n.status], ["phase", n.phase],
      ["module", (n.module || "(root)") + " · " + lastPart(n.module_type)],
      ["source", el("code", n.source, "source")],
      ["outputs", (n.outputs || []).map(function (o) {
        return "[" + (o.shape || []).join(", ") + "] " + (o.dtype || ""); }).join("; ")],
      ["FLOPs", si(n.flops, "FLOP") + " (" + si(n.flops / 2, "MAC") + ")"],
      ["bytes read", bytes(n.bytes_read)], ["bytes written", bytes(n.bytes_written)],
      ["est. time", hasTimes ? secs(times[n.id] || 0) : ""],
      ["live after", timeline ? bytes(live.get(n.id) || 0) : ""],
      ["inputs", nodeLinks(n.inputs)], ["users", nodeLinks(users)]
    ]);
    highlight(graphItemOf(n));
  }
  function showModule(path, run) {   // run: the graph's run of alike blocks it heads
    var m = modules.filter(function (x) { return x.path === path; })[0];
    if (!m) return;
    var first = nodes.filter(function (n) {
      return !hidden.has(n.id) &&
        (n.module === path || n.module.indexOf(path + ".") === 0 || path === ""); })[0];
    var many = run && run.count > 1;
    var link = el("a", "show " + (many ? "the first block" : "it") + " in the modules table");
    link.addEventListener("click", function () { if (revealModule) revealModule(path); });
    showFields(many ? "blocks " + run.label : "module " + (path || "(root)"), [
      ["run", many ? run.count + " alike blocks (type, params, ops, FLOPs, bytes); the " +
        "figures are " + path + "'s, one block's" : ""],
      ["type", m.type], ["params", si(m.params) + " (" + bytes(m.param_bytes) + ")"],
      ["FLOPs", si(m.flops, "FLOP")], ["bytes read", bytes(m.bytes_read)],
      ["bytes written", bytes(m.bytes_written)], ["ops", m.nodes],
      ["in all", many ? si(m.flops * run.count, "FLOP") + " · " +
        bytes((m.bytes_read + m.bytes_written) * run.count) + " · " + m.nodes * run.count +
        " ops" : ""],
      ["first op", first ? nodeLinks([first.id]) : ""],
      ["source", first ? el("code", first.source, "source") : ""],
      ["table", link]
    ]);
  }
  function showFolded() {
    var ids = fold.nodes || [];
    var sum = function (key) {
      return ids.reduce(function (s, id) { return s + ((byId.get(id) || {})[key] || 0); }, 0);
    };
    showFields("inputs & plumbing · " + ids.length + " ops", [
      ["what", fold.why], ["FLOPs", si(sum("flops"), "FLOP")],
      ["bytes moved", bytes(sum("bytes_read") + sum("bytes_written"))],
      ["ops", nodeLinks(ids)]
    ]);
    highlight(fold.item);
  }
  document.getElementById("details-close").addEventListener("click", function () {
    panel.hidden = true;
  });
  document.addEventListener("click", function (e) {
    var target = e.target.closest ? e.target.closest("[data-node]") : null;
    if (target && !target.closest("#graph-view")) showNode(Number(target.dataset.node));
  });

  // --- graph: pan, zoom, click ---------------------------------------------------------------
  function graphItemOf(n) {
    if (folded.has(n.id)) return fold.item;
    for (var i = 0; i < blocks.length; i++) {
      var b = blocks[i];
      if (n.module === b || n.module.indexOf(b + ".") === 0) {
        return runOfBlock[i] ? runOfBlock[i].item : "n" + n.id;
      }
    }
    return "n" + n.id;
  }
  var selected = null;
  function highlight(itemId) {
    var view = document.getElementById("graph-view");
    if (!view) return;
    if (selected) selected.classList.remove("selected");
    selected = view.querySelector("g.node[id='" + itemId + "']");
    if (selected) selected.classList.add("selected");
  }
  // The graph view shows the whole graph, or one collapsed block expanded in its place
  // (templates "block-graph-<i>"); pan and zoom act on whichever SVG is showing.
  function graph() {
    var view = document.getElementById("graph-view");
    var whole = view ? view.querySelector("svg") : null;
    if (!whole) return;
    var svg = null, home = null, box = null;
    var back = document.getElementById("graph-back");
    function show(next, key) {   // key: "whole" or a block graph's index (its legend)
      document.querySelectorAll(".legend[data-graph]").forEach(function (legend) {
        legend.hidden = legend.dataset.graph !== key;
      });
      if (svg && svg !== next) svg.style.display = "none";
      svg = next;
      svg.style.display = "";
      var base = svg.viewBox.baseVal;
      home = [base.x, base.y, base.width, base.height];
      box = home.slice();
      if (back) back.hidden = svg === whole;
    }
    function apply() { svg.setAttribute("viewBox", box.join(" ")); }
    function toSvg(cx, cy) {
      var pt = svg.createSVGPoint();
      pt.x = cx; pt.y = cy;
      var ctm = svg.getScreenCTM();
      return ctm ? pt.matrixTransform(ctm.inverse()) : {x: box[0], y: box[1]};
    }
    function zoom(factor, cx, cy) {
      var r = view.getBoundingClientRect();
      var p = toSvg(cx === undefined ? r.left + r.width / 2 : cx,
                    cy === undefined ? r.top + r.height / 2 : cy);
      box = [p.x - (p.x - box[0]) * factor, p.y - (p.y - box[1]) * factor,
             box[2] * factor, box[3] * factor];
      apply();
    }
    var expanded = {};
    function expand(index) {
      var which = (VIEW.block_graphs || {})[index];
      var template = which === undefined ? null :
        document.getElementById("block-graph-" + which);
      if (!template) return false;
      if (!expanded[which]) {
        var holder = document.createElement("div");
        holder.innerHTML = template.innerHTML;
        expanded[which] = holder.querySelector("svg");
        view.appendChild(expanded[which]);
      }
      show(expanded[which], String(which));
      return true;
    }
    show(whole, "whole");
    view.addEventListener("wheel", function (e) {
      e.preventDefault();
      zoom(e.deltaY > 0 ? 1.15 : 1 / 1.15, e.clientX, e.clientY);
    }, {passive: false});
    var drag = null;
    view.addEventListener("pointerdown", function (e) {
      drag = {x: e.clientX, y: e.clientY, box: box.slice(), moved: 0};
      view.classList.add("dragging");
    });
    window.addEventListener("pointermove", function (e) {
      if (!drag) return;
      var r = view.getBoundingClientRect();
      var scale = Math.max(drag.box[2] / r.width, drag.box[3] / r.height);
      var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      drag.moved = Math.max(drag.moved, Math.abs(dx) + Math.abs(dy));
      box = [drag.box[0] - dx * scale, drag.box[1] - dy * scale, box[2], box[3]];
      apply();
    });
    window.addEventListener("pointerup", function () {
      view.classList.remove("dragging");
      setTimeout(function () { drag = null; }, 0);
    });
    view.addEventListener("click", function (e) {
      e.preventDefault();  // node anchors point at #n<id>; the page does not navigate
      if (drag && drag.moved > 4) return;
      var g = e.target.closest("g.node");
      if (!g) return;
      var id = g.id;
      if (id.charAt(0) === "n") showNode(Number(id.slice(1)));
      else if (id.charAt(0) === "b") {
        var index = Number(id.slice(1));
        showModule(blocks[index], runByItem[id]);
        if (!expand(index)) highlight(id);
      } else if (id === fold.item) showFolded();
    });
    if (back) back.addEventListener("click", function () { show(whole, "whole"); });
    document.getElementById("zoom-in").addEventListener("click", function () { zoom(1 / 1.3); });
    document.getElementById("zoom-out").addEventListener("click", function () { zoom(1.3); });
    document.getElementById("zoom-fit").addEventListener("click", function () {
      box = home.slice();
      apply();
    });
  }

  moduleTree();
  opsTable();
  staticTables();
  graph();
  window.fxlensReady = performance.now();
  document.documentElement.dataset.ready = "1";
})();
