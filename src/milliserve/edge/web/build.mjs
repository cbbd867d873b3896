// Bundles the client (onnxruntime-web + tokenizers.js + client.js) and the demo page into
// dist/, with ORT's runtimes beside them: nothing is fetched from a CDN at run time.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";

const out = process.argv[2] || "dist";
// ORT's files go under a versioned folder: the server may let browsers cache them for good
const version = (pkg) => JSON.parse(readFileSync(`node_modules/${pkg}/package.json`, "utf8")).version;
const ortVersion = version("onnxruntime-web");
const ortDir = `ort-${ortVersion}`;
mkdirSync(`${out}/${ortDir}`, { recursive: true });
const common = { bundle: true, format: "esm", target: "es2022", minify: true, legalComments: "linked", logLevel: "warning" };
await build({ ...common, entryPoints: ["src/client.js"], outfile: `${out}/milliserve-edge.js`, platform: "browser" });
await build({ ...common, entryPoints: ["src/demo.js"], outfile: `${out}/demo.js`, external: ["./milliserve-edge.js"] });
// The WASM runtime (SIMD + threads) every page loads, and the WebGPU flavours a page imports
// only when it gets a WebGPU adapter: `milliserve edge build --webgpu` keeps the one it is
// asked for and drops the rest. Each flavour is ORT's own entry (it fetches its runtime pair
// from the same folder) and also runs the WASM provider. JSEP (ort.min.mjs, 28 MB) is not
// shipped: larger, and its older kernels gave wrong INT8 scores (docs/edge.md).
const ortDist = "node_modules/onnxruntime-web/dist";
const flavours = {
  jspi: { entry: "ort.jspi.min.mjs", runtime: "ort-wasm-simd-threaded.jspi", needs: "jspi" },
  asyncify: { entry: "ort.webgpu.min.mjs", runtime: "ort-wasm-simd-threaded.asyncify", needs: null },
};
const wanted = new Set(["ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs"]);
for (const f of Object.values(flavours)) for (const name of [f.entry, `${f.runtime}.mjs`, `${f.runtime}.wasm`]) wanted.add(name);
for (const f of readdirSync(ortDist)) {
  if (wanted.has(f)) copyFileSync(`${ortDist}/${f}`, `${out}/${ortDir}/${f}`);
}
for (const f of readdirSync("static")) copyFileSync(`static/${f}`, `${out}/${f}`);
// what the bundle was built with: milliserve edge build reads the ORT folder's name and the
// WebGPU flavours' files from it
const about = {
  ort_dir: ortDir,
  webgpu_flavours: flavours,
  "onnxruntime-web": ortVersion,
  "@huggingface/tokenizers": version("@huggingface/tokenizers"),
  esbuild: version("esbuild"),
};
writeFileSync(`${out}/versions.json`, JSON.stringify(about, null, 2) + "\n");
