// The official openai npm client against `strata serve`: models, chat and completions, streamed
// and whole, usage in streams, a cached repeated prompt and a cached multi-turn conversation,
// seeds, logprobs with n = 2, a tool call round trip (the model's own call and its result sent
// back), json_schema output that validates against its schema (whole through the SDK's
// parse helper and streamed, greedy and seeded; checked by a small validator below, no other
// package) and json_object output, 16 concurrent streams each equal to its request run alone (the
// server runs with --parallel 16), and the SDK's typed errors for bad requests.
// Usage: node client.mjs BASE_URL [API_KEY] (e.g. http://127.0.0.1:8080/v1; the key the server was
// started with, --api-key). Exits non-zero on a failure.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import OpenAI from "openai";

const sdkVersion = JSON.parse(readFileSync(new URL("./node_modules/openai/package.json", import.meta.url))).version;

const apiKey = process.argv[3] ?? "not-needed";
const client = new OpenAI({ baseURL: process.argv[2], apiKey, maxRetries: 0, timeout: 120_000 });
let checks = 0;
async function check(name, fn) {
  await fn();
  checks += 1;
  console.log(`ok - ${name}`);
}

await check("models.list", async () => {
  const models = [];
  for await (const model of client.models.list()) models.push(model.id);
  assert.deepEqual(models, ["strata-default"]);
  const one = await client.models.retrieve("strata-default");
  assert.equal(one.object, "model");
});

const chatRequest = {
  model: "strata-default",
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say something." }],
  max_tokens: 12,
  temperature: 0,
  chat_template_kwargs: { enable_thinking: false },
};

let wholeChat;
await check("chat.completions.create", async () => {
  wholeChat = await client.chat.completions.create(chatRequest);
  assert.equal(wholeChat.object, "chat.completion");
  assert.equal(wholeChat.choices.length, 1);
  assert.equal(wholeChat.choices[0].message.role, "assistant");
  assert.equal(typeof wholeChat.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(wholeChat.choices[0].finish_reason));
  assert.equal(wholeChat.usage.total_tokens, wholeChat.usage.prompt_tokens + wholeChat.usage.completion_tokens);
  // Reasoning tokens are part of the completion tokens (OpenAI's completion_tokens_details).
  const reasoningTokens = wholeChat.usage.completion_tokens_details.reasoning_tokens;
  assert.ok(Number.isInteger(reasoningTokens) && reasoningTokens >= 0);
  assert.ok(reasoningTokens <= wholeChat.usage.completion_tokens);
});

