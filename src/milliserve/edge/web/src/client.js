// milliserve's browser client: the model runs in the page with onnxruntime-web (WASM, or
// WebGPU where the bundle ships it and the browser has an adapter) when it is loaded and fast
// enough on this device; otherwise the server's Open Inference Protocol endpoint answers.
// Every answer says where it came from, which provider computed it and how long it took.
//
//   const client = await EdgeClient.create({ base: "/edge/sentiment/" });
//   const answer = await client.infer("what a lovely day");
//   // { label, score, outputs, source: "edge" | "server", provider: "wasm" | "webgpu" | null, ms, reason }
//
// The bundle's manifest.json (written by `milliserve edge build`) says which model file to
// load, how text becomes token ids, which outputs turn into a label, and which server model
// answers when the page cannot.

import * as ort from "onnxruntime-web/wasm";
import { Tokenizer } from "@huggingface/tokenizers";
import { measure, planProviders, providerLabel, quantile } from "./providers.js";

// the WASM runtime every page has; a page on WebGPU runs its models on `client.ort`
export { ort, providerLabel };

const STATES = ["loading", "ready", "off"];

function now() {
  return performance.now();
}

function utf8Length(text) {
  return new TextEncoder().encode(text).length;
}

// The server's tokenizer (Rust `tokenizers`) truncates the whole sequence, special tokens
// included, to max_length, keeping the template's special tokens at both ends. tokenizers.js
// has no truncation, so the template's prefix and suffix are found once and kept around the
// truncated core.
class TextEncoderStep {
  constructor(json, spec) {
    this.tokenizer = new Tokenizer(json, {});
    this.spec = spec;
    const probe = this.tokenizer.encode("a", { add_special_tokens: true }).ids;
    const core = this.tokenizer.encode("a", { add_special_tokens: false }).ids;
    const at = probe.findIndex((_, i) => core.every((id, j) => probe[i + j] === id));
    this.prefix = at >= 0 ? probe.slice(0, at) : [];
    this.suffix = at >= 0 ? probe.slice(at + core.length) : [];
  }

  // token ids for one text, or a reason why the edge model should not take it
  encode(text) {
    const spec = this.spec;
    const bytes = utf8Length(text);
    if (bytes > spec.text_limit) {
      return { over: `${bytes} bytes of text, the edge model takes at most ${spec.text_limit}` };
    }
    if (!spec.allow_empty && !text.trim()) {
      return { over: "empty text (the server answers with its own error)" };
    }
    const core = this.tokenizer.encode(text, { add_special_tokens: false }).ids;
    const room = spec.max_length - this.prefix.length - this.suffix.length;
    const tokens = core.length + this.prefix.length + this.suffix.length;
    if (spec.edge_max_tokens && tokens > spec.edge_max_tokens) {
      return { over: `${tokens} tokens, the edge model takes at most ${spec.edge_max_tokens}` };
    }
    const ids = [...this.prefix, ...core.slice(0, Math.max(0, room)), ...this.suffix];
    return { ids, tokens };
  }
}

// one request's tensor (of the runtime `ort` that runs the session): [1, ...dims] for a
// batching model, dims alone otherwise; a dynamic dim takes what the fixed ones leave
function tensorFor(ort, input, values, batched) {
  const fixed = input.dims.reduce((a, d) => (d < 0 ? a : a * d), 1);
  const dims = input.dims.map((d) => (d < 0 ? values.length / fixed : d));
  const shape = batched ? [1, ...dims] : dims;
  switch (input.datatype) {
    case "INT64":
      return new ort.Tensor("int64", BigInt64Array.from(values, (v) => BigInt(v)), shape);
    case "INT32":
      return new ort.Tensor("int32", Int32Array.from(values), shape);
    case "FP32":
      return new ort.Tensor("float32", Float32Array.from(values), shape);
    case "FP64":
      return new ort.Tensor("float64", Float64Array.from(values), shape);
    default:
      throw new Error(`input ${input.name}: datatype ${input.datatype} is not supported in the page`);
  }
}

function plainArray(data) {
  if (data instanceof BigInt64Array || data instanceof BigUint64Array) return Array.from(data, Number);
  return Array.from(data);
}

