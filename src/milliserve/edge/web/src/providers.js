// Which execution provider runs the model in this page: WASM everywhere, WebGPU where the
// bundle ships its runtime (`milliserve edge build --webgpu`) and the browser gives an
// adapter. The page asks for the adapter itself, imports the WebGPU runtime only then (a
// browser without WebGPU downloads nothing more), and the warm-up times every candidate and
// keeps the fastest. Nothing falls back silently: every reason a provider was not used is
// kept and reported.

import * as wasmOrt from "onnxruntime-web/wasm";

export const PROVIDERS = ["auto", "wasm", "webgpu"];
// a challenger whose steady run is this many times the best p90 so far cannot win: its
// warm-up stops there (a software adapter runs a small model ~100x slower than WASM)
const HOPELESS = 10;
const ADAPTER_TIMEOUT_MS = 10000;

function now() {
  return performance.now();
}

export function quantile(sorted, q) {
  if (!sorted.length) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

function message(err) {
  return String((err && err.message) || err).split("\n")[0].slice(0, 300);
}

async function requestAdapter() {
  if (!globalThis.navigator || !navigator.gpu) return { why: "this browser has no WebGPU (navigator.gpu)" };
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(() => resolve("timeout"), ADAPTER_TIMEOUT_MS);
  });
  try {
    const adapter = await Promise.race([navigator.gpu.requestAdapter(), timeout]);
    if (adapter === "timeout") return { why: `no WebGPU adapter within ${ADAPTER_TIMEOUT_MS} ms` };
    if (!adapter) return { why: "this browser gives no WebGPU adapter" };
    return { adapter };
  } catch (err) {
    return { why: `the WebGPU adapter request failed: ${message(err)}` };
  } finally {
    clearTimeout(timer);
  }
}

function adapterName(info) {
  if (!info) return "unknown adapter";
  return [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "unknown adapter";
}

// The runtime and the candidates this page will time, and why any provider is left out.
// provider: "auto" (time the candidates, keep the fastest), "wasm" or "webgpu" (only that
// one; when it cannot run here the edge is off and the server answers, saying why).
export async function planProviders(manifest, provider, base) {
  if (!PROVIDERS.includes(provider)) {
    throw new Error(`provider ${JSON.stringify(provider)}: one of ${PROVIDERS.join(", ")}`);
  }
  const wasm = { provider: "wasm", precision: manifest.model.precision, model: manifest.model };
  const plan = { ort: wasmOrt, runtime: "wasm", candidates: [wasm], skipped: [], adapter: null };
  if (provider === "wasm") {
    plan.skipped.push({ provider: "webgpu", why: "the page asked for wasm only" });
    return plan;
  }
  const webgpu = manifest.edge.webgpu;
  let why = null;
  let adapter = null;
  if (!webgpu) why = "this bundle ships the WASM runtime only (edge build --webgpu adds WebGPU)";
  else if (webgpu.needs === "jspi" && typeof globalThis.WebAssembly?.Suspending !== "function") {
    why = `the bundle's WebGPU runtime (${webgpu.flavour}) needs JSPI, which this browser lacks`;
  } else {
    const got = await requestAdapter();
    why = got.why || null;
    adapter = got.adapter || null;
  }
  const f16 = Boolean(adapter && adapter.features.has("shader-f16"));
  if (!why && manifest.model.precision === "fp16" && !f16) {
    why = "the model is FP16 and this WebGPU adapter has no shader-f16";
  }
  if (why) {
    if (provider === "webgpu") throw new Error(`webgpu was asked for, but ${why}`);
    plan.skipped.push({ provider: "webgpu", why });
    return plan;
  }
  plan.adapter = { name: adapterName(adapter.info), f16 };
  let ort;
  try {
    ort = await import(/* the WebGPU runtime, only here */ new URL(webgpu.entry, base).href);
  } catch (err) {
    why = `its runtime did not load: ${message(err)}`;
    if (provider === "webgpu") throw new Error(`webgpu was asked for, but ${why}`);
    plan.skipped.push({ provider: "webgpu", why });
    return plan;
  }
  plan.ort = ort;
  plan.runtime = webgpu.flavour;
  const gpu = { provider: "webgpu", precision: manifest.model.precision, model: manifest.model };
  const half = webgpu.half_model;
  const gpuHalf = half && f16 ? { provider: "webgpu", precision: "fp16", model: half } : null;
  if (half && !f16) plan.skipped.push({ provider: "webgpu", precision: "fp16", why: "the adapter has no shader-f16" });
  plan.candidates = provider === "webgpu" ? [gpu] : [wasm, gpu];
  if (gpuHalf) plan.candidates.push(gpuHalf);
  if (provider === "webgpu") plan.skipped.push({ provider: "wasm", why: "the page asked for webgpu only" });
  return plan;
}

// One candidate: its session created and timed over the warm-up runs (the first two pay
// one-off costs such as shader compilation and are not counted). Judged on the median of the
// rest; stopped early when a run shows it cannot beat `best`.
export async function measure(ort, candidate, bytes, runOnce, runs, best, log) {
  const result = { provider: candidate.provider, precision: candidate.precision, session_ms: null, runs: [] };
  let session = null;
  try {
    const t0 = now();
    session = await ort.InferenceSession.create(bytes, {
      executionProviders: [candidate.provider],
      graphOptimizationLevel: "all",
      ...(log ? { logSeverityLevel: 0 } : {}),
    });
    result.session_ms = now() - t0;
    if (candidate.provider === "webgpu") {
      // proof that ORT runs this session on a GPU device, and which
      const device = ort.env.webgpu && ort.env.webgpu.device;
      if (!device || typeof device.createBuffer !== "function") throw new Error("ORT created no WebGPU device");
      result.adapter = adapterName(device.adapterInfo);
      result.f16 = device.features.has("shader-f16");
    }
    const skip = Math.min(2, runs - 1);
    for (let i = 0; i < runs; i++) {
      const t = now();
      await runOnce(session);
      const ms = now() - t;
      result.runs.push(ms);
      if (best && i >= skip && ms > HOPELESS * best.p90) {
        result.stopped = `stopped after ${i + 1} runs: ${ms.toFixed(1)} ms, over ${HOPELESS}x ${best.provider}'s p90`;
        break;
      }
    }
    const steady = result.runs.slice(skip).sort((a, b) => a - b);
    result.p50 = quantile(steady, 0.5);
    result.p90 = quantile(steady, 0.9);
    return { result, session };
  } catch (err) {
    if (session) await session.release().catch(() => {});
    result.error = message(err);
    return { result, session: null };
  }
}

// "wasm", "webgpu", "webgpu (fp16)", or "wasm (jspi runtime)" for a WASM run on the WebGPU
// flavour's runtime where the plain one ran too
export function providerLabel(c) {
  if (c.provider === "webgpu") return c.precision === "fp16" ? "webgpu (fp16)" : "webgpu";
  return c.runtime ? `${c.provider} (${c.runtime} runtime)` : c.provider;
}
