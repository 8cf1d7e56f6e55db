#!/usr/bin/env node
// Measures llama.cpp's greedy decode speed on a GGUF — the prebuilt CPU libllama that
// node-llama-cpp@3.21.1 ships (@node-llama-cpp/linux-x64), CPU only (gpuLayers 0) — to put next to
// `strata bench experts`.  Run it under bench/run_with_memory_limit.sh to see what llama.cpp does when
// the file does not fit in RAM; docs/bench-experts.md ("llama.cpp under a memory limit").
//
// Usage: node decode_speed.mjs --model M.gguf --tokens 1,2,3,4 [--n 32] [--threads N] [--repeats R]
//                              [--use-mmap true|false] [--kv-cache-type F16|F32] [--flash-attention auto|true|false]
//   Loads the model once (mmap on by default, as llama.cpp runs out of the box; --use-mmap false reads
//   the weights into anonymous memory instead).  Each repeat gets a fresh context: the prompt is
//   evaluated in one batch, then N decode steps each feed the greedy (argmax) token and read the next
//   one — the same steps as `strata bench experts -n N`, and the N ids are those that
//   `strata run --tokens … -n N --print-ids --ignore-eos` prints.  Only the N decode steps are timed:
//   model load, context creation and the prompt are not.
//   --threads: default = the CPUs this process may use (strata's default too).  --repeats: default 3.
//   --kv-cache-type (default F16) and --flash-attention (default auto, on where supported) are
//   llama.cpp's defaults; F32 and false are dump_logprobs.mjs's parity settings, closer to strata's
//   fp32 path, so the greedy ids part from strata's less often at near-ties (random synth models have
//   many: see docs/bench-experts.md).
// Prints one JSON line on stdout: versions, settings, load ms, then per repeat the prompt ms, decode
// tokens, decode seconds, tok/s and the bytes read from disk while decoding (/proc/self/io), the
// median tok/s, the greedy ids (of the first repeat; whether every repeat produced the same ones),
// and the process's peak RSS (VmHWM: counts the mmapped weight pages it touched as well as its heap).
// Exits non-zero with a message on stderr on any failure (unknown arch, bad token id, ...); a failed
// GGML_ASSERT in llama.cpp (e.g. more experts than LLAMA_MAX_EXPERTS) aborts the process instead
// (SIGABRT, llama.cpp's own message).
//
// Why controlledEvaluate one token at a time: it is node-llama-cpp's lowest-level call (one
// llama_decode per call here, nothing predicted or sampled ahead), and with temperature 0 the addon's
// sampler chain is the greedy sampler alone (see dump_logprobs.mjs).  Each call crosses the addon's
// worker thread once; on models whose step takes well under a millisecond that overhead shows in tok/s.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const usage = "usage: decode_speed.mjs --model M.gguf --tokens 1,2,3 [--n 32] [--threads N] [--repeats R] " +
    "[--use-mmap true|false] [--kv-cache-type F16|F32] [--flash-attention auto|true|false]";

function parsePositiveInteger(key, value) {
    const number = Number(value);
    if (!Number.isInteger(number) || number < 1) throw new Error(`${key}: expected a positive integer, found "${value}"`);
    return number;
}

function parseArgs(argv) {
    const args = {n: 32, threads: os.availableParallelism(), repeats: 3, useMmap: true, kvCacheType: "F16",
        flashAttention: "auto"};
    for (let i = 0; i < argv.length; i += 2) {
        const key = argv[i];
        const value = argv[i + 1];
        if (value === undefined) throw new Error(`missing value after ${key}; ${usage}`);
        if (key === "--model") args.model = value;
        else if (key === "--tokens") {
            const tokens = value.split(",").map(Number);
            if (value === "" || tokens.some((t) => !Number.isInteger(t) || t < 0)) {
                throw new Error(`--tokens: expected non-negative integers, found "${value}"`);
            }
            args.tokens = tokens;
        } else if (key === "--n") args.n = parsePositiveInteger(key, value);
        else if (key === "--threads") args.threads = parsePositiveInteger(key, value);
        else if (key === "--repeats") args.repeats = parsePositiveInteger(key, value);
        else if (key === "--use-mmap") {
            if (value !== "true" && value !== "false") throw new Error(`--use-mmap: expected true or false, found "${value}"`);
            args.useMmap = value === "true";
        } else if (key === "--kv-cache-type") {
            if (value !== "F16" && value !== "F32") throw new Error(`--kv-cache-type: expected F16 or F32, found "${value}"`);
            args.kvCacheType = value;
        } else if (key === "--flash-attention") {
            if (!["auto", "true", "false"].includes(value)) {
                throw new Error(`--flash-attention: expected auto, true or false, found "${value}"`);
            }
            args.flashAttention = value === "auto" ? "auto" : value === "true";
        } else throw new Error(`unknown argument ${key}; ${usage}`);
    }
    if (!args.model || !args.tokens) throw new Error(usage);
    if (!fs.existsSync(args.model)) throw new Error(`--model: ${args.model}: no such file`);
    return args;
}

