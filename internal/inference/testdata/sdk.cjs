// Drives the official OpenAI and Anthropic Node SDKs against a Router:
// plain, streamed and tool-calling requests, and a tool result sent back.
// Prints one JSON object of what the clients got. Usage: node sdk.cjs BASE
const openaiMod = require('openai');
const anthropicMod = require('@anthropic-ai/sdk');
const OpenAI = openaiMod.OpenAI || openaiMod.default || openaiMod;
const Anthropic = anthropicMod.Anthropic || anthropicMod.default || anthropicMod;

async function main() {
  const base = process.argv[2];
  const out = {};
  const oa = new OpenAI({ baseURL: base + '/v1', apiKey: process.env.OPENAI_API_KEY, maxRetries: 0 });
  const an = new Anthropic({ baseURL: base, apiKey: process.env.ANTHROPIC_API_KEY, maxRetries: 0 });
  const ask = [{ role: 'user', content: 'weather in Paris?' }];
  const oaTools = [{ type: 'function', function: { name: 'weather', description: 'get weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const anTools = [{ name: 'weather', description: 'get weather',
    input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];

  let r = await oa.chat.completions.create({ model: 'gpt-x', messages: ask });
  out.openai_plain = r.choices[0].message.content;
  out.openai_plain_usage = r.usage.completion_tokens;
  const s = await oa.chat.completions.create({ model: 'gpt-x', stream: true, stream_options: { include_usage: true }, messages: ask });
  let text = '';
  for await (const c of s) {
    if (c.choices[0] && c.choices[0].delta && c.choices[0].delta.content) text += c.choices[0].delta.content;
    if (c.usage) out.openai_stream_usage = c.usage.completion_tokens;
  }
  out.openai_stream = text;
  r = await oa.chat.completions.create({ model: 'gpt-x', messages: ask, tools: oaTools });
  const call = r.choices[0].message.tool_calls[0];
  out.openai_tool = call.function.name + ' ' + call.function.arguments;
  r = await oa.chat.completions.create({ model: 'gpt-x', tools: oaTools, messages: [...ask, r.choices[0].message,
    { role: 'tool', tool_call_id: call.id, content: 'sunny' }] });
  out.openai_after_tool = r.choices[0].message.content;

  let m = await an.messages.create({ model: 'claude-x', max_tokens: 50, messages: ask });
  out.anthropic_plain = m.content[0].text;
  out.anthropic_plain_usage = m.usage.output_tokens;
  const st = an.messages.stream({ model: 'claude-x', max_tokens: 50, messages: ask });
  let t2 = '';
  st.on('text', (d) => { t2 += d; });
  const fin = await st.finalMessage();
  out.anthropic_stream = t2;
  out.anthropic_stream_usage = fin.usage.output_tokens;
  m = await an.messages.create({ model: 'claude-x', max_tokens: 50, messages: ask, tools: anTools });
  const tu = m.content.find((b) => b.type === 'tool_use');
  out.anthropic_tool = tu.name + ' ' + JSON.stringify(tu.input);
  m = await an.messages.create({ model: 'claude-x', max_tokens: 50, tools: anTools, messages: [...ask,
    { role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'sunny' }] }] });
  out.anthropic_after_tool = m.content[0].text;

  const models = await oa.models.list();
  out.models = models.data.map((x) => x.id);
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
