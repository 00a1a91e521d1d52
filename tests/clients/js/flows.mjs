// The Vercel AI SDK's side of tests/clients/test_ai_sdk.py: `node flows.mjs FLOW PROVIDER` runs
// one flow against the Hearth at $HEARTH_URL and prints one JSON object on stdout, which the
// Python test asserts on. PROVIDER is `chat` (@ai-sdk/openai-compatible, Chat Completions) or
// `responses` (@ai-sdk/openai's default provider, the Responses API). The shapes mirror
// tests/clients/shapes.py. The packages load from the
// npm prefix scripts/setup_clients.sh installed ($HEARTH_AI_SDK_DIR), not from the repository.
import { createRequire } from 'node:module';

const require = createRequire(`${process.env.HEARTH_AI_SDK_DIR}/package.json`);
const { generateText, streamText, tool, stepCountIs, Output } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');
const { createOpenAICompatible } = require('@ai-sdk/openai-compatible');
const { z } = require('zod');

const [flow, kind] = process.argv.slice(2);
const sent = [];  // every request body the provider sent, in order
const recordingFetch = (url, init) => {
  if (typeof init?.body === 'string') sent.push(JSON.parse(init.body));
  return fetch(url, init);
};
const base = `${process.env.HEARTH_URL}/v1`;
const modelName = process.env.HEARTH_MODEL;
const model = kind === 'chat'
  ? createOpenAICompatible({ name: 'hearth', baseURL: base, apiKey: 'unused', supportsStructuredOutputs: true,
    includeUsage: true })
    .chatModel(modelName)
  : createOpenAI({ baseURL: base, apiKey: 'unused', fetch: recordingFetch })(modelName);  // the default: Responses
const common = { model, temperature: 0, maxRetries: 0 };

const weather = tool({
  description: 'The current weather in a city.',
  inputSchema: z.object({ city: z.string().describe("the city's name") }),
  execute: async ({ city }) => `Sunny, 21 C in ${city}.`,
});

// A tool round trip: step 0 calls get_weather (forced, or in auto mode under the grammar given),
// the SDK runs it and sends the result back, step 1 answers in text (tool_choice none: another
// call is not the model's to choose).
async function roundTrip(firstStep) {
  const r = await generateText({
    ...common, maxOutputTokens: 64, tools: { get_weather: weather },
    prompt: 'What is the weather in Paris? Use the get_weather tool.',
    stopWhen: stepCountIs(2),
    prepareStep: ({ stepNumber }) => (stepNumber === 0 ? firstStep : { toolChoice: 'none' }),
  });
  return {
    steps: r.steps.map((s) => ({
      finishReason: s.finishReason,
      toolCalls: s.toolCalls.map((c) => ({ toolName: c.toolName, input: c.input })),
      toolResults: s.toolResults.map((t) => t.output),
      text: s.text,
    })),
  };
}

const flows = {
  async text() {
    const prompt = 'What is the capital of France?';
    const opts = { ...common, prompt, maxOutputTokens: 24, providerOptions: { hearth: { cache_prompt: false } } };
    const full = await generateText(opts);
    const stream = streamText(opts);
    let streamed = '';
    for await (const part of stream.textStream) streamed += part;
    return { text: full.text, finishReason: full.finishReason, streamed, streamFinishReason: await stream.finishReason,
      outputTokens: (await stream.usage).outputTokens };
  },
  forced: () => roundTrip({ toolChoice: { type: 'tool', toolName: 'get_weather' } }),
  auto: () => roundTrip({ toolChoice: 'auto', providerOptions: { hearth: { grammar: process.env.HEARTH_GRAMMAR } } }),
  async structured() {
    const Person = z.object({
      name: z.string().max(40),
      age: z.number().int().min(0).max(150),
      born: z.number().int().min(1900).max(2100),
      address: z.object({ street: z.string().max(40), city: z.string().max(30) }),
    });
    const r = await generateText({
      ...common, maxOutputTokens: 160, output: Output.object({ schema: Person }),
      prompt: process.env.HEARTH_PERSON_PROMPT,  // asks for a year out of `born`'s bounds
    });
    return { output: r.output, finishReason: r.finishReason };
  },
  // Two turns of one chat; the second sends the first answer back. With the provider's default
  // (store: true) it goes as an item reference; with store: false as the full message. Hearth must
  // build the same prompt from both: the same input token count.
  async multiturn() {
    const turns = async (store) => {
      const providerOptions = { openai: { store } };
      const messages = [{ role: 'user', content: 'My name is Ada. Say hello.' }];
      const first = await generateText({ ...common, messages, maxOutputTokens: 16, providerOptions });
      messages.push(...first.response.messages, { role: 'user', content: 'What is my name?' });
      const second = await generateText({ ...common, messages, maxOutputTokens: 16, providerOptions });
      return { first: first.usage.inputTokens, second: second.usage.inputTokens, text: second.text,
        sent: sent.at(-1) };
    };
    return { referenced: await turns(true), inline: await turns(false) };
  },
};

process.stdout.write(JSON.stringify(await flows[flow]()));
