"use strict";
// The page asks for a frame only when something changed: a key pressed or held, a menu changed. An open tab
// with no one at the keyboard costs the server nothing, and a session left idle is closed by the server;
// the next key press opens a new one.
const SCALE = 6, CH_SCALE = 2;
const KEYS = {ArrowUp: "forward", KeyW: "forward", ArrowDown: "back", KeyS: "back", ArrowLeft: "turn_left",
              ArrowRight: "turn_right", KeyA: "strafe_left", KeyD: "strafe_right"};
const $ = id => document.getElementById(id);
const held = [];
let ws = null, waiting = false, tapped = null, pending = {}, sentAt = 0, arrivals = [], frames = 0;
document.addEventListener("keydown", e => {
  if (!(e.code in KEYS)) return;
  e.preventDefault();
  if (!held.includes(e.code)) held.push(e.code);
  tapped = KEYS[e.code];                   // a tap shorter than a frame still moves once
  if (ws === null || ws.readyState > WebSocket.OPEN) connect(); else request();
});
document.addEventListener("keyup", e => { const i = held.indexOf(e.code); if (i >= 0) held.splice(i, 1); });
window.addEventListener("blur", () => { held.length = 0; });
function draw(id, im, scale) {
  const c = $(id);
  if (c.width !== im.w || c.height !== im.h) { c.width = im.w; c.height = im.h; }
  c.style.width = (im.w * scale) + "px"; c.style.height = (im.h * scale) + "px";
  const bin = atob(im.rgb), ctx = c.getContext("2d"), img = ctx.createImageData(im.w, im.h);
  for (let i = 0, j = 0; i < im.w * im.h; i++) {
    img.data[j++] = bin.charCodeAt(3 * i); img.data[j++] = bin.charCodeAt(3 * i + 1);
    img.data[j++] = bin.charCodeAt(3 * i + 2); img.data[j++] = 255;
  }
  ctx.putImageData(img, 0, 0);
}
function setWaiting(w) { waiting = w; document.body.dataset.waiting = w ? "yes" : "no"; }   // (tests read it)
function request(first = false) {          // one frame in flight at most; none when nothing changed
  if (waiting || ws === null || ws.readyState !== WebSocket.OPEN) return;
  const action = held.length ? KEYS[held[held.length - 1]] : tapped;
  if (!first && !action && !Object.keys(pending).length) return;
  const msg = Object.assign({action: action || "noop"}, pending);
  pending = {}; tapped = null; setWaiting(true);
  sentAt = performance.now();
  ws.send(JSON.stringify(msg));
}
function onFrame(m) {
  const now = performance.now();
  setWaiting(false);
  draw("model", m.images.model, SCALE); draw("truth", m.images.truth, SCALE); draw("channels", m.images.channels, CH_SCALE);
  arrivals.push(now); while (arrivals.length && arrivals[0] < now - 1000) arrivals.shift();
  frames += 1; document.body.dataset.frames = frames;
  $("fps").textContent = arrivals.length > 1 ? ((arrivals.length - 1) * 1000 / (now - arrivals[0])).toFixed(1) : "–";
  $("latency").textContent = (now - sentAt).toFixed(1);
  $("engine").textContent = m.timings.engine_ms.toFixed(2); $("modelms").textContent = m.timings.model_ms.toFixed(1);
  $("server").textContent = m.timings.total_ms.toFixed(1); $("batch").textContent = m.timings.batch;
  $("frame").textContent = m.frame;
  request();                               // only if a key is still held or a menu changed meanwhile
}
function fill(id, names, chosen, label = n => n) {
  const s = $(id);
  for (const n of names) { const o = document.createElement("option"); o.value = n; o.textContent = label(n); s.appendChild(o); }
  s.value = chosen;
  s.addEventListener("change", () => { pending[id] = id === "steps" ? Number(s.value) : s.value; s.blur(); request(); });
}
function themeNote(info) {                 // a designed theme: said plainly, with what the model measured on new ones
  const i = info.themes.indexOf($("theme").value), note = $("theme-note");
  note.hidden = !info.theme_trained || info.theme_trained[i] !== false;
  note.textContent = note.hidden ? "" : `“${info.themes[i]}” is a designed theme: this model was never trained on it, and paints ` +
    `it from the theme's palette and pattern alone. Held-out-theme quality: ${info.new_themes}.`;
}
function connect() {
  const q = new URLSearchParams({theme: $("theme").value, lighting: $("lighting").value, steps: $("steps").value});
  ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/play?${q}`);
  setWaiting(false); pending = {};
  $("status").textContent = "connecting…"; $("status").style.color = "";
  ws.onopen = () => { $("status").textContent = "waiting for the model…"; };
  ws.onmessage = e => {
    const m = JSON.parse(e.data);
    if (m.type === "frame") onFrame(m);
    else if (m.type === "hello") { $("status").textContent = "playing"; request(true); }   // the first picture
  };
  ws.onclose = e => {
    $("status").textContent = e.code === 1001 ? `paused (${e.reason}): press a key to play again` : `closed (${e.code}) ${e.reason}`;
    $("status").style.color = e.code === 1001 ? "#cc8" : "#e88";
  };
}
async function main() {
  const info = await (await fetch("/info")).json();
  const h = info.heldout_psnr, ks = h ? Object.keys(h).filter(k => k.startsWith("ddim_")) : [];
  $("about").textContent = `Model: ${info.model}, ${info.source}, step ${info.step}` + (h ? `. ${info.heldout_cells === "test" ? "Test-cell" : "Held-out"} PSNR ${ks.map(k => h[k].toFixed(2)).join(" / ")} dB at ` +
    `${ks.map(k => k.slice(5)).join(" / ")} DDIM steps (the mean-colour baseline: ${h.baseline.toFixed(2)} dB), on factor combinations it never saw in ` +
    `training` + (info.trained ? `; trained ${info.trained.minutes} min on ${info.trained.on}.` : ".") : ".");
  const designed = n => info.theme_trained && info.theme_trained[info.themes.indexOf(n)] === false;
  fill("theme", info.themes, info.themes[0], n => designed(n) ? `${n} (designed, never trained on)` : n);
  fill("lighting", info.lightings, info.lightings[0]);
  themeNote(info); $("theme").addEventListener("change", () => themeNote(info));
  fill("steps", info.step_choices.map(String), String(info.steps));       // every value the server accepts
  connect();
}
main();