// The rules step of a pipeline, as the server runs it: argmax over labelled columns, or the
// first threshold a score column reaches.
function applyRules(rules, outputs) {
  const x = outputs[rules.input];
  if (!x) throw new Error(`rules: the model gave no output ${rules.input}`);
  let label, score;
  if (rules.labels && rules.labels.length) {
    let best = 0;
    for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
    label = rules.labels[best];
    score = x[best];
  } else {
    score = x[rules.column || 0];
    const hit = rules.thresholds.find((t) => score >= Math.fround(t.at_least));
    label = hit ? hit.label : rules.default;
  }
  outputs[rules.output] = [label];
  if (rules.score_output) outputs[rules.score_output] = [score];
  return { label, score };
}

export class EdgeClient {
  // options: base (the bundle's URL, default: the page's folder), server (the server's origin,
  // default: the page's), budgetMs (edge only when warm-up p90 is within it; default: the
  // manifest's), provider ("auto": time WASM and WebGPU where both can run and keep the
  // faster; "wasm" or "webgpu": only that one; default: the manifest's), threads (WASM
  // threads; 0: ORT's choice), warmupRuns, headers (for the server call, e.g.
  // Authorization), serverTimeoutMs, loadTimeoutMs, edge (false: always the server),
  // ortLog (true: ORT logs its node placements to the console)
  static async create(options = {}) {
    const client = new EdgeClient(options);
    await client._loadManifest();
    client._startEdge();
    return client;
  }

  constructor(options = {}) {
    this.base = new URL(options.base || ".", globalThis.location ? location.href : undefined);
    if (!this.base.pathname.endsWith("/")) this.base.pathname += "/";
    this.server = options.server || (globalThis.location ? location.origin : "");
    this.options = options;
    this.state = "loading";
    this.reason = "model still loading";
    this.timings = {};
    this.listeners = [];
    this.recent = []; // the last edge latencies, ms
    this.errors = 0;
    this.ort = ort; // the runtime that runs the session: the WebGPU flavour's where one loads
    this.provider = null; // "wasm" or "webgpu" once the warm-up chose
  }

  onStateChange(fn) {
    this.listeners.push(fn);
  }

  _setState(state, reason) {
    if (!STATES.includes(state)) throw new Error(state);
    this.state = state;
    this.reason = reason;
    for (const fn of this.listeners) fn(state, reason);
  }

  async _loadManifest() {
    const t0 = now();
    const res = await fetch(new URL("manifest.json", this.base));
    if (!res.ok) throw new Error(`manifest.json: HTTP ${res.status}`);
    const manifest = await res.json();
    if (manifest.format !== 1 || !manifest.model || !manifest.edge || !manifest.server) {
      throw new Error(`manifest.json: format ${manifest.format}, this client reads format 1 (rebuild the bundle)`);
    }
    this.manifest = manifest;
    const budget = Number(this.options.budgetMs);
    this.budgetMs = budget > 0 ? budget : manifest.edge.budget_ms;
    this.timings.manifest_ms = now() - t0;
  }

  _startEdge() {
    this.ready = this._loadEdge().catch((err) => {
      this._setState("off", `edge unavailable: ${err.message || err}`);
      return this.state;
    });
  }

  async _loadEdge() {
    const m = this.manifest;
    if (this.options.edge === false) {
      this._setState("off", "edge turned off by the app");
      return this.state;
    }
    const start = now();
    const provider = this.options.provider || m.edge.provider || "auto";
    const tokenizer = m.tokenizer ? fetch(new URL(m.tokenizer.file, this.base)).then((r) => {
      if (!r.ok) throw new Error(`${m.tokenizer.file}: HTTP ${r.status}`);
      return r.json();
    }) : null;
    tokenizer?.catch(() => {}); // awaited below; a failure is reported there
    this._bytes = new Map();
    // every plan but a forced WebGPU one (which may find no adapter) runs the model file:
    // its download need not wait for the adapter
    if (provider !== "webgpu") this._model(m.model).catch(() => {});
    let plan, chosen;
    try {
      plan = await planProviders(m, provider, this.base);
      chosen = await this._choose(plan, tokenizer, start);
    } finally {
      this._bytes = null; // the sessions hold what they need of the model files
    }
    const { best, session, measured, rt } = chosen;
    this.timings.ready_ms = now() - start;
    this.providers = { runtime: plan.runtime, adapter: plan.adapter, measured, skipped: plan.skipped };
    if (!session) throw new Error(measured.map((r) => `${providerLabel(r)}: ${r.error}`).join("; "));
    this.session = session;
    this.ort = rt;
    this.threads = rt.env.wasm.numThreads;
    this.provider = best.provider;
    this.precision = best.precision;
    this.warmupTimes = best.runs;
    this.warmP90 = best.p90;
    this.providers.chosen = providerLabel(best);
    this.providers.why = this._why(best, measured, plan.skipped);
    const on = `on ${providerLabel(best)} (${this.providers.why})`;
    if (!(this.warmP90 <= this.budgetMs)) {
      this._setState(
        "off",
        `too slow on this device: warm-up p90 ${this.warmP90.toFixed(2)} ms > budget ${this.budgetMs} ms ${on}`,
      );
    } else {
      this._setState("ready", `warm-up p90 ${this.warmP90.toFixed(2)} ms within ${this.budgetMs} ms ${on}`);
    }
    return this.state;
  }

