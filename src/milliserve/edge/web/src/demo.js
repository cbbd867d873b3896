// The demo page: a text box, the answer, where it came from, and a live latency chart.
// Query parameters: budget_ms, threads, provider (auto, wasm, webgpu), warmup_runs,
// ort_log=1 (ORT logs its node placements to the console), edge=0 (always the server).
import { EdgeClient, providerLabel } from "./milliserve-edge.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const answers = [];

function setStatus(state, reason) {
  document.body.dataset.state = state;
  $("state").textContent = state;
  $("reason").textContent = reason || "";
}

function show(answer) {
  answers.push(answer);
  $("label").textContent = answer.label ?? JSON.stringify(answer.outputs);
  $("score").textContent = typeof answer.score === "number" ? answer.score.toFixed(4) : "";
  $("source").textContent = answer.source;
  $("source").className = answer.source;
  // which provider computed an edge answer: wasm, webgpu, or webgpu (fp16)
  $("via").textContent = answer.provider ? `on ${answer.provider}${answer.precision ? ` (${answer.precision})` : ""}` : "";
  $("ms").textContent = `${answer.ms.toFixed(2)} ms`;
  $("why").textContent = answer.reason || "";
  draw();
}

// the last 60 answers as bars, edge and server in two colours, on a log scale
function draw() {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const shown = answers.slice(-60);
  const top = Math.log10(Math.max(10, ...shown.map((a) => a.ms)) * 1.2);
  const bottom = Math.log10(0.1);
  const y = (ms) => h - ((Math.log10(Math.max(ms, 0.1)) - bottom) / (top - bottom)) * (h - 14);
  const left = 44; // the axis labels' column
  const bw = (w - left) / 60;
  shown.forEach((a, i) => {
    ctx.fillStyle = a.source === "edge" ? "#2a9d8f" : "#e76f51";
    ctx.fillRect(left + i * bw + 1, y(a.ms), bw - 2, h - y(a.ms));
  });
  ctx.font = "10px sans-serif";
  for (const mark of [0.1, 1, 10, 100, 1000]) {
    if (Math.log10(mark) > top) break;
    ctx.fillStyle = "#ccc";
    ctx.fillRect(left, y(mark), w - left, 1);
    ctx.fillStyle = "#666";
    ctx.fillText(`${mark} ms`, 2, Math.max(10, y(mark) + 3));
  }
}

async function main() {
  setStatus("loading", "loading the manifest");
  const options = {};
  if (params.has("budget_ms")) options.budgetMs = Number(params.get("budget_ms"));
  if (params.has("threads")) options.threads = Number(params.get("threads"));
  if (params.has("provider")) options.provider = params.get("provider");
  if (params.has("warmup_runs")) options.warmupRuns = Number(params.get("warmup_runs"));
  if (params.get("ort_log") === "1") options.ortLog = true;
  if (params.get("edge") === "0") options.edge = false;
  const client = await EdgeClient.create(options);
  window.milliserve = { client, answers, show };
  client.onStateChange(setStatus);
  setStatus(client.state, client.reason);
  $("model").textContent = `${client.manifest.name} (${client.manifest.model.precision}, ${(client.manifest.model.bytes / 2 ** 20).toFixed(1)} MiB)`;
  if (client.manifest.tokenizer) {
    $("text").value = client.manifest.edge.warmup_input;
  } else {
    // a tensor model takes JSON: an array for one input, an object of arrays by input name
    $("text").placeholder = 'JSON: [0.1, 0.2, ...] or {"input": [...]}';
    const example = client.manifest.edge.warmup_input;
    const names = Object.keys(example);
    $("text").value = JSON.stringify(names.length === 1 ? example[names[0]] : example);
  }
  $("form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const text = $("text").value;
      show(await client.infer(client.manifest.tokenizer ? text : JSON.parse(text)));
    } catch (err) {
      $("why").textContent = `error: ${err.message || err}`;
    }
  });
  await client.ready;
  $("timings").textContent = Object.entries(client.timings)
    .map(([k, v]) => `${k} ${v.toFixed(0)}`)
    .join(" · ");
  showProviders(client.providers);
}

// the warm-up report: which provider answers, on which adapter, and what each one measured
function showProviders(p) {
  if (!p) {
    $("provider").textContent = "none";
    $("adapter").textContent = "not asked";
    return;
  }
  $("provider").textContent = p.chosen || "none";
  $("adapter").textContent = p.adapter ? `${p.adapter.name}${p.adapter.f16 ? ", shader-f16" : ""}` : "none";
  const rows = p.measured.map((r) => {
    const name = providerLabel(r);
    if (r.error) return `${name}: failed (${r.error})`;
    const p50 = r.p50.toFixed(2), p90 = r.p90.toFixed(2);
    return `${name}: session ${r.session_ms.toFixed(0)} ms, warm-up p50 ${p50} / p90 ${p90} ms${r.stopped ? ` (${r.stopped})` : ""}`;
  });
  for (const s of p.skipped) rows.push(`${s.provider}${s.precision ? ` (${s.precision})` : ""}: not tried (${s.why})`);
  $("measured").textContent = rows.join("\n");
}

main().catch((err) => setStatus("error", err.message || String(err)));