await check("chat.completions.create stream + include_usage", async () => {
  const stream = await client.chat.completions.create({
    ...chatRequest,
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = "";
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      role = role ?? choice.delta.role ?? null;
      content += choice.delta.content ?? "";
      finish = choice.finish_reason ?? finish;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(content, wholeChat.choices[0].message.content);
  assert.equal(finish, wholeChat.choices[0].finish_reason);
  // Same prompt as the whole request before it: the conversation state cache holds all of it.
  assert.equal(wholeChat.usage.prompt_tokens_details.cached_tokens, 0);
  assert.deepEqual(usage, {
    ...wholeChat.usage,
    prompt_tokens_details: { cached_tokens: wholeChat.usage.prompt_tokens },
  });
});

await check("chat stream helper (finalChatCompletion)", async () => {
  const runner = client.chat.completions.stream(chatRequest);
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, wholeChat.choices[0].message.content);
});

await check("a multi-turn conversation resumes from the state cache", async () => {
  // The default model has DeltaNet layers: a turn resumes at the last 64-token prefill window
  // boundary of an earlier prompt that prefixes it (docs/serve.md, "Conversation state cache"), so
  // cached_tokens is a whole number of windows, and all but at most one window and the
  // generation prompt's tail (which the next prompt renders differently) of the previous prompt.
  const window = 64, generationPrompt = 16;
  const messages = [{ role: "system", content: "You answer questions about the book of Genesis in one line, plainly." }];
  const questions = [
    "In the beginning God created the heaven and the earth. What was the earth like then, and what moved upon the face of the waters?",
    "And God said, Let there be light: and there was light. What did God divide from the darkness, and what did he call each?",
    "What did God make on the second day, and what did he call the firmament that divided the waters?",
    "Say in one word which day you liked best.",
  ];
  let previousPrompt = 0;
  for (const [turn, question] of questions.entries()) {
    messages.push({ role: "user", content: question });
    const reply = await client.chat.completions.create({
      model: "strata-default", messages, max_tokens: 16, temperature: 0, chat_template_kwargs: { enable_thinking: false },
    });
    const prompt = reply.usage.prompt_tokens;
    const cached = reply.usage.prompt_tokens_details.cached_tokens;
    const where = `turn ${turn + 1}: ${cached} of ${prompt} prompt tokens cached, previous prompt ${previousPrompt}`;
    assert.equal(cached % window, 0, where);
    assert.ok(cached < prompt, where);
    if (turn === 0) assert.equal(cached, 0, where);
    else assert.ok(cached > 0 && cached <= previousPrompt && cached + window + generationPrompt >= previousPrompt, where);
    previousPrompt = prompt;
    messages.push({ role: "assistant", content: reply.choices[0].message.content });
  }
});

await check("completions.create, whole and streamed", async () => {
  const request = { model: "strata-default", prompt: "And God said", max_tokens: 20, temperature: 0 };
  const whole = await client.completions.create(request);
  assert.equal(whole.object, "text_completion");
  assert.equal(whole.usage.completion_tokens, 20);
  let text = "";
  for await (const chunk of await client.completions.create({ ...request, stream: true })) {
    text += chunk.choices[0]?.text ?? "";
  }
  assert.equal(text, whole.choices[0].text);
});

await check("seeded sampling repeats", async () => {
  const request = { model: "strata-default", prompt: "The", max_tokens: 10, temperature: 1, seed: 99 };
  const a = await client.completions.create(request);
  const b = await client.completions.create(request);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

await check("logprobs, n = 2 and logit_bias", async () => {
  const request = {
    model: "strata-default", messages: [{ role: "user", content: "Hello" }], max_tokens: 6,
    temperature: 1, seed: 5, n: 2, logprobs: true, top_logprobs: 3,
    frequency_penalty: 0.5, presence_penalty: 0.5, logit_bias: { "11": -100 },
    chat_template_kwargs: { enable_thinking: false },
  };
  const whole = await client.chat.completions.create(request);
  assert.equal(whole.choices.length, 2);
  for (const [i, choice] of whole.choices.entries()) {
    assert.equal(choice.index, i);
    for (const entry of choice.logprobs.content) {
      assert.ok(entry.logprob <= 0);
      assert.equal(entry.top_logprobs.length, 3);
      assert.ok(entry.top_logprobs[0].logprob >= entry.top_logprobs[2].logprob);
    }
  }
  const again = await client.chat.completions.create(request);
  assert.deepEqual(again.choices.map((c) => c.message.content), whole.choices.map((c) => c.message.content));
  const streamed = ["", ""];
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
    for (const choice of chunk.choices) streamed[choice.index] += choice.delta?.content ?? "";
  }
  assert.deepEqual(streamed, whole.choices.map((c) => c.message.content));
});

await check("tools: the request and a tool round trip are accepted", async () => {
  const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
  const reply = await client.chat.completions.create({
    model: "strata-default", max_tokens: 4, temperature: 0, tools, tool_choice: "auto",
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
      { role: "tool", tool_call_id: "call_1", content: '{"temp": 21}' },
    ],
  });
  assert.ok(["stop", "length", "tool_calls"].includes(reply.choices[0].finish_reason));
  // A forced call (drawn under the tools' grammar, so the random model finishes it: a city from
  // the enum), whole and through the SDK's stream helper, which assembles the tool_calls deltas
  // (index, id and name first, then argument fragments): the same message either way.
  const strictTools = [{ type: "function", function: { name: "get_weather", strict: true, parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Tokyo"] } }, required: ["city"] } } }];
  const forced = {
    model: "strata-default", max_tokens: 200, temperature: 0, tools: strictTools, parallel_tool_calls: false,
    tool_choice: { type: "function", function: { name: "get_weather" } },
    messages: [{ role: "user", content: "Weather in Paris?" }],
  };
  const whole = await client.chat.completions.create(forced);
  let fragments = 0;
  const runner = client.chat.completions.stream(forced);
  runner.on("chunk", (chunk) => {
    for (const call of chunk.choices[0]?.delta?.tool_calls ?? []) if (call.id === undefined) fragments += 1;
  });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, whole.choices[0].finish_reason);
  assert.equal(final.choices[0].message.content ?? null, whole.choices[0].message.content);
  const wholeCalls = whole.choices[0].message.tool_calls ?? [];
  assert.equal(whole.choices[0].finish_reason, "tool_calls");
  assert.equal(wholeCalls.length, 1);
  assert.ok(["Paris", "Tokyo"].includes(JSON.parse(wholeCalls[0].function.arguments).city));
  // (The stream helper adds parsed_arguments for strict tools: compared on what was sent.)
  const sent = (c) => ({ name: c.function.name, arguments: c.function.arguments });
  assert.deepEqual((final.choices[0].message.tool_calls ?? []).map(sent), wholeCalls.map(sent));
  if (wholeCalls.length > 0 && wholeCalls[0].function.arguments.length > 8) assert.ok(fragments > 1);
  // The round trip: the model's own call goes back as the assistant turn (the message as the SDK
  // returned it) with the tool's result, and the model answers after it.
  const roundTrip = await client.chat.completions.create({
    ...forced, tool_choice: "auto", max_tokens: 8,
    messages: [...forced.messages, whole.choices[0].message,
      { role: "tool", tool_call_id: wholeCalls[0].id, content: '{"temp": 21}' }],
  });
  assert.ok(["stop", "length", "tool_calls"].includes(roundTrip.choices[0].finish_reason));
  // The call and the result are in the prompt: it is longer than the question's by more than
  // the result's few tokens.
  assert.ok(roundTrip.usage.prompt_tokens > whole.usage.prompt_tokens + 8,
    `${roundTrip.usage.prompt_tokens} prompt tokens after the round trip, ${whole.usage.prompt_tokens} before`);
  await assert.rejects(
    client.chat.completions.create({ model: "strata-default", messages: [{ role: "user", content: "x" }], tools, tool_choice: { type: "function", function: { name: "nope" } } }),
    (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, String(error));
      assert.equal(error.param, "tool_choice.function.name");
      return true;
    });
});

// A JSON Schema validator for the subset the schemas below use, so the test needs no package beyond
// openai: a schema with any other keyword throws rather than have a constraint skipped silently.
const validatorKeywords = new Set([
  "type", "properties", "required", "additionalProperties", "enum", "items",
  "minItems", "maxItems", "minimum", "maximum", "minLength", "maxLength", "description",
]);

function jsonType(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
}

// The first place where `value` breaks `schema`, as "$.credits[1].role: expected ..., found ...",
// or null where it is valid.
function schemaViolation(schema, value, path = "$") {
  for (const keyword of Object.keys(schema)) {
    if (!validatorKeywords.has(keyword)) throw new Error(`schemaViolation: ${path}: keyword ${keyword} is not implemented`);
  }
  if (schema.additionalProperties !== undefined && schema.additionalProperties !== false) {
    throw new Error(`schemaViolation: ${path}: only additionalProperties: false is implemented`);
  }
  const found = (expected) => `${path}: expected ${expected}, found ${JSON.stringify(value)}`;
  const type = jsonType(value);
  if (schema.type !== undefined && schema.type !== type && !(schema.type === "number" && type === "integer")) {
    return found(schema.type);
  }
  // Primitive enum values only (what the schemas use): includes() compares by value for those.
  if (schema.enum !== undefined && !schema.enum.includes(value)) return found(`one of ${JSON.stringify(schema.enum)}`);
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) return found(`>= ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) return found(`<= ${schema.maximum}`);
  }
  if (type === "string") {
    const codePoints = [...value].length;  // JSON Schema counts code points, not UTF-16 units
    if (schema.minLength !== undefined && codePoints < schema.minLength) return found(`at least ${schema.minLength} characters`);
    if (schema.maxLength !== undefined && codePoints > schema.maxLength) return found(`at most ${schema.maxLength} characters`);
  }
  if (type === "array") {
    if (schema.minItems !== undefined && value.length < schema.minItems) return found(`at least ${schema.minItems} items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) return found(`at most ${schema.maxItems} items`);
    for (const [i, item] of value.entries()) {
      const violation = schema.items === undefined ? null : schemaViolation(schema.items, item, `${path}[${i}]`);
      if (violation) return violation;
    }
  }
  if (type === "object") {
    const properties = schema.properties ?? {};
    for (const name of schema.required ?? []) {
      if (!Object.hasOwn(value, name)) return `${path}: required property "${name}" is missing, found ${JSON.stringify(value)}`;
    }
    for (const [name, member] of Object.entries(value)) {
      if (Object.hasOwn(properties, name)) {
        const violation = schemaViolation(properties[name], member, `${path}.${name}`);
        if (violation) return violation;
      } else if (schema.additionalProperties === false) {
        return `${path}: property "${name}" is not in properties (additionalProperties: false)`;
      }
    }
  }
  return null;
}