  // ORT's settings, once per runtime (the WASM one, or the WebGPU flavour's)
  _configure(rt) {
    const m = this.manifest;
    rt.env.wasm.wasmPaths = new URL(m.edge.wasm_path, this.base).href;
    rt.env.wasm.proxy = false; // the proxy worker would load this bundle and find no backend
    const threads = Math.floor(Number(this.options.threads ?? m.edge.threads ?? 0));
    if (threads > 0) rt.env.wasm.numThreads = threads;
    else if (!globalThis.crossOriginIsolated) rt.env.wasm.numThreads = 1;
    return rt;
  }

  // The plan's candidates, each created and timed on the warm-up input; the fastest by
  // median is kept, the others released. A WASM candidate that fails on the WebGPU
  // flavour's runtime (its download failed, or it lacks a CPU kernel the plain build has) is
  // tried again on the plain WASM runtime.
  async _choose(plan, tokenizer, start) {
    const m = this.manifest;
    const bytes = new Map();
    for (const c of plan.candidates) bytes.set(c.model.file, this._model(c.model));
    for (const [file, pending] of bytes) {
      // the model itself must arrive; an FP16 copy that does not is that candidate's failure
      bytes.set(file, await pending.catch((err) => {
        if (file === m.model.file) throw err;
        return err;
      }));
    }
    const tokenizerJson = await tokenizer;
    if (tokenizerJson && !this.encoder) this.encoder = new TextEncoderStep(tokenizerJson, m.tokenizer);
    this.timings.download_ms = now() - start;
    const runs = Math.max(1, Number(this.options.warmupRuns ?? m.edge.warmup_runs ?? 8));
    const measured = [];
    let [best, session, bestRt] = [null, null, null];
    const attempts = plan.candidates.map((candidate) => [candidate, plan.ort]);
    while (attempts.length) {
      const [candidate, rt] = attempts.shift();
      const model = bytes.get(candidate.model.file);
      if (model instanceof Error) {
        measured.push({ provider: candidate.provider, precision: candidate.precision, runs: [], error: model.message });
        continue;
      }
      const runOnce = (s) => this._runEdge(m.edge.warmup_input, s, rt);
      const tried = await measure(this._configure(rt), candidate, model, runOnce, runs, best, this.options.ortLog);
      measured.push(tried.result);
      if (!tried.session) {
        if (candidate.provider === "wasm" && rt !== ort) {
          tried.result.runtime = plan.runtime;
          attempts.unshift([candidate, ort]);
        }
        continue;
      }
      if (best && !(tried.result.p50 < best.p50)) {
        await tried.session.release();
        continue;
      }
      if (session) await session.release();
      [best, session, bestRt] = [tried.result, tried.session, rt];
    }
    this.timings.session_ms = measured.reduce((a, r) => a + (r.session_ms || 0), 0);
    this.timings.warmup_ms = measured.reduce((a, r) => a + r.runs.reduce((x, y) => x + y, 0), 0);
    return { best, session, measured, rt: bestRt };
  }

