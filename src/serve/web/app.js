// strata's page: shared helpers and the view switch. chat.js and dashboard.js build on
// window.strata. Everything comes from this server (no CDN, no fonts): the page works offline.
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
    fetch('/v1/models').then(r => r.json()).then(m => {
      S.modelId = m.data && m.data[0] ? m.data[0].id : undefined;
      document.getElementById('model-name').textContent = S.modelId || '';
    }).catch(() => {});
  });
})(window.strata);