// Parses `text` and validates it, failing with the first violation's path.
function assertValidJson(schema, text, label) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    assert.fail(`${label}: not JSON (${error.message}): ${text}`);
  }
  const violation = schemaViolation(schema, value);
  assert.equal(violation, null, `${label}: ${violation}\n${text}`);
  return value;
}

// The kind of schema people send with strict: true (OpenAI's strict rules: every property
// required, additionalProperties false everywhere): a nested object, enums, an array of objects,
// integers with bounds. Every string and array is bounded, so the grammar admits at most ~2,100
// bytes (docs/serve.md, "What is generated"): 52 places for whitespace of at most 21 bytes (a
// newline and 20 spaces, after { [ , : and before } ]), ~740 bytes of strings (at most 6 bytes a
// character: \u00XX), keys, enums, numbers. A token is at least one byte, so max_tokens 2200
// cannot cut a value: "length" would be a server bug. (The values seen are 170-300 tokens.)
const workSchema = {
  type: "object",
  properties: {
    title: { type: "string", minLength: 1, maxLength: 24 },
    kind: { type: "string", enum: ["book", "film", "album"] },
    year: { type: "integer", minimum: 1900, maximum: 2030 },
    rating: { type: "integer", minimum: 1, maximum: 5 },
    available: { type: "boolean" },
    publisher: {
      type: "object",
      properties: { name: { type: "string", maxLength: 16 }, country: { type: "string", enum: ["FR", "JP", "US"] } },
      required: ["name", "country"],
      additionalProperties: false,
    },
    credits: {
      type: "array", minItems: 1, maxItems: 3,
      items: {
        type: "object",
        properties: {
          person: { type: "string", minLength: 1, maxLength: 16 },
          role: { type: "string", enum: ["author", "editor", "translator"] },
          share: { type: "integer", minimum: 0, maximum: 100 },
        },
        required: ["person", "role", "share"],
        additionalProperties: false,
      },
    },
    tags: { type: "array", maxItems: 4, items: { type: "string", maxLength: 8 } },
  },
  required: ["title", "kind", "year", "rating", "available", "publisher", "credits", "tags"],
  additionalProperties: false,
};