  // why the chosen provider answers: the measurement, or why the others could not run
  _why(best, measured, skipped) {
    const ms = (r) => `p50 ${r.p50.toFixed(2)} ms`;
    const others = measured.filter((r) => r !== best).map((r) =>
      r.error ? `${providerLabel(r)} failed: ${r.error}` : `${providerLabel(r)} ${ms(r)}${r.stopped ? ` (${r.stopped})` : ""}`,
    );
    const parts = [others.length ? `${ms(best)} against ${others.join(", ")}` : `the only provider: ${ms(best)}`];
    for (const s of skipped) parts.push(`${providerLabel(s)} not tried: ${s.why}`);
    return parts.join("; ");
  }

  // a model file of the manifest (the model, or its FP16 copy), downloaded once
  _model(file) {
    if (!this._bytes.has(file.file)) {
      this._bytes.set(file.file, this._download(new URL(file.file, this.base), file.bytes, file.sha256));
    }
    return this._bytes.get(file.file);
  }

  // the model, checked against the manifest's size and SHA-256 (where the page has
  // crypto.subtle: a secure context such as https or localhost); a download that takes
  // longer than loadTimeoutMs (default 120 s) turns the edge off
  async _download(url, expected, sha256) {
    const controller = new AbortController();
    const limit = Number(this.options.loadTimeoutMs ?? 120000);
    const timer = setTimeout(() => controller.abort(), limit);
    let buf;
    try {
      const res = await fetch(url, { signal: controller.signal });
      if (!res.ok) throw new Error(`${url.pathname}: HTTP ${res.status}`);
      buf = new Uint8Array(await res.arrayBuffer());
    } catch (err) {
      if (controller.signal.aborted) throw new Error(`${url.pathname}: not downloaded within ${limit} ms`);
      throw err;
    } finally {
      clearTimeout(timer);
    }
    if (expected && buf.length !== expected) {
      throw new Error(`${url.pathname}: ${buf.length} bytes, the manifest says ${expected}`);
    }
    if (sha256 && globalThis.crypto && crypto.subtle) {
      const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", buf));
      const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
      if (hex !== sha256) throw new Error(`${url.pathname}: SHA-256 ${hex.slice(0, 12)}…, the manifest says ${sha256.slice(0, 12)}…`);
      this.verified = true;
    }
    return buf;
  }

  // feeds for one request (tensors of the runtime `rt`), or { over } when the edge model
  // should not take it
  _feeds(input, rt = this.ort) {
    const m = this.manifest;
    const feeds = {};
    if (m.tokenizer) {
      if (typeof input !== "string") return { over: "this model takes text" };
      const enc = this.encoder.encode(input);
      if (enc.over) return enc;
      const ids = m.inputs.find((i) => i.name === m.tokenizer.ids);
      const batched = m.model.batched;
      feeds[ids.name] = tensorFor(rt, ids, enc.ids, batched);
      if (m.tokenizer.mask) {
        const mask = m.inputs.find((i) => i.name === m.tokenizer.mask);
        feeds[mask.name] = tensorFor(rt, mask, enc.ids.map(() => 1), batched);
      }
      if (m.tokenizer.type_ids) {
        const types = m.inputs.find((i) => i.name === m.tokenizer.type_ids);
        feeds[types.name] = tensorFor(rt, types, enc.ids.map(() => 0), batched);
      }
      return { feeds, tokens: enc.tokens };
    }
    const named = this._named(input);
    for (const spec of m.inputs) {
      const values = named[spec.server_name];
      if (!values || typeof values.length !== "number") return { over: `no input ${spec.server_name}` };
      const fixed = spec.dims.reduce((a, d) => (d < 0 ? a : a * d), 1);
      if (values.length === 0 || values.length % fixed !== 0 || (spec.dims.every((d) => d >= 0) && values.length !== fixed)) {
        return { over: `input ${spec.server_name} has ${values.length} values, the model takes [${spec.dims}]` };
      }
      feeds[spec.name] = tensorFor(rt, spec, values, m.model.batched);
    }
    return { feeds };
  }

  // a flat array for a one-input model, else an object of arrays by the server's input names
  _named(input) {
    const m = this.manifest;
    if (m.inputs.length === 1 && (Array.isArray(input) || ArrayBuffer.isView(input))) {
      return { [m.inputs[0].server_name]: input };
    }
    return input && typeof input === "object" ? input : {};
  }

  async _runEdge(input, session = this.session, rt = this.ort) {
    const prepared = this._feeds(input, rt);
    if (prepared.over) throw new Error(prepared.over);
    return this._run(prepared.feeds, session);
  }