const here = path.dirname(fileURLToPath(import.meta.url));
const readJson = (relative) => JSON.parse(fs.readFileSync(path.join(here, relative), "utf8"));
const packageVersion = readJson("node_modules/node-llama-cpp/package.json").version;
const llamaRelease = readJson("node_modules/node-llama-cpp/llama/binariesGithubRelease.json").release;

const msSince = (start) => Number(process.hrtime.bigint() - start) / 1e6;

function median(values) {
    const v = [...values].sort((a, b) => a - b);
    return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
}

// Bytes this process has had read from storage so far (/proc/self/io read_bytes: read() and the
// page faults of mmapped files that missed the page cache, read-ahead included), all threads.
function diskReadBytes() {
    const match = /^read_bytes: (\d+)$/m.exec(fs.readFileSync("/proc/self/io", "utf8"));
    return match ? Number(match[1]) : null;
}

// Peak resident set of this process in bytes (VmHWM); file-backed mmapped pages count once touched.
function peakRssBytes() {
    const match = /^VmHWM:\s+(\d+) kB$/m.exec(fs.readFileSync("/proc/self/status", "utf8"));
    return match ? Number(match[1]) * 1024 : null;
}

const greedyNext = {generateNext: {token: true, options: {temperature: 0}}};

function nextToken(results, index, what) {
    const token = results[index]?.next?.token;
    if (token == null) throw new Error(`${what}: llama.cpp returned no next token`);
    return token;
}

// One repeat: fresh context, prompt in one batch (untimed), then N timed single-token decode steps.
async function runOnce(model, args) {
    const context = await model.createContext({
        contextSize: Math.max(args.tokens.length + args.n + 1, 32), batchSize: Math.max(args.tokens.length, 32),
        sequences: 1, threads: args.threads, flashAttention: args.flashAttention,
        experimentalKvCacheKeyType: args.kvCacheType, experimentalKvCacheValueType: args.kvCacheType});
    try {
        const sequence = context.getSequence();
        const input = args.tokens.map((token, i) => (i + 1 === args.tokens.length ? [token, greedyNext] : token));
        const promptStart = process.hrtime.bigint();
        let token = nextToken(await sequence.controlledEvaluate(input), args.tokens.length - 1, "prompt");
        const promptMs = msSince(promptStart);
        const ids = [];
        const readBefore = diskReadBytes();
        const decodeStart = process.hrtime.bigint();
        for (let step = 0; step < args.n; step++) {
            ids.push(token);
            token = nextToken(await sequence.controlledEvaluate([[token, greedyNext]]), 0, `decode step ${step}`);
        }
        const decodeS = msSince(decodeStart) / 1e3;
        const readBytes = readBefore === null ? null : diskReadBytes() - readBefore;
        return {
            result: {prompt_ms: +promptMs.toFixed(3), decode_tokens: args.n, decode_s: +decodeS.toFixed(6),
                tok_s: +(args.n / decodeS).toFixed(3), decode_disk_read_bytes: readBytes},
            ids, threads: context.currentThreads, flashAttention: context.flashAttention};
    } finally {
        await context.dispose();
    }
}

async function main() {
    const args = parseArgs(process.argv.slice(2));
    // gpu: false selects the plain CPU prebuilt; build: "never" turns a missing prebuilt into an
    // error instead of a source build (this repository never builds llama.cpp).
    const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.warn,
        logger: (level, message) => process.stderr.write(`[llama.cpp] ${message}\n`)});
    const loadStart = process.hrtime.bigint();
    const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0, useMmap: args.useMmap});
    const loadMs = msSince(loadStart);
    const arch = model.fileInfo.metadata.general.architecture;
    const nVocab = model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length;
    if (!nVocab) throw new Error(`${args.model}: no tokenizer.ggml.tokens in the GGUF, cannot check token ids`);
    for (const t of args.tokens) {
        if (t >= nVocab) throw new Error(`--tokens: id ${t} is outside the vocabulary (${nVocab})`);
    }
    const repeats = [];
    let first;
    let sameIds = true;
    for (let r = 0; r < args.repeats; r++) {
        const run = await runOnce(model, args);
        repeats.push(run.result);
        if (!first) first = run;
        else sameIds &&= run.ids.length === first.ids.length && run.ids.every((id, i) => id === first.ids[i]);
    }
    console.log(JSON.stringify({
        arch, model: args.model, model_bytes: fs.statSync(args.model).size, n_vocab: nVocab,
        node_llama_cpp: packageVersion, llama_cpp_release: llamaRelease, gpu: llama.gpu, gpu_layers: 0,
        use_mmap: model.useMmap, threads: first.threads, kv_cache_type: args.kvCacheType,
        flash_attention: first.flashAttention, prompt_tokens: args.tokens.length, n: args.n,
        load_ms: +loadMs.toFixed(3), repeats,
        median_tok_s: +median(repeats.map((r) => r.tok_s)).toFixed(3),
        generated_ids: first.ids, ids_same_across_repeats: sameIds, peak_rss_bytes: peakRssBytes()}));
    await model.dispose();
    await llama.dispose();
}

main().catch((error) => {
    process.stderr.write(`decode_speed: ${error.message}\n`);
    process.exit(1);
});
