// The chat: conversations kept in localStorage, replies streamed from /v1/chat/completions
// (OpenAI server-sent events, with the API key when one is set: S.api), a stop button (aborts
// the request: the server cancels the generation when the client goes), thinking
// (reasoning_content) folded, tool calls shown.
'use strict';
(function (S) {
  const KEY = 'strata.conversations.v1';
  const el = S.el;
  let conversations = [];
  let current = null;
  let controller = null;  // the running request's AbortController

  function load() {
    try { conversations = JSON.parse(localStorage.getItem(KEY) || '[]'); } catch { conversations = []; }
    if (!Array.isArray(conversations)) conversations = [];
  }
  function save() {
    try { localStorage.setItem(KEY, JSON.stringify(conversations)); } catch { /* full or disabled */ }
  }
  function newConversation() {
    const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'new chat',
                created: Date.now(), messages: [] };
    conversations.unshift(c);
    current = c;
    save();
    renderList();
    renderMessages();
  }
  function select(id) {
    if (controller) return;  // not while a reply streams
    current = conversations.find(c => c.id === id) || current;
    renderList();
    renderMessages();
  }
  function remove(id) {
    if (controller && current && current.id === id) return;
    conversations = conversations.filter(c => c.id !== id);
    if (!current || current.id === id) current = conversations[0] || null;
    save();
    if (!current) newConversation(); else { renderList(); renderMessages(); }
  }

  function renderList() {
    const list = document.getElementById('conversation-list');
    list.replaceChildren(...conversations.map(c => el('li', {
      class: c === current ? 'active' : '', 'data-id': c.id, onclick: () => select(c.id) },
      el('span', { text: c.title, title: c.title }),
      el('button', { text: '×', title: 'delete', onclick: e => { e.stopPropagation(); remove(c.id); } }))));
  }

  function copyText(text, button) {
    const done = () => { button.textContent = 'copied'; setTimeout(() => { button.textContent = 'copy'; }, 1200); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text) && done());
    } else if (fallbackCopy(text)) done();
  }
  function fallbackCopy(text) {
    const area = el('textarea', {});
    area.value = text;
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand('copy'); } catch { ok = false; }
    area.remove();
    return ok;
  }

  // One message's DOM; `m` = {role, content, reasoning, tool_calls, meta, error}.
  function messageNode(m, streaming) {
    const node = el('div', { class: 'msg ' + m.role + (m.error ? ' error' : '') + (streaming ? ' streaming' : '') });
    if (m.reasoning) {
      const details = el('details', { class: 'thinking' }, el('summary', { text: 'thinking (' + m.reasoning.length + ' chars)' }),
                         el('div', { class: 'reasoning', text: m.reasoning }));
      node.append(details);
    }
    node.append(el('div', { class: 'content', text: m.error || m.content || '' }));
    for (const call of m.tool_calls || []) {
      node.append(el('div', { class: 'tool', text: 'tool call ' + (call.function?.name || '?') + '(' + (call.function?.arguments || '') + ')' }));
    }
    if (m.role === 'assistant' && !streaming && !m.error) {
      const copy = el('button', { text: 'copy', title: 'copy the reply' });
      copy.addEventListener('click', () => copyText(m.content || m.reasoning || '', copy));
      node.append(el('div', { class: 'meta' }, copy, el('span', { text: m.meta || '' })));
    }
    return node;
  }

  function renderMessages() {
    const box = document.getElementById('messages');
    box.replaceChildren(...(current ? current.messages : []).map(m => messageNode(m, false)));
    box.scrollTop = box.scrollHeight;
  }

  function settings() {
    const v = id => document.getElementById(id);
    return { max_tokens: Math.max(1, parseInt(v('set-max-tokens').value, 10) || 256),
             temperature: Math.max(0, parseFloat(v('set-temperature').value) || 0),
             system: v('set-system').value.trim(), thinking: v('set-thinking').checked,
             ignore_eos: v('set-ignore-eos').checked };
  }

  async function send(text) {
    if (controller || !text.trim()) return;
    if (!current) newConversation();
    const conv = current;
    conv.messages.push({ role: 'user', content: text });
    if (conv.title === 'new chat') conv.title = text.slice(0, 40);
    save();
    renderList();
    renderMessages();

    const s = settings();
    const history = conv.messages.filter(m => !m.error).map(m => ({ role: m.role, content: m.content || '' }));
    if (s.system) history.unshift({ role: 'system', content: s.system });
    const body = { messages: history, stream: true, stream_options: { include_usage: true },
                   max_tokens: s.max_tokens, temperature: s.temperature,
                   chat_template_kwargs: { enable_thinking: s.thinking } };
    if (s.ignore_eos) body.ignore_eos = true;
    if (S.modelId) body.model = S.modelId;

    const reply = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
    const box = document.getElementById('messages');
    let node = messageNode(reply, true);
    box.append(node);
    const redraw = () => { const fresh = messageNode(reply, true); node.replaceWith(fresh); node = fresh; box.scrollTop = box.scrollHeight; };

    controller = new AbortController();
    setBusy(true);
    const started = performance.now();
    let firstAt = 0, finish = null, usage = null, chunks = 0;
    try {
      const response = await S.api('/v1/chat/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body), signal: controller.signal });
      if (!response.ok) {
        let message = 'HTTP ' + response.status;
        try { message = (await response.json()).error.message; } catch { /* not JSON */ }
        if (response.status === 401) message = 'API key needed: enter it in the bar above, then send again (' + message + ')';
        throw new Error(message);
      }
      let pending = false;
      await S.readEvents(response, ({ data }) => {
        if (data === null || data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const d = choice.delta || {};
          if (d.content) reply.content += d.content;
          if (d.reasoning_content) reply.reasoning += d.reasoning_content;
          for (const t of d.tool_calls || []) {
            const slot = reply.tool_calls[t.index ?? reply.tool_calls.length] ||= { function: { name: '', arguments: '' } };
            if (t.id) slot.id = t.id;
            if (t.function?.name) slot.function.name += t.function.name;
            if (t.function?.arguments) slot.function.arguments += t.function.arguments;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
          if ((d.content || d.reasoning_content) && !firstAt) firstAt = performance.now();
        }
        chunks++;
        if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; redraw(); }); }
      });
    } catch (e) {
      if (e.name === 'AbortError') finish = 'stopped';
      else reply.error = String(e.message || e);
    } finally {
      controller = null;
      setBusy(false);
    }
    const seconds = (performance.now() - started) / 1000;
    const tokens = usage ? usage.completion_tokens : chunks;
    reply.meta = [finish || '', usage ? tokens + ' tokens' : '',
                  firstAt ? 'first token ' + ((firstAt - started) / 1000).toFixed(2) + ' s' : '',
                  tokens && seconds > 0 ? (tokens / seconds).toFixed(1) + ' tok/s' : ''].filter(Boolean).join(' · ');
    if (!reply.tool_calls.length) delete reply.tool_calls;
    if (!reply.reasoning) delete reply.reasoning;
    conv.messages.push(reply);
    save();
    if (conv === current) renderMessages();
  }

  function setBusy(busy) {
    document.getElementById('send').disabled = busy;
    document.getElementById('stop').disabled = !busy;
    document.body.classList.toggle('generating', busy);
  }

  document.addEventListener('DOMContentLoaded', () => {
    load();
    current = conversations[0] || null;
    if (!current) newConversation(); else { renderList(); renderMessages(); }
    const prompt = document.getElementById('prompt');
    document.getElementById('composer').addEventListener('submit', e => {
      e.preventDefault();
      const text = prompt.value;
      prompt.value = '';
      send(text);
    });
    prompt.addEventListener('keydown', e => {
      if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); document.getElementById('composer').requestSubmit(); }
    });
    document.getElementById('stop').addEventListener('click', () => controller && controller.abort());
    document.getElementById('new-chat').addEventListener('click', () => { if (!controller) newConversation(); });
  });

  S.chat = { send, busy: () => controller !== null, conversations: () => conversations };
})(window.strata);
