// The official openai npm client against `strata serve`: models, chat and completions, streamed
// and whole, usage in streams, and the SDK's typed errors for bad requests.
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
  await assert.rejects(
    client.chat.completions.create({ model: "strata-default", messages: [{ role: "user", content: "x" }], tools, tool_choice: { type: "function", function: { name: "nope" } } }),
    (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, String(error));
      assert.equal(error.param, "tool_choice.function.name");
      return true;
    });
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
