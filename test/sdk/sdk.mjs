// The SDKs people call Switchyard with, against a running gateway.
//
//   node sdk.mjs sdks URL        every SDK check; prints the owner of a
//                                stored conversation and its last response
//   node sdk.mjs drained URL ID  a next turn of ID after its owner drained
//   node sdk.mjs batch URL       the Batch API with openai 6.x and 5.x: a
//                                40-line batch uploaded, run and read back
//
// Each check prints one JSON line {"check","ok","detail"}; the Go test
// (test/sdk_test.go) fails on any line that is not ok.
import OpenAI, { toFile } from 'openai';
import OpenAIv5, { toFile as toFileV5 } from 'openai-v5';
import Anthropic from '@anthropic-ai/sdk';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';

const [cmd, url, arg] = process.argv.slice(2);
const key = 'sk-default-dev'; // tenant default: an SDK must send a key, and one not in the table is refused
const openai = new OpenAI({ baseURL: url + '/v1', apiKey: key, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0 });

function report(check, ok, detail) {
  console.log(JSON.stringify({ check, ok: !!ok, detail: detail === undefined ? '' : String(detail) }));
}

async function check(name, fn) {
  try {
    const r = await fn();
    if (r === true || r === undefined) report(name, true);
    else report(name, false, r);
  } catch (e) {
    report(name, false, (e && e.stack) || e);
  }
}

const words = (s) => (s || '').trim().split(/\s+/).filter(Boolean).length;

async function sdks() {
  await check('openai chat', async () => {
    const { data, response } = await openai.chat.completions
      .create({ model: 'chat-small', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4 })
      .withResponse();
    const text = data.choices[0].message.content;
    if (words(text) !== 4) return `content ${JSON.stringify(text)}, want 4 words`;
    if (!response.headers.get('x-request-id')) return 'no x-request-id';
    if (!response.headers.get('x-switchyard-replica')) return 'no X-Switchyard-Replica';
  });
  await check('openai chat stream', async () => {
    const stream = await openai.chat.completions.create({
      model: 'chat-small', messages: [{ role: 'user', content: 'Count' }], max_tokens: 5, stream: true,
    });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    if (words(text) !== 5) return `streamed ${JSON.stringify(text)}, want 5 words`;
  });
  await check('openai models.retrieve', async () => {
    const m = await openai.models.retrieve('chat-small');
    if (m.id !== 'chat-small' || m.object !== 'model') return JSON.stringify(m);
    try {
      await openai.models.retrieve('no-such-model');
      return 'an unknown model was found';
    } catch (e) {
      if (!(e instanceof OpenAI.NotFoundError)) return `unknown model: ${e}`;
    }
  });
  await check('openai responses', async () => {
    const r = await openai.responses.create({ model: 'chat-small', input: 'Hello', instructions: 'Be brief', max_output_tokens: 4 });
    if (!r.id.startsWith('resp_') || words(r.output_text) !== 4) return `id ${r.id}, output_text ${JSON.stringify(r.output_text)}`;
    if (r.usage.input_tokens <= 0) return `usage ${JSON.stringify(r.usage)}`;
  });
  await check('openai responses stream', async () => {
    const stream = await openai.responses.create({ model: 'chat-small', input: 'Hello', max_output_tokens: 3, stream: true });
    const types = [];
    let text = '';
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    if (types[0] !== 'response.created' || types.at(-1) !== 'response.completed') return `events ${types.join(' ')}`;
    if (words(text) !== 3) return `deltas ${JSON.stringify(text)}, want 3 words`;
  });
  let owner = '', last = '';
  await check('openai responses previous_response_id over three turns', async () => {
    let prev;
    const replicas = [];
    for (let i = 0; i < 3; i++) {
      const { data, response } = await openai.responses
        .create({ model: 'chat-small', input: `Turn ${i + 1}`, max_output_tokens: 3, previous_response_id: prev })
        .withResponse();
      replicas.push(response.headers.get('x-switchyard-replica'));
      if (i > 0 && response.headers.get('x-switchyard-reason') !== 'response-affinity')
        return `turn ${i + 1}: reason ${response.headers.get('x-switchyard-reason')}`;
      prev = data.id;
    }
    if (new Set(replicas).size !== 1) return `turns landed on ${replicas.join(', ')}`;
    owner = replicas[0];
    last = prev;
  });
  await check('ai-sdk openai default (Responses) model', async () => {
    const provider = createOpenAI({ baseURL: url + '/v1', apiKey: key });
    const model = provider('chat-small');
    const r = await generateText({ model, prompt: 'Hello', maxOutputTokens: 4, maxRetries: 0 });
    if (words(r.text) !== 4) return `text ${JSON.stringify(r.text)}`;
    if (!String(r.response.id).startsWith('resp_')) return `response id ${r.response.id}: not the Responses API`;
    const s = streamText({ model, prompt: 'Hello', maxOutputTokens: 3, maxRetries: 0, onError: () => {} });
    let text = '';
    for await (const t of s.textStream) text += t;
    if (words(text) !== 3) return `streamed ${JSON.stringify(text)}`;
  });
  await check('anthropic messages', async () => {
    const m = await anthropic.messages.create({
      model: 'chat-small', max_tokens: 4, system: 'Be brief', messages: [{ role: 'user', content: 'Hello' }],
    });
    if (m.type !== 'message' || m.content[0].type !== 'text' || words(m.content[0].text) !== 4 || m.stop_reason !== 'max_tokens')
      return JSON.stringify(m);
  });
  await check('anthropic messages stream', async () => {
    const stream = anthropic.messages.stream({ model: 'chat-small', max_tokens: 3, messages: [{ role: 'user', content: 'Hello' }] });
    let text = '';
    stream.on('text', (t) => { text += t; });
    const m = await stream.finalMessage();
    if (words(text) !== 3 || m.usage.output_tokens !== 3) return `text ${JSON.stringify(text)}, usage ${JSON.stringify(m.usage)}`;
  });
  await check('anthropic error', async () => {
    try {
      await anthropic.messages.create({ model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'Hello' }] });
      return 'an unknown model answered';
    } catch (e) {
      if (!(e instanceof Anthropic.NotFoundError)) return `${e}`;
      if (e.error?.type !== 'error' || e.error?.error?.type !== 'not_found_error') return JSON.stringify(e.error);
    }
  });
  console.log(JSON.stringify({ owner, last }));
}

