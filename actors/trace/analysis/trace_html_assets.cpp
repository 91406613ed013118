// The inline style and script of the trace page (trace_html.hpp). The script
// reads the timeline's data from the #trace-data element and draws it on a
// canvas: a lane per actor, spans as boxes, messages as arrows, a time axis;
// the wheel zooms around the pointer, dragging pans, double-click fits.
#include "actors/trace/analysis/trace_html.hpp"

namespace dsa::actors {

const char* const trace_html_style = R"css(
body { font: 14px system-ui, sans-serif; margin: 12px 16px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 8px; }
h2 { font-size: 15px; margin: 18px 0 6px; }
#controls { margin-bottom: 6px; }
#controls .hint { color: #777; margin-left: 12px; }
#render-status { float: right; color: #777; }
#render-errors { color: #b00; margin: 0; }
#timeline-box { position: relative; border: 1px solid #ccc; }
#timeline { display: block; cursor: grab; }
#tip { position: absolute; display: none; pointer-events: none; background: #fffff0; border: 1px solid #999;
       padding: 3px 6px; font-size: 12px; white-space: pre; }
pre.table { font-size: 12px; background: #f7f7f7; padding: 8px; overflow-x: auto; }
)css";

const char* const trace_html_script = R"js(
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('trace-data').textContent);
  var canvas = document.getElementById('timeline');
  var ctx = canvas.getContext('2d');
  var tip = document.getElementById('tip');
  var LABEL = 170, AXIS = 24, LANE = 22, MAX_ARROWS = 5000;
  var ranks = {};
  var lanes = D.lanes.map(function (l) { ranks[l.rank] = true; return { rank: l.rank, name: l.name, io: l.io, spans: [], maxDur: 0 }; });
  var manyRanks = Object.keys(ranks).length > 1;
  D.spans.forEach(function (s) {
    var lane = lanes[s[0]];
    lane.spans.push(s);
    lane.maxDur = Math.max(lane.maxDur, s[2] - s[1]);
  });
  lanes.forEach(function (l) { l.spans.sort(function (a, b) { return a[1] - b[1]; }); });
  var start = Infinity;
  D.spans.forEach(function (s) { start = Math.min(start, s[1]); });
  D.msgs.forEach(function (m) { start = Math.min(start, m[2]); });
  if (!isFinite(start)) start = 0;
  var end = Math.max(D.end, start + 1e-3);
  var view = { t0: start, t1: end };
  var width = 0, height = 0, showMessages = true, drag = null;
  var palette = { forward: '#4e79a7', backward: '#f28e2b', optimizer: '#59a14f', reduce: '#b07aa1',
                  allreduce: '#e15759', load: '#9c755f', speculate: '#76b7b2', stream_update: '#b07aa1', swap_read: '#8c8c8c',
                  swap_write: '#555555', swap_update: '#d4a6c8', gpu_forward: '#59a14f', gpu_backward: '#f28e2b',
                  produced: '#333333', released: '#aaaaaa' };
  function color(name) {
    if (palette[name]) return palette[name];
    var h = 0;
    for (var i = 0; i < name.length; ++i) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return 'hsl(' + (h % 360) + ',55%,55%)';
  }
  function fit() {
    view.t0 = start;
    view.t1 = start + (end - start) * 1.01;
  }
  function resize() {
    var ratio = window.devicePixelRatio || 1;
    width = Math.max(canvas.parentElement.clientWidth, LABEL + 200);
    height = AXIS + lanes.length * LANE + 4;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.width = width + 'px';
    canvas.style.height = height + 'px';
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  }
  function X(t) { return LABEL + (t - view.t0) / (view.t1 - view.t0) * (width - LABEL); }
  function T(x) { return view.t0 + (x - LABEL) / (width - LABEL) * (view.t1 - view.t0); }
  function laneTop(i) { return AXIS + i * LANE; }
  // The first span of a lane that may reach into [t, ...): spans are sorted by start.
  function firstFrom(lane, t) {
    var lo = 0, hi = lane.spans.length, from = t - lane.maxDur;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (lane.spans[mid][1] < from) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  function timeLabel(t, step) {
    if (step >= 1000) return (t / 1000).toFixed(step >= 10000 ? 0 : 1) + ' s';
    var digits = step >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(step)));
    return t.toFixed(digits) + ' ms';
  }
  function drawAxis() {
    var span = view.t1 - view.t0, raw = span / Math.max(1, (width - LABEL) / 110);
    var pow = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / pow;
    var step = pow * (f < 2 ? 2 : f < 5 ? 5 : 10);
    ctx.font = '11px sans-serif';
    ctx.textBaseline = 'middle';
    for (var t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      var x = X(t);
      ctx.fillStyle = '#e2e2e2';
      ctx.fillRect(x, AXIS, 1, height - AXIS);
      ctx.fillStyle = '#444';
      ctx.fillText(timeLabel(t, step), x + 3, AXIS / 2);
    }
  }
  function drawSpans() {
    ctx.font = '11px sans-serif';
    ctx.textBaseline = 'middle';
    lanes.forEach(function (lane, i) {
      var y = laneTop(i) + 3, h = LANE - 6, drawnTo = -Infinity;
      for (var k = firstFrom(lane, view.t0); k < lane.spans.length; ++k) {
        var s = lane.spans[k];
        if (s[1] > view.t1) break;
        if (s[2] < view.t0) continue;
        var x0 = Math.max(X(s[1]), LABEL - 1), x1 = Math.min(X(s[2]), width + 1), w = Math.max(1, x1 - x0);
        if (x0 + w <= drawnTo + 0.5) continue; // zoomed out: the pixel is drawn already
        drawnTo = Math.max(drawnTo, x0 + w);
        var name = D.names[s[3]];
        ctx.fillStyle = color(name);
        ctx.fillRect(x0, y, w, h);
        if (w > 40) {
          var text = name + ' s' + s[4] + (lane.io ? ' #' : ' mb') + s[5];
          var fits = Math.floor((w - 6) / 6.2);
          if (fits > 2) {
            ctx.fillStyle = '#fff';
            ctx.fillText(text.length > fits ? text.slice(0, fits - 1) + '\u2026' : text, x0 + 3, y + h / 2);
          }
        }
      }
    });
  }
  function visibleMessages() {
    var shown = [];
    for (var i = 0; i < D.msgs.length; ++i) {
      var m = D.msgs[i];
      if (Math.max(m[2], m[3]) >= view.t0 && Math.min(m[2], m[3]) <= view.t1) shown.push(m);
    }
    return shown;
  }
  function drawArrow(x0, y0, x1, y1) {
    ctx.beginPath();
    ctx.moveTo(x0, y0);
    ctx.lineTo(x1, y1);
    ctx.stroke();
    var a = Math.atan2(y1 - y0, x1 - x0), l = 6;
    ctx.beginPath();
    ctx.moveTo(x1, y1);
    ctx.lineTo(x1 - l * Math.cos(a - 0.4), y1 - l * Math.sin(a - 0.4));
    ctx.lineTo(x1 - l * Math.cos(a + 0.4), y1 - l * Math.sin(a + 0.4));
    ctx.closePath();
    ctx.fill();
  }
  function drawMessages() {
    var shown = visibleMessages();
    if (shown.length > MAX_ARROWS) return shown.length;
    ctx.lineWidth = 1;
    shown.forEach(function (m) {
      var c = color(D.names[m[4]]);
      ctx.strokeStyle = c;
      ctx.fillStyle = c;
      drawArrow(X(m[2]), laneTop(m[0]) + LANE / 2, X(m[3]), laneTop(m[1]) + LANE / 2);
    });
    return 0;
  }
  function draw() {
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, width, height);
    lanes.forEach(function (lane, i) {
      ctx.fillStyle = i % 2 ? '#f3f3f3' : '#fafafa';
      ctx.fillRect(LABEL, laneTop(i), width - LABEL, LANE);
    });
    drawAxis();
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABEL, AXIS, width - LABEL, height - AXIS);
    ctx.clip();
    drawSpans();
    var hidden = showMessages ? drawMessages() : 0;
    ctx.restore();
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, LABEL, height);
    ctx.font = '12px sans-serif';
    ctx.textBaseline = 'middle';
    lanes.forEach(function (lane, i) {
      if (i > 0 && lane.rank !== lanes[i - 1].rank) { // a rule between ranks
        ctx.fillStyle = '#888';
        ctx.fillRect(0, laneTop(i), width, 1);
      }
      ctx.fillStyle = lane.io ? '#666' : '#222';
      ctx.fillText((manyRanks ? 'rank ' + lane.rank + ' ' : '') + lane.name, 6, laneTop(i) + LANE / 2);
    });
    if (hidden) {
      ctx.fillStyle = '#777';
      ctx.fillText(hidden + ' messages here: zoom in to see them', 6, AXIS / 2);
    }
  }
  function spanAt(x, y) {
    var i = Math.floor((y - AXIS) / LANE);
    if (i < 0 || i >= lanes.length || x < LABEL) return null;
    var lane = lanes[i], t = T(x), tolerance = 2 * (view.t1 - view.t0) / (width - LABEL), best = null;
    for (var k = firstFrom(lane, t - tolerance); k < lane.spans.length; ++k) {
      var s = lane.spans[k];
      if (s[1] > t + tolerance) break;
      if (s[2] >= t - tolerance) best = s;
    }
    return best ? { lane: lane, span: best } : null;
  }
  function showTip(e) {
    var hit = spanAt(e.offsetX, e.offsetY);
    if (!hit) { tip.style.display = 'none'; return; }
    var s = hit.span;
    tip.textContent = hit.lane.name + ': ' + D.names[s[3]] + '\nstep ' + s[4] + (hit.lane.io ? ', chunk ' : ', micro-batch ') +
                      s[5] + '\nstart ' + s[1].toFixed(3) + ' ms, ' + (s[2] - s[1]).toFixed(3) + ' ms';
    tip.style.left = Math.min(e.offsetX + 12, width - 220) + 'px';
    tip.style.top = (e.offsetY + 14) + 'px';
    tip.style.display = 'block';
  }
  canvas.addEventListener('wheel', function (e) {
    e.preventDefault();
    var t = T(Math.max(e.offsetX, LABEL)), f = Math.exp(e.deltaY * 0.0015);
    var span = (view.t1 - view.t0) * f;
    if (span < 1e-4) return;
    view.t0 = t - (t - view.t0) * f;
    view.t1 = view.t0 + span;
    draw();
  }, { passive: false });
  canvas.addEventListener('mousedown', function (e) {
    drag = { x: e.offsetX, t0: view.t0, t1: view.t1 };
    canvas.style.cursor = 'grabbing';
  });
  window.addEventListener('mouseup', function () { drag = null; canvas.style.cursor = 'grab'; });
  canvas.addEventListener('mousemove', function (e) {
    if (!drag) { showTip(e); return; }
    var dt = (e.offsetX - drag.x) / (width - LABEL) * (drag.t1 - drag.t0);
    view.t0 = drag.t0 - dt;
    view.t1 = drag.t1 - dt;
    tip.style.display = 'none';
    draw();
  });
  canvas.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
  canvas.addEventListener('dblclick', function () { fit(); draw(); });
  document.getElementById('fit').addEventListener('click', function () { fit(); draw(); });
  document.getElementById('messages').addEventListener('change', function (e) { showMessages = e.target.checked; draw(); });
  window.addEventListener('resize', function () { resize(); draw(); });
  // page.html#selftest: drive the handlers as a user would (the headless test has no mouse).
  function selfTest() {
    var box = canvas.getBoundingClientRect(), x = box.left + LABEL + (width - LABEL) * 0.6, y = box.top + AXIS + LANE * 1.5;
    function mouse(type, dx) { return new MouseEvent(type, { clientX: x + dx, clientY: y, bubbles: true }); }
    var before = view.t1 - view.t0;
    canvas.dispatchEvent(new WheelEvent('wheel', { deltaY: -400, clientX: x, clientY: y, bubbles: true, cancelable: true }));
    if (!(view.t1 - view.t0 < before)) throw new Error('self-test: the wheel did not zoom in');
    var t0 = view.t0;
    canvas.dispatchEvent(mouse('mousedown', 0));
    canvas.dispatchEvent(mouse('mousemove', -100));
    window.dispatchEvent(mouse('mouseup', -100));
    if (!(view.t0 > t0)) throw new Error('self-test: dragging did not pan');
    canvas.dispatchEvent(mouse('mousemove', 0));
    document.getElementById('messages').click();
    document.getElementById('messages').click();
    canvas.dispatchEvent(mouse('dblclick', 0));
    if (Math.abs((view.t1 - view.t0) - before) > 1e-9 * before) throw new Error('self-test: double-click did not fit');
    return ', self-test passed (zoom, pan, hover, messages, fit)';
  }
  fit();
  resize();
  draw();
  var tested = location.hash === '#selftest' ? selfTest() : '';
  var status = document.getElementById('render-status');
  if (status.getAttribute('data-status') === 'pending') {
    status.setAttribute('data-status', 'ok');
    status.textContent = lanes.length + ' lanes, ' + D.spans.length + ' spans, ' + D.msgs.length + ' messages' + tested;
  }
})();
)js";

} // namespace dsa::actors
