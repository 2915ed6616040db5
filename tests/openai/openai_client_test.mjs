// openai_client_test.mjs — the official `openai` npm client against a running
// strata-coordinator (started by tests/api/api_test.py, mode "openai").
//
//   STRATA_BASE_URL=http://127.0.0.1:PORT STRATA_MODEL=stories260K \
//   STRATA_REF=.../stories260K-greedy.json node openai_client_test.mjs
//
// Checks (issue 16 too: token-id and batched prompts, n > 1, top_p 0, the
// sampling extras, unknown fields, /tokenize): non-streaming and streaming completions equal llama.cpp's greedy
// reference token ids (return_token_ids, a vendor field passed through the
// client as an extra body param) and text; non-streaming and streaming chat
// completions (shapes, delta.role then delta.content, usage, logprobs) equal
// a completion of the plain template's rendering; errors surface as the
// client's typed errors (BadRequestError 400, NotFoundError 404).
// Exit status 0 when every check passed.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const base = process.env.STRATA_BASE_URL;
const model = process.env.STRATA_MODEL;
const refs = JSON.parse(readFileSync(process.env.STRATA_REF, 'utf8'));
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'strata-test', maxRetries: 0, timeout: 120000 });

let fails = 0;
function check(cond, what) {
  console.log(`${cond ? 'ok' : 'FAIL'}: ${what}`);
  if (!cond) fails++;
}
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const N = 64;

// ---- models
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, `models.list() gives [${model}]`);

// ---- completions, non-streaming and streaming, against the reference
for (const r of refs.slice(0, 4)) {
  const c = await client.completions.create({
    model, prompt: r.prompt, max_tokens: N, temperature: 0, return_token_ids: true, user: 'openai-test',
  });
  const ch = c.choices[0];
  check(c.object === 'text_completion' && c.id.startsWith('cmpl-') && c.model === model,
    `completion ${JSON.stringify(r.prompt)}: object/id/model`);
  check(eq(ch.token_ids, r.completion_tokens.slice(0, N)), `completion ${JSON.stringify(r.prompt)}: token ids equal the reference`);
  check(eq(ch.prompt_token_ids, r.prompt_tokens), `completion ${JSON.stringify(r.prompt)}: prompt token ids equal the reference`);
  check(ch.text === r.completion_text && ch.finish_reason === 'length', `completion ${JSON.stringify(r.prompt)}: text equals the reference, finish length`);
  check(c.usage.prompt_tokens === r.prompt_tokens.length && c.usage.completion_tokens === N &&
    c.usage.total_tokens === r.prompt_tokens.length + N, `completion usage ${JSON.stringify(c.usage)}`);

  const stream = await client.completions.create({
    model, prompt: r.prompt, max_tokens: N, temperature: 0, stream: true,
    stream_options: { include_usage: true }, return_token_ids: true,
  });
  let text = '', ids = [], finish = null, usage = null, n = 0;
  for await (const chunk of stream) {
    n++;
    if (chunk.usage) usage = chunk.usage;
    for (const x of chunk.choices) {
      text += x.text;
      ids = ids.concat(x.token_ids || []);
      finish = x.finish_reason || finish;
    }
  }
  check(n > 2 && text === r.completion_text && eq(ids, r.completion_tokens.slice(0, N)) && finish === 'length',
    `stream ${JSON.stringify(r.prompt)}: ${n} chunks concatenate to the reference`);
  check(usage && usage.completion_tokens === N && usage.prompt_tokens === r.prompt_tokens.length,
    `stream ${JSON.stringify(r.prompt)}: include_usage chunk ${JSON.stringify(usage)}`);
}

// ---- stop strings and logprobs on completions
{
  const r = refs[0];
  const stopAt = r.completion_text.indexOf(' ', 10);
  const stopStr = r.completion_text.slice(stopAt, stopAt + 3);
  const c = await client.completions.create({ model, prompt: r.prompt, max_tokens: N, temperature: 0, stop: [stopStr, 'zzzz'] });
  check(c.choices[0].finish_reason === 'stop' && c.choices[0].text === r.completion_text.slice(0, r.completion_text.indexOf(stopStr)),
    `completion stop ${JSON.stringify(stopStr)} cuts the text before it`);
  const l = await client.completions.create({ model, prompt: r.prompt, max_tokens: 4, temperature: 0, logprobs: 3 });
  const lp = l.choices[0].logprobs;
  check(lp && lp.tokens.length === 4 && lp.token_logprobs.length === 4 && lp.top_logprobs.length === 4 &&
    Object.keys(lp.top_logprobs[0]).length === 3 && lp.token_logprobs.every((x) => x <= 0),
    'completion logprobs: 4 tokens with 3 alternatives each');
}

