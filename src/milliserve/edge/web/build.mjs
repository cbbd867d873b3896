// Bundles the client (onnxruntime-web + tokenizers.js + client.js) and the demo page into
// dist/, with ORT's WASM runtime beside them: nothing is fetched from a CDN at run time.
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
// the plain SIMD+threads build (the WebGPU/JSEP variants are 14 MB more each: not shipped)
const ortDist = "node_modules/onnxruntime-web/dist";
for (const f of readdirSync(ortDist)) {
  if (f === "ort-wasm-simd-threaded.wasm" || f === "ort-wasm-simd-threaded.mjs") copyFileSync(`${ortDist}/${f}`, `${out}/${ortDir}/${f}`);
}
for (const f of readdirSync("static")) copyFileSync(`static/${f}`, `${out}/${f}`);
// what the bundle was built with: milliserve edge build reads the ORT folder's name from it
const about = { ort_dir: ortDir, "onnxruntime-web": ortVersion, "@huggingface/tokenizers": version("@huggingface/tokenizers"), esbuild: version("esbuild") };
writeFileSync(`${out}/versions.json`, JSON.stringify(about, null, 2) + "\n");