await check("the schema validator finds each violation's path", async () => {
  const valid = {
    title: "Dune", kind: "book", year: 1965, rating: 5, available: true,
    publisher: { name: "Chilton", country: "US" },
    credits: [{ person: "Frank Herbert", role: "author", share: 100 }], tags: ["sf"],
  };
  assert.equal(schemaViolation(workSchema, valid), null);
  const broken = (edit) => {
    const value = structuredClone(valid);
    edit(value);
    return schemaViolation(workSchema, value);
  };
  assert.match(broken((v) => { v.kind = "poem"; }), /^\$\.kind: expected one of/);
  assert.match(broken((v) => { v.year = 1899; }), /^\$\.year: expected >= 1900/);
  assert.match(broken((v) => { v.rating = 2.5; }), /^\$\.rating: expected integer/);
  assert.match(broken((v) => { v.title = ""; }), /^\$\.title: expected at least 1 characters/);
  assert.match(broken((v) => { v.credits = []; }), /^\$\.credits: expected at least 1 items/);
  assert.match(broken((v) => { delete v.credits[0].role; }), /^\$\.credits\[0\]: required property "role"/);
  assert.match(broken((v) => { v.credits[0].share = 101; }), /^\$\.credits\[0\]\.share: expected <= 100/);
  assert.match(broken((v) => { v.publisher.city = "Philadelphia"; }), /^\$\.publisher: property "city"/);
  assert.match(broken((v) => { v.tags = [1]; }), /^\$\.tags\[0\]: expected string/);
  assert.throws(() => schemaViolation({ type: "string", pattern: "^a" }, "a"), /pattern is not implemented/);
});