// ---- chat, non-streaming and streaming
{
  const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Once upon a time' }];
  const c = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2 });
  const ch = c.choices[0];
  check(c.object === 'chat.completion' && c.id.startsWith('chatcmpl-') && ch.message.role === 'assistant' &&
    typeof ch.message.content === 'string' && ch.message.content.length > 0, `chat: ${JSON.stringify(ch.message)}`);
  check(['stop', 'length'].includes(ch.finish_reason), `chat finish_reason ${ch.finish_reason}`);
  check(ch.logprobs && ch.logprobs.content.length === c.usage.completion_tokens &&
    ch.logprobs.content.every((t) => typeof t.token === 'string' && t.logprob <= 0 && t.top_logprobs.length === 2 && Array.isArray(t.bytes)),
    `chat logprobs: ${ch.logprobs ? ch.logprobs.content.length : 0} entries with 2 top_logprobs each`);
  // The plain template (stories260K has no tokenizer.chat_template): the same greedy text.
  const plain = await client.completions.create({
    model, prompt: 'System: You tell stories.\nUser: Once upon a time\nAssistant:', max_tokens: 24, temperature: 0, stop: ['\nUser:'],
  });
  check(plain.choices[0].text === ch.message.content && plain.usage.prompt_tokens === c.usage.prompt_tokens,
    'chat equals a completion of the plain template rendering');

  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let first = null, content = '', finish = null, usage = null, n = 0, obj = true;
  for await (const chunk of stream) {
    n++;
    obj = obj && chunk.object === 'chat.completion.chunk' && chunk.id === (first ? first.id : chunk.id);
    if (!first) first = chunk;
    if (chunk.usage) usage = chunk.usage;
    for (const x of chunk.choices) {
      content += x.delta.content || '';
      finish = x.finish_reason || finish;
    }
  }
  check(first && first.choices[0].delta.role === 'assistant', 'chat stream: the first chunk has delta.role assistant');
  check(obj && content === ch.message.content && finish === ch.finish_reason,
    `chat stream: ${n} chunks, the deltas concatenate to the non-streaming content`);
  check(usage && usage.completion_tokens === c.usage.completion_tokens && usage.total_tokens === c.usage.total_tokens,
    `chat stream: usage ${JSON.stringify(usage)}`);
}

