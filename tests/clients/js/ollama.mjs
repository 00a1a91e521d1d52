// Ollama's JavaScript client (`ollama` on npm) against Hearth's native API: the side of
// tests/clients/test_ollama_clients.py. `node ollama.mjs FLOW` runs one flow against the Hearth
// at $HEARTH_URL with model $HEARTH_MODEL and prints one JSON object, which the Python test
// asserts on. The package loads from the npm prefix scripts/setup_clients.sh installed
// ($HEARTH_OLLAMA_JS_DIR), not from the repository.
import { createRequire } from 'node:module';

const require = createRequire(`${process.env.HEARTH_OLLAMA_JS_DIR}/package.json`);
const { Ollama } = require('ollama');

const client = new Ollama({ host: process.env.HEARTH_URL });
const model = process.env.HEARTH_MODEL;
const options = { temperature: 0, num_predict: 24 };
const messages = [{ role: 'user', content: 'What is the capital of France?' }];
const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'The current weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

async function caught(fn) {
  try {
    await fn();
    return null;
  } catch (e) {
    return { status: e.status_code, error: e.error };
  }
}

const flows = {
  async text() {
    const whole = await client.chat({ model, messages, options });
    let streamed = '';
    let last = null;
    for await (const part of await client.chat({ model, messages, options, stream: true })) {
      streamed += part.message.content;
      last = part;
    }
    const generated = await client.generate({ model, prompt: 'Name a color.', options });
    return { text: whole.message.content, doneReason: whole.done_reason, evalCount: whole.eval_count,
      streamed, streamDone: last.done, streamDoneReason: last.done_reason, generated: generated.response };
  },
  async models() {
    const list = await client.list();
    const show = await client.show({ model });
    await client.generate({ model, prompt: '' });  // a load
    const ps = await client.ps();
    const version = await client.version();
    const pull = await client.pull({ model });
    const missing = await caught(() => client.chat({ model: 'missing:7b', messages }));
    const noPull = await caught(() => client.pull({ model: 'no-such-model-anywhere' }));
    return { names: list.models.map((m) => m.name), family: list.models[0].details.family,
      capabilities: show.capabilities, loaded: ps.models.map((m) => m.name), version: version.version,
      pull: pull.status, missing, noPull };
  },
  async tools() {
    const r = await client.chat({ model, messages: [{ role: 'user', content: process.env.HEARTH_PROMPT }],
      tools: [weather], options: { temperature: 0 } });
    return { calls: r.message.tool_calls ?? [] };
  },
};

console.log(JSON.stringify(await flows[process.argv[2]]()));