await check("response_format json_schema (strict): values validate, whole (parse helper) and streamed", async () => {
  // Greedy, and sampled at temperature 1 with a seed: the grammar, not a lucky draw, has to make
  // the random model's value valid.
  for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 17 }]) {
    const label = `json_schema ${JSON.stringify(sampling)}`;
    const request = {
      model: "strata-default", messages: [{ role: "user", content: "Describe a book as JSON." }],
      max_tokens: 2200, ...sampling,
      response_format: { type: "json_schema", json_schema: { name: "work", strict: true, schema: workSchema } },
    };
    // parse() is the SDK's structured-output helper: it JSON.parses the content into
    // message.parsed, and throws LengthFinishReasonError where finish_reason is "length".
    let whole;
    try {
      whole = await client.chat.completions.parse(request);
    } catch (error) {
      if (error?.constructor?.name === "LengthFinishReasonError") {
        assert.fail(`${label}: finish_reason "length": max_tokens ${request.max_tokens} cut the value, yet this schema admits none that long (a server bug)`);
      }
      throw error;
    }
    const message = whole.choices[0].message;
    assert.equal(whole.choices[0].finish_reason, "stop", label);
    assert.deepEqual(assertValidJson(workSchema, message.content, `${label} whole`), message.parsed);
    let content = "";
    let finish = null;
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      for (const choice of chunk.choices) {
        content += choice.delta.content ?? "";
        finish = choice.finish_reason ?? finish;
      }
    }
    assert.equal(finish, "stop", `${label} streamed: finish_reason ${finish} (max_tokens cannot cut this schema's values)\n${content}`);
    assertValidJson(workSchema, content, `${label} streamed`);
    assert.equal(content, message.content, label);
  }
});

await check("response_format json_object: a JSON object", async () => {
  // Seeded sampling only: json_object bounds no string or nesting, and the random model's greedy
  // reply nests one key forever; sampled, it closes the object in well under 400 tokens.
  for (const seed of [3, 11]) {
    const reply = await client.chat.completions.create({
      model: "strata-default", messages: [{ role: "user", content: "Describe a book as a JSON object." }],
      max_tokens: 400, temperature: 1, seed, response_format: { type: "json_object" },
    });
    const content = reply.choices[0].message.content;
    assert.equal(reply.choices[0].finish_reason, "stop", `json_object seed ${seed}: finish_reason ${reply.choices[0].finish_reason}\n${content}`);
    assertValidJson({ type: "object" }, content, `json_object seed ${seed}`);
  }
});