// ---- issue 16: what clients of vLLM send
{
  const M = 16;
  const ids = (c) => [...c.choices].sort((a, b) => a.index - b.index).map((x) => x.token_ids);
  // token-id prompts, single and batched, equal the text prompts and the reference
  const one = await client.completions.create({ model, prompt: refs[0].prompt_tokens, max_tokens: M, temperature: 0, return_token_ids: true });
  check(eq(one.choices[0].token_ids, refs[0].completion_tokens.slice(0, M)), 'token-id prompt: the reference ids');
  const batch = await client.completions.create({
    model, prompt: refs.slice(0, 3).map((r) => r.prompt_tokens), max_tokens: M, temperature: 0, return_token_ids: true,
  });
  const texts = await client.completions.create({
    model, prompt: refs.slice(0, 3).map((r) => r.prompt), max_tokens: M, temperature: 0, return_token_ids: true,
  });
  check(batch.choices.length === 3 && eq(batch.choices.map((x) => x.index).sort(), [0, 1, 2]) &&
    eq(ids(batch), refs.slice(0, 3).map((r) => r.completion_tokens.slice(0, M))) && eq(ids(texts), ids(batch)),
  'batched token-id prompts == batched text prompts == the reference, indices 0-2');
  check(batch.usage.completion_tokens === 3 * M, `batched usage ${JSON.stringify(batch.usage)}`);

  // n = 3 with a seed: three choices, the same again with the same seed, others with another
  const q = { model, prompt: refs[1].prompt, max_tokens: M, temperature: 1, n: 3, return_token_ids: true };
  const a = await client.completions.create({ ...q, seed: 7 });
  const b = await client.completions.create({ ...q, seed: 7 });
  const c = await client.completions.create({ ...q, seed: 8 });
  check(a.choices.length === 3 && eq(a.choices.map((x) => x.index).sort(), [0, 1, 2]) && eq(ids(a), ids(b)) && !eq(ids(a), ids(c)),
    'n=3 with a seed: indices 0-2, same seed same choices, another seed other choices');
  check(a.usage.completion_tokens === ids(a).reduce((s, x) => s + x.length, 0), `n=3 usage ${JSON.stringify(a.usage)}`);

  // chat, n = 2, streaming: every chunk names its choice
  const st = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 8, temperature: 1, seed: 3, n: 2, stream: true,
  });
  const seen = new Set();
  for await (const chunk of st) for (const x of chunk.choices) seen.add(x.index);
  check(eq([...seen].sort(), [0, 1]), 'chat stream n=2: chunks for index 0 and 1');

  // top_p 0 keeps the argmax: greedy even at temperature 1
  const tp = await client.completions.create({ model, prompt: refs[2].prompt, max_tokens: M, temperature: 1, top_p: 0, return_token_ids: true });
  check(eq(tp.choices[0].token_ids, refs[2].completion_tokens.slice(0, M)), 'top_p 0 equals the greedy reference');

  // sampling extras: logit_bias (OpenAI's), repetition_penalty and min_tokens (vLLM's, extra body)
  const forced = await client.completions.create({ model, prompt: refs[0].prompt, max_tokens: 6, temperature: 0, logit_bias: { 300: 100 }, return_token_ids: true });
  check(eq(forced.choices[0].token_ids, [300, 300, 300, 300, 300, 300]), 'logit_bias +100 forces token 300');
  const rp = await client.completions.create({ model, prompt: refs[0].prompt, max_tokens: M, temperature: 0, repetition_penalty: 100, return_token_ids: true });
  const rpIds = rp.choices[0].token_ids;
  check(!eq(rpIds, refs[0].completion_tokens.slice(0, M)) && new Set(rpIds).size === rpIds.length &&
    !rpIds.some((x) => refs[0].prompt_tokens.includes(x)), `repetition_penalty 100: ${JSON.stringify(rpIds)} repeats nothing`);
  const mt = await client.completions.create({ model, prompt: refs[0].prompt, max_tokens: 16, temperature: 0, logit_bias: { 2: 100 }, min_tokens: 4 });
  check(mt.usage.completion_tokens === 4 && mt.choices[0].finish_reason === 'stop', `min_tokens 4 with EOS favoured: ${mt.usage.completion_tokens} tokens`);

  // /tokenize and /detokenize (vLLM's routes, outside /v1)
  const post = async (path, body) => (await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  })).json();
  const t = await post('/tokenize', { prompt: refs[3].prompt });
  const d = await post('/detokenize', { tokens: refs[3].prompt_tokens });
  check(eq(t.tokens, refs[3].prompt_tokens) && t.count === refs[3].prompt_tokens.length && d.prompt === refs[3].prompt,
    `/tokenize and /detokenize round-trip ${JSON.stringify(refs[3].prompt)}`);
  const inj = await post('/tokenize', { messages: [{ role: 'user', content: '<s></s>hi' }] });
  check(inj.tokens[0] === 1 && !inj.tokens.slice(1).includes(1) && !inj.tokens.includes(2),
    'chat content "<s></s>hi" yields no control ids');
}

// ---- typed errors
async function expectError(what, fn, cls, status, param) {
  try {
    await fn();
    check(false, `${what}: no error raised`);
  } catch (e) {
    check(e instanceof cls && e instanceof OpenAI.APIError && e.status === status &&
      (param === undefined || e.param === param) && typeof e.message === 'string',
    `${what}: ${e.constructor.name} status ${e.status} param ${e.param} type ${e.type}: ${e.message}`);
  }
}
await expectError('max_tokens -1', () => client.completions.create({ model, prompt: 'x', max_tokens: -1 }),
  OpenAI.BadRequestError, 400, 'max_tokens');
await expectError('n = 0', () => client.completions.create({ model, prompt: 'x', n: 0 }), OpenAI.BadRequestError, 400, 'n');
// Unknown fields are refused (docs/api.md), as OpenAI refuses them.
await expectError('an unknown field', () => client.completions.create({ model, prompt: 'x', bogus_param: 1 }),
  OpenAI.BadRequestError, 400, 'bogus_param');
await expectError('a token id outside the vocabulary', () => client.completions.create({ model, prompt: [1, 1000000] }),
  OpenAI.BadRequestError, 400, 'prompt');
await expectError('unknown role', () => client.chat.completions.create({ model, messages: [{ role: 'tool', content: 'x' }] }),
  OpenAI.BadRequestError, 400, 'messages');
await expectError('unknown model', () => client.completions.create({ model: 'no-such-model', prompt: 'x' }),
  OpenAI.NotFoundError, 404, 'model');
await expectError('streaming with a bad temperature', () => client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'x' }], temperature: 9, stream: true }), OpenAI.BadRequestError, 400, 'temperature');

console.log(fails ? `${fails} check(s) FAILED` : 'all checks passed');
process.exit(fails ? 1 : 0);
