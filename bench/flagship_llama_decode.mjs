#!/usr/bin/env node
// llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU libllama, as tools/llama_cpp/decode_speed.mjs) on a
// model that does not fit in RAM: the same steps as decode_speed.mjs (mmap, fresh context, prompt in
// one batch, then N greedy single-token decode steps), but every phase and every decode step is
// reported on stderr as it ends, with /proc/self/io read_bytes and VmRSS, so a run that is stopped
// (bench/flagship_measure.py --timeout) still says what it did.  Needs scripts/install-llama-cpp-peer.sh.
//
// Usage: node bench/flagship_llama_decode.mjs --model M.gguf --tokens 1,2,3,4 [--n 4] [--threads 2]
//                                              [--log-level warn|info|debug]
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "../tools/llama_cpp/node_modules/node-llama-cpp/dist/index.js";

const args = {n: 4, threads: 2, logLevel: "warn"};
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
    const [k, v] = [argv[i], argv[i + 1]];
    if (k === "--model") args.model = v;
    else if (k === "--tokens") args.tokens = v.split(",").map(Number);
    else if (k === "--n") args.n = Number(v);
    else if (k === "--threads") args.threads = Number(v);
    else if (k === "--log-level") args.logLevel = v;
    else throw new Error(`unknown argument ${k}`);
}
if (!args.model || !args.tokens) throw new Error("usage: --model M.gguf --tokens 1,2,3,4 [--n 4] [--threads 2]");

const t0 = process.hrtime.bigint();
const sec = () => Number(process.hrtime.bigint() - t0) / 1e9;
const io = () => Number(/^read_bytes: (\d+)$/m.exec(fs.readFileSync("/proc/self/io", "utf8"))[1]);
const rss = () => Number(/^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync("/proc/self/status", "utf8"))[1]) * 1024;
const say = (what, extra = {}) =>
    process.stderr.write(`llama: ${JSON.stringify({what, t_s: +sec().toFixed(3), read_bytes: io(), rss_bytes: rss(), ...extra})}\n`);

const levels = {warn: LlamaLogLevel.warn, info: LlamaLogLevel.info, debug: LlamaLogLevel.debug};
const llama = await getLlama({gpu: false, build: "never", logLevel: levels[args.logLevel],
    logger: (level, message) => process.stderr.write(`[llama.cpp] ${message.trimEnd()}\n`)});
say("backend ready");
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0, useMmap: true});
say("model loaded");
const context = await model.createContext({contextSize: Math.max(args.tokens.length + args.n + 1, 32),
    batchSize: Math.max(args.tokens.length, 32), sequences: 1, threads: args.threads});
say("context created", {threads: context.currentThreads});
const sequence = context.getSequence();
const greedy = {generateNext: {token: true, options: {temperature: 0}}};
const input = args.tokens.map((t, i) => (i + 1 === args.tokens.length ? [t, greedy] : t));
let token = (await sequence.controlledEvaluate(input))[args.tokens.length - 1].next.token;
say("prompt done", {prompt_tokens: args.tokens.length, token});
const ids = [];
for (let step = 0; step < args.n; step++) {
    ids.push(token);
    token = (await sequence.controlledEvaluate([[token, greedy]]))[0].next.token;
    say("decode step", {step, token});
}
say("done", {generated_ids: ids});
process.exit(0);