// Counters from /metrics (behind the API key like every route but /health).
async function metrics() {
  const reply = await fetch(new URL("/metrics", process.argv[2]), { headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(reply.status, 200);
  const values = {};
  for (const line of (await reply.text()).split("\n")) {
    const [name, value] = line.split(" ");
    if (name.startsWith("strata_batch_")) values[name] = Number(value);
  }
  return values;
}

await check("16 streams at once (--parallel 16), each as it is alone", async () => {
  const request = (content) => ({
    model: "strata-default", messages: [{ role: "user", content }], max_tokens: 32, temperature: 0,
    ignore_eos: true, stream: true, stream_options: { include_usage: true },
    chat_template_kwargs: { enable_thinking: false },
  });
  async function run(body) {
    let content = "";
    let finish = null;
    let usage = null;
    for await (const chunk of await client.chat.completions.create(body)) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        content += choice.delta.content ?? "";
        finish = choice.finish_reason ?? finish;
      }
    }
    assert.ok(usage, "no usage chunk with include_usage");
    // cached_tokens depends on what ran before (the state cache), not on the reply.
    return { content, finish, usage: { ...usage, prompt_tokens_details: undefined } };
  }
  // Twelve different prompts, run alone first (so at once they resume from the state cache and
  // decode together), and one new prompt sent four times at once (those four prefill in the
  // batched steps too), run alone after.
  const distinct = Array.from({ length: 12 }, (_, i) => `Tell me about the number ${i + 1}.`);
  const shared = "Write a line about rivers and the sea.";
  const bodies = [...distinct, shared, shared, shared, shared].map(request);
  let started = performance.now();
  const alone = [];
  for (const body of bodies.slice(0, 12)) alone.push(await run(body));
  const aloneSeconds = (performance.now() - started) / 1000;
  const before = await metrics();
  started = performance.now();
  const together = await Promise.all(bodies.map(run));
  const togetherSeconds = (performance.now() - started) / 1000;
  const after = await metrics();
  alone.push(...Array(4).fill(await run(bodies[12])));
  for (const [i, reply] of together.entries()) {
    assert.deepEqual(reply, alone[i], `stream ${i} (${bodies[i].messages[0].content})`);
    assert.equal(reply.usage.completion_tokens, 32);
    assert.equal(reply.finish, "length");
  }
  // The streams overlapped: their batched steps carried more than one decoding row on average
  // (one at a time, each of the 16 x 32 rows would take a step of its own).
  const steps = after.strata_batch_steps_total - before.strata_batch_steps_total;
  const rows = after.strata_batch_rows_total - before.strata_batch_rows_total;
  assert.ok(rows > steps, `${rows} decoded rows in ${steps} batched steps: the streams did not run together`);
  // For information only (the machines are shared): no timing is asserted.
  const aloneRate = (12 * 32) / aloneSeconds;
  const togetherRate = (16 * 32) / togetherSeconds;
  console.log(`  16 streams ${togetherRate.toFixed(0)} tok/s, one at a time ${aloneRate.toFixed(0)} tok/s ` +
    `(${(togetherRate / aloneRate).toFixed(2)}x); ${(rows / steps).toFixed(1)} rows a step, at most ${after.strata_batch_max_rows}`);
});

await check("typed errors", async () => {
  await assert.rejects(client.chat.completions.create({ ...chatRequest, model: "gpt-4o" }), (error) => {
    assert.ok(error instanceof OpenAI.NotFoundError, String(error));
    assert.equal(error.status, 404);
    assert.equal(error.error?.param ?? error.param, "model");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ ...chatRequest, max_tokens: -1 }), (error) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.equal(error.param, "max_tokens");
    assert.match(error.message, /max_tokens/);
    return true;
  });
  await assert.rejects(client.chat.completions.create({ ...chatRequest, messages: [] }), (error) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.equal(error.param, "messages");
    return true;
  });
});

if (process.argv[3]) {
  await check("a wrong API key is an AuthenticationError", async () => {
    const stranger = new OpenAI({ baseURL: process.argv[2], apiKey: apiKey + "x", maxRetries: 0 });
    await assert.rejects(stranger.models.list(), (error) => {
      assert.ok(error instanceof OpenAI.AuthenticationError, String(error));
      assert.equal(error.status, 401);
      assert.equal(error.code, "invalid_api_key");
      return true;
    });
  });
}

console.log(`openai ${sdkVersion} (npm): ${checks} checks passed`);
