// The Node clients of the verified list (docs/src/clients.md) through `mcp-context serve`, as tests/all/clients.rs
// runs them: `openai`, the AI SDK (`ai`) with `@ai-sdk/openai` and `@ai-sdk/anthropic`, and `@anthropic-ai/sdk`, each
// as alice and bob, plain and streamed, with one tool. Every prompt carries `[client user mode]` so that the test can
// tell the upstream's requests apart. Argument: the proxy's URL, without /v1. Prints one JSON object of the answers.
import { generateText, jsonSchema, streamText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const proxy = process.argv[2];
const schema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
const tools = { get_weather: tool({ description: "The weather in a city", inputSchema: jsonSchema(schema) }) };
const out = {};

async function aiSdk(name, model, user) {
  const plain = await generateText({ model, tools, maxRetries: 0, prompt: `[${name} ${user} plain] What is new?` });
  const stream = streamText({ model, tools, maxRetries: 0, prompt: `[${name} ${user} stream] What is new?` });
  let text = "";
  for await (const piece of stream.textStream) text += piece;
  return { plain: plain.text, stream: text };
}

for (const user of ["alice", "bob"]) {
  const apiKey = `key-${user}`;
  const official = new OpenAI({ baseURL: `${proxy}/v1`, apiKey, maxRetries: 0 });
  const chat = (mode, extra) =>
    official.chat.completions.create({
      model: "gpt-4o",
      tools: [{ type: "function", function: { name: "get_weather", description: "The weather in a city", parameters: schema } }],
      messages: [{ role: "user", content: `[openai ${user} ${mode}] What is new?` }],
      ...extra,
    });
  const reply = await chat("plain", {});
  let streamed = "";
  for await (const c of await chat("stream", { stream: true })) streamed += c.choices[0]?.delta?.content ?? "";
  (out["openai"] ??= {})[user] = { plain: reply.choices[0].message.content, stream: streamed };

  const openai = createOpenAI({ baseURL: `${proxy}/v1`, apiKey });
  (out["ai-sdk-openai"] ??= {})[user] = await aiSdk("ai-sdk-openai", openai.chat("gpt-4o"), user);
  // This provider's base URL includes /v1 (its default is https://api.anthropic.com/v1).
  const anthropic = createAnthropic({ baseURL: `${proxy}/v1`, apiKey });
  (out["ai-sdk-anthropic"] ??= {})[user] = await aiSdk("ai-sdk-anthropic", anthropic("claude-sonnet-4-5"), user);

  const client = new Anthropic({ baseURL: proxy, apiKey, maxRetries: 0 });
  const sdkTools = [{ name: "get_weather", description: "The weather in a city", input_schema: schema }];
  const ask = (mode) => ({
    model: "claude-sonnet-4-5",
    max_tokens: 64,
    tools: sdkTools,
    messages: [{ role: "user", content: `[anthropic-sdk ${user} ${mode}] What is new?` }],
  });
  const r = await client.messages.create(ask("plain"));
  const s = client.messages.stream(ask("stream"));
  (out["anthropic-sdk"] ??= {})[user] = { plain: r.content[0].text, stream: await s.finalText() };
}
console.log(JSON.stringify(out));
