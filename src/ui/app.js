// The dashboard: watches every listed key on ONE EventSource (browsers allow
// only six HTTP/1.1 streams per origin), and sets or deletes values with
// fetch. All URLs are relative to the page, so it works behind a prefix.
'use strict';

(() => {
  const STORAGE_KEY = 'statestore-gateway.ui.keys';
  // Keys shown as locks (the SDKs' convention: the value is the holder).
  const LOCKS_KEY = 'statestore-gateway.ui.locks';
  // The API token lives in sessionStorage: this tab only, gone when it closes.
  const TOKEN_KEY = 'statestore-gateway.ui.token';
  // The page is served at <root>/ui/; the API lives at <root>/.
  const API_ROOT = new URL('../', document.baseURI);
  const REQUEST_TIMEOUT_MS = 15000;
  const RETRY_MIN_MS = 1000;
  const RETRY_MAX_MS = 30000;
  const MAX_ERRORS_SHOWN = 5;
  const BROWSE_PAGE = 20; // keys per listing page
  const SPARK_POINTS = 60; // numeric values kept per key for its sparkline
  const SVG_NS = 'http://www.w3.org/2000/svg';

  const $ = (id) => document.getElementById(id);
  const ui = {
    connection: $('connection'),
    connectionText: $('connection-text'),
    addForm: $('add-form'),
    addKey: $('add-key'),
    addLock: $('add-lock'),
    errors: $('errors'),
    notice: $('notice'),
    table: $('keys'),
    rows: $('rows'),
    empty: $('empty'),
    template: $('row-template'),
    tokenBox: $('token-box'),
    tokenForm: $('token-form'),
    token: $('token'),
    browseForm: $('browse-form'),
    browsePattern: $('browse-pattern'),
    browseStatus: $('browse-status'),
    browseList: $('browse-list'),
    browseMore: $('browse-more'),
  };

  /** key -> { key, row, exists, value, valueBase64, version, kind, flags, at, error, history } */
  const watched = new Map();
  const locks = new Set(loadList(LOCKS_KEY));
  let source = null;
  let retryTimer = null;
  let retryDelay = RETRY_MIN_MS;
  let generation = 0; // counts openStream calls: a late answer for an old key set is ignored

  // ---- URLs --------------------------------------------------------------

  /** `keys/<key>`; throws for keys a URL path cannot carry. */
  function keyUrl(key) {
    if (key === '.' || key === '..') {
      throw new Error(`the key "${key}" cannot be written in a URL path`);
    }
    return new URL('keys/' + encodeURIComponent(key), API_ROOT);
  }

  function watchUrl(keys) {
    const query = keys.map((key) => 'key=' + encodeURIComponent(key));
    // EventSource cannot send an Authorization header: the gateway takes
    // the token as `access_token` on watch streams (RFC 6750, 2.3).
    const token = apiToken();
    if (token) query.push('access_token=' + encodeURIComponent(token));
    return new URL('watch?' + query.join('&'), API_ROOT);
  }

  function apiToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch {
      return '';
    }
  }

  /** Headers for fetch: the token, when one was given. */
  function authHeaders() {
    const token = apiToken();
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  /** Whether the key can travel in a URL (a lone UTF-16 surrogate cannot). */
  function encodable(key) {
    try {
      encodeURIComponent(key);
      return true;
    } catch {
      return false;
    }
  }

  // ---- persistence -------------------------------------------------------

  function loadKeys() {
    return loadList(STORAGE_KEY);
  }

  function loadList(name) {
    try {
      const stored = JSON.parse(localStorage.getItem(name) || '[]');
      if (!Array.isArray(stored)) return [];
      return [...new Set(stored.filter((k) => typeof k === 'string' && k !== '' && encodable(k)))];
    } catch {
      return [];
    }
  }

  function saveKeys() {
    try {
      localStorage.setItem(STORAGE_KEY, JSON.stringify([...watched.keys()]));
      localStorage.setItem(LOCKS_KEY, JSON.stringify([...locks].filter((k) => watched.has(k))));
    } catch (err) {
      showError(`The key list could not be saved in this browser: ${err.message}`);
    }
  }

  // ---- messages ----------------------------------------------------------

  /** `origin` 'watch' marks errors of the stream, cleared once it is live again. */
  function showError(message, origin = 'action') {
    // The same failure again (a refused stream retrying) counts up instead of stacking.
    const latest = ui.errors.firstElementChild;
    if (latest && latest.querySelector('.text').textContent === message) {
      const count = Number(latest.dataset.count) + 1;
      latest.dataset.count = String(count);
      latest.querySelector('.count').textContent = ` (${count} times)`;
      return;
    }
    const item = document.createElement('p');
    item.className = 'error';
    item.dataset.count = '1';
    item.dataset.origin = origin;
    const text = document.createElement('span');
    text.className = 'text';
    text.textContent = message;
    const count = document.createElement('span');
    count.className = 'count';
    const dismiss = document.createElement('button');
    dismiss.type = 'button';
    dismiss.className = 'dismiss';
    dismiss.textContent = 'Dismiss';
    dismiss.setAttribute('aria-label', 'Dismiss this error');
    dismiss.addEventListener('click', () => item.remove());
    const words = document.createElement('span');
    words.append(text, count);
    item.append(words, dismiss);
    ui.errors.prepend(item);
    while (ui.errors.children.length > MAX_ERRORS_SHOWN) ui.errors.lastElementChild.remove();
  }

  function showNotice(message) {
    ui.notice.textContent = message;
  }

  /** A readable message from a failed answer: problem+json title and detail if any. */
  async function describeFailure(response) {
    if (response.status === 401) {
      ui.tokenBox.open = true;
      return apiToken()
        ? 'the gateway refused the API token (HTTP 401)'
        : 'the gateway needs an API token: enter it under "API token" (HTTP 401)';
    }
    const status = `HTTP ${response.status}`;
    let body = '';
    try {
      body = await response.text();
    } catch {
      return status;
    }
    const type = response.headers.get('content-type') || '';
    if (type.includes('json')) {
      try {
        const problem = JSON.parse(body);
        const parts = [problem.title, problem.detail].filter((p) => typeof p === 'string' && p !== '');
        if (parts.length > 0) return `${parts.join(': ')} (${status})`;
      } catch {
        // fall through to the raw text
      }
    }
    const text = body.trim().slice(0, 200);
    return text ? `${text} (${status})` : `${response.statusText || 'failed'} (${status})`;
  }

  /** fetch with a deadline and messages a person can act on. */
  async function request(method, url, body) {
    const init = {
      method,
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      cache: 'no-store',
      headers: authHeaders(),
    };
    if (body !== undefined) {
      init.body = body;
      init.headers['Content-Type'] = 'text/plain; charset=utf-8';
    }
    try {
      return await fetch(url, init);
    } catch (err) {
      if (err.name === 'TimeoutError') {
        throw new Error(`no answer from the gateway within ${REQUEST_TIMEOUT_MS / 1000} s`);
      }
      throw new Error(`the gateway cannot be reached (${err.message})`);
    }
  }

  // ---- the event stream --------------------------------------------------

  function setConnection(state, text) {
    ui.connection.dataset.state = state;
    ui.connectionText.textContent = text;
    ui.table.classList.toggle('stale', state !== 'live');
  }

  function closeStream() {
    if (source) {
      source.close();
      source = null;
    }
    if (retryTimer !== null) {
      clearTimeout(retryTimer);
      retryTimer = null;
    }
  }

  /** (Re)opens the one stream for the current key set. */
  function openStream() {
    closeStream();
    generation += 1;
    const keys = [...watched.keys()];
    if (keys.length === 0) {
      setConnection('idle', 'No keys watched');
      return;
    }
    const url = watchUrl(keys);
    const stream = new EventSource(url);
    source = stream;
    setConnection('connecting', 'Connecting…');

    stream.addEventListener('open', () => {
      if (source !== stream) return;
      retryDelay = RETRY_MIN_MS;
      for (const stale of ui.errors.querySelectorAll('[data-origin="watch"]')) stale.remove();
      const n = keys.length;
      setConnection('live', `Live: watching ${n} key${n === 1 ? '' : 's'}`);
    });
    for (const kind of ['sync', 'set', 'delete']) {
      stream.addEventListener(kind, (event) => {
        if (source === stream) onStoreEvent(kind, event);
      });
    }
    stream.addEventListener('error', (event) => {
      if (source !== stream) return;
      // The gateway's own `event: error` arrives as a MessageEvent with data;
      // a broken connection arrives as a plain Event.
      if (event instanceof MessageEvent) {
        onStoreEvent('error', event);
        return;
      }
      if (stream.readyState === EventSource.CONNECTING) {
        setConnection('reconnecting', 'Reconnecting…');
        return;
      }
      // CLOSED: the gateway refused the stream. EventSource does not say
      // why, so ask once: a busy gateway (429, 5xx) is retried with backoff;
      // a refused key set (too long, too many keys) waits for a change.
      stream.close();
      source = null;
      const opened = generation;
      setConnection('refused', 'Not watching');
      explainRefusal(url).then(({ message, retry, unauthorized }) => {
        if (opened !== generation) return; // the key set changed meanwhile
        showError(message, 'watch');
        if (unauthorized) {
          setConnection('refused', 'Not watching: the gateway needs its API token');
          return;
        }
        if (!retry) {
          setConnection('refused', 'Not watching: change the keys');
          return;
        }
        const delay = retryDelay;
        retryDelay = Math.min(retryDelay * 2, RETRY_MAX_MS);
        setConnection('refused', `Not watching; retrying in ${Math.round(delay / 1000)} s`);
        retryTimer = setTimeout(() => {
          retryTimer = null;
          openStream();
        }, delay);
      });
    });
  }

  /**
   * Why the gateway refused a watch: repeats the request and reads the
   * problem. `retry` is false when the same keys would be refused again;
   * `unauthorized` when the token is missing or wrong (the token form
   * reopens the stream).
   */
  async function explainRefusal(url) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 5000);
    try {
      const response = await fetch(url, {
        headers: { Accept: 'text/event-stream' },
        signal: abort.signal,
        cache: 'no-store',
      });
      if (response.ok) {
        return { message: 'The watch stream was closed by the gateway', retry: true };
      }
      const retry = response.status === 408 || response.status === 429 || response.status >= 500;
      const unauthorized = response.status === 401;
      return { message: `Watching failed: ${await describeFailure(response)}`, retry, unauthorized };
    } catch {
      return { message: 'Watching failed: the gateway cannot be reached', retry: true };
    } finally {
      clearTimeout(timer);
      abort.abort(); // never keep a second stream open
    }
  }

  function onStoreEvent(kind, event) {
    let data;
    try {
      data = JSON.parse(event.data);
    } catch {
      showError(`The gateway sent a ${kind} event that is not JSON`);
      return;
    }
    // Keys typed here are text; a key that is not UTF-8 is not one of ours.
    if (data === null || typeof data.key !== 'string') return;
    const entry = watched.get(data.key);
    if (!entry) return;

    entry.kind = kind;
    entry.at = new Date();
    entry.flags = [];
    switch (kind) {
      case 'sync':
        entry.exists = data.exists === true;
        entry.value = entry.exists ? data.value ?? null : null;
        // A resync repeats the value it already had: one point per change.
        if (entry.history.length === 0 || data.resync !== true) remember(entry, entry.value);
        entry.valueBase64 = entry.exists ? data.value_base64 ?? null : null;
        entry.omittedBytes = entry.exists && data.value_omitted === true ? data.value_bytes : null;
        entry.version = data.version ?? null;
        if (data.resync === true) entry.flags.push('resync');
        if (data.lagged === true) entry.flags.push('lagged');
        entry.error = null;
        break;
      case 'set':
        entry.exists = true;
        entry.value = data.value ?? null;
        remember(entry, entry.value);
        entry.valueBase64 = data.value_base64 ?? null;
        entry.omittedBytes = data.value_omitted === true ? data.value_bytes : null;
        entry.version = data.version ?? null;
        entry.error = null;
        break;
      case 'delete':
        entry.exists = false;
        entry.value = null;
        entry.valueBase64 = null;
        entry.omittedBytes = null;
        entry.version = data.version ?? null;
        entry.error = null;
        break;
      case 'error':
        entry.error = typeof data.error === 'string' ? data.error : 'the gateway cannot follow this key';
        break;
    }
    render(entry);
  }

  // ---- rows --------------------------------------------------------------

  function addRow(key) {
    const row = ui.template.content.firstElementChild.cloneNode(true);
    row.dataset.key = key;
    row.querySelector('.key').textContent = key;
    const input = row.querySelector('.set-value');
    input.setAttribute('aria-label', `New value for ${key}`);
    row.querySelector('.set').setAttribute('aria-label', `Set ${key}`);
    row.querySelector('.delete').setAttribute('aria-label', `Delete ${key} from the store`);
    row.querySelector('.remove').setAttribute('aria-label', `Stop watching ${key}`);

    row.querySelector('.set-form').addEventListener('submit', (event) => {
      event.preventDefault();
      setValue(key, input.value, row);
    });
    row.querySelector('.delete').addEventListener('click', () => deleteKey(key, row));
    row.querySelector('.remove').addEventListener('click', () => unwatch(key));

    const entry = {
      key, row, exists: null, value: null, valueBase64: null, omittedBytes: null, version: null,
      kind: null, flags: [], at: null, error: null, history: [],
    };
    watched.set(key, entry);
    ui.rows.append(row);
    render(entry);
    updateEmpty();
    return entry;
  }

  function render(entry) {
    const { row } = entry;
    const marker = row.querySelector('.value .marker');
    const text = row.querySelector('.value .text');
    row.dataset.exists = entry.exists === null ? 'unknown' : String(entry.exists);
    row.dataset.kind = entry.kind ?? '';
    const lock = locks.has(entry.key);
    row.classList.toggle('lock', lock);
    if (entry.exists === null) {
      marker.textContent = 'waiting for the store…';
      text.textContent = '';
    } else if (lock && !entry.exists) {
      marker.textContent = 'lock free';
      text.textContent = '';
    } else if (lock && typeof entry.value === 'string') {
      marker.textContent = 'held by';
      text.textContent = entry.value;
    } else if (!entry.exists) {
      marker.textContent = 'absent';
      text.textContent = '';
    } else if (typeof entry.value === 'string') {
      marker.textContent = entry.value === '' ? 'empty' : '';
      text.textContent = entry.value;
    } else if (typeof entry.valueBase64 === 'string') {
      marker.textContent = 'not UTF-8, base64:';
      text.textContent = entry.valueBase64;
    } else if (typeof entry.omittedBytes === 'number') {
      // Too large for events: GET /keys/{key} reads it.
      marker.textContent = `${entry.omittedBytes} bytes, too large to show`;
      text.textContent = '';
    } else {
      marker.textContent = 'value unknown';
      text.textContent = '';
    }
    marker.hidden = marker.textContent === '';

    // A lock's version is its holder's fencing token.
    const version = entry.version ?? '—';
    row.querySelector('.version').textContent = lock && entry.exists ? `fencing token ${version}` : version;
    renderSpark(entry);

    const kind = row.querySelector('.event .kind');
    const time = row.querySelector('.event .time');
    kind.textContent = entry.kind === null ? '—' : [entry.kind, ...entry.flags].join(', ');
    if (entry.at) {
      time.dateTime = entry.at.toISOString();
      time.textContent = entry.at.toLocaleTimeString();
    }
    const error = row.querySelector('.event .event-error');
    error.textContent = entry.error ? entry.error : '';
    error.hidden = !entry.error;
    row.classList.toggle('has-error', Boolean(entry.error));
  }

  // ---- sparklines --------------------------------------------------------

  /** A plain decimal number (what sensors write), or null. */
  function numeric(value) {
    if (typeof value !== 'string' || !/^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$/.test(value)) return null;
    const number = Number(value);
    return Number.isFinite(number) ? number : null;
  }

  /** Keeps the numeric values seen since the page opened (bounded). */
  function remember(entry, value) {
    const number = numeric(value);
    if (number === null) return;
    entry.history.push(number);
    if (entry.history.length > SPARK_POINTS) entry.history.shift();
  }

  /** An inline SVG polyline of the history: attributes only, no inline style (CSP). */
  function renderSpark(entry) {
    const svg = entry.row.querySelector('.spark');
    const points = entry.history;
    // An SVG element has no `hidden` property: the attribute it is.
    svg.toggleAttribute('hidden', points.length < 2);
    if (points.length < 2) return;
    const low = Math.min(...points);
    const high = Math.max(...points);
    const span = high - low || 1;
    const step = 100 / (points.length - 1);
    const coordinates = points.map((value, index) => {
      const x = (index * step).toFixed(2);
      const y = (18 - ((value - low) / span) * 16).toFixed(2);
      return `${x},${y}`;
    });
    svg.querySelector('polyline').setAttribute('points', coordinates.join(' '));
    svg.setAttribute('aria-label', `${entry.key}: ${points.length} values since the page opened, from ${low} to ${high}`);
    let title = svg.querySelector('title');
    if (!title) {
      title = document.createElementNS(SVG_NS, 'title');
      svg.prepend(title);
    }
    title.textContent = `last ${points.length} values: ${points.join(', ')}`;
  }

  // ---- key browser --------------------------------------------------------

  let browsing = { pattern: '*', next: null, generation: 0 };

  function listUrl(pattern, cursor) {
    const query = [`match=${encodeURIComponent(pattern)}`, `limit=${BROWSE_PAGE}`];
    if (cursor) query.push(`cursor=${encodeURIComponent(cursor)}`);
    return new URL('keys?' + query.join('&'), API_ROOT);
  }

  /** Lists the first page for `pattern` (replacing the list) or the next one. */
  async function browse(pattern, more) {
    if (!more) {
      browsing = { pattern, next: null, generation: browsing.generation + 1 };
      ui.browseList.replaceChildren();
    }
    const mine = browsing.generation;
    ui.browseMore.hidden = true;
    ui.browseStatus.textContent = 'Listing…';
    let response;
    try {
      response = await request('GET', listUrl(pattern, more ? browsing.next : null));
    } catch (err) {
      ui.browseStatus.textContent = '';
      showError(`Listing failed: ${err.message}`);
      return;
    }
    if (mine !== browsing.generation) return; // a newer listing started
    if (response.status === 401) {
      ui.browseStatus.textContent = 'Listing keys needs the API token (below)';
      return;
    }
    if (!response.ok) {
      ui.browseStatus.textContent = '';
      showError(`Listing ${pattern} failed: ${await describeFailure(response)}`);
      return;
    }
    let page;
    try {
      page = await response.json();
    } catch {
      ui.browseStatus.textContent = '';
      showError('The gateway sent a listing that is not JSON');
      return;
    }
    if (mine !== browsing.generation) return;
    for (const entry of Array.isArray(page.keys) ? page.keys : []) addListed(entry);
    browsing.next = typeof page.next === 'string' ? page.next : null;
    ui.browseMore.hidden = browsing.next === null;
    const shown = ui.browseList.childElementCount;
    ui.browseStatus.textContent = shown === 0 && browsing.next === null
      ? `No keys match ${pattern}`
      : `${shown} key${shown === 1 ? '' : 's'} matching ${pattern}${browsing.next ? ', more to list' : ''}`;
  }

  function addListed(entry) {
    const item = document.createElement('li');
    if (typeof entry.key === 'string') {
      const button = document.createElement('button');
      button.type = 'button';
      button.textContent = entry.key;
      button.dataset.key = entry.key;
      button.dataset.watched = String(watched.has(entry.key));
      button.setAttribute('aria-label', `Watch ${entry.key}`);
      button.addEventListener('click', () => {
        if (!watched.has(entry.key)) watch(entry.key);
        button.dataset.watched = 'true';
      });
      item.append(button);
    } else {
      // This page watches text keys; the bytes are shown, not watched.
      const span = document.createElement('span');
      span.className = 'binary';
      span.textContent = `(not UTF-8) ${entry.key_base64 ?? ''}`;
      item.append(span);
    }
    ui.browseList.append(item);
  }

  function updateEmpty() {
    const none = watched.size === 0;
    ui.table.hidden = none;
    ui.empty.hidden = !none;
  }

  // ---- actions -----------------------------------------------------------

  function watch(key) {
    if (key === '') {
      showError('Type a key to watch');
      return false;
    }
    if (!encodable(key)) {
      showError('That key contains a character that cannot be sent in a URL');
      return false;
    }
    if (watched.has(key)) {
      showNotice(`${key} is already watched`);
      watched.get(key).row.querySelector('.set-value').focus();
      return false;
    }
    addRow(key);
    saveKeys();
    openStream();
    showNotice(`Watching ${key}`);
    return true;
  }

  function unwatch(key) {
    const entry = watched.get(key);
    if (!entry) return;
    entry.row.remove();
    watched.delete(key);
    locks.delete(key);
    for (const button of ui.browseList.querySelectorAll('button')) {
      if (button.dataset.key === key) button.dataset.watched = 'false';
    }
    saveKeys();
    updateEmpty();
    openStream();
    showNotice(`Stopped watching ${key}`);
    ui.addKey.focus();
  }

  async function busy(row, work) {
    row.setAttribute('aria-busy', 'true');
    for (const button of row.querySelectorAll('button')) button.disabled = true;
    try {
      await work();
    } catch (err) {
      showError(err.message);
    } finally {
      row.removeAttribute('aria-busy');
      for (const button of row.querySelectorAll('button')) button.disabled = false;
    }
  }

  function setValue(key, value, row) {
    return busy(row, async () => {
      const response = await request('PUT', keyUrl(key), value);
      if (!response.ok) throw new Error(`Setting ${key} failed: ${await describeFailure(response)}`);
      let version = '';
      try {
        version = (await response.json()).version || '';
      } catch {
        // the value is set; only the version is unknown
      }
      row.querySelector('.set-value').value = '';
      showNotice(version ? `Set ${key} (version ${version})` : `Set ${key}`);
    });
  }

  function deleteKey(key, row) {
    return busy(row, async () => {
      const response = await request('DELETE', keyUrl(key));
      if (response.status === 404) {
        showNotice(`${key} was already absent`);
      } else if (response.ok) {
        showNotice(`Deleted ${key}`);
      } else {
        throw new Error(`Deleting ${key} failed: ${await describeFailure(response)}`);
      }
    });
  }

  // ---- start -------------------------------------------------------------

  ui.addForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const key = ui.addKey.value;
    if (ui.addLock.checked && !watched.has(key)) locks.add(key);
    if (watch(key)) {
      ui.addKey.value = '';
      ui.addLock.checked = false;
    } else if (!watched.has(key)) {
      locks.delete(key);
    }
  });

  ui.browseForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const pattern = ui.browsePattern.value || '*';
    browse(pattern, false);
  });

  ui.browseMore.addEventListener('click', () => browse(browsing.pattern, true));

  ui.tokenForm.addEventListener('submit', (event) => {
    event.preventDefault();
    try {
      if (ui.token.value) {
        sessionStorage.setItem(TOKEN_KEY, ui.token.value);
      } else {
        sessionStorage.removeItem(TOKEN_KEY);
      }
    } catch {
      showError('This browser does not let the page keep the token');
      return;
    }
    ui.token.value = '';
    ui.tokenBox.open = false;
    showNotice(apiToken() ? 'Using the API token' : 'No API token');
    openStream();
    browse(browsing.pattern, false);
  });

  for (const key of loadKeys()) addRow(key);
  updateEmpty();
  openStream();
  // The first page of every key, so the page does not open empty.
  browse('*', false);
})();
