#!/usr/bin/env node
// Evaluates token sequences with llama.cpp — the prebuilt CPU libllama that node-llama-cpp@3.21.1
// ships (@node-llama-cpp/linux-x64) — and writes the next-token log-probabilities of EVERY position
// of each sequence as a [T, n_vocab] row-major little-endian float32 file.  Used by tests/llama_cpp
// (strata's logits vs llama.cpp's for a GGUF written by `strata convert`); docs/llama-cpp-parity.md.
//
// Usage: node dump_logprobs.mjs --model M.gguf --tokens 1,2,3 --out A.bin [--tokens 4,5 --out B.bin]...
//                               [--threads N] [--batch-size B]
//   Each --tokens/--out pair is one sequence, evaluated from an empty state in its own context.
//   --batch-size: tokens per llama_decode call; default = the whole sequence (one prefill batch);
//   1 feeds the sequence token by token through the KV/recurrent cache (llama.cpp's decode path).
// Prints one JSON line on stdout: versions, settings, n_vocab, and n_tokens per sequence.
// Exits non-zero with a message on stderr on any failure (unknown arch, bad token id, ...).
//
// Why log-probabilities and not raw logits: node-llama-cpp 3.21.1 exposes no raw-logit accessor,
// neither in its public API nor in its native addon (AddonContext binds no llama_get_logits*).
// The one path that reaches every vocabulary entry is the sampler's probability list: with
// temperature 0 the addon's sampler chain is the greedy sampler alone (no top-k/top-p/min-p,
// penalties or token bias), which leaves llama_get_logits_ith(i) untouched; the addon then computes
// softmax in float over the whole vocabulary (AddonContextSampleTokenWorker, `probabilities`).
// log(p) = logit − logsumexp(logits) up to float rounding (~1e-7 relative), so comparing log-softmax
// rows compares logits up to one constant per row, which is all a softmax consumer can observe.
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const usage = "usage: dump_logprobs.mjs --model M.gguf --tokens 1,2,3 --out OUT.bin [--tokens ... --out ...] " +
    "[--threads N] [--batch-size B]";

function parsePositiveInteger(key, value) {
    const number = Number(value);
    if (!Number.isInteger(number) || number < 1) throw new Error(`${key}: expected a positive integer, found "${value}"`);
    return number;
}

function parseArgs(argv) {
    const args = {threads: 2, batchSize: undefined, tokenLists: [], outs: []};
    for (let i = 0; i < argv.length; i += 2) {
        const key = argv[i];
        const value = argv[i + 1];
        if (value === undefined) throw new Error(`missing value after ${key}; ${usage}`);
        if (key === "--model") args.model = value;
        else if (key === "--tokens") {
            const tokens = value.split(",").map(Number);
            if (tokens.some((t) => !Number.isInteger(t) || t < 0)) throw new Error(`--tokens: expected non-negative integers, found "${value}"`);
            args.tokenLists.push(tokens);
        } else if (key === "--out") args.outs.push(value);
        else if (key === "--threads") args.threads = parsePositiveInteger(key, value);
        else if (key === "--batch-size") args.batchSize = parsePositiveInteger(key, value);
        else throw new Error(`unknown argument ${key}; ${usage}`);
    }
    if (!args.model || args.tokenLists.length === 0 || args.tokenLists.length !== args.outs.length) throw new Error(usage);
    return args;
}

const here = path.dirname(fileURLToPath(import.meta.url));
const readJson = (relative) => JSON.parse(fs.readFileSync(path.join(here, relative), "utf8"));
const packageVersion = readJson("node_modules/node-llama-cpp/package.json").version;
const llamaRelease = readJson("node_modules/node-llama-cpp/llama/binariesGithubRelease.json").release;

async function dumpSequence(model, nVocab, tokens, out, args) {
    for (const t of tokens) {
        if (t >= nVocab) throw new Error(`--tokens: id ${t} is outside the vocabulary (${nVocab})`);
    }
    const nTokens = tokens.length;
    // KV cache F32 (the default F16 would round K/V to 11 bits); flash attention off (its path
    // accumulates differently from the plain soft_max one).
    const context = await model.createContext({
        contextSize: Math.max(nTokens, 32), batchSize: args.batchSize ?? Math.max(nTokens, 32), sequences: 1,
        flashAttention: false, threads: args.threads,
        experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
    try {
        const sequence = context.getSequence();
        const input = tokens.map((token) => [token, {generateNext: {probabilities: true, options: {temperature: 0}}}]);
        const results = await sequence.controlledEvaluate(input);
        const logprobs = new Float32Array(nTokens * nVocab);
        for (let t = 0; t < nTokens; t++) {
            const probabilities = results[t]?.next?.probabilities;
            if (!probabilities || probabilities.size !== nVocab) {
                throw new Error(`position ${t}: expected ${nVocab} probabilities, found ${probabilities?.size ?? "none"}`);
            }
            for (const [token, probability] of probabilities) {
                if (!(probability > 0)) throw new Error(`position ${t}: token ${token} has probability ${probability} (no log)`);
                logprobs[t * nVocab + token] = Math.log(probability);
            }
        }
        fs.writeFileSync(out, Buffer.from(logprobs.buffer));
    } finally {
        await context.dispose();
    }
    return nTokens;
}

async function main() {
    const args = parseArgs(process.argv.slice(2));
    // gpu: false selects the plain CPU prebuilt; build: "never" turns a missing prebuilt into an
    // error instead of a source build (this repository never builds llama.cpp).
    const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.warn,
        logger: (level, message) => process.stderr.write(`[llama.cpp] ${message}\n`)});
    const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0});
    const arch = model.fileInfo.metadata.general.architecture;
    const nVocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
    const nTokens = [];
    for (let i = 0; i < args.tokenLists.length; i++) {
        nTokens.push(await dumpSequence(model, nVocab, args.tokenLists[i], args.outs[i], args));
    }
    console.log(JSON.stringify({
        arch, n_vocab: nVocab, n_tokens: nTokens, node_llama_cpp: packageVersion, llama_cpp_release: llamaRelease,
        gpu: llama.gpu, kv_cache_type: "F32", flash_attention: false, threads: args.threads,
        batch_size: args.batchSize ?? "whole sequence"}));
    await model.dispose();
    await llama.dispose();
}

main().catch((error) => {
    process.stderr.write(`dump_logprobs: ${error.message}\n`);
    process.exit(1);
});