  // the model's outputs by name, as plain arrays
  async _run(feeds, session = this.session) {
    const results = await session.run(feeds);
    const outputs = {};
    for (const name of this.manifest.outputs) outputs[name] = plainArray(results[name].data);
    return outputs;
  }

  async _callServer(input) {
    const m = this.manifest;
    const s = m.server;
    let inputs;
    if (m.tokenizer) {
      inputs = [{ name: s.text_input, datatype: "BYTES", shape: s.text_shape, data: [input] }];
    } else {
      const named = this._named(input);
      inputs = m.inputs.map((spec) => {
        const values = Array.from(named[spec.server_name] ?? []);
        const fixed = spec.dims.reduce((a, d) => (d < 0 ? a : a * d), 1);
        const dims = spec.dims.map((d) => (d < 0 ? values.length / fixed : d));
        const shape = s.batched ? [1, ...dims] : dims;
        return { name: spec.server_name, datatype: spec.datatype, shape, data: values };
      });
    }
    const controller = new AbortController();
    const timeoutMs = Number(this.options.serverTimeoutMs ?? 10000);
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    try {
      let res;
      try {
        res = await fetch(new URL(s.infer_path, this.server), {
          method: "POST",
          headers: { "content-type": "application/json", ...(this.options.headers || {}) },
          body: JSON.stringify({ inputs }),
          signal: controller.signal,
        });
      } catch (err) {
        if (controller.signal.aborted) throw new Error(`server: no answer within ${timeoutMs} ms`);
        throw new Error(`server unreachable: ${err.message || err}`);
      }
      const body = await res.json().catch(() => ({}));
      if (!res.ok) {
        const err = new Error(`server: HTTP ${res.status}: ${body.error || res.statusText}`);
        err.status = res.status;
        throw err;
      }
      const outputs = {};
      for (const out of body.outputs || []) outputs[out.name] = out.data;
      return { outputs, serverTiming: res.headers.get("server-timing") };
    } finally {
      clearTimeout(timer);
    }
  }

  // One answer: { label, score, outputs, source: "edge" | "server", provider, ms, reason }.
  // options.prefer: "edge" (default policy) or "server" (skip the page's model)
  async infer(input, options = {}) {
    const t0 = now();
    let reason = this.state === "ready" ? null : this.reason;
    if (options.prefer === "server") reason = "the caller asked for the server";
    if (!reason) {
      const prepared = this._feeds(input);
      if (prepared.over) {
        reason = `input over the edge model's limits: ${prepared.over}`;
      } else {
        try {
          const answer = this._finish(await this._run(prepared.feeds), "edge", t0, null);
          answer.tokens = prepared.tokens;
          this._observe(answer.ms);
          this.errors = 0;
          return answer;
        } catch (err) {
          reason = `edge error: ${err.message || err}`;
          if (++this.errors >= 3) this._setState("off", `edge failed 3 times in a row (${err.message || err})`);
        }
      }
    }
    const { outputs, serverTiming } = await this._callServer(input);
    const answer = this._finish(outputs, "server", t0, reason);
    answer.serverTiming = serverTiming;
    return answer;
  }

  _finish(outputs, source, t0, reason) {
    const m = this.manifest;
    let label, score;
    if (source === "edge" && m.rules) ({ label, score } = applyRules(m.rules, outputs));
    else if (m.rules) {
      label = outputs[m.rules.output]?.[0];
      score = m.rules.score_output ? outputs[m.rules.score_output]?.[0] : undefined;
    }
    const provider = source === "edge" ? this.provider : null;
    const answer = { label, score, outputs, source, provider, ms: now() - t0, reason };
    if (provider && this.precision === "fp16" && m.model.precision !== "fp16") answer.precision = "fp16";
    return answer;
  }

  // a device that slows down (thermal throttling, a busy tab) hands its work to the server
  _observe(ms) {
    this.recent.push(ms);
    if (this.recent.length > 32) this.recent.shift();
    if (this.recent.length < 8) return;
    const p50 = quantile([...this.recent].sort((a, b) => a - b), 0.5);
    if (p50 > this.budgetMs) {
      this._setState("off", `too slow on this device: recent p50 ${p50.toFixed(2)} ms > budget ${this.budgetMs} ms`);
    }
  }
}