async function drained(id) {
  await check('openai responses after the owner drained', async () => {
    try {
      await openai.responses.create({ model: 'chat-small', input: 'And then?', max_output_tokens: 3, previous_response_id: id });
      return 'answered without the stored conversation';
    } catch (e) {
      if (!(e instanceof OpenAI.NotFoundError) || e.code !== 'previous_response_not_found') return `${e} (code ${e.code})`;
      if (!/gone or draining/.test(e.message)) return `message ${e.message}`;
    }
  });
}

// batch runs files.create → batches.create → batches.retrieve until the
// batch is completed → files.content, and checks that every custom_id has
// exactly one answer, with one SDK version.
async function batch(name, Client, toFileOf) {
  const client = new Client({ baseURL: url + '/v1', apiKey: key, maxRetries: 0 });
  await check(`${name} batch`, async () => {
    const lines = [];
    for (let i = 1; i <= 40; i++) {
      lines.push(JSON.stringify({
        custom_id: `req-${i}`, method: 'POST', url: '/v1/chat/completions',
        body: { model: 'chat-small', max_tokens: 3, messages: [{ role: 'user', content: `line ${i}` }] },
      }));
    }
    const file = await client.files.create({
      file: await toFileOf(Buffer.from(lines.join('\n') + '\n'), 'batch.jsonl'), purpose: 'batch',
    });
    if (file.purpose !== 'batch' || !file.id.startsWith('file-')) return `file ${JSON.stringify(file)}`;
    let b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const start = Date.now();
    while (!['completed', 'failed', 'expired', 'cancelled'].includes(b.status)) {
      if (Date.now() - start > 60000) return `not completed within 60 s: ${JSON.stringify(b)}`;
      await new Promise((r) => setTimeout(r, 250));
      b = await client.batches.retrieve(b.id);
    }
    if (b.status !== 'completed') return `status ${b.status}: ${JSON.stringify(b.errors)}`;
    if (b.request_counts.total !== 40 || b.request_counts.completed !== 40) return `counts ${JSON.stringify(b.request_counts)}`;
    const text = await (await client.files.content(b.output_file_id)).text();
    const seen = new Map();
    for (const line of text.split('\n').filter(Boolean)) {
      const r = JSON.parse(line);
      if (seen.has(r.custom_id)) return `${r.custom_id} answered twice`;
      if (r.response?.status_code !== 200 || r.response.body.object !== 'chat.completion') return `line ${line}`;
      seen.set(r.custom_id, r);
    }
    for (let i = 1; i <= 40; i++) if (!seen.has(`req-${i}`)) return `req-${i} has no answer`;
    if (seen.size !== 40) return `${seen.size} answers`;
  });
}

if (cmd === 'sdks') await sdks();
else if (cmd === 'batch') {
  await batch('openai 6', OpenAI, toFile);
  await batch('openai 5', OpenAIv5, toFileV5);
}
else if (cmd === 'drained') await drained(arg);
else {
  console.error('usage: node sdk.mjs sdks URL | drained URL ID | batch URL');
  process.exit(2);
}
