// strata's page: shared helpers, the API key and the view switch. chat.js and dashboard.js build
// on window.strata. Everything comes from this server (no CDN, no fonts): the page works offline.
'use strict';
window.strata = window.strata || {};
(function (S) {
  S.el = function (tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c != null) node.append(c);
    return node;
  };
  S.bytes = function (n) {
    if (n == null || !isFinite(n)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + units[i];
  };
  S.num = function (n, digits) {
    if (n == null || !isFinite(n)) return '–';
    return Number(n).toLocaleString('en-US', { maximumFractionDigits: digits ?? 1 });
  };
  S.pct = function (x) { return x == null || !isFinite(x) ? '–' : (100 * x).toFixed(1) + ' %'; };

  // The API key (strata serve --api-key): kept in this page's memory, and in localStorage only
  // when the user ticks "remember"; sent as "Authorization: Bearer KEY" on every API request
  // (S.api). A 401 shows the key bar (#auth) with a message asking for it; entering a key calls
  // the S.onKey listeners (the dashboard reconnects, the model name is fetched again).
  const KEY_STORE = 'strata.api_key.v1';
  let apiKey = '';
  try { apiKey = localStorage.getItem(KEY_STORE) || ''; } catch { apiKey = ''; }
  const keyListeners = [];
  let askingForKey = false;  // the bar is shown because the server answered 401
  S.onKey = function (listener) { keyListeners.push(listener); };

  function showKeyBar(message) {
    const bar = document.getElementById('auth');
    document.getElementById('auth-message').textContent = message;
    if (bar.hidden) {
      bar.hidden = false;
      document.getElementById('api-key').focus();
    }
  }
  function hideKeyBar() { document.getElementById('auth').hidden = true; askingForKey = false; }
  function needKey() {
    askingForKey = true;
    showKeyBar(apiKey
      ? 'The server did not accept this API key. Enter the key it was started with (strata serve --api-key).'
      : 'This server requires an API key (strata serve --api-key). Enter it to chat and to see the dashboard.');
  }
  function setKey(key, remember) {
    apiKey = key;
    try {
      if (remember && key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
    } catch { /* storage full or disabled: the key stays for this page only */ }
    document.getElementById('auth-message').textContent = key ? 'checking the key…' : 'no key set';
    askingForKey = true;  // the next answer says whether the server takes it
    for (const listener of keyListeners) listener();
  }

  // fetch() of an API route with the key; a 401 asks for one, the next success hides the bar.
  S.api = async function (path, options) {
    const init = Object.assign({}, options);
    init.headers = Object.assign({}, init.headers);
    if (apiKey) init.headers.Authorization = 'Bearer ' + apiKey;
    const response = await fetch(path, init);
    if (response.status === 401) needKey();
    else if (response.ok && askingForKey) hideKeyBar();
    return response;
  };

  // Reads a server-sent-events body: onEvent({event, data, id, retry}) per event (data lines
  // joined by "\n"; comments skipped). For the chat's replies and the dashboard's stream alike.
  S.readEvents = async function (response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const event = { event: 'message', data: null, id: null, retry: null };
        for (const line of block.split('\n')) {
          const colon = line.indexOf(':');
          if (colon === 0) continue;  // a comment (": keep-alive")
          const name = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? '' : line.slice(colon + (line[colon + 1] === ' ' ? 2 : 1));
          if (name === 'data') event.data = event.data === null ? value : event.data + '\n' + value;
          else if (name === 'event') event.event = value;
          else if (name === 'id') event.id = value;
          else if (name === 'retry' && /^\d+$/.test(value)) event.retry = parseInt(value, 10);
        }
        if (event.data !== null || event.id !== null || event.retry !== null) onEvent(event);
      }
    }
  };

  function fetchModel() {
    S.api('/v1/models').then(r => r.ok ? r.json() : null).then(m => {
      if (!m) return;
      S.modelId = m.data && m.data[0] ? m.data[0].id : undefined;
      document.getElementById('model-name').textContent = S.modelId || '';
    }).catch(() => {});
  }

  function setView(view) {
    document.getElementById('main').className = 'view-' + view;
    for (const b of document.querySelectorAll('nav .tab'))
      b.classList.toggle('active', b.dataset.view === view);
    if (location.hash !== '#' + view) history.replaceState(null, '', '#' + view);
  }
  S.setView = setView;

  document.addEventListener('DOMContentLoaded', () => {
    for (const b of document.querySelectorAll('nav .tab'))
      b.addEventListener('click', () => setView(b.dataset.view));
    const hash = location.hash.slice(1);
    if (['both', 'chat', 'dash'].includes(hash)) setView(hash);
    const keyInput = document.getElementById('api-key');
    const remember = document.getElementById('api-key-remember');
    keyInput.value = apiKey;
    remember.checked = apiKey !== '';
    document.getElementById('auth').addEventListener('submit', e => {
      e.preventDefault();
      setKey(keyInput.value.trim(), remember.checked);
    });
    document.getElementById('api-key-forget').addEventListener('click', () => {
      keyInput.value = '';
      remember.checked = false;
      setKey('', false);
    });
    document.getElementById('key-button').addEventListener('click', () => {
      if (document.getElementById('auth').hidden) showKeyBar(apiKey ? 'the key in use (kept ' +
        (remember.checked ? 'in this browser' : 'until the page closes') + ')' : 'no key set');
      else hideKeyBar();
    });
    S.onKey(fetchModel);
    fetchModel();
  });
})(window.strata);
